"""Tests for transformer_lite.training.schedule (chapter 6): the Noam
learning rate against the paper's formula (warm-up proportional to the
step, then 1 / sqrt(step)), the scheduler giving step k that rate in the
update SGD makes, and its state reloading with ``weights_only``."""

import pytest
import torch
from torch import nn

from transformer_lite.training import noam_lr, noam_scheduler


def test_noam_lr_warms_up_linearly_then_decays_as_inverse_sqrt():
    d_model, warmup = 512, 4000
    peak = noam_lr(warmup, d_model, warmup)
    assert peak == pytest.approx(6.98771242e-4)  # 1 / sqrt(512 * 4000)
    lrs = [noam_lr(s, d_model, warmup) for s in range(1, 3 * warmup)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == warmup
    for step in (1, 10, 1000):  # warm-up: proportional to the step
        assert noam_lr(2 * step, d_model, warmup) == pytest.approx(
            2 * noam_lr(step, d_model, warmup)
        )
    for step in (warmup, 10 * warmup):  # decay: 1 / sqrt(step)
        assert noam_lr(4 * step, d_model, warmup) == pytest.approx(
            noam_lr(step, d_model, warmup) / 2
        )
    assert noam_lr(7, 64, 10, factor=3.0) == pytest.approx(
        3.0 * 64**-0.5 * min(7**-0.5, 7 * 10**-1.5)
    )
    assert noam_lr(0, d_model, warmup) == noam_lr(1, d_model, warmup)


@pytest.mark.parametrize(
    "args", [(-1, 64, 10), (1, 0, 10), (1, 64, 0), (1.5, 64, 10)]
)
def test_noam_lr_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        noam_lr(*args)


def test_noam_scheduler_makes_step_k_use_noam_lr_k():
    """Whatever lr the optimizer was built with, step k uses noam_lr(k):
    seen in the update SGD makes with a gradient of one."""
    weights = [
        nn.Parameter(torch.zeros((), dtype=torch.float64)) for _ in range(2)
    ]
    optimizer = torch.optim.SGD(
        [{"params": [weights[0]], "lr": 0.123}, {"params": [weights[1]]}],
        lr=5.0,
    )
    scheduler = noam_scheduler(optimizer, d_model=64, warmup=5, factor=2.0)
    for k in range(1, 12):
        before = [w.item() for w in weights]
        for w in weights:
            w.grad = torch.ones_like(w)
        optimizer.step()
        scheduler.step()
        for w, b in zip(weights, before, strict=True):
            assert b - w.item() == pytest.approx(noam_lr(k, 64, 5, 2.0))


def test_noam_scheduler_state_reloads_with_weights_only(tmp_path):
    def build():
        param = nn.Parameter(torch.zeros(()))
        optimizer = torch.optim.Adam([param])
        return optimizer, noam_scheduler(optimizer, 32, 4)

    optimizer, scheduler = build()
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    torch.save(scheduler.state_dict(), tmp_path / "s.pt")
    _, restored = build()
    restored.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert restored.last_epoch == 6
    assert restored.get_last_lr() == scheduler.get_last_lr()
