"""Transformer-XL's segment memory: attention over [memory; segment]
equals one pass over the concatenated text wherever the two must agree,
the memory reaches N x M positions back, and no gradient goes into it."""

import pytest
import torch
from conftest import LM_VOCAB, lm_tokens, tiny_lm

from transformer_lite.attention import KERNELS
from transformer_lite.lm import SegmentMemory
from transformer_lite.schemes import POSITIONS, SCHEMES

V = LM_VOCAB
MEMORY_POSITIONS = [p for p in POSITIONS if not SCHEMES[p].table]
T = 5  # segment length


def read_in_segments(model, x, mem_len):
    memory = model.new_memory(mem_len)
    pieces = [model(x[:, i : i + T], memory=memory) for i in range(0, 15, T)]
    return torch.cat(pieces, dim=1)  # (B, L, V)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("position", MEMORY_POSITIONS)
def test_a_memory_of_everything_equals_one_pass(position, norm_first, kernel):
    """Three segments, a memory long enough for all that came before:
    every block of every segment sees what one causal pass over the 15
    tokens shows it, so the logits agree (two blocks, float64)."""
    model = tiny_lm(position=position, norm_first=norm_first, kernel=kernel)
    x = lm_tokens(2, 15)
    got = read_in_segments(model, x, mem_len=2 * T)
    torch.testing.assert_close(got, model(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("position", MEMORY_POSITIONS)
def test_one_block_with_one_segment_of_memory_equals_one_pass(position):
    """One block and a memory of T: segment j's queries see the keys of
    segments j - 1 and j, exactly the keys a single pass lets them see
    once it is told to hide older ones; so the first two segments agree
    with one pass and the third does not see segment 1."""
    model = tiny_lm(position=position, n_layers=1)
    x = lm_tokens(2, 15)
    got = read_in_segments(model, x, mem_len=T)
    torch.testing.assert_close(
        got[:, : 2 * T], model(x[:, : 2 * T]), rtol=1e-10, atol=1e-10
    )
    y = x.clone()
    y[:, :T] = lm_tokens(2, T, seed=9)  # another first segment
    torch.testing.assert_close(
        read_in_segments(model, y, mem_len=T)[:, 2 * T :],
        got[:, 2 * T :],
        rtol=1e-12,
        atol=1e-12,
    )


def test_the_memory_reaches_n_blocks_times_m_back():
    """With two blocks and a memory of T, segment 3 depends on segment 1
    through the second block's memory (computed while segment 2 attended
    to segment 1): the reach grows with depth, as in Transformer-XL."""
    model = tiny_lm(n_layers=2)
    x = lm_tokens(2, 15)
    y = x.clone()
    y[:, :T] = lm_tokens(2, T, seed=9)
    a = read_in_segments(model, x, mem_len=T)[:, 2 * T :]
    b = read_in_segments(model, y, mem_len=T)[:, 2 * T :]
    assert (a - b).abs().max() > 1e-6


def test_no_gradient_flows_into_the_memory():
    """Segment 1 uses token ids that segment 2 does not: after the loss
    of segment 2 alone, their embedding rows get no gradient (the stop
    gradient), while a single pass over both would give them one."""
    model = tiny_lm(tie_embeddings=False, dropout=0.0).train()
    first = torch.randint(4, 10, (2, T))  # ids 4..9
    second = torch.randint(10, V, (2, T))  # ids 10..V-1
    memory = model.new_memory(T)
    model(first, memory=memory)
    assert not any(s.requires_grad for s in memory.states)
    model.zero_grad()
    model(second, memory=memory).sum().backward()
    assert (model.embed.weight.grad[4:10] == 0).all()
    model.zero_grad()
    model(torch.cat([first, second], 1))[:, T:].sum().backward()
    assert (model.embed.weight.grad[4:10] != 0).any()


def test_the_memory_keeps_the_newest_positions():
    memory = SegmentMemory(mem_len=4, n_layers=2)
    assert memory.length == 0 and memory.layer(1) is None
    a = torch.arange(6.0).view(1, 6, 1).requires_grad_()
    memory.update([a, 10 * a])
    assert memory.length == 4
    assert memory.states[0].flatten().tolist() == [2, 3, 4, 5]
    memory.update([a[:, :1] + 100, a[:, :1] + 200])
    assert memory.states[1].flatten().tolist() == [30, 40, 50, 200]
    memory.reset()
    assert memory.states is None


def test_bad_memories_are_refused():
    with pytest.raises(ValueError, match="mem_len must be a positive int"):
        SegmentMemory(0, 2)
    memory = SegmentMemory(3, 2)
    with pytest.raises(ValueError, match="the inputs of 2 blocks"):
        memory.update([torch.zeros(1, 2, 4)])
    memory.update([torch.zeros(1, 2, 4)] * 2)
    with pytest.raises(ValueError, match="call reset"):
        memory.update([torch.zeros(3, 2, 4)] * 2)
    table = tiny_lm(position="sinusoidal")
    with pytest.raises(ValueError, match="needs relative positions"):
        table(lm_tokens(1, 3), memory=table.new_memory(4))


def test_a_memory_that_does_not_fit_the_model_is_named_before_the_pass():
    # Before: a raw torch.cat error (batch), a LayerNorm error (width),
    # "mixed dtype" (float64), and a wrong n_layers only after a pass.
    model = tiny_lm(position="rope", dtype=torch.float32)
    memory = model.new_memory(4)
    model(lm_tokens(2, 5), memory=memory)
    with pytest.raises(ValueError, match="batch of 2 rows.*has 3"):
        model(lm_tokens(3, 5), memory=memory)
    wider = tiny_lm(position="rope", dtype=torch.float32, d_model=64)
    with pytest.raises(ValueError, match="width 32.*d_model is 64"):
        wider(lm_tokens(2, 5), memory=memory)
    with pytest.raises(ValueError, match="float32 states"):
        model.double()(lm_tokens(2, 5), memory=memory)
    model.float()
    calls = []
    model.layers[0].register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match="for 3 blocks; the model has 2"):
        model(lm_tokens(2, 5), memory=SegmentMemory(4, 3))
    assert not calls  # refused before any block ran
    with pytest.raises(ValueError, match="must be a SegmentMemory"):
        model(lm_tokens(2, 5), memory=[torch.zeros(2, 4, 32)])
