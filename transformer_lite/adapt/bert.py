"""Hugging Face's BERT in the book's own classes (chapter 13).

BERT is the book's encoder-only model with published settings: the
post-LN encoder layer of chapter 5 with the exact (erf) GELU and
LayerNorm's epsilon at 1e-12, inputs that sum token, token-type and
learned position vectors and normalise them (no sqrt(d_model) factor),
a masked-LM head tied to the token embedding, and a pooler.
:func:`from_hf_bert` reads a ``BertModel``, ``BertForMaskedLM`` or
``BertForSequenceClassification``, builds the
:class:`~transformer_lite.lm.masked.EncoderModel` (or
:class:`~transformer_lite.lm.masked.EncoderClassifier`) of the same
sizes and copies every weight, so the two compute the same function,
layer by layer. Hugging Face's ``nn.Linear`` layers store what ours
store: nothing is transposed or cut.

What the book's encoder cannot compute is refused, with the setting
named: a decoder (``is_decoder``, ``add_cross_attention``), relative
position embeddings, an activation other than ReLU and the two forms of
GELU. Dropout: BERT has two rates (on the attention weights, and
everywhere else), the book's layers one; the copy takes the shared
rate and asks for ``dropout=`` when they differ (dropout acts only in
training, never on the outputs compared). It drops in BERT's places
(``inner_dropout=False``: nothing inside the feed-forward network),
though not with Hugging Face's random draws, so a training step with
dropout on is not Hugging Face's draw for draw.

Ours builds its padding mask from ``pad_id`` where BERT reads an
``attention_mask``: the two agree for ``attention_mask = (input_ids !=
pad_id)``.
"""

import torch
from torch import Tensor, nn

from transformer_lite.adapt.hf_weights import one_dropout, weights_place
from transformer_lite.extras import require
from transformer_lite.lm.masked import (
    EncoderClassifier,
    EncoderConfig,
    EncoderModel,
)

__all__ = ["HF_ACTIVATIONS", "from_hf_bert"]

hf_bert = require("transformers.models.bert.modeling_bert", "hf")

# BERT's two dropout rates: every sublayer's output, attention weights
BERT_DROPOUTS = ("hidden_dropout_prob", "attention_probs_dropout_prob")

# Hugging Face's names (ACT2FN) of the activations the book's layers
# compute (layers.ACTIVATIONS).
HF_ACTIVATIONS = {
    "gelu": "gelu",  # the exact, erf form: BERT's
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",  # the tanh form, written out by hand
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "relu": "relu",
}


def _check_settings(hf) -> None:
    """Refuse the settings the book's encoder cannot reproduce."""
    for name in ("is_decoder", "add_cross_attention"):
        if getattr(hf, name):
            raise ValueError(
                f"cannot load a BERT with {name}=True: it attends "
                "causally or to an encoder's states, and the book's "
                "encoder model is BERT's bidirectional encoder only "
                f"(expected {name}=False)"
            )
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(
            f"cannot load a BERT with position_embedding_type={kind!r}: "
            "the book's encoder model adds learned absolute positions "
            "(expected 'absolute')"
        )
    act = hf.hidden_act
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(
            f"cannot load a BERT with hidden_act={act!r}: the book's "
            f"layers compute {', '.join(HF_ACTIVATIONS)}"
        )


def _pieces(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """The ``BertModel`` of ``model`` and its masked-LM head (or None)."""
    if isinstance(model, hf_bert.BertModel):
        return model, None
    if isinstance(model, hf_bert.BertForMaskedLM):
        return model.bert, model.cls.predictions
    if isinstance(model, hf_bert.BertForSequenceClassification):
        return model.bert, None
    raise ValueError(
        "model must be a Hugging Face BertModel, BertForMaskedLM or "
        f"BertForSequenceClassification, got {type(model).__name__}"
    )


def _params(module: nn.Module) -> dict[str, Tensor]:
    """The weight and bias of a Linear or LayerNorm (an Embedding's
    weight), by name."""
    names = ("weight", "bias")
    return {n: getattr(module, n) for n in names if hasattr(module, n)}


def _state(
    body: nn.Module, head: nn.Module | None, config: EncoderConfig
) -> dict[str, Tensor]:
    """Every weight of a ``BertModel`` (and of its masked-LM head) under
    the names of the book's :class:`EncoderModel` (its state dict, tied
    output included)."""
    e = body.embeddings
    parts = {
        "embedding.token": e.word_embeddings,
        "embedding.position": e.position_embeddings,
        "embedding.norm": e.LayerNorm,
    }
    if config.type_vocab:
        parts["embedding.token_type"] = e.token_type_embeddings
    for i, layer in enumerate(body.encoder.layer):
        attention = layer.attention
        parts |= {
            f"encoder.layers.{i}.self_attn.w_q": attention.self.query,
            f"encoder.layers.{i}.self_attn.w_k": attention.self.key,
            f"encoder.layers.{i}.self_attn.w_v": attention.self.value,
            f"encoder.layers.{i}.self_attn.w_o": attention.output.dense,
            f"encoder.layers.{i}.norm1": attention.output.LayerNorm,
            f"encoder.layers.{i}.feed_forward.w_1": layer.intermediate.dense,
            f"encoder.layers.{i}.feed_forward.w_2": layer.output.dense,
            f"encoder.layers.{i}.norm2": layer.output.LayerNorm,
        }
    if config.pooler:
        parts["pooler.dense"] = body.pooler.dense
    if head is not None:  # the decoder's bias is what its forward adds
        parts["mlm_head.dense"] = head.transform.dense
        parts["mlm_head.norm"] = head.transform.LayerNorm
        parts["mlm_head.output"] = head.decoder
    if head is not None and head.decoder.bias is None:
        raise ValueError("the masked-LM decoder has no bias; BERT's has one")
    return {
        f"{module}.{name}": tensor
        for module, hf_module in parts.items()
        for name, tensor in _params(hf_module).items()
    }


def _config(
    hf,
    body: nn.Module,
    head: nn.Module | None,
    *,
    pad_id: int | None,
    kernel: str,
    dropout: float | None,
) -> EncoderConfig:
    """The :class:`EncoderConfig` of what ``hf`` (a ``BertConfig``) and
    the modules present describe."""
    _check_settings(hf)
    pad_id = hf.pad_token_id if pad_id is None else pad_id
    if pad_id is None:
        raise ValueError(
            "the BERT config has no pad_token_id: pass pad_id=, the id "
            "whose positions are masked out (the book's model builds its "
            "padding mask from it, where BERT reads attention_mask)"
        )
    tied = bool(hf.tie_word_embeddings)  # no output layer: as configured
    if head is not None:  # tied if the decoder's weight is the embedding
        tied = head.decoder.weight is body.embeddings.word_embeddings.weight
    return EncoderConfig(
        vocab=hf.vocab_size,
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        d_ff=hf.intermediate_size,
        n_heads=hf.num_attention_heads,
        dropout=one_dropout("BERT", hf, BERT_DROPOUTS, dropout),
        max_len=hf.max_position_embeddings,
        type_vocab=hf.type_vocab_size,
        pad_id=pad_id,
        activation=HF_ACTIVATIONS[hf.hidden_act],
        norm_eps=float(hf.layer_norm_eps),
        inner_dropout=False,  # BERT drops nothing inside its FFN
        tie_embeddings=tied,
        mlm_head=head is not None,
        pooler=body.pooler is not None,
        kernel=kernel,
    )


def from_hf_bert(
    model: nn.Module,
    *,
    pad_id: int | None = None,
    kernel: str = "fused",
    dropout: float | None = None,
) -> EncoderModel | EncoderClassifier:
    """The book's model holding a Hugging Face BERT's weights: the same
    outputs, on the same device, in the same dtype, in the same training
    or eval mode.

    * ``BertModel``: an :class:`EncoderModel` without the masked-LM head
      (``mlm_head=False``), with the pooler if ``model`` has one;
    * ``BertForMaskedLM``: an :class:`EncoderModel` with the head and no
      pooler (Hugging Face builds this model without one); its output
      tied to the embedding unless ``model``'s is not;
    * ``BertForSequenceClassification``: an :class:`EncoderClassifier`
      (its dropout ``model``'s, ``classifier_dropout`` or the hidden
      rate).

    Args:
        model: the Hugging Face model.
        pad_id: the padding id; None: the config's ``pad_token_id``.
        kernel: the attention kernel (``attention.KERNELS``).
        dropout: the one dropout rate; None: BERT's, when its two rates
            agree (a ``ValueError`` when they do not).

    A setting the book's model cannot reproduce (see the module
    docstring) raises a ``ValueError`` that names it.
    """
    body, head = _pieces(model)
    config = _config(model.config, body, head, pad_id=pad_id, kernel=kernel,
                     dropout=dropout)  # fmt: skip
    device, dtype = weights_place(model, "BERT")
    # The random start is overwritten: leave the caller's generator be.
    with torch.random.fork_rng(devices=[]):
        ours = EncoderModel(config)
        if isinstance(model, hf_bert.BertForSequenceClassification):
            ours = EncoderClassifier(
                ours, model.config.num_labels, dropout=model.dropout.p
            )
    # In the weights' own dtype before copying: float64 stays float64.
    ours.to(device=device, dtype=dtype)
    state = _state(body, head, config)
    if isinstance(ours, EncoderClassifier):
        state = {f"encoder.{name}": t for name, t in state.items()}
        state |= {f"head.{n}": t for n, t in _params(model.classifier).items()}
    with torch.no_grad():
        # strict: every weight of ours is written, nothing is left over
        ours.load_state_dict(state, strict=True)
    return ours.train(model.training)
