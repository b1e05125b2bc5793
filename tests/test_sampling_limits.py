"""Sampling at the limits: the nucleus is exact on a real vocabulary
(kept mass >= p, ``p = 1`` the identity), any finite positive
temperature draws, rows of -inf and +inf mean what they say, NaN is a
``ValueError``; and properties of both filters under hypothesis."""

import numpy as np
import pytest
import torch
from conftest import lm_tokens, tiny_lm
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lite.lm import generate, top_k_filter, top_p_filter
from transformer_lite.lm.generate import next_token

GPT2_VOCAB = 50_257


def exact_mass(logits: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    """The kept probability of every row, in extended precision (the
    80-bit long double of x86; float64 elsewhere)."""
    x = logits.double().numpy().astype(np.longdouble)
    x = x - x.max(axis=-1, keepdims=True)
    probs = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    return (probs * keep.numpy()).sum(axis=-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_nucleus_reaches_p_on_a_real_vocabulary(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(16, GPT2_VOCAB, generator=g)).to(dtype)
    for p in (0.9, 0.99, 0.999):
        keep = torch.isfinite(top_p_filter(logits, p))
        mass = exact_mass(logits, keep)
        assert (mass >= p).all(), (p, mass.min())
        # The smallest such set: without its least likely token (no
        # ties among 50,257 random floats) the mass is short of p.
        probs = logits.double().softmax(-1)
        least = probs.masked_fill(~keep, 2.0).min(-1).values.numpy()
        assert (mass - least < p).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_top_p_one_keeps_every_token(dtype):
    g = torch.Generator().manual_seed(1)
    logits = (5 * torch.randn(16, GPT2_VOCAB, generator=g)).to(dtype)
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()


def test_nan_logits_are_refused_by_every_step():
    logits = torch.tensor([[0.0, 1.0, 2.0], [0.0, float("nan"), 1.0]])
    for step in (
        lambda: top_k_filter(logits, 2),
        lambda: top_p_filter(logits, 0.9),
        lambda: next_token(logits),
        lambda: next_token(logits, temperature=0),
    ):
        with pytest.raises(ValueError, match="logits hold NaN"):
            step()


def test_a_row_of_minus_infinity_is_kept_as_it_is_and_cannot_be_drawn():
    inf = float("inf")
    logits = torch.tensor([[-inf, -inf, -inf], [0.0, 3.0, -inf]])
    filtered = top_p_filter(logits, 0.5)
    assert torch.equal(filtered[0], logits[0])  # nothing to keep
    assert torch.isfinite(filtered[1]).tolist() == [False, True, False]
    assert torch.equal(top_k_filter(logits, 1)[0], logits[0])
    with pytest.raises(ValueError, match="row 0 .* every token -inf"):
        next_token(logits)


def test_plus_infinity_takes_all_the_probability():
    inf = float("inf")
    logits = torch.tensor([[inf, 0.0, inf, 5.0]] * 64)
    kept = top_p_filter(logits, 0.1)[0] > -float("inf")
    assert kept.tolist() == [True, False, True, False]
    g = torch.Generator().manual_seed(0)
    drawn = next_token(logits, temperature=0.5, top_p=0.5, generator=g)
    assert set(drawn.flatten().tolist()) == {0, 2}  # both, never another


@pytest.mark.parametrize("top_p", [None, 0.9])
@pytest.mark.parametrize("temperature", [1e-45, 1e-39, 1e-30, 5e-324])
def test_a_tiny_temperature_is_the_greedy_limit(temperature, top_p):
    model = tiny_lm()
    prompt = lm_tokens(3, 4)
    greedy = generate(model, prompt, 6, temperature=0)
    g = torch.Generator().manual_seed(0)
    cold = generate(
        model, prompt, 6, temperature=temperature, top_p=top_p, generator=g
    )
    assert torch.equal(cold, greedy)  # random logits have no ties


@pytest.mark.parametrize("temperature", [1e30, 3e38, 1e300])
def test_a_huge_temperature_draws_from_the_whole_vocabulary(temperature):
    logits = torch.tensor([[0.0, 40.0, -40.0, -float("inf")]] * 4000)
    g = torch.Generator().manual_seed(0)
    drawn = next_token(logits, temperature=temperature, generator=g)
    counts = torch.bincount(drawn.flatten(), minlength=4).tolist()
    assert counts[3] == 0  # -inf stays impossible
    assert all(1200 < c < 1470 for c in counts[:3])  # uniform: 1333 each


def test_the_ordinary_temperatures_give_the_plain_quotient():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(8, 100, generator=g)
    for tau in (0.3, 0.7, 1.0, 1.5):
        a = torch.Generator().manual_seed(5)
        b = torch.Generator().manual_seed(5)
        drawn = next_token(logits, temperature=tau, generator=a)
        plain = torch.multinomial((logits / tau).softmax(-1), 1, generator=b)
        assert torch.equal(drawn, plain)


# Property tests: random logits with ties and infinities, both dtypes.

finite_or_minus_inf = st.one_of(
    st.integers(-6, 6).map(float),  # few values: many ties
    st.floats(-30, 30, allow_nan=False, width=32),
    st.just(-float("inf")),
)
rows = st.lists(finite_or_minus_inf, min_size=1, max_size=40).filter(
    lambda xs: any(x != -float("inf") for x in xs)
)
dtypes = st.sampled_from([torch.float32, torch.float64])


@settings(max_examples=300, deadline=None)
@given(values=rows, p=st.floats(1e-6, 1.0), dtype=dtypes)
def test_top_p_property(values, p, dtype):
    logits = torch.tensor(values, dtype=dtype)
    keep = torch.isfinite(top_p_filter(logits, p))
    probs = logits.double().softmax(-1)
    assert keep.any()
    assert keep[probs.argmax()]  # the most likely token stays
    # Ties stay together: every token as likely as a kept one is kept.
    assert (keep | ~torch.isin(probs, probs[keep])).all()
    mass = float(exact_mass(logits, keep))
    assert mass >= p - 1e-12
    # Minimal: the tokens strictly more likely than the least kept
    # hold less than p.
    least = probs[keep].min()
    assert float(exact_mass(logits, probs > least)) < p + 1e-12
    if p == 1.0:
        assert torch.equal(top_p_filter(logits, p), logits)


@settings(max_examples=300, deadline=None)
@given(values=rows, k=st.integers(1, 50), dtype=dtypes)
def test_top_k_property(values, k, dtype):
    logits = torch.tensor(values, dtype=dtype)
    filtered = top_k_filter(logits, k)
    keep = filtered > -float("inf")
    finite = int((logits > -float("inf")).sum())
    assert int(keep.sum()) >= min(k, finite)  # at least k (ties: more)
    kth = logits.sort(descending=True).values[min(k, len(values)) - 1]
    assert torch.equal(keep, (logits >= kth) & (logits > -float("inf")))
    assert torch.equal(filtered[keep], logits[keep])  # kept ones unchanged
