"""Perplexity: exp of the mean token loss, padding left out; segments
predict every token once; a uniform model scores exactly V."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import LM_VOCAB, lm_tokens, tiny_lm

from transformer_lite.lm import (
    next_token_loss,
    perplexity,
    segments,
    token_losses,
)
from transformer_lite.tokens import PAD_ID

V = LM_VOCAB


@pytest.mark.parametrize("T", [1, 4, 5, 11])
def test_segments_predict_every_token_once(T):
    stream = torch.arange(12).repeat(2, 1)  # (B, L): ids equal positions
    pairs = list(segments(stream, T))
    inputs = torch.cat([x for x, _ in pairs], dim=1)
    targets = torch.cat([y for _, y in pairs], dim=1)
    assert torch.equal(inputs, stream[:, :-1])
    assert torch.equal(targets, stream[:, 1:])
    assert all(x.size(1) <= T for x, _ in pairs)


def test_plain_perplexity_is_exp_of_the_mean_loss_of_each_segment():
    model = tiny_lm()
    stream = lm_tokens(2, 13)
    got = perplexity(model, stream, segment_len=4)
    with torch.no_grad():
        nll = [
            F.cross_entropy(
                model(x).flatten(0, 1), y.flatten(), reduction="sum"
            )
            for x, y in segments(stream, 4)
        ]  # each segment read alone: the context starts again
    assert math.isclose(got, math.exp(sum(nll) / (2 * 12)), rel_tol=1e-12)


def test_padding_targets_are_left_out():
    model = tiny_lm()
    stream = lm_tokens(2, 9)
    padded = torch.cat([stream, torch.full((2, 4), PAD_ID)], dim=1)
    padded[1, 9:] = lm_tokens(1, 4, seed=3)  # one row longer
    losses, counted = token_losses(model, padded, segment_len=5)
    assert counted.sum() == 8 + 12
    assert (losses[~counted] == 0).all()
    alone = token_losses(model, stream, segment_len=5)[0]
    torch.testing.assert_close(losses[0, :8], alone[0], rtol=1e-12, atol=1e-12)
    expected = math.exp(float(losses.sum()) / 20)
    assert math.isclose(perplexity(model, padded, segment_len=5), expected)


def test_a_model_that_knows_nothing_scores_the_vocabulary_size():
    model = tiny_lm()
    for p in model.generator.parameters():
        torch.nn.init.zeros_(p)  # every logit 0: a uniform guess
    model.config.tie_embeddings = False
    got = perplexity(model, lm_tokens(3, 20), segment_len=6)
    assert math.isclose(got, V, rel_tol=1e-12)


def test_next_token_loss_ignores_padding():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, V, generator=g, dtype=torch.float64)
    targets = lm_tokens(2, 5)
    targets[0, 3:] = PAD_ID
    loss = next_token_loss(logits, targets)
    keep = targets != PAD_ID
    expected = F.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(loss, expected)


def test_bad_arguments_are_refused():
    model = tiny_lm()
    stream = lm_tokens(2, 9)
    with pytest.raises(ValueError, match="segment_len must be a positive"):
        perplexity(model, stream, segment_len=0)
    with pytest.raises(ValueError, match="mem_len must be a non-negative"):
        perplexity(model, stream, segment_len=3, mem_len=-1)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        perplexity(model, stream[:, :1], segment_len=3)
    with pytest.raises(ValueError, match="no target token"):
        perplexity(model, torch.zeros(2, 5, dtype=torch.long), segment_len=3)


def test_perplexity_leaves_a_training_model_in_training_mode():
    # Before: token_losses switched the caller's model to eval mode for
    # the duration; a thread training it lost its dropout meanwhile.
    model = tiny_lm(dropout=0.5).train()
    seen = []

    def record(module, args, output):
        seen.append(module.training)

    model.layers[0].register_forward_hook(record)
    stream = lm_tokens(2, 33)
    first = perplexity(model, stream, segment_len=8)
    assert model.training and all(m.training for m in model.modules())
    assert seen and not any(seen)  # the twin ran without dropout
    assert perplexity(model, stream, segment_len=8) == first  # no dropout


def test_ids_outside_the_vocabulary_are_named():
    model = tiny_lm()
    stream = lm_tokens(2, 17)
    stream[1, 5] = V
    with pytest.raises(ValueError, match=rf"stream holds token ids.*{V}"):
        perplexity(model, stream, segment_len=8)


@pytest.mark.parametrize("pad_id", [True, 1.5, -1, "0"])
def test_pad_id_is_a_token_id(pad_id):
    with pytest.raises(ValueError, match="pad_id must be"):
        perplexity(tiny_lm(), lm_tokens(1, 9), segment_len=4,
                   pad_id=pad_id)  # fmt: skip


def test_a_diverged_model_has_an_infinite_perplexity():
    # Before: OverflowError once the mean loss passed about 709 nats.
    model = tiny_lm()
    with torch.no_grad():
        model.generator.weight.mul_(1e4)
    value = perplexity(model, lm_tokens(2, 17), segment_len=8)
    assert value == math.inf
