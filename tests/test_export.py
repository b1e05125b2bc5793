"""Export to graphs (chapter 12): torch.export of the encoder, the
cross-attention keys and values and one cached decoder step, each equal
to the eager model on batch sizes and lengths other than the traced
ones."""

import pytest
import torch

from transformer_lite.model import make_model
from transformer_lite.shipping.export import (
    CrossGraph,
    DecoderStep,
    EncoderGraph,
    export_programs,
)
from transformer_lite.tokens import BOS_ID, PAD_ID

pytestmark = pytest.mark.timeout(300)

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = dict(n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.1)
    return make_model(30, 31, max_len=40, norm_first=True, **config).eval()


@pytest.fixture(scope="module")
def programs(model):
    torch.set_num_threads(1)
    return export_programs(model)


def sources(batch, length, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 30, (batch, length), generator=g)
    src[0, length // 2 :] = PAD_ID  # one padded row
    return src


@pytest.mark.parametrize("batch, length", [(1, 3), (4, 11), (7, 40)])
def test_exported_encoder_equals_eager_at_any_size(
    model, programs, batch, length
):
    src = sources(batch, length)
    exported = programs["encoder"].module()
    torch.testing.assert_close(exported(src), EncoderGraph(model)(src), **TOL)


def test_exported_steps_equal_the_eager_cached_decoder(model, programs):
    """Decoding 6 tokens with the graphs, the cache passed in and out,
    gives the logits of the eager decoder with ``use_cache``."""
    src = sources(3, 9)
    src_mask = (src != PAD_ID).unsqueeze(1)  # (B, 1, S)
    encoder = programs["encoder"].module()
    cross_graph = programs["cross"].module()
    step = programs["step"].module()
    memory = encoder(src)
    cross = cross_graph(memory)
    B, (H, D) = 3, (4, 8)
    past = tuple(torch.zeros(B, H, 0, D) for _ in range(4))
    cache = model.new_cache()
    ys = torch.full((B, 1), BOS_ID)
    with torch.no_grad():
        eager_memory = model.encode(src, src_mask)
        for t in range(6):
            tgt_mask = (ys != PAD_ID).unsqueeze(1)  # (B, 1, T)
            token = ys[:, -1:]
            hidden = model.decode(
                eager_memory, src_mask, token, tgt_mask, cache
            )
            expected = model.generator(hidden[:, -1])  # (B, V)
            logits, *past = step(token, tgt_mask, src_mask, past, cross)
            past = tuple(past)
            torch.testing.assert_close(logits, expected, **TOL)
            assert past[0].shape == (B, H, t + 1, D)
            ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], dim=1)
            ys[1, -1] = PAD_ID if t == 2 else ys[1, -1]  # padding mid-way


def test_the_step_graph_is_the_eager_step(model):
    """DecoderStep (the traced function) against decode with a cache,
    in eager mode: the wrapper itself adds nothing."""
    src = sources(2, 5)
    src_mask = (src != PAD_ID).unsqueeze(1)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cross = CrossGraph(model)(memory)
        cache = model.new_cache()
        ys = torch.tensor([[BOS_ID, 7, 9], [BOS_ID, 5, PAD_ID]])
        keys = (ys != PAD_ID).unsqueeze(1)  # (B, 1, T)
        model.decode(memory, src_mask, ys[:, :2], keys[:, :, :2], cache)
        hidden = model.decode(memory, src_mask, ys[:, 2:], keys, cache)
        expected = model.generator(hidden[:, -1])
        past = []
        for layer in cache.layers:  # the keys and values before step 3
            past += [
                layer.self_attn.key[:, :, :2],
                layer.self_attn.value[:, :, :2],
            ]
        logits, *grown = DecoderStep(model)(
            ys[:, 2:], keys, src_mask, tuple(past), cross
        )
    torch.testing.assert_close(logits, expected, **TOL)
    torch.testing.assert_close(grown[0], cache.layers[0].self_attn.key)


def test_export_refuses_what_it_cannot_do(model):
    with pytest.raises(ValueError, match="eval-mode"):
        export_programs(model.train())
    model.eval()
    rope = make_model(30, 31, n_layers=1, d_model=16, d_ff=32, n_heads=2,
                      position="rope")  # fmt: skip
    with pytest.raises(ValueError, match="absolute positions"):
        export_programs(rope.eval())
    with pytest.raises(ValueError, match="must be a Transformer"):
        export_programs(torch.nn.Linear(2, 2))


def test_the_whole_model_exports_and_token_checks_stay_eager(model):
    """torch.export traces forward (the range check of the ids reads
    values, so it is off by default and checked where batches are
    built); in eager mode check_ids still explains a bad id."""
    src, tgt = sources(2, 6), torch.full((2, 4), BOS_ID)
    program = torch.export.export(model, (src, tgt))
    torch.testing.assert_close(program.module()(src, tgt), model(src, tgt))
    model.check_ids = True
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            model(src + 100, tgt)
    finally:
        model.check_ids = False


def test_a_short_max_len_exports_or_is_refused_by_name():
    # Before: max_len < 5 failed inside torch.export (its example source
    # had 5 tokens).
    def tiny(max_len):
        torch.manual_seed(0)
        return make_model(11, 11, n_layers=1, d_model=16, d_ff=16,
                          n_heads=2, max_len=max_len).eval()  # fmt: skip

    short = tiny(4)
    programs = export_programs(short)
    src = torch.randint(
        4, 11, (2, 4), generator=torch.Generator().manual_seed(1)
    )
    memory = programs["encoder"].module()(src)
    torch.testing.assert_close(memory, EncoderGraph(short)(src), **TOL)
    with pytest.raises(ValueError, match="max_len >= 3"):
        export_programs(tiny(2))
