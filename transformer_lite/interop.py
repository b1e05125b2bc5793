"""Load weights from PyTorch's own modules (chapters 3 and 5).

Each ``from_torch_*`` function builds the transformer-lite module of the
same size and copies the weights, so the two compute the same function.
The equivalence tests and the book use this to show that our readable code
is exactly the real thing. Only batch-first modules with a ReLU or GELU
activation are accepted: those are the ones we claim equality with.
"""

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lite.attention import MultiHeadAttention
from transformer_lite.layers import DecoderLayer, EncoderLayer

__all__ = [
    "from_torch_decoder_layer",
    "from_torch_encoder_layer",
    "from_torch_mha",
]


def _copy(target: torch.Tensor, source: torch.Tensor) -> None:
    with torch.no_grad():
        target.copy_(source)


def _load_mha(ours: MultiHeadAttention, theirs: nn.MultiheadAttention):
    """Split the packed in-projection (3C, C) into W^Q, W^K, W^V."""
    w_q, w_k, w_v = theirs.in_proj_weight.chunk(3, dim=0)  # 3 x (C, C)
    _copy(ours.w_q.weight, w_q)
    _copy(ours.w_k.weight, w_k)
    _copy(ours.w_v.weight, w_v)
    _copy(ours.w_o.weight, theirs.out_proj.weight)
    if theirs.in_proj_bias is not None:
        b_q, b_k, b_v = theirs.in_proj_bias.chunk(3)  # 3 x (C,)
        _copy(ours.w_q.bias, b_q)
        _copy(ours.w_k.bias, b_k)
        _copy(ours.w_v.bias, b_v)
        _copy(ours.w_o.bias, theirs.out_proj.bias)


def _check_mha(m: nn.MultiheadAttention) -> None:
    if not isinstance(m, nn.MultiheadAttention):
        raise ValueError(f"expected nn.MultiheadAttention, got {type(m)}")
    if not m._qkv_same_embed_dim:
        raise ValueError("kdim and vdim must equal embed_dim")
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("add_bias_kv and add_zero_attn are not supported")


def from_torch_mha(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` with the weights of ``m``.

    Call ours batch-first; pass masks in our convention (True = may attend),
    or convert with :func:`transformer_lite.masks.to_torch_attn_mask` when
    calling ``m``.
    """
    _check_mha(m)
    ours = MultiHeadAttention(
        m.embed_dim, m.num_heads, m.dropout, bias=m.in_proj_bias is not None
    )
    # Move first, then copy: copying into float32 would round float64.
    ours.to(m.in_proj_weight.device, m.in_proj_weight.dtype)
    _load_mha(ours, m)
    return ours


def _check_layer(m: nn.Module, kind: type) -> None:
    if not isinstance(m, kind):
        raise ValueError(f"expected {kind.__name__}, got {type(m)}")
    if not m.self_attn.batch_first:
        raise ValueError("only batch_first=True layers are supported")
    _activation(m.activation)
    if not m.norm1.elementwise_affine:
        raise ValueError("only LayerNorms with affine weights")
    if m.linear1.bias is None or m.norm1.bias is None:
        raise ValueError(
            "only layers with biases (bias=True) are supported: ours "
            "always have them"
        )
    _check_mha(m.self_attn)


def _activation(f: object) -> str:
    """The name (:data:`~transformer_lite.layers.ACTIVATIONS`) of a torch
    layer's activation, which is a function or a module."""
    if f is F.relu or isinstance(f, nn.ReLU):
        return "relu"
    if f is F.gelu:
        return "gelu"
    if isinstance(f, nn.GELU):
        return "gelu" if f.approximate == "none" else "gelu_tanh"
    raise ValueError(f"only ReLU and GELU activations are supported, got {f}")


def _load_common(ours: nn.Module, theirs: nn.Module) -> None:
    _load_mha(ours.self_attn, theirs.self_attn)
    _copy(ours.feed_forward.w_1.weight, theirs.linear1.weight)
    _copy(ours.feed_forward.w_1.bias, theirs.linear1.bias)
    _copy(ours.feed_forward.w_2.weight, theirs.linear2.weight)
    _copy(ours.feed_forward.w_2.bias, theirs.linear2.bias)
    for name in ("norm1", "norm2", "norm3"):
        if hasattr(theirs, name):
            _copy(getattr(ours, name).weight, getattr(theirs, name).weight)
            _copy(getattr(ours, name).bias, getattr(theirs, name).bias)


def _sizes(m: nn.Module) -> dict:
    return dict(
        d_model=m.self_attn.embed_dim,
        n_heads=m.self_attn.num_heads,
        d_ff=m.linear1.out_features,
        dropout=m.dropout.p,
        norm_first=m.norm_first,
        activation=_activation(m.activation),
        norm_eps=m.norm1.eps,
    )


def from_torch_encoder_layer(m: nn.TransformerEncoderLayer) -> EncoderLayer:
    """An :class:`EncoderLayer` with the weights of ``m``."""
    _check_layer(m, nn.TransformerEncoderLayer)
    ours = EncoderLayer(**_sizes(m))
    ours.to(m.linear1.weight.device, m.linear1.weight.dtype)
    _load_common(ours, m)
    return ours


def from_torch_decoder_layer(m: nn.TransformerDecoderLayer) -> DecoderLayer:
    """A :class:`DecoderLayer` with the weights of ``m``."""
    _check_layer(m, nn.TransformerDecoderLayer)
    _check_mha(m.multihead_attn)
    ours = DecoderLayer(**_sizes(m))
    ours.to(m.linear1.weight.device, m.linear1.weight.dtype)
    _load_common(ours, m)
    _load_mha(ours.cross_attn, m.multihead_attn)
    return ours
