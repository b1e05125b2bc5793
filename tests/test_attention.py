"""Attention against PyTorch's own: F.scaled_dot_product_attention and
nn.MultiheadAttention, outputs and gradients, plus invariants, errors
and ``set_attention_kernel``."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, random_padding
from torch import nn

from transformer_lite import make_model
from transformer_lite.attention import (
    KERNELS,
    MultiHeadAttention,
    attend,
    scaled_dot_product_attention,
    set_attention_kernel,
)
from transformer_lite.cache import KVCache
from transformer_lite.interop import from_torch_mha
from transformer_lite.masks import causal_mask, to_torch_attn_mask

SHAPES = [  # (B, H, Lq, Lk, D)
    (1, 1, 1, 1, 1),
    (2, 3, 5, 7, 8),
    (3, 2, 9, 4, 16),
    (1, 4, 16, 16, 32),
]


def random_mask(shape, generator):
    """A random bool mask with at least one allowed key per query row."""
    mask = torch.rand(shape, generator=generator) > 0.4
    mask[..., 0] = True
    return mask


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_equals_torch(shape, masked, dtype, device):
    g = torch.Generator().manual_seed(sum(shape))
    B, H, Lq, Lk, D = shape
    q = torch.randn(B, H, Lq, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, Lk, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, Lk, D, generator=g, dtype=dtype)
    mask = random_mask((B, 1, Lq, Lk), g).to(device) if masked else None
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))

    ours, weights = scaled_dot_product_attention(q, k, v, mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(ours, theirs, dtype, "outputs differ")

    grad = torch.randn_like(ours)
    ours_grads = torch.autograd.grad(ours, (q, k, v), grad)
    theirs_grads = torch.autograd.grad(theirs, (q, k, v), grad)
    for name, a, b in zip("qkv", ours_grads, theirs_grads, strict=True):
        assert_close(a, b, dtype, f"gradient of {name} differs")


def test_weights_are_a_distribution_over_allowed_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g) for _ in range(3))
    mask = random_mask((2, 1, 6, 6), g)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 6))
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    assert (weights >= 0).all()


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_fully_masked_row_gives_zeros_not_nan(dtype, device):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    q, k, v = (t.to(device, dtype).requires_grad_() for t in (q, k, v))
    mask = causal_mask(4, device).unsqueeze(0).clone()  # (1, 1, 4, 4)
    mask[..., 2, :] = False  # query 2 may attend to nothing
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all()
    assert (weights[..., 2, :] == 0).all() and (out[..., 2, :] == 0).all()
    # other rows are unaffected and still sum to one
    rows = weights[..., [0, 1, 3], :].float().sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-2, rtol=0)
    out.float().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def test_sdpa_rejects_bad_input():
    q = torch.randn(2, 5, 8)
    with pytest.raises(
        ValueError,
        match=r"last dimension.*\(2, 5, 8\).*"
        r"\(2, 5, 4\)",
    ):
        scaled_dot_product_attention(q, torch.randn(2, 5, 4), q)
    with pytest.raises(ValueError, match="same length"):
        scaled_dot_product_attention(q, q, torch.randn(2, 6, 8))
    with pytest.raises(ValueError, match="bool"):
        scaled_dot_product_attention(q, q, q, torch.ones(2, 5, 5))
    with pytest.raises(ValueError, match="does not broadcast"):
        scaled_dot_product_attention(
            q, q, q, torch.ones(2, 4, 5, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="number of dimensions"):
        scaled_dot_product_attention(q, q[0], q[0])


# --- MultiHeadAttention against nn.MultiheadAttention ----------------------

MHA_CASES = [  # (C, H, B, Lq, Lk, cross, mask kind)
    (8, 1, 1, 3, 3, False, None),
    (16, 4, 2, 6, 6, False, "causal"),
    (16, 4, 3, 6, 6, False, "padding"),
    (24, 3, 2, 5, 9, True, "padding"),
    (32, 8, 2, 4, 7, True, None),
    (12, 2, 2, 7, 7, False, "both"),
]


def make_pair(C, H, dtype, device, bias=True, seed=0):
    torch.manual_seed(seed)
    # Created in `dtype`, so float64 weights use all 53 bits.
    theirs = nn.MultiheadAttention(
        C, H, bias=bias, batch_first=True, device=device, dtype=dtype
    )
    return from_torch_mha(theirs), theirs


def build_mask(kind, B, Lq, Lk, device):
    """Our mask (True = may attend) with a head axis, or None."""
    if kind is None:
        return None
    lengths = [max(1, Lk - 2 * b) for b in range(B)]
    padding = random_padding(lengths, Lk, device)  # (B, 1, Lk)
    if kind == "padding":
        return padding
    causal = causal_mask(Lq, device)  # (1, Lq, Lq)
    return causal if kind == "causal" else causal & padding


def torch_mask(mask, H, Lq, Lk):
    """Our (B or 1, Lq or 1, Lk) mask as nn.MultiheadAttention's attn_mask."""
    flipped = to_torch_attn_mask(mask)  # True = masked out
    if flipped.size(0) == 1:
        return flipped[0].expand(Lq, Lk)
    flipped = flipped.expand(-1, Lq, Lk)  # (B, Lq, Lk)
    return flipped.repeat_interleave(H, dim=0)  # (B * H, Lq, Lk)


@pytest.mark.parametrize("case", MHA_CASES, ids=str)
def test_mha_equals_torch(case, dtype, device):
    C, H, B, Lq, Lk, cross, kind = case
    ours, theirs = make_pair(C, H, dtype, device)
    ours.eval(), theirs.eval()
    g = torch.Generator().manual_seed(C + Lq)
    x = torch.randn(B, Lq, C, generator=g, dtype=dtype).to(device)
    memory = torch.randn(B, Lk, C, generator=g, dtype=dtype).to(device)
    x_ref = x.clone().requires_grad_()
    x.requires_grad_()
    kv, kv_ref = (memory, memory) if cross else (x, x_ref)
    mask = build_mask(kind, B, Lq, kv.size(1), device)

    out = ours(x, kv, kv, mask)
    ref, _ = theirs(
        x_ref,
        kv_ref,
        kv_ref,
        attn_mask=(
            None if mask is None else torch_mask(mask, H, Lq, kv.size(1))
        ),
        need_weights=False,
    )
    assert out.shape == (B, Lq, C)
    assert_close(out, ref, dtype, "outputs differ")

    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    assert_close(x.grad, x_ref.grad, dtype, "gradient of the input differs")
    w_q, w_k, w_v = theirs.in_proj_weight.grad.chunk(3)
    for name, a, b in [
        ("W^Q", ours.w_q.weight.grad, w_q),
        ("W^K", ours.w_k.weight.grad, w_k),
        ("W^V", ours.w_v.weight.grad, w_v),
        ("W^O", ours.w_o.weight.grad, theirs.out_proj.weight.grad),
    ]:
        assert_close(a, b, dtype, f"gradient of {name} differs")


def test_mha_gradients_wrt_inputs_equal_torch():
    ours, theirs = make_pair(16, 4, torch.float64, "cpu")
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    mask = causal_mask(5)
    ours(x, x, x, mask).sum().backward()
    theirs(y, y, y, attn_mask=to_torch_attn_mask(mask[0]))[0].sum().backward()
    assert_close(x.grad, y.grad, torch.float64)


def test_mha_without_bias_equals_torch():
    ours, theirs = make_pair(16, 2, torch.float64, "cpu", bias=False)
    assert ours.w_q.bias is None
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    assert_close(ours(x, x, x), theirs(x, x, x)[0], torch.float64)


@pytest.mark.parametrize("kind", [None, "padding", "causal", "both"])
def test_fused_path_equals_plain_path(kind, device):
    ours, _ = make_pair(16, 4, torch.float64, device)
    ours.eval()
    x = torch.randn(3, 6, 16, dtype=torch.float64, device=device)
    mask = build_mask(kind, 3, 6, 6, device)
    if mask is not None:
        mask = mask.expand(3, 6, 6).clone()
        mask[1, 2] = False  # a query row with no allowed key
    plain = ours(x, x, x, mask)
    ours.kernel = "fused"
    fused = ours(x, x, x, mask)
    assert_close(fused, plain, torch.float64, "fused path differs")
    assert torch.isfinite(fused).all()


@pytest.mark.parametrize(
    "shape", [(2, 5, 7), (2, 1, 7), (5, 7), (2, 1, 5, 7), (2, 4, 5, 7)]
)
def test_mha_accepts_documented_mask_shapes(shape):
    ours, _ = make_pair(16, 4, torch.float64, "cpu")
    x, m = torch.randn(2, 5, 16).double(), torch.randn(2, 7, 16).double()
    mask = torch.ones(shape, dtype=torch.bool)
    mask[..., -1] = False
    full = torch.ones(2, 4, 5, 7, dtype=torch.bool)
    full[..., -1] = False
    assert_close(ours(x, m, m, mask), ours(x, m, m, full), torch.float64)


def test_weights_are_kept_only_when_asked():
    mha = MultiHeadAttention(16, 4, dropout=0.0)
    x = torch.randn(2, 5, 16)
    mha(x, x, x)
    assert mha.weights is None
    mha.keep_weights = True
    mha(x, x, x, causal_mask(5))
    assert mha.weights.shape == (2, 4, 5, 5)
    assert not mha.weights.requires_grad
    assert (mha.weights[0, 0].triu(1) == 0).all()


def test_zero_dropout_means_no_dropout():
    mha = MultiHeadAttention(16, 4, dropout=0.0)
    assert mha.dropout_p == 0.0
    x = torch.randn(2, 5, 16)
    mha.train()
    train_out = mha(x, x, x)
    mha.eval()
    torch.testing.assert_close(train_out, mha(x, x, x), rtol=0, atol=0)
    # and a positive rate does drop in training (so the check above bites)
    noisy = MultiHeadAttention(16, 4, dropout=0.5).train()
    assert not torch.allclose(noisy(x, x, x), noisy.eval()(x, x, x))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: MultiHeadAttention(10, 3), r"d_model \(10\).*n_heads \(3\)"),
        (lambda: MultiHeadAttention(8, 2, dropout=1.0), "dropout"),
    ],
)
def test_mha_constructor_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_mha_forward_errors():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(
        ValueError,
        match=r"key must have shape .*16.*"
        r"\(2, 5, 12\)",
    ):
        mha(x, torch.randn(2, 5, 12), x)
    with pytest.raises(ValueError, match="batch size"):
        mha(x, torch.randn(3, 5, 16), torch.randn(3, 5, 16))
    with pytest.raises(ValueError, match="same length"):
        mha(x, x, torch.randn(2, 6, 16))
    with pytest.raises(
        ValueError, match=r"does not broadcast.*\(2, 4, 5, 5\)"
    ):
        mha(x, x, x, torch.ones(2, 5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        mha(x, x, x, torch.ones(2, 5, 5))


# --- the fused kernels themselves, in the dtypes a GPU trains in -----------

KERNEL_TOLERANCES = {  # against float64; bfloat16 keeps 8 bits
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=5e-2),  # worst seen: 0.02
}


def awkward_mask(device):
    """(B, L, L) causal and padding, with one query row that sees nothing."""
    lengths = torch.tensor([9, 6, 3], device=device)
    keep = torch.arange(9, device=device) < lengths[:, None]  # (B, L)
    mask = causal_mask(9, device) & keep[:, None, :]  # (B, L, L)
    mask[1, 4] = False
    return mask


@pytest.mark.parametrize("dtype", KERNEL_TOLERANCES, ids=str)
def test_fused_kernel_forward_and_backward(dtype, device):
    """The kernel PyTorch picks on ``device`` for ``dtype`` (the CPU's fused
    kernel; flash, memory-efficient or cuDNN on a GPU) against the plain
    path in float64: outputs and gradients, a fully masked row included."""
    torch.manual_seed(0)
    reference = MultiHeadAttention(32, 4, dropout=0.0).double().eval()
    fused = MultiHeadAttention(32, 4, dropout=0.0, kernel="fused").eval()
    fused.load_state_dict(reference.state_dict())
    fused.to(device, dtype)
    x = torch.randn(3, 9, 32, dtype=torch.float64)  # (B, L, C)
    x_ref = x.clone().requires_grad_()
    x_fused = x.to(device, dtype).requires_grad_()
    mask = awkward_mask("cpu")
    y_ref = reference(x_ref, x_ref, x_ref, mask)  # (B, L, C)
    y = fused(x_fused, x_fused, x_fused, mask.to(device))  # (B, L, C)
    grad = torch.randn_like(y_ref)
    y_ref.backward(grad)
    y.backward(grad.to(device, dtype))
    tol = KERNEL_TOLERANCES[dtype]
    assert y.dtype == dtype and torch.isfinite(y).all()
    # the row that sees nothing: attention gives zeros, w_o its bias
    assert torch.equal(y[1, 4], fused.w_o.bias.detach())
    torch.testing.assert_close(y.double().cpu(), y_ref, **tol)
    torch.testing.assert_close(x_fused.grad.double().cpu(), x_ref.grad, **tol)
    for name, p in reference.named_parameters():
        got = dict(fused.named_parameters())[name].grad
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.double().cpu(), p.grad, **tol)


def nan_for_empty_rows(monkeypatch):
    """Make F.scaled_dot_product_attention behave as some CUDA kernels do
    for a query row with no allowed key: NaN, forward and backward."""
    real = F.scaled_dot_product_attention

    def kernel(q, k, v, attn_mask=None, **kwargs):
        out = real(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is None:
            return out
        empty = ~attn_mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
        nan_rows = torch.ones_like(empty, dtype=out.dtype)
        return out * nan_rows.masked_fill(empty, torch.nan)

    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)


def test_fused_path_never_hands_the_kernel_an_empty_row(monkeypatch):
    nan_for_empty_rows(monkeypatch)
    torch.manual_seed(0)
    attention = MultiHeadAttention(32, 4, dropout=0.0, kernel="fused").double()
    x = torch.randn(3, 9, 32, dtype=torch.float64, requires_grad=True)
    y = attention(x, x, x, awkward_mask("cpu"))  # (B, L, C)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attention.parameters())


# --- is_causal: no mask tensor, so that FlashAttention may run -------------


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_is_causal_equals_a_causal_mask(kernel, padding):
    ours, _ = make_pair(16, 4, torch.float64, "cpu")
    ours.eval()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    mask = build_mask("padding", 3, 6, 6, "cpu") if padding else None
    full = causal_mask(6) if mask is None else causal_mask(6) & mask
    expected = ours(x, x, x, full)
    ours.kernel = kernel
    assert_close(ours(x, x, x, mask, is_causal=True), expected, torch.float64)


def test_is_causal_alone_gives_the_kernel_no_mask(kernel_calls):
    calls = kernel_calls
    ours, _ = make_pair(16, 4, torch.float64, "cpu")
    ours.kernel = "fused"
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    ours(x, x, x, is_causal=True)
    ours(x, x, x)
    assert [c.get("attn_mask") for c in calls] == [None, None]
    assert [c.get("is_causal") for c in calls] == [True, False]


def test_is_causal_needs_no_more_queries_than_keys():
    ours, _ = make_pair(16, 4, torch.float64, "cpu")
    x, m = torch.randn(2, 7, 16).double(), torch.randn(2, 5, 16).double()
    with pytest.raises(ValueError, match="as many keys as queries"):
        ours(x, m, m, is_causal=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_is_causal_with_a_cache_aligns_queries_with_the_last_keys(
    kernel_calls, kernel
):
    """Chunks of 5, 3 and 1 new positions through a KV cache: the same
    outputs as one causal pass over all 9. The kernel is told is_causal
    only when Lq = Lk (its own alignment is top-left, wrong for a cache);
    3 queries after 5 cached keys get a spelled-out mask, 1 query none."""
    calls = kernel_calls
    ours, _ = make_pair(16, 4, torch.float64, "cpu")
    ours.eval()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    expected = ours(x, x, x, causal_mask(9))  # (B, L, C)
    ours.kernel = kernel
    cache = KVCache()
    chunks = [x[:, :5], x[:, 5:8], x[:, 8:]]
    outputs = [ours(c, c, c, cache=cache, is_causal=True) for c in chunks]
    assert_close(torch.cat(outputs, dim=1), expected, torch.float64)
    if kernel == "fused":
        assert [c.get("is_causal") for c in calls] == [True, None, False]
        masks = [c.get("attn_mask") for c in calls]
        assert masks[0] is None and masks[2] is None
        assert masks[1].shape == (1, 1, 3, 8)
        assert torch.equal(masks[1][0, 0], causal_mask(8)[0, 5:])
    else:
        assert calls == []  # the hand-written path calls no kernel


def test_a_bias_row_of_minus_infinity_is_an_empty_row_in_every_path():
    """-inf in a bias forbids a key as the mask does; a row it forbids
    entirely gives zeros in the plain, fused and chunked paths alike."""
    from transformer_lite.attention import fused_attention
    from transformer_lite.chunked import chunked_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 8, generator=g) for _ in range(3))
    bias = torch.randn(4, 4, generator=g)
    bias[1] = -math.inf  # every key forbidden
    bias[2, :3] = -math.inf  # all but one
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[3, 3] = False
    for m in (None, mask):
        plain, weights = scaled_dot_product_attention(q, k, v, m, bias=bias)
        assert torch.isfinite(plain).all()
        assert (plain[:, :, 1] == 0).all() and (weights[:, :, 1] == 0).all()
        torch.testing.assert_close(weights[:, :, 2].sum(-1), torch.ones(2, 2))
        torch.testing.assert_close(
            fused_attention(q, k, v, m, bias=bias), plain
        )
        torch.testing.assert_close(
            chunked_attention(q, k, v, m, bias=bias, chunk_size=2), plain
        )


def test_nan_in_a_bias_shows_in_the_output():
    q = k = v = torch.ones(1, 3, 4)
    bias = torch.zeros(3, 3)
    bias[0, 1] = math.nan
    out, _ = scaled_dot_product_attention(q, k, v, bias=bias)
    assert out[0, 0].isnan().all() and torch.isfinite(out[0, 1:]).all()


# --- attend: the one seam that knows kernels -------------------------------


def test_attend_gives_one_answer_by_every_kernel():
    """Causal after 5 cached keys (right-aligned), a padding mask, a row
    with no allowed key and an ALiBi-like bias: the fused and chunked
    kernels equal the plain one (float64), the bias given to the chunked
    kernel as a tensor or as a function of query and key indices."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, 3, 9, 8, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :6] = False  # row 0 of batch 1 then sees nothing
    offsets = torch.arange(9)[None, :] - torch.arange(5, 9)[:, None]
    bias = -0.5 * offsets.abs().double()  # (Lq, Lk)
    expected, weights = attend(
        q, k, v, mask=mask, is_causal=True, bias=bias, need_weights=True
    )
    assert torch.equal(expected[1, :, 0], torch.zeros(3, 8))
    assert (weights[..., 0, 6:] == 0).all()  # query 0 sits at position 5
    assert (weights[0, :, 0, :6] > 0).all()
    for kernel in ("fused", "chunked"):
        got, none = attend(
            q, k, v, mask=mask, is_causal=True, bias=bias, kernel=kernel
        )
        assert none is None
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    by_index = lambda block, rows, cols: bias[rows][:, cols]  # noqa: E731
    got, _ = attend(
        q, k, v, mask=mask, is_causal=True, bias=by_index, kernel="chunked"
    )
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(kernel="flash"), "kernel must be one of"),
        (dict(kernel="fused", need_weights=True), "never forms the weights"),
        (dict(kernel="chunked", dropout_p=0.1), "no weights to drop"),
        (dict(is_causal=True), "as many keys as queries"),
    ],
)
def test_attend_refuses_what_its_kernel_cannot_do(options, match):
    q = torch.randn(1, 6, 4)
    k = torch.randn(1, 5, 4)
    with pytest.raises(ValueError, match=match):
        attend(q, k, k, **options)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_module_checks_its_mask_once_per_call(kernel, monkeypatch):
    from transformer_lite import attention, chunked

    calls = []

    def counted(mask, shape, real=attention.check_mask):
        calls.append(tuple(shape))
        return real(mask, shape)

    monkeypatch.setattr(attention, "check_mask", counted)
    monkeypatch.setattr(chunked, "check_mask", counted)
    mha = MultiHeadAttention(16, 4, dropout=0.0, kernel=kernel).eval()
    x = torch.randn(2, 5, 16)
    mha(x, x, x, torch.ones(2, 1, 5, dtype=torch.bool))
    assert calls == [(2, 4, 5, 5)]
    bad = torch.ones(2, 1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="does not broadcast"):
        mha(x, x, x, bad)


@pytest.mark.parametrize("name", ["alibi", "t5", "shaw", "rope"])
def test_a_module_takes_the_chunked_kernel_with_any_scheme(name):
    """A relative scheme through the chunked kernel (its bias asked for
    block by block) equals the plain kernel, with a cache too."""
    from transformer_lite.relative import (
        ALiBiBias,
        ShawRelativeKeys,
        T5RelativeBias,
    )
    from transformer_lite.rotary import RotaryEmbedding

    position = {
        "alibi": lambda: ALiBiBias(4),
        "t5": lambda: T5RelativeBias(4, bidirectional=False),
        "shaw": lambda: ShawRelativeKeys(4),
        "rope": lambda: RotaryEmbedding(4),
    }[name]()
    torch.manual_seed(0)
    plain = MultiHeadAttention(16, 4, dropout=0.0, position=position)
    plain = plain.double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    expected = plain(x, x, x, is_causal=True)
    plain.kernel = "chunked"
    torch.testing.assert_close(
        plain(x, x, x, is_causal=True), expected, rtol=1e-12, atol=1e-12
    )
    cache = KVCache()
    pieces = [plain(c, c, c, cache=cache, is_causal=True)
              for c in (x[:, :4], x[:, 4:6], x[:, 6:])]  # fmt: skip
    torch.testing.assert_close(
        torch.cat(pieces, dim=1), expected, rtol=1e-12, atol=1e-12
    )


def test_why_not_fused_names_the_reason():
    mha = MultiHeadAttention(16, 4, kernel="fused")
    assert mha.why_not_fused == ""
    mha.keep_weights = True
    assert "keep_weights" in mha.why_not_fused
    mha.keep_weights = False
    mha.kernel = "chunked"
    assert "'chunked'" in mha.why_not_fused


def test_the_chunked_kernel_refuses_dropout_in_training_only():
    mha = MultiHeadAttention(16, 4, dropout=0.1, kernel="chunked")
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="no weights to drop"):
        mha.train()(x, x, x)
    assert mha.eval()(x, x, x).shape == (2, 5, 16)


def test_set_attention_kernel_switches_every_attention_module():
    model = make_model(11, 11, n_layers=2, d_model=16, d_ff=32, n_heads=2)
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for kernel in ("fused", "chunked", "plain"):
        assert set_attention_kernel(model, kernel) == 2 + 2 * 2  # enc, dec
        assert {m.kernel for m in modules} == {kernel}
    with pytest.raises(ValueError, match="kernel must be one of"):
        set_attention_kernel(model, "flash")
    assert {m.kernel for m in modules} == {"plain"}  # nothing switched


def test_forward_is_the_seam_in_thirty_statement_lines():
    import ast
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(MultiHeadAttention.forward))
    (function,) = ast.parse(source).body
    lines = {
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.stmt) and node is not function
    }
    lines -= {function.body[0].lineno}  # the docstring
    assert len(lines) <= 30, len(lines)
