"""Hugging Face's BERT in the book's own classes (chapter 13).

:func:`from_hf_bert` reads a ``BertModel``, ``BertForMaskedLM`` or
``BertForSequenceClassification`` and builds the
:class:`~transformer_lite.lm.EncoderModel` (or
:class:`~transformer_lite.lm.EncoderClassifier`) of the same sizes, with
every weight copied: the two compute the same function, layer by layer
(``tests/test_bert.py`` checks it in float64). BERT's layer is the
post-LN encoder layer of chapter 5 with GELU and LayerNorm's epsilon at
1e-12; its embeddings are normalised and have no sqrt(d_model) factor.

What the book's classes cannot compute is refused with a clear error:
a decoder (causal or with cross-attention), relative position
embeddings, an activation other than ReLU and the two GELUs, different
dropout rates in attention and elsewhere (the layers have one).

Needs the ``[hf]`` extra (``transformers``).
"""

import torch
from torch import nn

from transformer_lite.extras import require
from transformer_lite.lm.masked import (
    EncoderClassifier,
    EncoderConfig,
    EncoderModel,
)

__all__ = ["HF_ACTIVATIONS", "from_hf_bert"]

# Hugging Face's names of the activations the layers have (ACT2FN).
HF_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",  # the exact, erf form: BERT's
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",  # GPT-2's tanh approximation
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
}


def _refuse_unless_encoder(hf) -> None:
    """Raise a ``ValueError`` for a configuration the book's encoder does
    not compute exactly."""
    if hf.is_decoder or hf.add_cross_attention:
        raise ValueError(
            "a BERT decoder (is_decoder=True or add_cross_attention=True) "
            "attends causally or to an encoder's output: the encoder "
            "model reproduces only BERT's bidirectional encoder"
        )
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(
            f"position_embedding_type={kind!r} is not reproduced: the "
            "encoder model has BERT's learned absolute positions only"
        )
    act = hf.hidden_act
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(
            f"hidden_act={act!r} is not one of the layers' activations; "
            f"accepted: {', '.join(HF_ACTIVATIONS)}"
        )
    if hf.hidden_dropout_prob != hf.attention_probs_dropout_prob:
        raise ValueError(
            "the layers have one dropout rate, got hidden_dropout_prob="
            f"{hf.hidden_dropout_prob} and attention_probs_dropout_prob="
            f"{hf.attention_probs_dropout_prob}; set them equal (in eval "
            "mode neither matters)"
        )


def _config(hf, *, pad_id, mlm_head: bool, pooler: bool, tied: bool):
    if pad_id is None:
        pad_id = hf.pad_token_id
    if pad_id is None:
        raise ValueError(
            "the BERT config has no pad_token_id: pass pad_id=, the id "
            "whose positions are masked out (the model builds its "
            "padding mask from it, where BERT reads attention_mask)"
        )
    return EncoderConfig(
        vocab=hf.vocab_size,
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        d_ff=hf.intermediate_size,
        n_heads=hf.num_attention_heads,
        dropout=float(hf.hidden_dropout_prob),
        max_len=hf.max_position_embeddings,
        type_vocab=hf.type_vocab_size,
        pad_id=pad_id,
        activation=HF_ACTIVATIONS[hf.hidden_act],
        norm_eps=float(hf.layer_norm_eps),
        tie_embeddings=tied,
        mlm_head=mlm_head,
        pooler=pooler,
    )


def _copy(ours: nn.Module, theirs: nn.Module, name: str) -> None:
    """Copy the weight and bias of a Linear, LayerNorm or Embedding."""
    for attr in ("weight", "bias"):
        target, source = getattr(ours, attr, None), getattr(theirs, attr, None)
        if (target is None) != (source is None):
            raise ValueError(f"{name}.{attr}: one side has none")
        if target is None:
            continue
        if target.shape != source.shape:
            raise ValueError(
                f"{name}.{attr} has shape {tuple(source.shape)}, expected "
                f"{tuple(target.shape)}"
            )
        target.copy_(source)


def _load_encoder(ours: EncoderModel, bert) -> None:
    """Copy a ``BertModel``'s embeddings, layers and pooler."""
    e, their_e = ours.embedding, bert.embeddings
    _copy(e.token, their_e.word_embeddings, "word_embeddings")
    _copy(e.position, their_e.position_embeddings, "position_embeddings")
    if e.token_type is not None:
        _copy(e.token_type, their_e.token_type_embeddings,
              "token_type_embeddings")  # fmt: skip
    _copy(e.norm, their_e.LayerNorm, "embeddings.LayerNorm")
    for i, (layer, theirs) in enumerate(
        zip(ours.encoder.layers, bert.encoder.layer, strict=True)
    ):
        at = f"encoder.layer.{i}"
        attention = theirs.attention
        pairs = [
            (layer.self_attn.w_q, attention.self.query, "query"),
            (layer.self_attn.w_k, attention.self.key, "key"),
            (layer.self_attn.w_v, attention.self.value, "value"),
            (layer.self_attn.w_o, attention.output.dense, "output.dense"),
            (layer.norm1, attention.output.LayerNorm, "LayerNorm"),
            (layer.feed_forward.w_1, theirs.intermediate.dense,
             "intermediate.dense"),
            (layer.feed_forward.w_2, theirs.output.dense, "output.dense"),
            (layer.norm2, theirs.output.LayerNorm, "output.LayerNorm"),
        ]  # fmt: skip
        for mine, hf_module, name in pairs:
            _copy(mine, hf_module, f"{at}.{name}")
    if ours.pooler is not None:
        _copy(ours.pooler.dense, bert.pooler.dense, "pooler.dense")


def _load_mlm_head(ours: EncoderModel, cls) -> None:
    """Copy ``BertOnlyMLMHead`` (``cls``): the transform and the output
    layer (its weight unless tied to the embedding; its bias always)."""
    predictions, head = cls.predictions, ours.mlm_head
    _copy(head.dense, predictions.transform.dense, "transform.dense")
    _copy(head.norm, predictions.transform.LayerNorm, "transform.LayerNorm")
    if predictions.decoder.bias is None:
        raise ValueError("the MLM decoder has no bias; BERT's has one")
    if not ours.config.tie_embeddings:
        _copy(head.output, predictions.decoder, "predictions.decoder")
    else:
        head.output.bias.copy_(predictions.decoder.bias)


def _placement(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """The one device and floating dtype of ``model``'s parameters."""
    places = {(p.device, p.dtype) for p in model.parameters()}
    if len(places) != 1:
        raise ValueError(
            "the model's parameters must share one device and dtype, got "
            f"{sorted(str(p) for p in places)}"
        )
    return places.pop()


def from_hf_bert(
    model: nn.Module, *, pad_id: int | None = None
) -> EncoderModel | EncoderClassifier:
    """The book's model with the weights of Hugging Face's BERT.

    * ``BertModel``: an :class:`EncoderModel` without the masked-LM head
      (``mlm_head=False``), with the pooler if ``model`` has one;
    * ``BertForMaskedLM``: an :class:`EncoderModel` with the head and no
      pooler (BERT's masked-LM model has none); the output layer tied to
      the embedding unless ``model``'s is not;
    * ``BertForSequenceClassification``: an :class:`EncoderClassifier`
      (its dropout ``classifier_dropout``, else the hidden dropout).

    The copy is built on ``model``'s device and in its dtype, draws
    nothing from the caller's random stream, and is in ``model``'s
    training or eval mode. Ours builds its padding mask from ``pad_id``
    (default: the config's ``pad_token_id``): it equals ``model`` called
    with ``attention_mask = (input_ids != pad_id)``.

    Args:
        model: the Hugging Face model.
        pad_id: the padding id, if not the config's.

    Raises:
        ValueError: another class, or a configuration the book's
            encoder does not compute exactly (see the module's
            docstring).
    """
    bert_module = require("transformers.models.bert.modeling_bert", "hf")
    known = (
        bert_module.BertForSequenceClassification,
        bert_module.BertForMaskedLM,
        bert_module.BertModel,
    )
    if not isinstance(model, known):
        raise ValueError(
            "model must be a BertModel, BertForMaskedLM or "
            f"BertForSequenceClassification, got {type(model).__name__}"
        )
    hf = model.config
    _refuse_unless_encoder(hf)
    device, dtype = _placement(model)
    bert = model if isinstance(model, bert_module.BertModel) else model.bert
    masked_lm = isinstance(model, bert_module.BertForMaskedLM)
    tied = bool(hf.tie_word_embeddings)  # no output layer but MLM's
    if masked_lm:  # tied if the decoder's weight is the embedding's
        decoder = model.cls.predictions.decoder
        tied = decoder.weight is bert.embeddings.word_embeddings.weight
    config = _config(hf, pad_id=pad_id, mlm_head=masked_lm,
                     pooler=bert.pooler is not None, tied=tied)  # fmt: skip
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        ours = EncoderModel(config).to(device=device, dtype=dtype)
        _load_encoder(ours, bert)
        if masked_lm:
            _load_mlm_head(ours, model.cls)
        if isinstance(model, bert_module.BertForSequenceClassification):
            ours = EncoderClassifier(
                ours, hf.num_labels, dropout=model.dropout.p
            )
            _copy(ours.head, model.classifier, "classifier")
    return ours.train(model.training)
