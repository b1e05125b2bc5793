"""Mixed precision (chapter 8): bfloat16 autocast trains with finite
losses and gradients under padding and causal masks, even with query rows
that may attend to nothing; its loss is close to float32's; float16 gets
a GradScaler on CUDA and a clear error elsewhere, in
``TrainOptions(amp_dtype=...)`` of the training step."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import CUDA, tiny_model
from torch.overrides import TorchFunctionMode

from transformer_lite import (
    MultiHeadAttention,
    causal_mask,
    make_model,
    scaled_dot_product_attention,
    seed_everything,
)
from transformer_lite.bench.memory import peak_memory
from transformer_lite.training import (
    Batch,
    LabelSmoothingLoss,
    TrainOptions,
    seq2seq_loss,
)
from transformer_lite.training.step import (
    autocast,
    check_amp,
    grad_scaler,
    train_step,
)

V, PAD, BOS, EOS = 13, 0, 1, 2
SIZES = dict(n_layers=2, d_model=32, d_ff=64, n_heads=4, pad_id=PAD)


def awkward_batch(device="cpu") -> Batch:
    """Right padding, left padding (target queries 0 and 1 see only
    padding) and a source row that is all padding (its cross-attention
    rows see nothing)."""
    src = torch.tensor(
        [
            [BOS, 5, 6, 7, 8, EOS],
            [BOS, 5, EOS, PAD, PAD, PAD],
            [PAD, PAD, PAD, PAD, PAD, PAD],
        ]
    )
    tgt = torch.tensor(
        [
            [BOS, 5, 6, 7, 8, EOS, PAD],
            [PAD, PAD, BOS, 9, 4, EOS, PAD],
            [BOS, 3, 3, EOS, PAD, PAD, PAD],
        ]
    )
    return Batch(src, tgt, PAD).to(device)


def test_the_batch_really_has_empty_query_rows():
    batch = awkward_batch()
    assert not batch.tgt_mask[1, 0].any() and not batch.tgt_mask[1, 1].any()
    assert not batch.src_mask[2].any()


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_bfloat16_step_gives_finite_loss_and_gradients(kernel):
    model = tiny_model(V, **SIZES, dropout=0.1, device="cpu")
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.kernel = kernel
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    objective = seq2seq_loss(LabelSmoothingLoss(V, PAD, 0.1, reduction="sum"))
    before = copy.deepcopy(model.state_dict())
    loss = train_step(
        model,
        awkward_batch(),
        objective,
        optimizer,
        options=TrainOptions(amp_dtype=torch.bfloat16),
    )
    assert torch.isfinite(torch.tensor(loss)) and loss > 0
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name  # the weights stay float32
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name
    changed = [
        not torch.equal(before[k], v) for k, v in model.state_dict().items()
    ]
    assert any(changed)


def test_bfloat16_loss_is_close_to_the_float32_loss():
    # no dropout: the same function
    model = tiny_model(V, **SIZES, device="cpu").eval()
    batch = awkward_batch()
    loss_fn = LabelSmoothingLoss(V, PAD, smoothing=0.0)
    with torch.no_grad():
        full = loss_fn(model(batch.src, batch.tgt_in), batch.tgt_out)
        with autocast("cpu", torch.bfloat16):
            logits = model(batch.src, batch.tgt_in)  # (B, T, V)
            half = loss_fn(logits, batch.tgt_out)
    assert logits.dtype == torch.bfloat16  # autocast really was on
    assert torch.isfinite(half)
    torch.testing.assert_close(half.float(), full, rtol=3e-2, atol=3e-2)


def test_bfloat16_gradients_are_close_to_float32_gradients():
    model = tiny_model(V, **SIZES, device="cpu")
    batch = awkward_batch()
    loss_fn = LabelSmoothingLoss(V, PAD, smoothing=0.0)
    grads = []
    for amp_dtype in (None, torch.bfloat16):
        model.zero_grad()
        with autocast("cpu", amp_dtype):
            loss = loss_fn(model(batch.src, batch.tgt_in), batch.tgt_out)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    full, half = grads
    assert torch.isfinite(half).all()
    cosine = torch.nn.functional.cosine_similarity(full, half, dim=0)
    assert cosine > 0.99, cosine


def test_attention_under_autocast_keeps_empty_rows_at_zero():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(3))
    mask = causal_mask(5).unsqueeze(0).repeat(2, 1, 1, 1)  # (B, 1, L, L)
    mask[0, :, 3] = False  # query 3 of the first row may attend to nothing
    with autocast("cpu", torch.bfloat16):
        out, w = scaled_dot_product_attention(q, k, v, mask)
    assert out.dtype == torch.bfloat16  # the products ran in bfloat16
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (out[0, :, 3] == 0).all() and (w[0, :, 3] == 0).all()
    full, _ = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out.float(), full, rtol=5e-2, atol=5e-2)


def test_float32_step_is_the_plain_step():
    batch = awkward_batch()
    loss_fn = LabelSmoothingLoss(V, PAD, 0.1, reduction="sum")
    models = [
        tiny_model(V, **SIZES, device="cpu"),
        tiny_model(V, **SIZES, device="cpu"),
    ]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    ours = train_step(models[0], batch, seq2seq_loss(loss_fn), optimizers[0])
    # the same step written out: the mean loss per target token
    optimizers[1].zero_grad()
    loss = (
        loss_fn(
            models[1](batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask),
            batch.tgt_out,
        )
        / batch.n_tokens
    )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(models[1].parameters(), 1.0)
    optimizers[1].step()
    assert ours == pytest.approx(loss.item(), rel=1e-6)
    for a, b in zip(
        models[0].parameters(), models[1].parameters(), strict=True
    ):
        assert torch.equal(a, b)


def test_no_loss_scaling_except_for_float16():
    """The scaler is a no-op for float32 and bfloat16, so one step serves
    every precision: the loss passes unchanged."""
    for amp_dtype in (None, torch.bfloat16):
        scaler = grad_scaler("cpu", amp_dtype)
        assert not scaler.is_enabled()
        loss = torch.tensor(2.5)
        assert scaler.scale(loss) is loss


@pytest.mark.parametrize(
    "device, amp_dtype, match",
    [
        ("cpu", torch.float16, "on cpu use amp_dtype=torch.bfloat16"),
        ("cpu", torch.float32, "amp_dtype must be None"),
        ("cpu", torch.int8, "amp_dtype must be None"),
    ],
)
def test_unsupported_choices_explain_themselves(device, amp_dtype, match):
    with pytest.raises(ValueError, match=match):
        check_amp(device, amp_dtype)
    with pytest.raises(ValueError, match=match):
        autocast(device, amp_dtype)
    with pytest.raises(ValueError, match=match):
        grad_scaler(device, amp_dtype)


def test_float16_on_the_cpu_is_refused_before_the_step():
    """``TrainOptions`` cannot know the device: the step checks it."""
    model = tiny_model(V, **SIZES, device="cpu")
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    objective = seq2seq_loss(LabelSmoothingLoss(V, PAD, reduction="sum"))
    float16 = TrainOptions(amp_dtype=torch.float16)
    with pytest.raises(ValueError, match="on cpu use amp_dtype=torch.bf"):
        train_step(model, awkward_batch(), objective, optimizer,
                   options=float16)  # fmt: skip
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.skipif(not CUDA, reason="float16 with a GradScaler needs CUDA")
def test_float16_without_an_enabled_scaler_is_refused_on_cuda():
    model = tiny_model(V, **SIZES, device="cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    objective = seq2seq_loss(LabelSmoothingLoss(V, PAD, reduction="sum"))
    with pytest.raises(ValueError, match="float16 needs a scaler"):
        train_step(
            model,
            awkward_batch("cuda"),
            objective,
            optimizer,
            options=TrainOptions(amp_dtype=torch.float16),
            scaler=grad_scaler("cuda", None),  # a disabled one
        )


@pytest.mark.skipif(not CUDA, reason="float16 with a GradScaler needs CUDA")
def test_float16_with_a_scaler_on_cuda():
    model = tiny_model(V, **SIZES, dropout=0.1, device="cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    objective = seq2seq_loss(
        LabelSmoothingLoss(V, PAD, smoothing=0.1, reduction="sum")
    )
    scaler = grad_scaler("cuda", torch.float16)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled()
    losses = [
        train_step(
            model,
            awkward_batch("cuda"),
            objective,
            optimizer,
            options=TrainOptions(amp_dtype=torch.float16),
            scaler=scaler,
        )
        for _ in range(20)
    ]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    for p in model.parameters():
        assert p.dtype == torch.float32 and torch.isfinite(p).all()


class CudaAutocastRules(TorchFunctionMode):
    """CUDA's autocast emulated on the CPU where it matters for memory:
    softmax, log_softmax and layer_norm run in float32 (the CPU's autocast
    leaves them in the dtype of their input)."""

    FLOAT32 = {
        F.softmax,
        F.log_softmax,
        F.layer_norm,
        torch.softmax,
        torch.log_softmax,
        torch.layer_norm,
        torch.Tensor.softmax,
        torch.Tensor.log_softmax,
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FLOAT32 and torch.is_autocast_enabled("cpu"):

            def up(a):
                floating = (
                    isinstance(a, torch.Tensor) and a.is_floating_point()
                )
                return a.float() if floating else a

            args = tuple(up(a) for a in args)
            kwargs = {k: up(v) for k, v in kwargs.items()}
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def test_chapter_8_bfloat16_memory_bound_holds_under_cudas_rules():
    """Chapter 8 asserts that bfloat16 autocast lowers a training step's
    peak memory below 0.85 of float32's, on every device: ~0.57 on the
    CPU, and about 0.77 under CUDA's rules (more kept in float32)."""
    seed_everything(9)
    model = make_model(100, 100, n_layers=4, d_model=64, d_ff=256,
                       n_heads=4, dropout=0.1)  # fmt: skip
    src = torch.randint(1, 100, (4, 128))  # (B, S)
    tgt = torch.randint(1, 100, (4, 129))  # (B, T + 1)

    def step(amp_dtype=None):
        torch.manual_seed(10)
        with autocast("cpu", amp_dtype):
            logits = model(src, tgt[:, :-1])  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    float32 = peak_memory(step)
    cpu = peak_memory(lambda: step(torch.bfloat16)) / float32
    with CudaAutocastRules():
        cuda = peak_memory(lambda: step(torch.bfloat16)) / float32
    # Attention scores are kept in float32 for 16-bit inputs (so nothing
    # overflows), under either rule: measured 0.69 for both.
    assert cpu < 0.75, cpu  # the chapter's "~1.4x" on the CPU
    assert cuda < 0.85, cuda  # within the chapter's bound on a GPU
