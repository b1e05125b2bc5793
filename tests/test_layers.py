"""Encoder and decoder layers and stacks against PyTorch's own modules."""

import copy

import pytest
import torch
from conftest import assert_close, random_padding
from torch import nn

from transformer_lite.interop import (
    from_torch_decoder_layer,
    from_torch_encoder_layer,
)
from transformer_lite.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
)
from transformer_lite.masks import causal_mask, to_torch_attn_mask

SIZES = [(16, 4, 32), (24, 2, 8), (8, 1, 64)]  # (C, H, d_ff)
# (torch's activation, LayerNorm epsilon): the paper's, BERT's, GPT-2's
FLAVOURS = {
    "relu": ("relu", 1e-5),
    "gelu": ("gelu", 1e-12),
    "gelu_tanh": (nn.GELU(approximate="tanh"), 1e-5),
}


def inputs(B, S, T, C, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(B, S, C, generator=g, dtype=dtype).to(device)
    tgt = torch.randn(B, T, C, generator=g, dtype=dtype).to(device)
    lengths = [S - b for b in range(B)]
    return src, tgt, random_padding(lengths, S, device)  # mask (B, 1, S)


def grads(module):
    return {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_encoder_layer_equals_torch(size, norm_first, flavour, dtype, device):
    C, H, d_ff = size
    activation, eps = FLAVOURS[flavour]
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(
        C,
        H,
        d_ff,
        dropout=0.1,
        batch_first=True,
        norm_first=norm_first,
        activation=activation,
        layer_norm_eps=eps,
        device=device,
        dtype=dtype,  # so float64 weights use all 53 bits
    ).eval()
    ours = from_torch_encoder_layer(theirs).eval()
    assert ours.norm1.eps == ours.norm2.eps == eps
    src, _, mask = inputs(3, 6, 4, C, dtype, device)

    out = ours(src, mask)
    ref = theirs(src, src_key_padding_mask=to_torch_attn_mask(mask[:, 0]))
    assert_close(out, ref, dtype, "outputs differ")

    out.square().sum().backward()
    ref.square().sum().backward()
    ours_grads = grads(ours)
    assert_close(
        ours_grads["feed_forward.w_1.weight"],
        theirs.linear1.weight.grad,
        dtype,
        "grad of linear1",
    )
    assert_close(
        ours_grads["norm1.weight"],
        theirs.norm1.weight.grad,
        dtype,
        "grad of norm1",
    )
    w_q, _, w_v = theirs.self_attn.in_proj_weight.grad.chunk(3)
    assert_close(ours_grads["self_attn.w_q.weight"], w_q, dtype, "grad W^Q")
    assert_close(ours_grads["self_attn.w_v.weight"], w_v, dtype, "grad W^V")


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_decoder_layer_equals_torch(size, norm_first, flavour, dtype, device):
    C, H, d_ff = size
    activation, eps = FLAVOURS[flavour]
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(
        C,
        H,
        d_ff,
        dropout=0.1,
        batch_first=True,
        norm_first=norm_first,
        activation=activation,
        layer_norm_eps=eps,
        device=device,
        dtype=dtype,  # so float64 weights use all 53 bits
    ).eval()
    ours = from_torch_decoder_layer(theirs).eval()
    memory, tgt, src_mask = inputs(2, 7, 5, C, dtype, device, seed=3)
    tgt_mask = causal_mask(5, device)

    out = ours(tgt, memory, src_mask, tgt_mask)
    ref = theirs(
        tgt,
        memory,
        tgt_mask=to_torch_attn_mask(tgt_mask[0]),
        memory_key_padding_mask=to_torch_attn_mask(src_mask[:, 0]),
    )
    assert_close(out, ref, dtype, "outputs differ")

    out.square().sum().backward()
    ref.square().sum().backward()
    ours_grads = grads(ours)
    w_q, w_k, _ = theirs.multihead_attn.in_proj_weight.grad.chunk(3)
    assert_close(
        ours_grads["cross_attn.w_q.weight"],
        w_q,
        dtype,
        "grad of cross-attention W^Q",
    )
    assert_close(
        ours_grads["cross_attn.w_k.weight"],
        w_k,
        dtype,
        "grad of cross-attention W^K",
    )
    assert_close(
        ours_grads["norm3.bias"],
        theirs.norm3.bias.grad,
        dtype,
        "grad of norm3",
    )
    assert_close(
        ours_grads["feed_forward.w_2.weight"],
        theirs.linear2.weight.grad,
        dtype,
        "grad of linear2",
    )


def load_stack(ours, layers, final_norm):
    """Copy torch layers (and the final norm) into one of our stacks."""
    for mine, theirs in zip(ours.layers, layers, strict=True):
        convert = (
            from_torch_encoder_layer
            if isinstance(mine, EncoderLayer)
            else from_torch_decoder_layer
        )
        mine.load_state_dict(convert(theirs).state_dict())
    if final_norm is not None:
        ours.norm.load_state_dict(final_norm.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_equal_torch(norm_first):
    C, H, d_ff, N = 16, 4, 32, 3
    dtype = torch.float64
    torch.manual_seed(2)
    norm = nn.LayerNorm(C).double() if norm_first else None
    enc_layer = nn.TransformerEncoderLayer(
        C, H, d_ff, 0.0, batch_first=True, norm_first=norm_first, dtype=dtype
    )
    dec_layer = nn.TransformerDecoderLayer(
        C, H, d_ff, 0.0, batch_first=True, norm_first=norm_first, dtype=dtype
    )
    theirs_enc = nn.TransformerEncoder(
        enc_layer, N, norm=norm, enable_nested_tensor=False
    ).double()
    theirs_dec = nn.TransformerDecoder(
        dec_layer, N, norm=copy.deepcopy(norm)
    ).double()
    ours_enc = Encoder(N, C, H, d_ff, 0.0, norm_first).double()
    ours_dec = Decoder(N, C, H, d_ff, 0.0, norm_first).double()
    load_stack(ours_enc, theirs_enc.layers, theirs_enc.norm)
    load_stack(ours_dec, theirs_dec.layers, theirs_dec.norm)
    assert (ours_enc.norm is None) == (not norm_first)

    src, tgt, src_mask = inputs(2, 6, 5, C, dtype, "cpu")
    tgt_mask = causal_mask(5)
    memory = ours_enc(src, src_mask)
    ref_memory = theirs_enc(
        src, src_key_padding_mask=to_torch_attn_mask(src_mask[:, 0])
    )
    assert_close(memory, ref_memory, dtype, "encoder stack differs")
    out = ours_dec(tgt, memory, src_mask, tgt_mask)
    ref = theirs_dec(
        tgt,
        ref_memory,
        tgt_mask=to_torch_attn_mask(tgt_mask[0]),
        memory_key_padding_mask=to_torch_attn_mask(src_mask[:, 0]),
    )
    assert_close(out, ref, dtype, "decoder stack differs")


def test_checkpointing_gives_the_same_gradients():
    torch.manual_seed(3)
    enc = Encoder(2, 16, 4, 32, dropout=0.0).double()
    dec = Decoder(2, 16, 4, 32, dropout=0.0).double()
    src, tgt, src_mask = inputs(2, 6, 5, 16, torch.float64, "cpu")
    results = []
    for checkpointing in (False, True):
        enc.checkpointing = dec.checkpointing = checkpointing
        enc.zero_grad(), dec.zero_grad()
        out = dec(tgt, enc(src, src_mask), src_mask, causal_mask(5))
        out.square().sum().backward()
        results.append(
            [p.grad.clone() for p in [*enc.parameters(), *dec.parameters()]]
        )
    for plain, recomputed in zip(*results, strict=True):
        torch.testing.assert_close(plain, recomputed, rtol=1e-12, atol=1e-12)


def test_feed_forward_acts_on_each_position_alone():
    ff = FeedForward(8, 32, dropout=0.0)
    x = torch.randn(2, 5, 8)
    perm = torch.randperm(5)
    torch.testing.assert_close(ff(x)[:, perm], ff(x[:, perm]))


def test_decoder_layer_is_causal():
    layer = DecoderLayer(16, 4, 32, dropout=0.0).eval()
    memory, tgt, src_mask = inputs(2, 6, 5, 16, torch.float32, "cpu")
    out = layer(tgt, memory, src_mask, causal_mask(5))
    changed = tgt.clone()
    changed[:, 3] += 1.0
    out2 = layer(changed, memory, src_mask, causal_mask(5))
    torch.testing.assert_close(out[:, :3], out2[:, :3])
    assert not torch.allclose(out[:, 3:], out2[:, 3:])


def test_interop_rejects_what_it_cannot_copy():
    with pytest.raises(ValueError, match="batch_first"):
        from_torch_encoder_layer(nn.TransformerEncoderLayer(8, 2, 16))
    with pytest.raises(ValueError, match="only ReLU and GELU"):
        from_torch_encoder_layer(
            nn.TransformerEncoderLayer(
                8, 2, 16, activation=torch.tanh, batch_first=True
            )
        )
    with pytest.raises(ValueError, match="TransformerDecoderLayer"):
        from_torch_decoder_layer(
            nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        )


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_activation_is_the_named_function(name):
    """Each activation is the function it names, computed independently
    (GELU exactly: x Phi(x); its tanh form as GPT-2 writes it)."""
    ffn = FeedForward(8, 16, dropout=0.0, activation=name).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    z = ffn.w_1(x)
    phi = 0.5 * (1 + torch.erf(z / 2**0.5))
    inner = (2 / torch.pi) ** 0.5 * (z + 0.044715 * z**3)
    f = {
        "relu": z.clamp(min=0),
        "gelu": z * phi,
        "gelu_tanh": 0.5 * z * (1 + torch.tanh(inner)),
    }[name]
    torch.testing.assert_close(ffn(x), ffn.w_2(f), rtol=1e-12, atol=1e-12)


def test_layer_options_are_checked():
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(8, 16, activation="swish")
    with pytest.raises(ValueError, match="norm_eps must be positive"):
        EncoderLayer(8, 2, 16, norm_eps=0.0)
    with pytest.raises(ValueError, match="norm_eps"):
        DecoderLayer(8, 2, 16, norm_eps=-1e-5)


def test_default_layers_hold_the_same_parameters_in_the_same_order():
    """The options add no parameter and draw no random number at their
    defaults: a seeded layer is the same as one built without them."""
    torch.manual_seed(0)
    plain = EncoderLayer(16, 4, 32)
    next_plain = torch.rand(())
    torch.manual_seed(0)
    named = EncoderLayer(16, 4, 32, activation="relu", norm_eps=1e-5)
    next_named = torch.rand(())
    a, b = plain.state_dict(), named.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(next_plain, next_named)


def test_feed_forward_without_inner_dropout_drops_nothing_in_training():
    """``inner_dropout=False`` (GPT-2's and BERT's network): in training
    the output is the eval output, where the default drops activations
    before W2 (so at p = 0.5 it differs)."""
    torch.manual_seed(0)
    kept = FeedForward(8, 64, dropout=0.5, inner_dropout=False).double()
    x = torch.randn(4, 6, 8, dtype=torch.float64)
    want = kept.w_2(kept.activation(kept.w_1(x)))
    torch.testing.assert_close(kept.train()(x), want, rtol=0, atol=0)
    dropping = FeedForward(8, 64, dropout=0.5).double().train()
    dropping.load_state_dict(kept.state_dict())
    assert not torch.allclose(dropping(x), want)
    with pytest.raises(ValueError, match="inner_dropout"):
        FeedForward(8, 16, inner_dropout=1)


@pytest.mark.parametrize("layer_type", [EncoderLayer, DecoderLayer])
def test_inner_dropout_reaches_every_feed_forward_network(layer_type):
    """The stacks pass ``inner_dropout`` to each layer's network; the
    layer keeps every other dropout, and the same parameters."""
    stack = (Encoder if layer_type is EncoderLayer else Decoder)(
        2, 16, 4, 32, dropout=0.1, inner_dropout=False
    )
    ffns = [m for m in stack.modules() if isinstance(m, FeedForward)]
    assert len(ffns) == 2
    assert all(isinstance(f.dropout, torch.nn.Identity) for f in ffns)
    drops = [m for m in stack.modules() if isinstance(m, torch.nn.Dropout)]
    per_layer = 2 if layer_type is EncoderLayer else 3
    assert len(drops) == 2 * per_layer  # the sublayers' own
    default = type(stack)(2, 16, 4, 32, dropout=0.1)
    assert list(default.state_dict()) == list(stack.state_dict())
