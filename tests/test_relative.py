"""Relative position biases (chapter 9): ALiBi's slopes, T5's buckets and
Shaw's relative keys against their published definitions; every bias the
same in the plain, fused and chunked paths, with no NaN from a mask."""

import math

import pytest
import torch

from transformer_lite import MultiHeadAttention
from transformer_lite.attention import (
    fused_attention,
    scaled_dot_product_attention,
)
from transformer_lite.chunked import chunked_attention
from transformer_lite.relative import (
    ALiBiBias,
    ShawRelativeKeys,
    T5RelativeBias,
    alibi_slopes,
    t5_bucket,
)

# ALiBi ----------------------------------------------------------------


def test_alibi_slopes_for_8_heads_are_the_papers_geometric_sequence():
    assert alibi_slopes(8) == [2.0**-h for h in range(1, 9)]
    assert alibi_slopes(16) == [2.0 ** (-h / 2) for h in range(1, 17)]


def test_alibi_slopes_for_12_heads_follow_the_non_power_of_two_rule():
    """The 8 slopes of 8 heads, then every other slope of 16 heads:
    2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5."""
    expected = [2.0**-h for h in range(1, 9)]
    expected += [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12) == pytest.approx(expected, rel=1e-15)
    for n in range(1, 33):
        slopes = alibi_slopes(n)
        assert len(slopes) == len(set(slopes)) == n
        assert all(0 < m < 1 for m in slopes)


def test_alibi_bias_is_minus_slope_times_distance():
    alibi = ALiBiBias(4)
    q = torch.zeros(1, 4, 3, 8)
    query_positions = torch.tensor([5, 6, 7])
    key_positions = torch.arange(8)
    bias = alibi.bias(q, query_positions, key_positions)  # (H, 3, 8)
    assert bias.shape == (4, 3, 8)
    for h, m in enumerate(alibi_slopes(4)):
        for a, i in enumerate(query_positions.tolist()):
            for j in key_positions.tolist():
                assert bias[h, a, j].item() == pytest.approx(-m * abs(i - j))


# T5 --------------------------------------------------------------------


def published_bucket(offset, bidirectional, n_buckets, max_distance):
    """T5's relative_position_bucket (Raffel et al., 2020), one number at
    a time: offset = key position - query position."""
    bucket = 0
    n = -offset  # the published code works with query - key
    if bidirectional:
        n_buckets //= 2
        if n < 0:
            bucket += n_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = n_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(
        math.log(n / max_exact)
        / math.log(max_distance / max_exact)
        * (n_buckets - max_exact)
    )
    return bucket + min(large, n_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(
    "n_buckets, max_distance", [(32, 128), (16, 64), (8, 20), (64, 1000)]
)
def test_t5_buckets_match_the_published_definition(
    bidirectional, n_buckets, max_distance
):
    offsets = torch.arange(-3000, 3001)
    got = t5_bucket(
        offsets,
        bidirectional=bidirectional,
        n_buckets=n_buckets,
        max_distance=max_distance,
    )
    expected = [
        published_bucket(o, bidirectional, n_buckets, max_distance)
        for o in offsets.tolist()
    ]
    assert got.tolist() == expected
    assert int(got.min()) == 0 and int(got.max()) == n_buckets - 1


def test_t5_buckets_by_hand():
    """32 buckets, max_distance 128. Bidirectional: 16 per side, exact
    below 8, then logarithmic; keys after the query in 16..31. Causal:
    exact below 16; every key after the query in bucket 0."""
    bi = dict(bidirectional=True, n_buckets=32, max_distance=128)
    offsets = torch.tensor([0, -1, -7, -8, -15, -16, -127, -128, -5000])
    assert t5_bucket(offsets, **bi).tolist() == [0, 1, 7, 8, 9, 10, 15, 15, 15]
    assert t5_bucket(-offsets, **bi).tolist() == [
        0,
        17,
        23,
        24,
        25,
        26,
        31,
        31,
        31,
    ]
    causal = dict(bidirectional=False, n_buckets=32, max_distance=128)
    assert t5_bucket(
        torch.tensor([0, -1, -15, -16, -128]), **causal
    ).tolist() == [0, 1, 15, 16, 31]
    assert t5_bucket(torch.tensor([1, 2, 500]), **causal).tolist() == [0] * 3


@pytest.mark.parametrize("bidirectional, first", [(True, 91), (False, 113)])
def test_t5_last_bucket_starts_before_max_distance(bidirectional, first):
    """The bucket index is rounded down: with 32 buckets and max_distance
    128, the last bucket starts at distance 91 (bidirectional) or 113
    (causal), not at 128."""
    distance = torch.arange(300)
    bucket = t5_bucket(
        -distance, bidirectional=bidirectional, n_buckets=32, max_distance=128
    )
    last = int(bucket.max())
    assert last == (15 if bidirectional else 31)
    assert int((bucket == last).nonzero()[0]) == first
    assert (bucket[first:] == last).all() and (bucket[:first] < last).all()


def test_t5_bias_looks_up_one_scalar_per_head_and_bucket():
    t5 = T5RelativeBias(3, bidirectional=True, n_buckets=8, max_distance=16)
    with torch.no_grad():
        t5.table.weight.copy_(torch.randn(8, 3))
    q_pos, k_pos = torch.arange(4, 6), torch.arange(9)
    bias = t5.bias(torch.zeros(1, 3, 2, 4), q_pos, k_pos)  # (H, 2, 9)
    for a, i in enumerate(q_pos.tolist()):
        for j in k_pos.tolist():
            b = published_bucket(j - i, True, 8, 16)
            torch.testing.assert_close(bias[:, a, j], t5.table.weight[b])


def test_t5_refuses_buckets_that_leave_no_exact_range():
    with pytest.raises(ValueError, match="exact buckets"):
        T5RelativeBias(2, bidirectional=True, n_buckets=2)


# Shaw ------------------------------------------------------------------


def test_shaw_bias_equals_a_double_loop():
    """b_ij = q_i . a_clip(j - i) / sqrt(D), computed pair by pair."""
    g = torch.Generator().manual_seed(0)
    shaw = ShawRelativeKeys(d_k=6, max_distance=3).double()
    q = torch.randn(2, 3, 5, 6, generator=g, dtype=torch.float64)
    q_pos, k_pos = torch.arange(4, 9), torch.arange(11)
    bias = shaw.bias(q, q_pos, k_pos)  # (B, H, 5, 11)
    a = shaw.table.weight
    expected = torch.empty(2, 3, 5, 11, dtype=torch.float64)
    for a_i, i in enumerate(q_pos.tolist()):
        for j in k_pos.tolist():
            r = max(-3, min(3, j - i))
            expected[:, :, a_i, j] = q[:, :, a_i] @ a[r + 3] / math.sqrt(6)
    torch.testing.assert_close(bias, expected, rtol=0, atol=1e-12)


def test_shaw_attention_equals_relative_keys_written_out():
    """A Shaw head computes softmax(q_i (k_j + a_ij) / sqrt(D)) v_j."""
    torch.manual_seed(0)
    shaw = ShawRelativeKeys(d_k=4, max_distance=2)
    mha = MultiHeadAttention(8, 2, dropout=0.0, position=shaw).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    out = mha(x, x, x)
    q, k, v = (mha.split_heads(w(x)) for w in (mha.w_q, mha.w_k, mha.w_v))
    heads = torch.empty_like(q)
    for i in range(6):
        scores = torch.empty(2, 6, dtype=torch.float64)
        for j in range(6):
            a_ij = shaw.table.weight[max(-2, min(2, j - i)) + 2].double()
            scores[:, j] = (q[0, :, i] * (k[0, :, j] + a_ij)).sum(-1)
        weights = (scores / 2.0).softmax(-1)  # sqrt(D) = 2
        heads[0, :, i] = torch.einsum("hj,hjd->hd", weights, v[0])
    expected = mha.w_o(mha.merge_heads(heads))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


# Every path, every bias -------------------------------------------------

BIASES = {
    "alibi": lambda H, D: ALiBiBias(H),
    "t5": lambda H, D: T5RelativeBias(
        H, bidirectional=True, n_buckets=8, max_distance=10
    ),
    "shaw": lambda H, D: ShawRelativeKeys(D, max_distance=2),
}


def biased_inputs(name, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    B, H, Lq, Lk, D = 2, 3, 5, 9, 4
    scheme = BIASES[name](H, D).double()
    for p in scheme.parameters():
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g))
    q, k, v = (
        torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
        for L in (Lq, Lk, Lk)
    )
    mask = torch.rand(B, 1, Lq, Lk, generator=g) > 0.4
    mask[0, :, 1] = False  # a query row that may attend to nothing
    mask[1, :, :, 0] = True
    q_pos, k_pos = torch.arange(Lk - Lq, Lk), torch.arange(Lk)
    return (
        scheme.to(device),
        tuple(t.to(device) for t in (q, k, v)),
        mask.to(device),
        q_pos.to(device),
        k_pos.to(device),
    )


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("masked", [False, True])
def test_plain_fused_and_chunked_paths_agree_with_a_bias(name, masked, device):
    scheme, (q, k, v), mask, q_pos, k_pos = biased_inputs(name, 0, device)
    mask = mask if masked else None
    for t in (q, k, v):
        t.requires_grad_()
    bias = scheme.bias(q, q_pos, k_pos)
    plain, _ = scaled_dot_product_attention(q, k, v, mask, bias=bias)
    fused = fused_attention(q, k, v, mask, bias=bias)

    def block_bias(query, rows, cols):  # queries sit at Lk - Lq + row
        return scheme.bias(query, rows + q_pos[0], cols)

    chunked = chunked_attention(q, k, v, mask, 2, 2, bias=block_bias)
    recomputed = chunked_attention(
        q, k, v, mask, 4, 3, recompute=True, bias=block_bias
    )
    given = chunked_attention(q, k, v, mask, 3, bias=bias)
    outputs = dict(
        fused=fused, chunked=chunked, recomputed=recomputed, given=given
    )
    grad = torch.randn_like(plain)
    inputs = (q, k, v, *scheme.parameters())
    want = torch.autograd.grad(plain, inputs, grad, retain_graph=True)
    for path, out in outputs.items():
        torch.testing.assert_close(out, plain, msg=path)
        got = torch.autograd.grad(out, inputs, grad, retain_graph=True)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, msg=f"{path}: gradient")
    if masked:  # the empty row: zero output, finite gradients
        assert torch.equal(plain[0, :, 1], torch.zeros_like(plain[0, :, 1]))
        assert all(torch.isfinite(g).all() for g in want)


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_fully_masked_rows_stay_nan_free_with_every_bias(name, dtype, device):
    scheme, (q, k, v), _, q_pos, k_pos = biased_inputs(name, 1, device)
    scheme = scheme.to(dtype)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    nothing = torch.zeros(
        1, 1, q.size(2), k.size(2), dtype=torch.bool, device=device
    )
    bias = scheme.bias(q, q_pos, k_pos)
    for out in (
        scaled_dot_product_attention(q, k, v, nothing, bias=bias)[0],
        fused_attention(q, k, v, nothing, bias=bias),
        chunked_attention(q, k, v, nothing, 4, bias=bias),
    ):
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(n_buckets=32, max_distance=8), "max_distance must exceed"),
        (dict(n_buckets=32, max_distance=4), "max_distance must exceed"),
        (dict(n_buckets=2, max_distance=8), "n_buckets must be"),
        (dict(n_buckets=32.0, max_distance=128), "n_buckets must be"),
        (dict(n_buckets=32, max_distance=True), "max_distance must be"),
    ],
)
def test_t5_buckets_refuse_a_table_that_would_give_nan_ids(options, message):
    # Before: max_distance <= n_buckets / 2 (bidirectional) gave ids of
    # about -9.2e18, a NaN cast to int.
    offsets = torch.arange(-50, 51)
    with pytest.raises(ValueError, match=message):
        t5_bucket(offsets, bidirectional=True, **options)


def test_t5_buckets_want_integer_offsets():
    with pytest.raises(ValueError, match="integer offsets"):
        t5_bucket(torch.zeros(3), bidirectional=False)
    got = t5_bucket(torch.arange(-40, 1), bidirectional=False, n_buckets=32,
                    max_distance=17)  # fmt: skip
    assert int(got.min()) >= 0 and int(got.max()) <= 31
