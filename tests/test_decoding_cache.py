"""Greedy decoding with the KV cache (``use_cache=True``, chapter 8) gives
the same tokens as decoding every prefix again, for every position scheme
(chapter 9), and really feeds the model one new token per step."""

import pytest
import torch

from transformer_lite import make_model, padding_mask, seed_everything
from transformer_lite.decoding import greedy_decode
from transformer_lite.schemes import POSITIONS

V = 16
PAD, BOS = 3, 1  # a pad id other than 0: read from the config


def model_for(
    norm_first: bool,
    dtype: torch.dtype,
    seed: int = 0,
    position: str = "sinusoidal",
):
    seed_everything(seed)
    model = make_model(
        V,
        V,
        n_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=4,
        dropout=0.1,
        norm_first=norm_first,
        pad_id=PAD,
        position=position,
    )
    return model.to(dtype)


def padded_source(seed: int = 0) -> torch.Tensor:
    """Six rows of different real lengths, padded to the longest."""
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 2, 5, 7, 3, 1]
    src = torch.randint(4, V, (len(lengths), max(lengths)), generator=g)
    for row, n in enumerate(lengths):
        src[row, n:] = PAD
    return src


def decode_both(model, src, max_len, eos_id):
    mask = padding_mask(src, PAD)
    return [
        greedy_decode(
            model,
            src,
            src_mask=mask,
            max_len=max_len,
            bos_id=BOS,
            eos_id=eos_id,
            use_cache=use_cache,
        )
        for use_cache in (False, True)
    ]


def some_rows_token(free: torch.Tensor) -> int:
    """The token at row 1, step 2, or else the first one that not every
    row emits (random models differ in what they repeat)."""
    for token in [free[1, 2]] + free[:, 1:].flatten().tolist():
        emitted = (free[:, 1:] == token).any(dim=1)  # (B,)
        if token != PAD and not emitted.all():
            return int(token)
    raise AssertionError(f"every row emits the same tokens: {free}")


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_cached_tokens_equal_recomputed_tokens(norm_first, dtype, position):
    model = model_for(norm_first, dtype, position=position)
    src = padded_source()
    free, free_cached = decode_both(model, src, 12, None)
    assert torch.equal(free_cached, free)
    # An eos that some rows emit and others do not: rows stop at
    # different steps and are padded after it.
    eos = some_rows_token(free)
    plain, cached = decode_both(model, src, 12, eos)
    assert torch.equal(cached, plain)
    stopped = (plain == eos).any(dim=1)
    assert stopped.any() and plain.size(1) <= 12
    assert (plain == PAD).any()  # padding after eos is compared too


def test_a_pad_token_inside_a_row_is_masked_as_without_the_cache():
    """If a row emits the pad id before it ends, the full decoder masks
    that key (``target_mask``); the cached step must mask it too."""
    model = model_for(False, torch.float64)
    src = padded_source(seed=1)
    free = greedy_decode(model, src, max_len=10, bos_id=BOS)
    token = int(free[0, 2])  # emitted mid-row by row 0
    model.config.pad_id = token  # from now on that token is padding
    plain, cached = decode_both(
        model, src.masked_fill(src == PAD, token), 10, None
    )
    assert (plain[:, 1:-1] == token).any()
    assert torch.equal(cached, plain)


def test_each_step_feeds_only_the_newest_token():
    model = model_for(True, torch.float64)
    src = padded_source()
    lengths = []
    model.decoder.register_forward_pre_hook(
        lambda module, args: lengths.append(args[0].size(1))
    )
    out = greedy_decode(model, src, max_len=9, bos_id=BOS, use_cache=True)
    assert lengths == [1] * (out.size(1) - 1)
    lengths.clear()
    greedy_decode(model, src, max_len=9, bos_id=BOS, use_cache=False)
    assert lengths == list(range(1, out.size(1)))


def test_the_cache_runs_to_max_len_and_restores_the_mode():
    seed_everything(0)
    model = (
        make_model(
            V,
            V,
            n_layers=1,
            d_model=16,
            d_ff=16,
            n_heads=2,
            max_len=12,
            pad_id=PAD,
        )
        .double()
        .train()
    )
    src = padded_source()
    out = greedy_decode(model, src, max_len=1, bos_id=BOS, use_cache=True)
    assert torch.equal(out, torch.full((src.size(0), 1), BOS))
    out = greedy_decode(model, src, max_len=12, bos_id=BOS, use_cache=True)
    assert out.size(1) == 12  # every position of the positional table
    assert torch.equal(out, greedy_decode(model, src, max_len=12, bos_id=BOS))
    assert model.training  # the mode is restored


def test_a_cache_refuses_the_memory_of_another_source():
    """The cross-attention keys are computed once, from the first memory:
    reusing the cache for another source would silently reuse them."""
    model = model_for(norm_first=True, dtype=torch.float32).eval()
    src = padded_source()
    other = padded_source(seed=1)
    bos = torch.full((src.size(0), 1), BOS)
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache()
        model.decode(memory, padding_mask(src, PAD), bos, cache=cache)
        model.decode(memory, padding_mask(src, PAD), bos, cache=cache)
        with pytest.raises(ValueError, match="new_cache"):
            model.decode(
                model.encode(other), padding_mask(other, PAD), bos, cache=cache
            )
