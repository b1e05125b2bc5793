"""Tests for transformer_lite.scores (chapters 1, 2 and 8): the precision
rules every attention path shares, Q scaled by 1 / sqrt(d_k) before the
product and the scores computed in float32 for 16-bit inputs, checked
through every path (plain, chunked, fused and the cached
MultiHeadAttention) against PyTorch's fused kernel: whatever it computes
in float16 or bfloat16 ours computes too, finite and equal within the
dtype's tolerance. A property test over shapes, dtypes, scales and
masks."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

from transformer_lite import MultiHeadAttention, chunked_attention
from transformer_lite.attention import (
    fused_attention,
    scaled_dot_product_attention,
)
from transformer_lite.cache import KVCache

HALF = (torch.float16, torch.bfloat16)
# A dtype's tolerance on an output, relative to the largest |value|.
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
EPS32 = torch.finfo(torch.float32).eps


def issue_inputs(dtype):
    """The reported case: Q K^T = 69696 overflows float16 (65504), the
    scaled score 8712 does not."""
    q = torch.full((1, 2, 64), 33.0, dtype=dtype)  # (B, Lq, D)
    k = torch.zeros(1, 3, 64, dtype=dtype)  # (B, Lk, D)
    k[:, 0] = 33.0
    v = torch.arange(3 * 64, dtype=dtype).view(1, 3, 64) / 100  # (B, Lk, D)
    return q, k, v


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_product_that_overflows_float16_is_scaled_first(dtype):
    q, k, v = issue_inputs(dtype)
    expected = F.scaled_dot_product_attention(q, k, v)
    plain, weights = scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(plain).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(plain, expected)
    chunked = chunked_attention(q, k, v, chunk_size=2)
    torch.testing.assert_close(chunked, expected)


def test_cached_attention_in_float16_is_finite():
    """The cached path of MultiHeadAttention goes through the same
    function: a decoding step whose product would overflow stays finite."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 1, dropout=0.0, bias=False).eval()
    with torch.no_grad():
        for w in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
            w.weight.copy_(torch.eye(64))
    mha.half()
    q, k, _ = issue_inputs(torch.float16)
    cache = KVCache()
    with torch.no_grad():
        mha(k, k, k, cache=cache)  # fill the cache with the keys
        out = mha(q[:, :1], q[:, :1], q[:, :1], cache=cache)
    assert torch.isfinite(out).all()


@st.composite
def attention_inputs(draw):
    dtype = draw(st.sampled_from([torch.float32, *HALF]))
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    Lq, Lk = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    D = draw(st.sampled_from([1, 2, 8, 16, 64]))
    scale = 10 ** draw(st.floats(-2.0, 2.5))  # of |q| and |k|
    seed = draw(st.integers(0, 2**31 - 1))
    mask_kind = draw(st.sampled_from(["none", "random", "causal", "empty"]))
    return dtype, (B, H, Lq, Lk, D), scale, seed, mask_kind


def make_inputs(dtype, shape, scale, seed, mask_kind):
    B, H, Lq, Lk, D = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g) * scale
    k = torch.randn(B, H, Lk, D, generator=g) * scale
    v = torch.randn(B, H, Lk, D, generator=g)
    mask = None
    if mask_kind == "random":
        mask = torch.rand(B, 1, Lq, Lk, generator=g) < 0.6
    elif mask_kind == "causal":
        mask = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)
    elif mask_kind == "empty":
        mask = torch.rand(B, 1, Lq, Lk, generator=g) < 0.6
        mask[..., 0, :] = False  # query 0 may attend to nothing
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


@settings(max_examples=150, deadline=None)
@given(attention_inputs())
@example((torch.float16, (1, 2, 2, 3, 64), 100.0, 0, "none"))
@example((torch.float16, (1, 1, 4, 4, 64), 100.0, 1, "empty"))
@example((torch.bfloat16, (2, 2, 5, 7, 16), 30.0, 2, "random"))
def test_every_path_equals_the_fused_kernel(case):
    dtype, shape, scale, seed, mask_kind = case
    q, k, v, mask = make_inputs(dtype, shape, scale, seed, mask_kind)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # Rows with an allowed key, where the fused kernel gives a number.
    rows = torch.ones(expected.shape[:-1], dtype=torch.bool)
    if mask is not None:
        rows = mask.any(dim=-1).expand(rows.shape)
    handled = rows & torch.isfinite(expected).all(dim=-1)
    # Both compute the scores in float32, rounding them differently: an
    # error of a few eps32 * |score| in a score moves the weights by as
    # much, so the tolerance grows with the largest scaled score.
    q64, k64 = q.double(), k.double()
    largest = (q64 @ k64.transpose(-2, -1)).abs().max() / math.sqrt(q.size(-1))
    tol = TOL[dtype] + 16 * EPS32 * float(largest)
    atol = tol * float(v.abs().max().clamp(min=1.0))
    plain, _ = scaled_dot_product_attention(q, k, v, mask)
    paths = {
        "plain": plain,
        "chunked": chunked_attention(q, k, v, mask, chunk_size=2),
        "fused": fused_attention(q, k, v, mask),
    }
    for name, out in paths.items():
        assert out.dtype == dtype, name
        assert torch.isfinite(out).all(), name  # empty rows: zeros
        torch.testing.assert_close(
            out[handled].float(),
            expected[handled].float(),
            atol=atol,
            rtol=0,
            msg=lambda m, name=name: f"{name}: {m}",
        )
        if mask is not None:
            assert (out[~rows] == 0).all(), name
