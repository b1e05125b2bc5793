"""Tests for transformer_lite.training (chapter 6)."""

import math

import pytest
import torch
from torch import nn

from transformer_lite import (
    make_model,
    padding_mask,
    seed_everything,
    target_mask,
)
from transformer_lite.decoding import exact_match, greedy_decode
from transformer_lite.tasks.copy_task import (
    copy_task_batches,
    copy_task_held_out,
)
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_lite.training import (
    Batch,
    History,
    LabelSmoothingLoss,
    evaluate,
    fit,
    noam_lr,
    noam_scheduler,
    progress,
    train_epoch,
    train_step,
)
from transformer_lite.training.checkpoint import (
    CHECKPOINT_FORMAT,
    load_checkpoint,
    save_checkpoint,
)

V = 11  # vocabulary of the small test models
PAD = 0


def tiny_model(seed: int = 0, **fields) -> nn.Module:
    seed_everything(seed)
    config = dict(n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0)
    return make_model(V, V, **{**config, **fields})


def random_tokens(rows: int, width: int, seed: int, min_len: int = 2):
    """Random ids in [1, V) with each row padded after a random length."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, V, (rows, width), generator=g)
    lengths = torch.randint(min_len, width + 1, (rows, 1), generator=g)
    return tokens.masked_fill(torch.arange(width) >= lengths, PAD)


def random_batch(rows: int = 4, seed: int = 0) -> Batch:
    return Batch(
        random_tokens(rows, 7, seed), random_tokens(rows, 6, seed + 100), PAD
    )


def same_parameters(a: nn.Module, b: nn.Module, atol: float = 0.0) -> bool:
    return all(
        torch.allclose(p, q, rtol=0.0, atol=atol)
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


# ----------------------------------------------------------------------------
# Label smoothing


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


def test_label_smoothing_reads_no_values_to_check_ids():
    """The loss checks shapes and dtypes only (no host sync); an id
    outside the vocabulary still fails, in the lookup itself."""
    with pytest.raises((IndexError, RuntimeError)):
        LabelSmoothingLoss(V, PAD)(torch.randn(2, V), torch.tensor([1, V]))


def test_training_step_checks_ids_where_the_batch_lives_on_the_cpu():
    model = tiny_model()
    bad = random_batch()
    bad.tgt[0, 1] = V  # one past the vocabulary
    bad = Batch(bad.src, bad.tgt, PAD)
    with pytest.raises(ValueError, match=r"batch.tgt holds token ids"):
        train_step(
            model,
            bad,
            LabelSmoothingLoss(V, PAD, reduction="sum"),
            torch.optim.SGD(model.parameters(), lr=0.1),
        )


# ----------------------------------------------------------------------------
# The Noam schedule


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


# ----------------------------------------------------------------------------
# Batches


def test_batch_shifts_the_target_and_builds_the_masks():
    src, tgt = random_tokens(3, 7, seed=1), random_tokens(3, 6, seed=2)
    batch = Batch(src, tgt, PAD)
    assert torch.equal(batch.tgt_in, tgt[:, :-1])
    assert torch.equal(batch.tgt_out, tgt[:, 1:])
    assert batch.src_mask.shape == (3, 1, 7)
    assert torch.equal(batch.src_mask, padding_mask(src, PAD))
    assert batch.tgt_mask.shape == (3, 5, 5)
    assert torch.equal(batch.tgt_mask, target_mask(tgt[:, :-1], PAD))
    assert batch.n_tokens == int((tgt[:, 1:] != PAD).sum())
    assert batch.n_tokens < tgt[:, 1:].numel()  # there is padding
    assert "n_tokens" in repr(batch)


def test_batch_to_moves_every_tensor():
    batch = random_batch()
    moved = batch.to("meta")
    tensors = [
        name for name, v in vars(batch).items() if isinstance(v, torch.Tensor)
    ]
    assert len(tensors) == 6
    for name in tensors:
        assert getattr(moved, name).device.type == "meta"
        assert getattr(batch, name).device.type == "cpu"
    assert moved.n_tokens == batch.n_tokens
    assert moved.tgt_in._base is moved.tgt  # views, as in the batch
    assert moved.tgt_out._base is moved.tgt


def copies_to(monkeypatch, device: str) -> list[tuple]:
    """Batch.to(device) with the copies recorded instead of made (this
    machine may have no GPU): ('pin',) and ('to', device, non_blocking)."""
    calls = []

    def pin_memory(tensor):
        calls.append(("pin",))
        return tensor

    def to(tensor, device, non_blocking=False):
        calls.append(("to", torch.device(device).type, non_blocking))
        return tensor

    batch = random_batch()
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    moved = batch.to(device)
    monkeypatch.undo()
    for name in ("src", "tgt", "src_mask", "tgt_mask", "tgt_in", "tgt_out"):
        assert torch.equal(getattr(moved, name), getattr(batch, name)), name
    return calls


def test_batch_to_a_gpu_copies_from_pinned_memory_without_waiting(
    monkeypatch,
):
    calls = copies_to(monkeypatch, "cuda")
    assert calls == [("pin",), ("to", "cuda", True)] * 4


def test_batch_to_another_device_pins_nothing(monkeypatch):
    for device in ("cpu", "meta"):
        calls = copies_to(monkeypatch, device)
        assert calls == [("to", device, False)] * 4


@pytest.mark.parametrize(
    "src, tgt, match",
    [
        (torch.ones(0, 4).long(), torch.ones(0, 4).long(), "empty"),
        (torch.ones(2, 0).long(), torch.ones(2, 4).long(), "empty"),
        (torch.ones(2, 4).long(), torch.ones(3, 4).long(), "batch size"),
        (torch.ones(2, 4).long(), torch.ones(2, 1).long(), "at least 2"),
        (torch.ones(2, 4), torch.ones(2, 4).long(), "integer"),
        (torch.ones(4).long(), torch.ones(2, 4).long(), r"\(B, L\)"),
    ],
)
def test_batch_rejects_bad_inputs(src, tgt, match):
    with pytest.raises(ValueError, match=match):
        Batch(src, tgt, PAD)


# ----------------------------------------------------------------------------
# The training loop


def test_accumulating_two_batches_equals_one_big_batch():
    """The halves hold different numbers of real tokens, so the losses
    must be weighted by tokens, not simply divided by `accumulate`."""
    src = random_tokens(6, 7, seed=10)
    tgt = random_tokens(6, 6, seed=11)
    tgt[:2, 3:] = PAD  # the first half is shorter
    whole = Batch(src, tgt, PAD)
    halves = [Batch(src[:3], tgt[:3], PAD), Batch(src[3:], tgt[3:], PAD)]
    assert halves[0].n_tokens != halves[1].n_tokens
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    losses, models = [], []
    for batches, accumulate in (([whole], 1), (halves, 2)):
        model = tiny_model().double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        losses.append(
            train_epoch(
                model,
                batches,
                loss_fn,
                optimizer,
                clip_norm=None,
                accumulate=accumulate,
                progress=False,
            )
        )
        models.append(model)
    assert not same_parameters(models[0], tiny_model().double())
    assert same_parameters(*models, atol=1e-12)
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)


def test_optimizer_and_scheduler_step_once_per_group():
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    scheduler = noam_scheduler(optimizer, 16, warmup=3)
    history = History()
    batches = [random_batch(seed=s) for s in range(5)]
    train_epoch(
        model,
        batches,
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        optimizer,
        scheduler=scheduler,
        accumulate=2,
        progress=False,
        history=history,
    )
    assert scheduler.last_epoch == 3  # groups of 2, 2 and 1 batches
    assert len(history.step_loss) == len(history.lr) == 3
    assert history.lr == pytest.approx([noam_lr(k, 16, 3) for k in (1, 2, 3)])
    steps = {int(s["step"]) for s in optimizer.state.values()}
    assert steps == {3}


@pytest.mark.parametrize("clip_norm", [1e-3, None])
def test_clipping_bounds_the_update(clip_norm):
    model = tiny_model().double()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    train_epoch(
        model,
        [random_batch()],
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        optimizer,
        clip_norm=clip_norm,
        progress=False,
    )
    step = torch.cat(
        [
            (p.detach() - b).flatten()
            for p, b in zip(model.parameters(), before, strict=True)
        ]
    )
    if clip_norm is None:
        assert step.norm() > 0.1  # the raw gradient is far above 1e-3
    else:
        assert step.norm().item() == pytest.approx(clip_norm, rel=1e-6)


def test_epoch_loss_is_the_token_weighted_mean():
    """With lr = 0 nothing changes, so the epoch's loss must equal the
    evaluation loss: the mean over all real target tokens."""
    model = tiny_model()
    batches = [random_batch(rows=r, seed=r) for r in (2, 5, 3)]
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trained = train_epoch(model, batches, loss_fn, optimizer, progress=False)
    with torch.no_grad():
        per_batch = [
            loss_fn(model(b.src, b.tgt_in), b.tgt_out).item() for b in batches
        ]
    expected = sum(per_batch) / sum(b.n_tokens for b in batches)
    assert trained == pytest.approx(expected, rel=1e-6)
    assert evaluate(model, batches, loss_fn) == pytest.approx(expected)


def test_batches_may_be_a_callable_but_not_a_spent_generator():
    model = tiny_model()
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    optimizer = torch.optim.Adam(model.parameters())

    def fresh():
        return (random_batch(seed=s) for s in range(3))

    history = fit(model, fresh, loss_fn, optimizer, epochs=2, progress=False)
    assert len(history.step_loss) == 6
    with pytest.raises(ValueError, match="callable"):
        fit(model, fresh(), loss_fn, optimizer, epochs=2, progress=False)


def test_validation_runs_without_gradients_in_eval_mode():
    model = tiny_model()
    seen = []
    model.register_forward_hook(
        lambda module, args, out: seen.append(
            (args[0].size(0), module.training, torch.is_grad_enabled())
        )
    )
    train = [random_batch(rows=4, seed=s) for s in range(2)]
    val = [random_batch(rows=3, seed=9)]
    history = fit(
        model,
        train,
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        torch.optim.Adam(model.parameters()),
        epochs=2,
        val_batches=val,
        progress=False,
    )
    assert set(seen) == {(4, True, True), (3, False, False)}
    assert model.training
    assert len(history.train_loss) == len(history.val_loss) == 2
    assert not history.stopped_early


def test_early_stopping_restores_the_best_weights():
    """Training pushes towards token 5, validation wants token 6: the
    validation loss rises after the first epoch."""
    src = random_tokens(8, 7, seed=12, min_len=7)
    train = [Batch(src, torch.full((8, 5), 5), PAD)]
    val = [Batch(src, torch.full((8, 5), 6), PAD)]
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")

    def run(epochs, patience):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, fit(
            model,
            train,
            loss_fn,
            optimizer,
            epochs=epochs,
            val_batches=val,
            patience=patience,
            progress=False,
        )

    model, history = run(epochs=10, patience=2)
    assert history.val_loss[1] > history.val_loss[0]
    assert history.stopped_early and history.best_epoch == 0
    assert len(history.val_loss) == 3
    after_one_epoch, _ = run(epochs=1, patience=None)
    assert same_parameters(model, after_one_epoch)
    assert evaluate(model, val, loss_fn) == pytest.approx(history.val_loss[0])


def test_fit_rejects_patience_without_validation():
    model = tiny_model()
    with pytest.raises(ValueError, match="patience"):
        fit(
            model,
            [random_batch()],
            LabelSmoothingLoss(V, PAD, reduction="sum"),
            torch.optim.Adam(model.parameters()),
            patience=2,
        )


def test_progress_bar_shows_only_when_asked_and_watched(capsys, monkeypatch):
    """A bar only where a person watches: never in a log (carriage
    returns), even when asked for."""
    model = tiny_model()
    args = (
        [random_batch()],
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        torch.optim.Adam(model.parameters()),
    )
    train_epoch(model, *args, progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "watched", lambda: False)
    train_epoch(model, *args, progress=True)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "watched", lambda: True)
    train_epoch(model, *args, progress=True)
    assert "train" in capsys.readouterr().err


def test_not_watched_when_stderr_is_a_file(monkeypatch, tmp_path):
    with open(tmp_path / "log", "w") as log:
        monkeypatch.setattr("sys.stderr", log)
        assert not progress.watched()


def test_sum_loss_is_required():
    """A mean loss would be divided by the token count twice."""
    model = tiny_model()
    with pytest.raises(ValueError, match="reduction='sum'"):
        train_epoch(
            model,
            [random_batch()],
            LabelSmoothingLoss(V, PAD),
            torch.optim.Adam(model.parameters()),
        )


def test_non_finite_loss_stops_training():
    model = tiny_model()
    with pytest.raises(FloatingPointError):
        train_epoch(
            model,
            [random_batch()],
            lambda logits, targets: logits.sum() * math.nan,
            torch.optim.Adam(model.parameters()),
            progress=False,
        )


# ----------------------------------------------------------------------------
# Checkpoints


def _train(model, epochs, optimizer, scheduler):
    batches = [random_batch(seed=s) for s in range(3)]
    fit(
        model,
        batches,
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        optimizer,
        scheduler=scheduler,
        epochs=epochs,
        progress=False,
    )


def _optimizer_and_scheduler(model):
    optimizer = torch.optim.Adam(model.parameters())
    return optimizer, noam_scheduler(optimizer, 16, warmup=2)


def test_resuming_from_a_checkpoint_equals_training_straight_through(
    tmp_path,
):
    straight = tiny_model()
    _train(straight, 2, *_optimizer_and_scheduler(straight))

    first = tiny_model()
    optimizer, scheduler = _optimizer_and_scheduler(first)
    _train(first, 1, optimizer, scheduler)
    history = History(train_loss=[1.5])
    save_checkpoint(
        tmp_path / "ckpt.pt",
        first,
        optimizer,
        scheduler,
        epoch=1,
        history=history.to_dict(),
    )

    resumed = tiny_model(seed=1)  # other initial weights, overwritten
    optimizer, scheduler = _optimizer_and_scheduler(resumed)
    model, extra = load_checkpoint(
        tmp_path / "ckpt.pt", resumed, optimizer, scheduler
    )
    assert model is resumed
    assert extra == {"epoch": 1, "history": history.to_dict()}
    assert scheduler.last_epoch == 3
    _train(resumed, 1, optimizer, scheduler)
    assert same_parameters(resumed, straight)


def test_load_rebuilds_the_model_from_its_config(tmp_path):
    saved = tiny_model(n_heads=4, norm_first=True)
    save_checkpoint(tmp_path / "m.pt", saved)
    raw = torch.load(tmp_path / "m.pt", weights_only=True)
    assert raw["config"] == saved.config.to_dict()
    model, extra = load_checkpoint(tmp_path / "m.pt")
    assert model.config == saved.config and extra == {}
    batch = random_batch()
    saved.eval()
    model.eval()
    torch.testing.assert_close(
        model(batch.src, batch.tgt_in),
        saved(batch.src, batch.tgt_in),
        rtol=0,
        atol=0,
    )


def test_load_accepts_another_dropout(tmp_path):
    save_checkpoint(tmp_path / "m.pt", tiny_model(dropout=0.1))
    model, _ = load_checkpoint(tmp_path / "m.pt", tiny_model(seed=3))
    assert same_parameters(model, tiny_model(dropout=0.1))


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(d_model=32), ["d_model: checkpoint 16, model 32"]),
        (dict(n_layers=2, norm_first=True), ["n_layers", "norm_first"]),
    ],
)
def test_load_names_the_config_fields_that_differ(tmp_path, fields, named):
    save_checkpoint(tmp_path / "m.pt", tiny_model())
    with pytest.raises(ValueError, match="another configuration") as info:
        load_checkpoint(tmp_path / "m.pt", tiny_model(**fields))
    for text in named:
        assert text in str(info.value)


def test_load_names_a_different_vocabulary(tmp_path):
    save_checkpoint(tmp_path / "m.pt", tiny_model())
    other = make_model(V + 2, V, n_layers=1, d_model=16, d_ff=32, n_heads=2)
    with pytest.raises(ValueError, match=f"src_vocab: checkpoint {V}, model"):
        load_checkpoint(tmp_path / "m.pt", other)


def test_load_rejects_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint file"):
        load_checkpoint(tmp_path / "missing.pt")
    save_checkpoint(tmp_path / "good.pt", tiny_model())
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    for name in ("truncated.pt", "garbage.pt"):
        with pytest.raises(ValueError, match="cannot read checkpoint"):
            load_checkpoint(tmp_path / name)


def test_load_rejects_pickled_objects_and_foreign_files(tmp_path):
    torch.save(
        {"format": CHECKPOINT_FORMAT, "x": History()}, tmp_path / "pickled.pt"
    )
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "pickled.pt")
    torch.save(tiny_model().state_dict(), tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="not a transformer-lite"):
        load_checkpoint(tmp_path / "weights.pt")


def test_save_refuses_what_weights_only_cannot_load(tmp_path):
    with pytest.raises(ValueError, match=r"\['history'\] is a History"):
        save_checkpoint(tmp_path / "m.pt", tiny_model(), history=History())
    assert not (tmp_path / "m.pt").exists()


def test_load_needs_saved_optimizer_state_to_restore_it(tmp_path):
    model = tiny_model()
    save_checkpoint(tmp_path / "m.pt", model)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(
            tmp_path / "m.pt", model, torch.optim.Adam(model.parameters())
        )


# ----------------------------------------------------------------------------
# The whole recipe: a small model learns the copy task (chapter 6)

COPY_VOCAB = 13  # PAD, BOS, EOS and 10 symbols
COPY_LEN = 10  # symbols per sequence
COPY_STEPS = 200  # optimizer steps of 64 fresh sequences each
# Token embeddings drawn small, so that positions dominate at the start:
# the default (Xavier) init gives them std 1.3 after the sqrt(d_model)
# scale for a vocabulary this small, and training then needs several
# times the steps and keeps flipping a few sequences. Label smoothing
# (0.1) matters too: without it the held-out score kept oscillating.
EMBED_STD = 0.05


@pytest.mark.slow
def test_small_model_learns_the_copy_task(one_thread):
    seed_everything(0)
    model = make_model(
        COPY_VOCAB,
        COPY_VOCAB,
        n_layers=1,
        d_model=64,
        d_ff=128,
        n_heads=4,
        dropout=0.0,
    )
    for embedding in (model.src_embed, model.tgt_embed):
        nn.init.normal_(embedding.weight, std=EMBED_STD)
    optimizer = torch.optim.Adam(
        model.parameters(), betas=(0.9, 0.98), eps=1e-9
    )
    scheduler = noam_scheduler(optimizer, d_model=64, warmup=50, factor=0.5)
    train = copy_task_batches(COPY_STEPS, 64, COPY_LEN, COPY_VOCAB, 1)
    loss_fn = LabelSmoothingLoss(COPY_VOCAB, PAD_ID, 0.1, reduction="sum")
    train_epoch(
        model, train, loss_fn, optimizer, scheduler=scheduler, progress=False
    )
    held_out = copy_task_held_out(500, COPY_LEN, COPY_VOCAB)
    decoded = greedy_decode(
        model,
        held_out.src,
        src_mask=held_out.src_mask,
        max_len=COPY_LEN + 2,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
    )
    assert exact_match(decoded, held_out.tgt, PAD_ID).all()
