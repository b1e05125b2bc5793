"""Tests for transformer_lite.training.loss (chapter 6): label smoothing
against PyTorch's ``nn.CrossEntropyLoss(label_smoothing=...)`` and
``nn.KLDivLoss``, against the definition (cross-entropy with the smoothed
target distribution) in float64, finite at extreme confidence in 16-bit
floats, and its settings and shapes refused with a clear error."""

import math

import pytest
import torch
from conftest import PAD, random_tokens
from conftest import VOCAB as V
from torch import nn

from transformer_lite.training import LabelSmoothingLoss


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("shape", [(3, 5), (15,)])
def test_label_smoothing_equals_torch_cross_entropy(smoothing, shape):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(*shape, V, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, V, shape, generator=g)
    targets.view(-1)[::4] = PAD  # some padding to ignore
    ours_in = logits.clone().requires_grad_()
    torch_in = logits.clone().requires_grad_()
    ours = LabelSmoothingLoss(V, PAD, smoothing)(ours_in, targets)
    reference = nn.CrossEntropyLoss(
        label_smoothing=smoothing, ignore_index=PAD
    )(torch_in.reshape(-1, V), targets.reshape(-1))
    ours.backward()
    reference.backward()
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_in.grad, torch_in.grad)


def test_sum_reduction_is_mean_times_real_tokens():
    logits = torch.randn(4, 6, V, dtype=torch.float64)
    targets = random_tokens(4, 6, seed=3)
    mean = LabelSmoothingLoss(V, PAD)(logits, targets)
    total = LabelSmoothingLoss(V, PAD, reduction="sum")(logits, targets)
    n_real = int((targets != PAD).sum())
    torch.testing.assert_close(total, mean * n_real)


@pytest.mark.parametrize("spread", ["all", "others"])
def test_loss_is_cross_entropy_against_smoothed_targets(spread):
    loss_fn = LabelSmoothingLoss(V, PAD, 0.2, spread, reduction="sum")
    logits = torch.randn(3, 5, V, dtype=torch.float64)
    targets = random_tokens(3, 5, seed=4)
    q = loss_fn.smoothed_targets(targets, torch.float64)  # (3, 5, V)
    real = targets != PAD
    torch.testing.assert_close(q.sum(-1), real.double())
    true_q = q.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[real]
    expected_true = 0.8 + 0.2 / V if spread == "all" else 0.8
    torch.testing.assert_close(true_q, torch.full_like(true_q, expected_true))
    if spread == "others":
        assert (q[..., PAD] == 0).all()
    by_definition = -(q * logits.log_softmax(-1)).sum()
    torch.testing.assert_close(loss_fn(logits, targets), by_definition)


def test_annotated_variant_equals_kl_divergence():
    """spread="others" with kl=True is the Annotated Transformer's loss:
    KL divergence to eps / (V - 2) everywhere but the target and padding.
    """
    eps = 0.1
    logits = torch.randn(4, 6, V, dtype=torch.float64)
    targets = random_tokens(4, 6, seed=5)
    flat = targets.reshape(-1)
    q = torch.full((flat.numel(), V), eps / (V - 2), dtype=torch.float64)
    q.scatter_(1, flat.unsqueeze(1), 1 - eps)
    q[:, PAD] = 0
    q[flat == PAD] = 0
    log_p = logits.reshape(-1, V).log_softmax(-1)
    reference = nn.KLDivLoss(reduction="sum")(log_p, q)
    ours = LabelSmoothingLoss(V, PAD, eps, "others", kl=True, reduction="sum")
    torch.testing.assert_close(ours(logits, targets), reference)


@pytest.mark.parametrize("spread", ["all", "others"])
def test_kl_is_cross_entropy_minus_entropy_and_zero_at_target(spread):
    ce = LabelSmoothingLoss(V, PAD, 0.3, spread)
    kl = LabelSmoothingLoss(V, PAD, 0.3, spread, kl=True)
    targets = random_tokens(2, 8, seed=6)
    logits = torch.randn(2, 8, V, dtype=torch.float64)
    torch.testing.assert_close(
        kl(logits, targets), ce(logits, targets) - ce.entropy
    )
    q = ce.smoothed_targets(targets, torch.float64)
    at_target = q.clamp(min=1e-300).log()  # log q, finite where q = 0
    assert abs(kl(at_target, targets).item()) < 1e-12
    assert kl(logits, targets) > 0


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32]
)
@pytest.mark.parametrize("scale", [1e4, 6e4])
def test_loss_stays_finite_at_extreme_confidence(dtype, scale):
    targets = random_tokens(3, 4, seed=7)
    wrong = (targets + 1) % V  # confidently wrong everywhere
    logits = nn.functional.one_hot(wrong, V).to(dtype) * scale
    logits.requires_grad_()
    for loss_fn in (
        LabelSmoothingLoss(V, PAD, 0.1),
        LabelSmoothingLoss(V, PAD, 0.1, "others", kl=True),
    ):
        loss = loss_fn(logits, targets)
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.isfinite(loss) and loss > 1000
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("pad_logit", [-math.inf, -1e9, -1e30])
def test_others_ignores_the_pad_logit_however_low(pad_logit):
    """spread="others" puts no mass on padding, so the pad logit cannot
    matter: -inf gives no NaN and -1e9 no cancellation error."""
    loss_fn = LabelSmoothingLoss(V, PAD, 0.1, "others", reduction="sum")
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 5, V, generator=gen)  # float32: -1e9 cancelled
    targets = random_tokens(3, 5, seed=8)
    logits[..., PAD] = pad_logit
    logits.requires_grad_()
    q = loss_fn.smoothed_targets(targets, torch.float64)
    log_p = logits.detach().double().log_softmax(-1)
    # the definition, summed only where q > 0 (0 * -inf is taken as 0)
    by_definition = -(q * log_p).where(q > 0, 0.0).sum()
    loss = loss_fn(logits, targets)
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    # float32 loss against the float64 definition: float32's tolerance
    torch.testing.assert_close(loss.detach(), by_definition.float())


def test_all_padding_gives_zero_not_nan():
    logits = torch.randn(2, 3, V, requires_grad=True)
    targets = torch.full((2, 3), PAD)
    loss = LabelSmoothingLoss(V, PAD)(logits, targets)
    loss.backward()
    assert loss.item() == 0.0
    assert (logits.grad == 0).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(vocab_size=V, pad_id=V), "pad_id"),
        (dict(vocab_size=V, pad_id=-1), "pad_id"),
        (dict(vocab_size=V, pad_id=0, smoothing=1.0), "smoothing"),
        (dict(vocab_size=V, pad_id=0, smoothing=-0.1), "smoothing"),
        (dict(vocab_size=2, pad_id=0, spread="others"), "vocab_size"),
        (dict(vocab_size=V, pad_id=0, spread="some"), "spread"),
        (dict(vocab_size=V, pad_id=0, reduction="none"), "reduction"),
    ],
)
def test_label_smoothing_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LabelSmoothingLoss(**kwargs)


@pytest.mark.parametrize(
    "logits_shape, targets_shape, match",
    [
        ((2, 3, V + 1), (2, 3), "vocab_size"),
        ((2, 3, V), (2, 4), "targets must have shape"),
        ((2, 3, V), (6,), "targets must have shape"),
        ((V,), (), "logits must be"),
    ],
)
def test_label_smoothing_rejects_bad_shapes(
    logits_shape, targets_shape, match
):
    loss_fn = LabelSmoothingLoss(V, PAD)
    with pytest.raises(ValueError, match=match):
        loss_fn(torch.randn(logits_shape), torch.zeros(targets_shape).long())


def test_label_smoothing_names_a_target_outside_the_vocabulary():
    """On the CPU, where reading two values costs no sync, a target id
    past V is a clear error (a translator's last target token is one the
    model never reads, so only the loss can catch it); on a GPU the loss
    reads no values (``check_ids_here``)."""
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    with pytest.raises(ValueError, match=rf"targets holds .*\[0, {V - 1}\]"):
        loss_fn(torch.randn(2, V), torch.tensor([1, V]))
    with pytest.raises(ValueError, match="targets holds"):
        loss_fn(torch.randn(2, V), torch.tensor([-1, 1]))
