"""Tests for transformer_lite.chunked (chapter 8): chunked
(online-softmax) attention equals plain attention
(``scaled_dot_product_attention``), outputs and gradients, for every
chunking, mask kind and broadcastable mask shape, gives zeros for a
query row that may attend to nothing, recomputes the same gradients,
and needs far less memory than the plain scores (measured by
``bench.memory.peak_memory``)."""

import pytest
import torch
from conftest import assert_close, random_padding

from transformer_lite.attention import scaled_dot_product_attention
from transformer_lite.bench.memory import peak_memory
from transformer_lite.chunked import chunked_attention
from transformer_lite.masks import causal_mask

CASES = [  # (B, H, Lq, Lk, D, chunk_size, query_chunk_size)
    (1, 1, 1, 1, 1, 1, None),
    (2, 3, 5, 7, 8, 3, None),  # chunk does not divide Lk
    (2, 2, 16, 16, 8, 4, 4),  # chunk divides Lk; query blocks too
    (3, 2, 9, 13, 16, 5, 4),  # neither divides
    (1, 4, 6, 11, 4, 64, None),  # one chunk bigger than Lk
    (2, 1, 12, 12, 8, 1, 5),  # one key at a time
]


def make_mask(kind, B, Lq, Lk, g):
    """(B, 1, Lq or 1, Lk) bool masks of four kinds; "random" has fully
    masked query rows on purpose."""
    if kind == "none":
        return None
    if kind == "padding":
        lengths = torch.randint(1, Lk + 1, (B,), generator=g)
        return random_padding(lengths, Lk).unsqueeze(1)  # (B, 1, 1, Lk)
    if kind == "causal":
        offset = Lk - Lq  # queries are the last Lq positions
        rows = torch.arange(Lq).unsqueeze(1) + offset  # (Lq, 1)
        return (torch.arange(Lk) <= rows).expand(B, 1, Lq, Lk)
    mask = torch.rand(B, 1, Lq, Lk, generator=g) > 0.5
    mask[:, :, 0] = False  # the first query row may attend to nothing
    return mask


def qkv(B, H, Lq, Lk, D, dtype, g):
    q = torch.randn(B, H, Lq, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, Lk, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, Lk, D, generator=g, dtype=dtype)
    return tuple(t.requires_grad_() for t in (q, k, v))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "random"])
def test_chunked_equals_plain(case, kind, dtype):
    B, H, Lq, Lk, D, chunk, q_chunk = case
    g = torch.Generator().manual_seed(sum(case[:5]))
    q, k, v = qkv(B, H, Lq, Lk, D, dtype, g)
    mask = make_mask(kind, B, Lq, Lk, g)

    plain, _ = scaled_dot_product_attention(q, k, v, mask)
    chunked = chunked_attention(q, k, v, mask, chunk, q_chunk)
    assert_close(chunked, plain, dtype, "outputs differ")

    grad = torch.randn(plain.shape, generator=g, dtype=dtype)
    plain_grads = torch.autograd.grad(plain, (q, k, v), grad)
    chunked_grads = torch.autograd.grad(chunked, (q, k, v), grad)
    for name, a, b in zip("qkv", chunked_grads, plain_grads, strict=True):
        assert_close(a, b, dtype, f"gradient of {name} differs")


@pytest.mark.parametrize("q_chunk", [None, 3])
def test_recompute_gives_the_same_gradients(q_chunk):
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv(2, 2, 10, 9, 4, torch.float64, g)
    mask = make_mask("random", 2, 10, 9, g)
    stored = chunked_attention(q, k, v, mask, 4, q_chunk)
    again = chunked_attention(q, k, v, mask, 4, q_chunk, recompute=True)
    assert_close(again, stored, torch.float64, "outputs differ")
    grads = [
        torch.autograd.grad(out.sum(), (q, k, v)) for out in (stored, again)
    ]
    for a, b in zip(*grads, strict=True):
        assert_close(a, b, torch.float64, "gradients differ")


@pytest.mark.parametrize(
    "shape",
    [
        (5, 7),
        (7,),
        (3, 5, 7),
        (3, 1, 7),
        (2, 1, 1, 7),
        (1, 5, 1),
        (2, 3, 5, 7),
    ],
    ids=str,
)
def test_every_broadcastable_mask_shape(shape):
    g = torch.Generator().manual_seed(4)
    q, k, v = qkv(2, 3, 5, 7, 4, torch.float64, g)
    mask = torch.rand(shape, generator=g) > 0.3
    plain, _ = scaled_dot_product_attention(q, k, v, mask)
    chunked = chunked_attention(q, k, v, mask, chunk_size=3)
    assert_close(chunked, plain, torch.float64, f"mask {shape}")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_fully_masked_row_gives_zeros_not_nan(dtype, device):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    q, k, v = (t.to(device, dtype).requires_grad_() for t in (q, k, v))
    mask = causal_mask(6, device).unsqueeze(0).clone()  # (1, 1, 6, 6)
    mask[..., 4, :] = False  # query 4 may attend to nothing
    out = chunked_attention(q, k, v, mask, chunk_size=4)
    assert out.dtype == dtype
    assert torch.isfinite(out).all() and (out[..., 4, :] == 0).all()
    plain, _ = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, plain, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def test_without_batch_axes_and_other_value_width():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(6, 4, generator=g, dtype=torch.float64)
    k = torch.randn(9, 4, generator=g, dtype=torch.float64)
    v = torch.randn(9, 3, generator=g, dtype=torch.float64)  # Dv != D
    plain, _ = scaled_dot_product_attention(q, k, v)
    assert_close(
        chunked_attention(q, k, v, chunk_size=2),
        plain,
        torch.float64,
        "unbatched",
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(chunk_size=0), "chunk_size must be a positive int"),
        (dict(query_chunk_size=2.0), "query_chunk_size must be"),
        (dict(mask=torch.ones(3, 4)), "mask must be a bool tensor"),
        (dict(mask=torch.ones(3, 5, dtype=torch.bool)), "does not broadcast"),
    ],
)
def test_errors_explain_themselves(kwargs, message):
    q, k, v = torch.randn(3, 8), torch.randn(4, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match=message):
        chunked_attention(q, k, v, **kwargs)


def test_chunked_attention_needs_far_less_memory():
    """At L = 2048 the plain scores alone are 16 MiB; chunks of 128 keys
    and blocks of 256 queries need a small fraction of that."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 1, 2048, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        plain = peak_memory(lambda: scaled_dot_product_attention(q, k, v))
        chunked = peak_memory(
            lambda: chunked_attention(q, k, v, None, 128, 256)
        )
    assert plain >= 2 * 2048 * 2048 * 4  # scores and weights, float32
    assert chunked * 8 <= plain, (plain, chunked)


def test_recompute_bounds_training_memory():
    """Forward and backward: without ``recompute`` autograd keeps every
    chunk's weights; with it, one query block's at a time."""
    g = torch.Generator().manual_seed(7)
    q, k, v = qkv(1, 1, 1024, 1024, 32, torch.float32, g)

    def training_peak(recompute):
        def step():
            out = chunked_attention(q, k, v, None, 128, 128, recompute)
            out.sum().backward()

        return peak_memory(step)

    stored, recomputed = training_peak(False), training_peak(True)
    assert stored >= 1024 * 1024 * 4  # all weights, float32
    assert recomputed * 2 <= stored, (stored, recomputed)
