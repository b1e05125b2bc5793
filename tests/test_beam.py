"""Tests for transformer_lite.decoding.beam_search (chapter 7)."""

import math

import pytest
import torch
from torch import Tensor, nn

from transformer_lite import (
    POSITIONS,
    TransformerConfig,
    make_model,
    padding_mask,
    seed_everything,
)
from transformer_lite.cache import DecoderCache
from transformer_lite.decoding import (
    beam_search,
    gnmt_length_penalty,
    greedy_decode,
)

PAD, BOS, EOS, A, B, C, D = range(7)
V = 7


class MarkovModel(nn.Module):
    """A stub whose next-token distribution depends only on the last
    token: P(next | last) = ``table[last]``. It speaks the decoding
    protocol (``decoding.Seq2Seq``: source_mask, encode, decode with a
    cache, logits, new_cache) and nothing more."""

    def __init__(self, table: dict[int, dict[int, float]]) -> None:
        super().__init__()
        self.config = TransformerConfig(
            V,
            V,
            n_layers=1,
            d_model=2,
            d_ff=2,
            n_heads=1,
            max_len=20,
            pad_id=PAD,
        )
        log_p = torch.full((V, V), -1e9, dtype=torch.float64)
        for last, row in table.items():
            assert math.isclose(sum(row.values()), 1.0)
            for token, p in row.items():
                log_p[last, token] = math.log(p)
        self.register_buffer("log_p", log_p)  # (V, V)
        self.weight = nn.Parameter(torch.zeros(()))  # gives it a device

    def source_mask(self, src: Tensor) -> Tensor:
        return padding_mask(src, PAD)  # (B, 1, S)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return torch.zeros(src.size(0), 1, 1, dtype=torch.float64)

    def new_cache(self) -> DecoderCache:
        return DecoderCache.empty(1)

    def decode(self, memory, src_mask, tgt, tgt_mask=None, cache=None):
        return nn.functional.one_hot(tgt, V).double()  # (B, T, V)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.log_p[hidden.argmax(-1)]  # (B, V): log P(. | last)

    def log_prob(self, ys: Tensor) -> float:
        """log P of one output (BOS ... EOS, then padding)."""
        tokens = [t for t in ys.tolist() if t != PAD]
        return sum(
            float(self.log_p[a, b])
            for a, b in zip(tokens, tokens[1:], strict=False)
        )


# Greedy takes A (0.5) and then has only poor choices (0.35 at best);
# B (0.4) is followed by EOS at 0.95, which makes B EOS more probable.
TRAP = {
    BOS: {A: 0.5, B: 0.4, EOS: 0.1},
    A: {C: 0.35, D: 0.34, EOS: 0.31},
    B: {EOS: 0.95, C: 0.05},
    C: {EOS: 1.0},
    D: {EOS: 1.0},
}
SRC = torch.tensor([[A, B]])  # the stub ignores its source


def test_beam_search_finds_a_more_probable_output_than_greedy():
    model = MarkovModel(TRAP)
    greedy = greedy_decode(model, SRC, max_len=10, bos_id=BOS, eos_id=EOS)
    beam, score = beam_search(
        model,
        SRC,
        max_len=10,
        bos_id=BOS,
        eos_id=EOS,
        beam_size=2,
        length_penalty=0.0,
        return_scores=True,
    )
    assert greedy.tolist() == [[BOS, A, C, EOS]]
    assert beam.tolist() == [[BOS, B, EOS]]
    assert model.log_prob(beam[0]) > model.log_prob(greedy[0])
    assert float(score) == pytest.approx(math.log(0.4 * 0.95))


def test_scores_are_log_probabilities_over_the_length_penalty():
    model = MarkovModel(TRAP)
    beam, score = beam_search(
        model,
        SRC,
        max_len=10,
        bos_id=BOS,
        eos_id=EOS,
        beam_size=3,
        return_scores=True,
    )
    n = int((beam[0] != PAD).sum()) - 1  # tokens after BOS, EOS included
    expected = model.log_prob(beam[0]) / ((5 + n) / 6) ** 0.6
    assert float(score) == pytest.approx(expected)


def test_gnmt_length_penalty():
    length = torch.tensor([0.0, 1.0, 7.0])
    torch.testing.assert_close(
        gnmt_length_penalty(length, 0.6), ((5 + length) / 6) ** 0.6
    )
    assert gnmt_length_penalty(torch.tensor(1.0), 0.6) == 1.0
    assert (gnmt_length_penalty(length, 0.0) == 1).all()


def test_length_penalty_favours_longer_outputs():
    # Two outputs: BOS A EOS (p = 0.3) or BOS B C C EOS (p = 0.7 * 0.35).
    table = {
        BOS: {A: 0.3, B: 0.7},
        A: {EOS: 1.0},
        B: {C: 0.35, D: 0.65 - 1e-9, EOS: 1e-9},
        C: {C: 0.5, EOS: 0.5},
        D: {D: 0.5, EOS: 0.5},
    }
    model = MarkovModel(table)
    plain = beam_search(
        model,
        SRC,
        max_len=12,
        bos_id=BOS,
        eos_id=EOS,
        beam_size=4,
        length_penalty=0.0,
    )
    assert plain.tolist() == [[BOS, A, EOS]]  # 0.3 beats 0.7 * 0.65 * 0.5
    longer = beam_search(
        model,
        SRC,
        max_len=12,
        bos_id=BOS,
        eos_id=EOS,
        beam_size=4,
        length_penalty=2.0,
    )
    assert longer.size(1) > 3  # alpha = 2 prefers a longer output


def real_model(seed: int = 0, position: str = "sinusoidal") -> nn.Module:
    seed_everything(seed)
    model = make_model(
        12,
        12,
        n_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=4,
        pad_id=3,
        position=position,
    )
    return model.double().eval()


def padded_source(seed: int = 0) -> tuple[Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 2, 4, 6, 3]
    src = torch.randint(4, 12, (len(lengths), 6), generator=g)
    for row, n in enumerate(lengths):
        src[row, n:] = 3
    return src, lengths


@pytest.mark.parametrize("eos", [5, 8, 10])
def test_beam_size_one_is_greedy(eos):
    model = real_model()
    src, _ = padded_source()
    greedy = greedy_decode(model, src, max_len=9, bos_id=1, eos_id=eos)
    beam = beam_search(
        model,
        src,
        max_len=9,
        bos_id=1,
        eos_id=eos,
        beam_size=1,
    )
    assert torch.equal(beam, greedy)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_batched_equals_one_by_one(beam_size):
    model = real_model(seed=1)
    src, lengths = padded_source(seed=1)
    src_mask = padding_mask(src, 3)
    batched, scores = beam_search(
        model,
        src,
        src_mask=src_mask,
        max_len=9,
        bos_id=1,
        eos_id=6,
        beam_size=beam_size,
        return_scores=True,
    )
    finished = 0
    for i, n in enumerate(lengths):
        alone, score = beam_search(
            model,
            src[i : i + 1, :n],
            max_len=9,
            bos_id=1,
            eos_id=6,
            beam_size=beam_size,
            return_scores=True,
        )
        L = alone.size(1)
        assert torch.equal(batched[i, :L], alone[0])
        assert (batched[i, L:] == 3).all()
        torch.testing.assert_close(scores[i], score[0])
        finished += int((alone[0] == 6).any())
    assert 0 < finished  # eos did stop some row


def test_outputs_are_padded_after_eos_and_mode_is_restored():
    model = MarkovModel(TRAP)
    model.train()
    src = torch.tensor([[A, B], [B, A], [C, C]])
    out = beam_search(
        model,
        src,
        max_len=10,
        bos_id=BOS,
        eos_id=EOS,
        beam_size=3,
    )
    assert out.tolist() == [[BOS, B, EOS]] * 3  # the stub ignores src
    assert model.training
    no_eos = beam_search(
        model,
        src,
        max_len=4,
        bos_id=BOS,
        eos_id=PAD + 6,
        beam_size=2,
    )
    assert no_eos.shape == (3, 4)  # D = 6 is never emitted: max_len


def test_bad_arguments():
    model = MarkovModel(TRAP)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, SRC, max_len=5, bos_id=BOS, eos_id=EOS, beam_size=0)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(
            model,
            SRC,
            max_len=5,
            bos_id=BOS,
            eos_id=EOS,
            length_penalty=-1.0,
        )
    with pytest.raises(ValueError, match="max_len"):
        beam_search(model, SRC, max_len=0, bos_id=BOS, eos_id=EOS)


def teacher_forced_score(model, src, ys, eos, alpha) -> float:
    """log P(ys | src) / lp from one full forward pass (no cache)."""
    tokens = ys.tolist()
    end = tokens.index(eos) + 1 if eos in tokens else len(tokens)
    ys = ys[:end].unsqueeze(0)  # (1, L)
    with torch.no_grad():
        log_p = model(src, ys[:, :-1]).log_softmax(-1)  # (1, L - 1, V)
    total = log_p[0].gather(-1, ys[0, 1:, None]).sum()
    return float(total / gnmt_length_penalty(torch.tensor(end - 1.0), alpha))


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize(
    "seed, position",
    [(seed, "sinusoidal") for seed in range(4)]
    + [(0, position) for position in POSITIONS if position != "sinusoidal"],
)
def test_scores_equal_a_full_forward_pass(alpha, seed, position):
    """The cached, reordered decoding scores each output exactly as the
    model does in one pass: the cache rows follow their hypotheses (and,
    with a relative position scheme, their positions)."""
    model = real_model(seed=seed, position=position)
    with torch.no_grad():
        model.generator.weight.mul_(3)  # peakier: hypotheses diverge
    src, lengths = padded_source(seed=seed)
    out, scores = beam_search(
        model,
        src,
        max_len=12,
        bos_id=1,
        eos_id=6,
        beam_size=4,
        length_penalty=alpha,
        return_scores=True,
    )
    for i, n in enumerate(lengths):
        expected = teacher_forced_score(
            model, src[i : i + 1, :n], out[i], 6, alpha
        )
        assert float(scores[i]) == pytest.approx(expected, abs=1e-9)


def reference_beam_search(log_p, k, alpha, max_len):
    """The rule of the docstring, one source, plain Python: keep the k
    candidates with the best log P / lp; finished ones extend by PAD."""

    def score(c):
        tokens, total, _ = c
        n = len([t for t in tokens[1:] if t != PAD])
        return total / ((5 + n) / 6) ** alpha

    beams = [([BOS], 0.0, False)]
    for _ in range(max_len - 1):
        candidates = []
        for tokens, total, done in beams:
            if done:
                candidates.append((tokens + [PAD], total, True))
                continue
            for t in range(V):
                step = float(log_p[tokens[-1], t])
                candidates.append((tokens + [t], total + step, t == EOS))
        beams = sorted(candidates, key=score, reverse=True)[:k]
        if all(done for _, _, done in beams):
            break
    return max(beams, key=score)


# Seeds 13, 22 and 95 are tables where a search that ranked candidates by
# log P alone (dividing by lp only at the end) would end elsewhere.
CASES = [(seed, 2, alpha) for seed in range(3) for alpha in (0.0, 1.0)]
CASES += [(13, 3, 2.0), (22, 2, 2.0), (95, 2, 2.0)]


@pytest.mark.parametrize("seed, k, alpha", CASES)
def test_equals_a_plain_reference_on_random_models(seed, k, alpha):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(V, V, generator=g, dtype=torch.float64) ** 3
    probs[:, PAD] = 0.0  # never emitted
    probs[:, EOS] *= 0.6
    probs /= probs.sum(-1, keepdim=True)
    table = {a: {b: float(probs[a, b]) for b in range(1, V)} for a in range(V)}
    model = MarkovModel(table)
    out, score = beam_search(
        model,
        SRC,
        max_len=6,
        bos_id=BOS,
        eos_id=EOS,
        beam_size=k,
        length_penalty=alpha,
        return_scores=True,
    )
    tokens, _, _ = expected = reference_beam_search(model.log_p, k, alpha, 6)
    n = len(out[0])
    assert out[0].tolist() == tokens[:n] and set(tokens[n:]) <= {PAD}
    assert float(score[0]) == pytest.approx(
        expected[1]
        / ((5 + len([t for t in tokens[1:] if t != PAD])) / 6) ** alpha
    )


@pytest.mark.parametrize("max_len", [1, 2, 5])
def test_bos_may_be_the_padding_id(max_len):
    """bos_id == pad_id: no crash when nothing but BOS is decoded."""
    model = MarkovModel({PAD: {A: 0.6, EOS: 0.4}, A: {EOS: 1.0}})
    out = beam_search(
        model, SRC, max_len=max_len, bos_id=PAD, eos_id=EOS, beam_size=2
    )
    assert out.size(0) == SRC.size(0) and 1 <= out.size(1) <= max_len
    assert (out[:, 0] == PAD).all()


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(length_penalty=math.inf), "length_penalty"),
        (dict(length_penalty=math.nan), "length_penalty"),
        (dict(length_penalty=True), "length_penalty"),
        (dict(beam_size=True), "beam_size"),
        (dict(beam_size=2.0), "beam_size"),
        (dict(max_len=True), "max_len"),
        (dict(eos_id=True), "eos_id"),
        (dict(return_scores=1), "return_scores"),
    ],
)
def test_rejects_infinite_penalty_bools_and_floats(options, named):
    kwargs = dict(max_len=5, bos_id=BOS, eos_id=EOS) | options
    with pytest.raises(ValueError, match=named):
        beam_search(MarkovModel(TRAP), SRC, **kwargs)
