"""Sampling: top-k and top-p keep exactly the right tokens (ties
included) and renormalise; generation is greedy at temperature 0,
reproducible with a seeded generator, the same with and without the
cache, and refuses bad arguments."""

import math

import pytest
import torch
from conftest import LM_VOCAB, lm_tokens, tiny_lm

from transformer_lite.attention import KERNELS
from transformer_lite.lm import generate, top_k_filter, top_p_filter
from transformer_lite.lm.generate import next_token
from transformer_lite.schemes import POSITIONS

V = LM_VOCAB


def kept(filtered: torch.Tensor) -> set[int]:
    return set(torch.isfinite(filtered).nonzero().flatten().tolist())


@pytest.mark.parametrize(
    "k, expected",
    [(1, {0, 2}), (2, {0, 2}), (3, {0, 2, 3}), (5, {0, 1, 2, 3, 4}),
     (9, {0, 1, 2, 3, 4})],
)  # fmt: skip
def test_top_k_keeps_the_k_largest_and_their_ties(k, expected):
    logits = torch.tensor([3.0, 1.0, 3.0, 2.0, 0.0])
    assert kept(top_k_filter(logits, k)) == expected


def test_top_k_with_ties_at_the_kth_value_keeps_them_all():
    logits = torch.tensor([5.0, 2.0, 2.0, 2.0, 1.0])
    assert kept(top_k_filter(logits, 2)) == {0, 1, 2, 3}


DYADIC = torch.tensor([0.125, 0.5, 0.125, 0.25])  # sums exactly in binary


@pytest.mark.parametrize(
    "p, expected",
    [
        (0.3, {1}),  # 0.5 alone reaches 0.3
        (0.5, {1}),  # ... and exactly 0.5
        (0.6, {1, 3}),
        (0.75, {1, 3}),  # 0.5 + 0.25 reaches 0.75 exactly
        (0.8, {0, 1, 2, 3}),  # the two 0.125s are tied: both or none
        (1.0, {0, 1, 2, 3}),
    ],
)
def test_top_p_keeps_the_smallest_nucleus_with_ties(p, expected):
    logits = DYADIC.log()
    assert kept(top_p_filter(logits, p)) == expected


def test_top_p_keeps_every_token_tied_with_the_most_likely():
    logits = torch.tensor([0.25, 0.25, 0.25, 0.125, 0.125]).log()
    assert kept(top_p_filter(logits, 0.01)) == {0, 1, 2}


def nucleus_by_definition(probs: list[float], p: float) -> set[int]:
    """Token x stays iff the tokens strictly more likely than x hold less
    than p of the probability: a double loop."""
    return {
        x
        for x, px in enumerate(probs)
        if sum(py for py in probs if py > px) < p
    }


@pytest.mark.parametrize("seed", range(20))
def test_top_p_equals_its_definition_on_random_tied_logits(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 4, (12,), generator=g).double()  # many ties
    p = float(torch.rand((), generator=g, dtype=torch.float64))
    probs = logits.softmax(-1).tolist()
    expected = nucleus_by_definition(probs, p)
    assert kept(top_p_filter(logits, p)) == expected
    mass = sum(probs[i] for i in expected)
    assert mass >= p  # reaches p ...
    least = min(probs[i] for i in expected)
    assert mass - sum(probs[i] for i in expected if probs[i] == least) < p
    # ... and without its least likely tie group it would not


@pytest.mark.parametrize("top_k, top_p", [(3, None), (None, 0.7), (4, 0.5)])
def test_kept_probabilities_are_renormalised(top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, V, generator=g, dtype=torch.float64)
    filtered = logits
    if top_k is not None:
        filtered = top_k_filter(filtered, top_k)
    if top_p is not None:
        filtered = top_p_filter(filtered, top_p)
    keep = torch.isfinite(filtered)
    probs = logits.softmax(-1) * keep
    expected = probs / probs.sum(-1, keepdim=True)
    torch.testing.assert_close(filtered.softmax(-1), expected)
    assert ((filtered.softmax(-1) > 0) == keep).all()


def test_next_token_draws_only_kept_tokens():
    logits = torch.tensor([[2.0, 1.9, 0.0, 0.0, -1.0]]).repeat(400, 1)
    g = torch.Generator().manual_seed(0)
    drawn = next_token(logits, top_k=2, generator=g).flatten()
    assert set(drawn.tolist()) == {0, 1}  # both seen, nothing else


def greedy_by_hand(model, prompt, n):
    tokens = prompt
    for _ in range(n):
        best = model(tokens)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        tokens = torch.cat([tokens, best], dim=1)
    return tokens


@pytest.mark.parametrize("use_cache", [False, True])
def test_temperature_zero_is_greedy(use_cache):
    model = tiny_lm()
    prompt = lm_tokens(3, 4)
    expected = greedy_by_hand(model, prompt, 10)
    got = generate(model, prompt, 10, temperature=0, use_cache=use_cache)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "options",
    [dict(temperature=0.0), dict(temperature=0.7, top_k=5),
     dict(temperature=1.3, top_p=0.8)],
)  # fmt: skip
def test_the_cache_gives_the_same_tokens(kernel, options):
    model = tiny_lm(kernel=kernel)
    prompt = lm_tokens(4, 3)
    outputs = [
        generate(model, prompt, 16, **options, use_cache=use_cache,
                 generator=torch.Generator().manual_seed(7))
        for use_cache in (False, True)
    ]  # fmt: skip
    assert torch.equal(*outputs)


@pytest.mark.parametrize("position", POSITIONS)
def test_the_cache_gives_the_same_tokens_with_every_position(position):
    model = tiny_lm(position=position)
    prompt = lm_tokens(2, 3)
    outputs = [
        generate(model, prompt, 12, use_cache=use_cache,
                 generator=torch.Generator().manual_seed(7))
        for use_cache in (False, True)
    ]  # fmt: skip
    assert torch.equal(*outputs)


def test_a_seeded_generator_reproduces_the_sample():
    model = tiny_lm()
    prompt = lm_tokens(2, 3)
    outputs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # the global generator is not used
        g = torch.Generator().manual_seed(5)
        outputs.append(generate(model, prompt, 30, generator=g))
    assert torch.equal(*outputs)
    other = generate(
        model, prompt, 30, generator=torch.Generator().manual_seed(6)
    )
    assert not torch.equal(outputs[0], other)


def test_generate_keeps_the_prompt_and_leaves_the_model_as_it_was():
    model = tiny_lm().train()
    prompt = lm_tokens(2, 5)
    out = generate(model, prompt, 6, generator=torch.Generator())
    assert out.shape == (2, 11) and torch.equal(out[:, :5], prompt)
    assert model.training and all(m.training for m in model.modules())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive int"),
        (dict(max_new_tokens=62), "exceed the model's max_len"),
        (dict(temperature=-0.5), "temperature must be a finite number"),
        (dict(temperature=math.inf), "temperature must be a finite number"),
        (dict(top_k=0), "top_k must be a positive int"),
        (dict(top_k=2.0), "top_k must be a positive int"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), "top_p must be a finite number"),
        (dict(generator=7), "generator must be a torch.Generator"),
        (dict(use_cache=1), "use_cache must be True or False"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    model = tiny_lm()
    options = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(model, lm_tokens(1, 3), **options)


def test_bad_prompts_are_refused():
    model = tiny_lm()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, torch.tensor([[1, V]]), 2)
    with pytest.raises(ValueError, match=r"prompt must be a \(B, L\)"):
        generate(model, torch.tensor([1, 2]), 2)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, torch.zeros(2, 0, dtype=torch.long), 2)
