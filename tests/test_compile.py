"""The model has no host syncs in its forward pass: ``torch.compile`` with
``fullgraph=True`` (which refuses any graph break) takes ``forward``,
``encode`` and one cached decoding step whole (chapter 8)."""

import pytest
import torch

from transformer_lite import make_model, set_attention_kernel
from transformer_lite.masks import padding_mask

pytestmark = pytest.mark.slow  # compiling takes seconds


@pytest.fixture(params=["plain", "fused"])
def model(request):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make_model(
        11, 13, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0
    ).eval()
    set_attention_kernel(model, request.param)
    return model


SRC = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])  # (B, S)
TGT = torch.tensor([[1, 9, 10, 3], [1, 4, 0, 0]])  # (B, T)


def test_forward_compiles_whole(model):
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(SRC, TGT), model(SRC, TGT))


def test_encode_and_a_cached_decoding_step_compile_whole(model):
    encode = torch.compile(model.encode, fullgraph=True)
    decode = torch.compile(model.decode, fullgraph=True)
    src_mask = padding_mask(SRC, 0)  # (B, 1, S)
    with torch.no_grad():
        memory = encode(SRC, src_mask)  # (B, S, C)
        torch.testing.assert_close(memory, model.encode(SRC, src_mask))
        compiled_cache, eager_cache = model.new_cache(), model.new_cache()
        for t in range(2):  # the second step reads what the first cached
            step = TGT[:, t : t + 1]  # (B, 1)
            keys = padding_mask(TGT[:, : t + 1], 0)  # (B, 1, t + 1)
            got = decode(memory, src_mask, step, keys, compiled_cache)
            want = model.decode(memory, src_mask, step, keys, eager_cache)
            torch.testing.assert_close(got, want)
        assert compiled_cache.length == eager_cache.length == 2


@pytest.mark.parametrize("position", ["rope", "alibi", "t5", "shaw"])
def test_relative_positions_compile_whole(position):
    """RoPE and the biases add no graph break (fused path, chapter 9)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make_model(
        11,
        13,
        n_layers=1,
        d_model=16,
        d_ff=32,
        n_heads=2,
        dropout=0.0,
        position=position,
    ).eval()
    set_attention_kernel(model, "fused")
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(SRC, TGT), model(SRC, TGT))


def test_ids_are_checked_on_the_cpu_and_stay_out_of_the_graph(model):
    """Out-of-vocabulary ids: eager on the CPU, a ValueError naming the
    tensor, the id and the vocabulary (two values read, no device to
    wait for); the compiled graph leaves the check out, and fullgraph
    still takes it. check_ids asks for it on a GPU too."""
    bad = SRC.clone()
    bad[0, 1] = 11  # src_vocab is 11: ids 0..10
    with pytest.raises(ValueError, match=r"src .* id 11 is not one of its 11"):
        model(bad, TGT)
    with pytest.raises(ValueError, match=r"tgt .* id 13 is not one of its 13"):
        model(SRC, TGT.masked_fill(TGT == 9, 13))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(SRC, TGT), model(SRC, TGT))
    model.check_ids = True  # a read of values: no whole graph
    refusals = (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError)
    with pytest.raises(refusals):
        torch.compile(model, fullgraph=True)(SRC, TGT)
    model.check_ids = False
