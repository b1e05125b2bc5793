"""Incremental decoding with a key/value cache equals full decoding, for
every position scheme (RoPE and the biases need the cached offsets)."""

import pytest
import torch

from transformer_lite.cache import KVCache
from transformer_lite.masks import padding_mask
from transformer_lite.model import make_model
from transformer_lite.schemes import POSITIONS


def model_and_inputs(norm_first, seed=0, position="sinusoidal"):
    torch.manual_seed(seed)
    model = (
        make_model(
            20,
            20,
            n_layers=2,
            d_model=32,
            d_ff=64,
            n_heads=4,
            norm_first=norm_first,
            position=position,
        )
        .double()
        .eval()
    )
    src = torch.randint(1, 20, (3, 7))
    src[0, 5:] = 0  # padding, so the source mask matters
    tgt = torch.randint(1, 20, (3, 6))
    return model, src, padding_mask(src, 0), tgt


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("step", [1, 2])
def test_cached_decoding_equals_full_decoding(norm_first, step, position):
    model, src, src_mask, tgt = model_and_inputs(norm_first, 0, position)
    memory = model.encode(src, src_mask)
    full = model.decode(memory, src_mask, tgt)  # (B, T, C)
    cache = model.new_cache()
    pieces = []
    for t in range(0, tgt.size(1), step):
        new = tgt[:, t : t + step]
        T_new, T_all = new.size(1), t + new.size(1)
        # several new positions at once need a causal mask over the cache
        mask = torch.ones(T_new, T_all, dtype=torch.bool).tril(t)
        pieces.append(model.decode(memory, src_mask, new, mask, cache))
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=0, atol=1e-12)
    assert cache.length == tgt.size(1)
    assert cache.layers[0].self_attn.key.shape == (3, 4, 6, 8)


def test_cross_attention_keys_are_projected_once():
    model, src, src_mask, tgt = model_and_inputs(False)
    memory = model.encode(src, src_mask)
    calls = []
    layer = model.decoder.layers[0]
    layer.cross_attn.w_k.register_forward_hook(lambda *a: calls.append(1))
    cache = model.new_cache()
    for t in range(tgt.size(1)):
        model.decode(memory, src_mask, tgt[:, t : t + 1], cache=cache)
    assert len(calls) == 1


def test_select_reorders_every_layer():
    model, src, src_mask, tgt = model_and_inputs(True)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    model.decode(memory, src_mask, tgt[:, :1], cache=cache)
    before = cache.layers[1].self_attn.key.clone()
    index = torch.tensor([2, 0, 0])
    cache.select(index)
    torch.testing.assert_close(cache.layers[1].self_attn.key, before[index])
    assert cache.layers[1].cross_attn.key.size(0) == 3


def test_kv_cache_appends_or_stores():
    appended, static = KVCache(), KVCache(static=True)
    for step in range(3):
        k = torch.full((1, 2, 1, 4), float(step))
        appended.update(k, k)
        static.update(k, k)
    assert appended.key.shape == (1, 2, 3, 4)
    assert static.key.shape == (1, 2, 1, 4)


def test_cache_respects_the_positional_table_length():
    torch.manual_seed(0)
    model = make_model(
        10, 10, n_layers=1, d_model=8, d_ff=8, n_heads=2, max_len=3
    ).eval()
    src = torch.randint(1, 10, (1, 3))
    memory = model.encode(src)
    cache = model.new_cache()
    for _ in range(3):
        model.decode(
            memory, None, torch.ones(1, 1, dtype=torch.long), cache=cache
        )
    with pytest.raises(ValueError, match=r"length 4 .*max_len=3"):
        model.decode(
            memory, None, torch.ones(1, 1, dtype=torch.long), cache=cache
        )


def test_a_language_models_cache_holds_self_attention_only():
    """A decoder-only stack has no source: one KVCache per block, which
    ``select`` reorders together, and generation fills every one."""
    from transformer_lite.cache import StackCache
    from transformer_lite.lm import generate, make_lm

    lm = make_lm(20, n_layers=2, d_model=16, d_ff=32, n_heads=2,
                 dropout=0.0).eval()  # fmt: skip
    cache = lm.new_cache()
    assert type(cache) is StackCache and cache.length == 0
    assert [type(layer) for layer in cache.layers] == [KVCache, KVCache]
    tokens = torch.randint(4, 20, (3, 5))
    lm(tokens, cache=cache)
    assert cache.length == 5
    keys = [layer.key.clone() for layer in cache.layers]  # (B, H, 5, D)
    cache.select(torch.tensor([2, 0]))
    for layer, before in zip(cache.layers, keys, strict=True):
        assert torch.equal(layer.key, before[[2, 0]])
    out = generate(lm, tokens[:2], 3, temperature=0)
    assert out.shape == (2, 8)
