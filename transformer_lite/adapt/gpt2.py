"""Hugging Face's GPT-2 as the book's language model (chapter 13).

GPT-2 is chapter 10's model with published settings: learned absolute
positions, pre-LN blocks, GELU's tanh form in the feed-forward network,
embeddings that are not multiplied by sqrt(d_model), and an output layer
without a bias that is the token embedding itself. :func:`from_hf_gpt2`
reads the sizes from the Hugging Face config, builds the
:class:`~transformer_lite.lm.model.LanguageModel` and copies every
weight, so the two compute the same logits.

Two things are stored differently:

* Hugging Face's ``Conv1D`` keeps its weight as (in, out) and computes
  ``x W + b``; ``nn.Linear`` keeps (out, in) and computes ``x W^T + b``:
  every matrix is transposed on the way.
* ``c_attn`` packs W^Q, W^K and W^V side by side, (C, 3C), with one
  bias of 3C: it is cut into three.

What the book's model cannot compute is refused, with the setting named:
cross-attention blocks, attention scores without the 1/sqrt(D) scale or
with an extra 1/(layer index + 1), an output layer that is not the token
embedding, an activation other than ReLU and the two forms of GELU.
``reorder_and_upcast_attn`` is accepted: it makes Hugging Face's eager
attention scale inside the product and form the scores in float32,
which changes the logits by rounding only (as its other attention
implementation does, which ignores the setting); the book's kernels
form the scores of 16-bit inputs in float32 too.

Dropout: GPT-2 has three rates (on the embeddings, on the attention
weights, on each sublayer's output), the book's model one; the copy
takes the shared rate, and asks for ``dropout=`` when they differ.
Dropout acts only in training, so it never changes the logits compared.
The copy drops in GPT-2's places (``inner_dropout=False``: nothing
inside the feed-forward network), though not with Hugging Face's random
draws, so a training step with dropout on is not Hugging Face's draw
for draw.
"""

import torch
from torch import Tensor, nn

from transformer_lite.adapt.hf_weights import one_dropout, weights_place
from transformer_lite.extras import require
from transformer_lite.lm.model import LanguageModel, LMConfig

__all__ = ["ACTIVATION_NAMES", "from_hf_gpt2", "gpt2_lm_config"]

transformers = require("transformers", "hf")

# GPT-2's three dropout rates: embeddings, attention weights, sublayers
GPT2_DROPOUTS = ("embd_pdrop", "attn_pdrop", "resid_pdrop")

# Hugging Face's names of the activations the book's layers compute
# (layers.ACTIVATIONS): "gelu_new" writes the tanh form out by hand,
# "gelu_pytorch_tanh" calls PyTorch's; both are GELU's tanh form.
ACTIVATION_NAMES = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}

# GPT-2's settings the book's model cannot reproduce: each with the value
# that it matches, and what the other value does.
_REFUSED_SETTINGS = (
    (
        "add_cross_attention",
        False,
        "every block also attends to an encoder's states, and the book's "
        "language model has no cross-attention",
    ),
    (
        "scale_attn_weights",
        True,
        "the scores are not divided by sqrt(D), and the book's attention "
        "always divides them",
    ),
    (
        "scale_attn_by_inverse_layer_idx",
        False,
        "block i divides its scores by i + 1 as well, which the book's "
        "attention does not",
    ),
)


def _check_settings(config) -> None:
    """Refuse the settings the book's model cannot reproduce."""
    for name, matched, why in _REFUSED_SETTINGS:
        value = getattr(config, name)
        if value != matched:
            raise ValueError(
                f"cannot load a GPT-2 with {name}={value!r}: {why} "
                f"(expected {name}={matched!r})"
            )
    if config.activation_function not in ACTIVATION_NAMES:
        raise ValueError(
            "cannot load a GPT-2 with activation_function="
            f"{config.activation_function!r}: the book's layers compute "
            f"{', '.join(ACTIVATION_NAMES)}"
        )


def gpt2_lm_config(
    config, *, kernel: str = "fused", dropout: float | None = None
) -> LMConfig:
    """The :class:`LMConfig` of the book's model that computes what a
    Hugging Face ``GPT2Config`` describes.

    Args:
        config: a ``transformers.GPT2Config``.
        kernel: the attention kernel (``attention.KERNELS``).
        dropout: the one dropout rate; None: GPT-2's, when its three
            rates agree (a ``ValueError`` when they do not).
    """
    if not isinstance(config, transformers.GPT2Config):
        raise ValueError(
            f"config must be a GPT2Config, got {type(config).__name__}"
        )
    _check_settings(config)
    d_ff = config.n_inner if config.n_inner is not None else 4 * config.n_embd
    return LMConfig(
        vocab=config.vocab_size,
        n_layers=config.n_layer,
        d_model=config.n_embd,
        d_ff=d_ff,
        n_heads=config.n_head,
        dropout=one_dropout("GPT-2", config, GPT2_DROPOUTS, dropout),
        norm_first=True,
        tie_embeddings=True,
        position="learned",
        max_len=config.n_positions,
        kernel=kernel,
        activation=ACTIVATION_NAMES[config.activation_function],
        norm_eps=config.layer_norm_epsilon,
        inner_dropout=False,  # GPT-2 drops nothing inside its MLP
        scale_embeddings=False,
        output_bias=False,
    )


def _body(model: object) -> nn.Module:
    """The ``GPT2Model`` of ``model``: itself, or the body under its
    output layer."""
    if isinstance(model, transformers.GPT2Model):
        return model
    if not isinstance(model, transformers.GPT2LMHeadModel):
        raise ValueError(
            "model must be a Hugging Face GPT2LMHeadModel or GPT2Model, "
            f"got {type(model).__name__}"
        )
    return model.transformer


def _check_tied(model: nn.Module) -> None:
    """Refuse an output layer that is not the token embedding."""
    if isinstance(model, transformers.GPT2Model):
        return  # no output layer: the tied one is used
    head, wte = model.lm_head.weight, model.transformer.wte.weight
    tied = head is wte or (head.shape == wte.shape and torch.equal(head, wte))
    if not tied:
        raise ValueError(
            "cannot load a GPT-2 whose output layer (lm_head) is not its "
            "token embedding (wte): the book's GPT-2 ties them "
            f"(tie_word_embeddings={model.config.tie_word_embeddings!r})"
        )


def _linear(weight: Tensor, bias: Tensor) -> dict[str, Tensor]:
    """A ``Conv1D``'s (in, out) weight as ``nn.Linear``'s (out, in)."""
    return {"weight": weight.t(), "bias": bias}  # (out, in), (out,)


def _block_state(block: nn.Module, C: int) -> dict[str, Tensor]:
    """One GPT-2 block's weights under the names of an
    :class:`~transformer_lite.layers.EncoderLayer`."""
    w_q, w_k, w_v = block.attn.c_attn.weight.split(C, dim=1)  # 3 x (C, C)
    b_q, b_k, b_v = block.attn.c_attn.bias.split(C)  # 3 x (C,)
    parts = {
        "norm1": {"weight": block.ln_1.weight, "bias": block.ln_1.bias},
        "self_attn.w_q": _linear(w_q, b_q),
        "self_attn.w_k": _linear(w_k, b_k),
        "self_attn.w_v": _linear(w_v, b_v),
        "self_attn.w_o": _linear(
            block.attn.c_proj.weight, block.attn.c_proj.bias
        ),
        "norm2": {"weight": block.ln_2.weight, "bias": block.ln_2.bias},
        "feed_forward.w_1": _linear(
            block.mlp.c_fc.weight, block.mlp.c_fc.bias
        ),
        "feed_forward.w_2": _linear(
            block.mlp.c_proj.weight, block.mlp.c_proj.bias
        ),
    }
    return {
        f"{module}.{name}": tensor
        for module, tensors in parts.items()
        for name, tensor in tensors.items()
    }


def _state(body: nn.Module, C: int) -> dict[str, Tensor]:
    """Every weight of a ``GPT2Model`` under the names of the book's
    :class:`LanguageModel` (its state dict, tied output included)."""
    state = {
        "embed.weight": body.wte.weight,
        "generator.weight": body.wte.weight,  # tied
        "positional.embedding.weight": body.wpe.weight,
        "norm.weight": body.ln_f.weight,
        "norm.bias": body.ln_f.bias,
    }
    for i, block in enumerate(body.h):
        for name, tensor in _block_state(block, C).items():
            state[f"layers.{i}.{name}"] = tensor
    return state


def from_hf_gpt2(
    model: nn.Module, *, kernel: str = "fused", dropout: float | None = None
) -> LanguageModel:
    """The book's :class:`LanguageModel` holding a Hugging Face GPT-2's
    weights: the same logits, on the same device, in the same dtype, in
    the same training or eval mode.

    Args:
        model: a ``GPT2LMHeadModel``, or a ``GPT2Model`` (whose logits
            are then those of the tied output layer, as GPT-2's head).
        kernel: the attention kernel (``attention.KERNELS``).
        dropout: the one dropout rate; None: GPT-2's, when its three
            rates agree (a ``ValueError`` when they do not).

    A setting the book's model cannot reproduce (see the module
    docstring) raises a ``ValueError`` that names it.
    """
    body = _body(model)
    config = gpt2_lm_config(body.config, kernel=kernel, dropout=dropout)
    device, dtype = weights_place(model, "GPT-2")
    _check_tied(model)
    # The random start is overwritten: leave the caller's generator be.
    with torch.random.fork_rng(devices=[]):
        ours = LanguageModel(config)
    # In the weights' own dtype before copying: float64 stays float64.
    ours.to(device=device, dtype=dtype)
    with torch.no_grad():
        # strict: every weight of ours is written, nothing is left over
        ours.load_state_dict(_state(body, config.d_model), strict=True)
    return ours.train(model.training)
