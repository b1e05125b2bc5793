"""BERT's masked-LM batches: exactly which positions are chosen (never
padding or a special id, a fixed count per row), what each chosen one
shows (the mask, a random ordinary token, itself) in the proportions
asked, checked against the binomial, and bad input refused."""

import math

import pytest
import torch

from transformer_lite.lm import IGNORE_INDEX, mask_tokens

V = 30
PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL = (CLS, SEP)  # MASK and PAD are special without being listed
FIRST = 4  # the first ordinary id


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sentences(B: int, L: int, seed: int = 0) -> torch.Tensor:
    """(B, L) rows of [CLS] text [SEP], padded after a random length."""
    g = generator(seed)
    tokens = torch.randint(FIRST, V, (B, L), generator=g)
    lengths = torch.randint(3, L + 1, (B, 1), generator=g)
    places, last = torch.arange(L), lengths - 1
    tokens[:, 0] = CLS
    tokens = tokens.masked_fill(places == last, SEP)
    return tokens.masked_fill(places > last, PAD)


def mask(tokens, seed=0, **rates):
    return mask_tokens(tokens, vocab=V, mask_id=MASK, special_ids=SPECIAL,
                       generator=generator(seed), **rates)  # fmt: skip


def expected_count(n: int, p: float = 0.15) -> int:
    return max(1, math.floor(p * n + 0.5)) if n else 0


def test_one_eligible_token_is_chosen_and_masked():
    tokens = torch.tensor([[CLS, 7, SEP, PAD, PAD]])
    inputs, targets = mask(tokens, mask_rate=1.0, random_rate=0.0)
    assert inputs.tolist() == [[CLS, MASK, SEP, PAD, PAD]]
    assert targets.tolist() == [[IGNORE_INDEX, 7] + [IGNORE_INDEX] * 3]


def test_p_one_chooses_every_eligible_token_and_nothing_else():
    tokens = torch.tensor([[CLS, 5, 6, MASK, 7, SEP, PAD]])
    inputs, targets = mask(tokens, p=1.0, mask_rate=1.0, random_rate=0.0)
    assert inputs.tolist() == [[CLS, MASK, MASK, MASK, MASK, SEP, PAD]]
    I = IGNORE_INDEX  # noqa: E741
    assert targets.tolist() == [[I, 5, 6, I, 7, I, I]]


@pytest.mark.parametrize("p", [0.15, 0.5, 0.01, 1.0])
def test_each_row_has_exactly_its_count_of_targets(p):
    tokens = sentences(64, 40)
    _, targets = mask(tokens, p=p)
    eligible = (tokens >= FIRST).sum(dim=1)
    chosen = (targets != IGNORE_INDEX).sum(dim=1)
    assert chosen.tolist() == [expected_count(int(n), p) for n in eligible]


def test_the_count_rounds_half_up_and_is_at_least_one():
    counts = {n: expected_count(n) for n in (1, 3, 7, 10, 30, 100)}
    assert counts == {1: 1, 3: 1, 7: 1, 10: 2, 30: 5, 100: 15}
    for n, k in counts.items():
        tokens = torch.full((1, n + 2), 9)
        tokens[0, 0], tokens[0, -1] = CLS, SEP
        _, targets = mask(tokens)
        assert int((targets != IGNORE_INDEX).sum()) == k, n


@pytest.mark.parametrize("seed", range(5))
def test_specials_and_padding_are_never_chosen(seed):
    tokens = sentences(32, 20, seed)
    tokens[:, 5] = MASK  # a [MASK] already in the text is not a target
    inputs, targets = mask(tokens, seed, p=0.5)
    special = tokens < FIRST
    assert (targets[special] == IGNORE_INDEX).all()
    assert torch.equal(inputs[special], tokens[special])


@pytest.mark.parametrize("seed", range(5))
def test_targets_are_the_originals_exactly_where_chosen(seed):
    tokens = sentences(32, 20, seed)
    inputs, targets = mask(tokens, seed, p=0.3)
    chosen = targets != IGNORE_INDEX
    assert torch.equal(targets[chosen], tokens[chosen])
    assert torch.equal(inputs[~chosen], tokens[~chosen])  # the rest kept
    assert targets.dtype == torch.long


def test_only_masks_with_rates_one_zero_zero():
    tokens = sentences(32, 20)
    inputs, targets = mask(tokens, mask_rate=1.0, random_rate=0.0)
    chosen = targets != IGNORE_INDEX
    assert (inputs[chosen] == MASK).all()
    assert torch.equal(inputs[~chosen], tokens[~chosen])


def test_only_ordinary_random_tokens_with_rates_zero_one_zero():
    tokens = sentences(256, 20)
    inputs, targets = mask(tokens, p=0.5, mask_rate=0.0, random_rate=1.0)
    chosen = targets != IGNORE_INDEX
    shown = inputs[chosen]
    assert ((shown >= FIRST) & (shown < V)).all()  # never a special id
    assert (shown != tokens[chosen]).any()  # replaced, not kept


def test_inputs_equal_the_tokens_with_rates_zero_zero_one():
    tokens = sentences(32, 20)
    inputs, targets = mask(tokens, mask_rate=0.0, random_rate=0.0)
    assert torch.equal(inputs, tokens)
    assert (targets != IGNORE_INDEX).any()  # still asked for


def test_a_seeded_generator_gives_one_batch():
    tokens = sentences(16, 20)
    a, b, c = mask(tokens, 3), mask(tokens, 3), mask(tokens, 4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_the_dtype_is_kept():
    tokens = sentences(4, 10).int()
    inputs, targets = mask(tokens)
    assert inputs.dtype == torch.int32 and targets.dtype == torch.long


def test_a_batch_on_a_device_is_drawn_by_its_generator(device):
    """The draws are the generator's, on its device; the batch stays on
    the tokens' device, whichever generator drew it."""
    tokens = sentences(8, 16).to(device)
    cpu = mask_tokens(tokens, vocab=V, mask_id=MASK, special_ids=SPECIAL,
                      generator=generator(5))  # fmt: skip
    here = torch.Generator(device).manual_seed(5)
    ours = mask_tokens(tokens, vocab=V, mask_id=MASK, special_ids=SPECIAL,
                       generator=here)  # fmt: skip
    for inputs, targets in (cpu, ours):
        assert inputs.device == targets.device == tokens.device
        chosen = targets != IGNORE_INDEX
        assert torch.equal(targets[chosen], tokens[chosen])
        assert (tokens[chosen] >= FIRST).all()
    if device.type == "cpu":
        assert torch.equal(cpu[1], ours[1])


def test_rows_without_eligible_tokens_choose_nothing():
    tokens = torch.tensor([[CLS, SEP, PAD, PAD], [CLS, 8, 9, SEP]])
    _, targets = mask(tokens, p=1.0)
    assert (targets[0] == IGNORE_INDEX).all()
    assert targets[1].tolist() == [IGNORE_INDEX, 8, 9, IGNORE_INDEX]


def test_a_batch_with_nothing_eligible_is_refused():
    tokens = torch.tensor([[CLS, SEP, PAD], [CLS, MASK, SEP]])
    with pytest.raises(ValueError, match="nothing to predict"):
        mask(tokens)


# Statistics on a large batch, each within 5 standard deviations of a
# binomial count: sqrt(n q (1 - q)) for n trials of probability q.


def within_binomial(count: int, n: int, q: float, sds: float = 5.0):
    sd = math.sqrt(n * q * (1 - q))
    assert abs(count - n * q) <= sds * sd, (count, n * q, sd)


def test_every_position_is_chosen_equally_often():
    """Rows of 20 eligible tokens choose 3: each place with probability
    3/20 (choosing the first three, or never the last, fails)."""
    B, L = 4000, 20
    tokens = torch.randint(FIRST, V, (B, L), generator=generator(1))
    _, targets = mask(tokens)
    chosen = targets != IGNORE_INDEX
    assert int(chosen.sum()) == 3 * B  # the fraction is exact: 15%
    for count in chosen.sum(dim=0).tolist():
        within_binomial(count, B, 3 / L)


@pytest.mark.parametrize("rates", [(0.8, 0.1), (0.5, 0.3), (0.0, 0.6)])
def test_the_split_of_the_chosen_follows_the_rates(rates):
    mask_rate, random_rate = rates
    tokens = torch.randint(FIRST, V, (2000, 40), generator=generator(2))
    inputs, targets = mask(tokens, mask_rate=mask_rate,
                           random_rate=random_rate)  # fmt: skip
    chosen = targets != IGNORE_INDEX
    n = int(chosen.sum())
    shown, original = inputs[chosen], tokens[chosen]
    ordinary = V - FIRST  # a random token is its own with 1 / ordinary
    keep_rate = 1 - mask_rate - random_rate
    same = keep_rate + random_rate / ordinary
    within_binomial(int((shown == MASK).sum()), n, mask_rate)
    within_binomial(int((shown == original).sum()), n, same)
    other = (shown != MASK) & (shown != original)
    within_binomial(int(other.sum()), n, random_rate * (1 - 1 / ordinary))


def test_random_tokens_are_uniform_over_the_ordinary_ids():
    tokens = torch.randint(FIRST, V, (4000, 40), generator=generator(3))
    inputs, targets = mask(tokens, p=0.5, mask_rate=0.0, random_rate=1.0)
    shown = inputs[targets != IGNORE_INDEX]
    counts = torch.bincount(shown, minlength=V)
    assert (counts[:FIRST] == 0).all()
    for count in counts[FIRST:].tolist():
        within_binomial(count, shown.numel(), 1 / (V - FIRST))


# Bad input


@pytest.mark.parametrize(
    "tokens, match",
    [
        (torch.rand(2, 5), "integer token ids"),
        (torch.tensor([5, 6, 7]), r"\(B, L\)"),
        (torch.tensor([[5, V]]), "outside the vocabulary"),
        (torch.tensor([[5, -1]]), "outside the vocabulary"),
        ([[5, 6]], "tensor of token ids"),
    ],
)
def test_bad_tokens_are_refused(tokens, match):
    with pytest.raises(ValueError, match=match):
        mask(tokens)


@pytest.mark.parametrize(
    "rates, match",
    [
        (dict(p=0.0), r"p must be in \(0, 1\]"),
        (dict(p=1.5), "p must be"),
        (dict(p=-0.1), "p must be"),
        (dict(p=float("nan")), "p must be"),
        (dict(mask_rate=1.2), "mask_rate must be"),
        (dict(random_rate=-0.1), "random_rate must be"),
        (dict(mask_rate=True), "mask_rate must be a number"),
        (dict(mask_rate=0.8, random_rate=0.3), "at most 1"),
    ],
)
def test_bad_rates_are_refused(rates, match):
    with pytest.raises(ValueError, match=match):
        mask(sentences(2, 8), **rates)


def test_rates_summing_to_one_are_accepted():
    mask(sentences(2, 8), mask_rate=0.7, random_rate=0.3)
    mask(sentences(2, 8), mask_rate=0.9, random_rate=0.1)


@pytest.mark.parametrize(
    "arguments, match",
    [
        (dict(mask_id=V), "mask_id holds id 30, outside the vocabulary"),
        (dict(mask_id=-1), "mask_id holds id -1"),
        (dict(mask_id=3.0), "mask_id must be an int"),
        (dict(pad_id=V + 4), "pad_id holds id 34"),
        (dict(special_ids=[1, 99]), "special_ids holds id 99"),
        (dict(special_ids="12"), "special_ids must be a collection"),
        (dict(special_ids=5), "special_ids must be a collection"),
        (dict(vocab=0), "vocab must be a positive int"),
        (dict(generator=0), "generator must be a torch.Generator"),
        (dict(special_ids=range(V)), "every id of the vocabulary"),
    ],
)
def test_bad_ids_and_generators_are_refused(arguments, match):
    kwargs = dict(vocab=V, mask_id=MASK, special_ids=SPECIAL,
                  generator=generator())  # fmt: skip
    with pytest.raises(ValueError, match=match):
        mask_tokens(sentences(2, 8), **{**kwargs, **arguments})
