"""The decoder-only language model: causal, the cache equal to a full
pass, fused equal to plain, is_causal on the fused path, tied weights,
and its options refused with a clear error."""

import pytest
import torch
from conftest import LM_VOCAB, lm_tokens, tiny_lm

from transformer_lite.attention import KERNELS
from transformer_lite.layers import EncoderLayer
from transformer_lite.lm import LMConfig
from transformer_lite.schemes import POSITIONS

V = LM_VOCAB


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_future_does_not_change_the_past(position, kernel):
    model = tiny_lm(position=position, kernel=kernel)
    x = lm_tokens(3, 12)
    y = x.clone()
    y[:, 7:] = lm_tokens(3, 5, seed=1)
    a, b = model(x), model(y)  # (B, L, V)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kernel", ["fused", "chunked"])
def test_every_kernel_equals_plain(position, norm_first, kernel):
    plain = tiny_lm(position=position, norm_first=norm_first, kernel="plain")
    other = tiny_lm(position=position, norm_first=norm_first, kernel=kernel)
    other.load_state_dict(plain.state_dict())
    x = lm_tokens(2, 10)
    torch.testing.assert_close(other(x), plain(x), rtol=1e-10, atol=1e-10)


def test_a_block_is_the_encoder_layer_under_a_causal_mask():
    model = tiny_lm()
    assert all(type(layer) is EncoderLayer for layer in model.layers)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    layer = model.layers[0]
    mask = torch.ones(9, 9, dtype=torch.bool).tril()[None]  # (1, L, L)
    torch.testing.assert_close(
        layer(x, is_causal=True), layer(x, mask), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("chunks", [[5, 7], [5, 1, 1, 5], [1] * 12])
def test_cached_chunks_equal_one_pass(position, kernel, chunks):
    model = tiny_lm(position=position, kernel=kernel)
    x = lm_tokens(2, 12)
    expected = model(x)  # (B, L, V)
    cache = model.new_cache()
    pieces, start = [], 0
    for n in chunks:
        pieces.append(model(x[:, start : start + n], cache=cache))
        start += n
    assert cache.length == 12
    got = torch.cat(pieces, dim=1)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_causal_calls_reach_the_kernel_as_is_causal(kernel_calls):
    """A full pass and a cache's first chunk (Lq = Lk) hand the kernel
    is_causal=True and no mask; one cached token needs neither."""
    model = tiny_lm(kernel="fused")
    x = lm_tokens(2, 6)
    model(x)
    cache = model.new_cache()
    model(x[:, :5], cache=cache)
    model(x[:, 5:], cache=cache)
    flags = [(c.get("is_causal"), c.get("attn_mask")) for c in kernel_calls]
    assert flags == [(True, None)] * 4 + [(False, None)] * 2


def test_tied_embeddings_share_one_matrix():
    tied, untied = tiny_lm(), tiny_lm(tie_embeddings=False)
    assert tied.generator.weight is tied.embed.weight
    assert untied.generator.weight is not untied.embed.weight
    difference = untied.count_parameters() - tied.count_parameters()
    assert difference == V * 32


def test_published_model_options_change_what_they_name():
    """GPT-2's choices (chapter 13): embeddings not scaled, no output
    bias, GELU, another epsilon. With the embeddings alone in play (no
    blocks), the logits are the embedding, maybe scaled, times E^T."""
    x = lm_tokens(2, 8)
    for scale in (True, False):
        model = tiny_lm(n_layers=1, position="none", scale_embeddings=scale,
                        output_bias=False, norm_first=False)  # fmt: skip
        model.layers = torch.nn.ModuleList()  # embeddings straight out
        E = model.embed.weight
        expected = E[x] * (32**0.5 if scale else 1.0) @ E.T
        torch.testing.assert_close(model(x), expected)
    gpt2 = tiny_lm(activation="gelu_tanh", norm_eps=1e-6, output_bias=False)
    assert gpt2.generator.bias is None
    block = gpt2.layers[0]
    assert isinstance(block.feed_forward.activation, torch.nn.GELU)
    assert block.feed_forward.activation.approximate == "tanh"
    assert block.norm1.eps == block.norm2.eps == gpt2.norm.eps == 1e-6
    difference = tiny_lm().count_parameters() - gpt2.count_parameters()
    assert difference == V  # the output bias


def test_training_mode_is_restored_and_gradients_flow():
    model = tiny_lm().train()
    x = lm_tokens(2, 8)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"vocab": 0}, "vocab must be a positive int"),
        ({"n_layers": True}, "n_layers must be a positive int"),
        ({"d_model": 30, "n_heads": 4}, "divisible by n_heads"),
        ({"dropout": 1.0}, "dropout must be a finite number"),
        ({"tie_embeddings": 1}, "tie_embeddings must be True or False"),
        ({"kernel": "yes"}, "kernel must be one of"),
        ({"position": "relative"}, "position must be one of"),
        ({"activation": "swish"}, "activation must be one of"),
        ({"norm_eps": 0}, "norm_eps must be positive"),
        ({"scale_embeddings": "no"}, "scale_embeddings must be True"),
        ({"output_bias": None}, "output_bias must be True or False"),
        ({"inner_dropout": 0}, "inner_dropout must be True or False"),
    ],
)
def test_bad_config_is_refused(fields, match):
    options = {"vocab": V, **fields}
    with pytest.raises(ValueError, match=match):
        LMConfig(**options)


def test_bad_calls_are_refused():
    model = tiny_lm()
    with pytest.raises(ValueError, match="tokens must hold integer"):
        model(torch.randn(2, 5))
    with pytest.raises(ValueError, match="a cache or a segment memory"):
        model(lm_tokens(1, 3), cache=model.new_cache(),
              memory=model.new_memory(4))  # fmt: skip
    with pytest.raises(ValueError, match="longer than the positional"):
        model(lm_tokens(1, 65))


def test_out_of_vocabulary_ids_are_a_value_error_on_the_cpu():
    """Before: PyTorch's bare "index out of range in self"."""
    model = tiny_lm()
    for bad in (V, -1):
        with pytest.raises(
            ValueError,
            match=rf"tokens holds .*: id {bad} is not one of its {V}",
        ):
            model(torch.tensor([[1, bad, 2]]))
