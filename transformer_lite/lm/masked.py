"""An encoder-only model trained by masked language modelling, BERT's
shape (chapter 13; Devlin et al., 2019).

Token, position and (optionally) token-type vectors are summed, then
normalised, then dropped out; the encoder stack of chapter 5 runs
post-LN over them, every position seeing every other one that is not
padding. Two heads read the result: the masked-LM head predicts the
token at each place (dense, activation, LayerNorm, then the output
layer, tied to the token embedding, with its own bias), and the pooler
turns the first position, BERT's [CLS], into one vector per sequence
(dense, then tanh). :class:`EncoderClassifier` puts a linear layer on
that vector to fine-tune the encoder on labelled sequences.
"""

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from transformer_lite.attention import check_kernel, set_attention_kernel
from transformer_lite.checks import (
    check_bool,
    check_heads,
    check_int,
    check_real,
)
from transformer_lite.layers import (
    Encoder,
    activation_module,
    check_activation,
    check_norm_eps,
    glorot_init,
)
from transformer_lite.masks import padding_mask
from transformer_lite.model import ModelBasics
from transformer_lite.tokens import (
    PAD_ID,
    check_ids_here,
    check_token_tensor,
)

__all__ = [
    "EncoderClassifier",
    "EncoderConfig",
    "EncoderEmbedding",
    "EncoderModel",
    "MaskedLMHead",
    "Pooler",
    "make_encoder",
]

BERT_NORM_EPS = 1e-12  # BERT's LayerNorm epsilon


@dataclass
class EncoderConfig:
    """Every size and switch of an :class:`EncoderModel`.

    The defaults are a small model that trains on a CPU in minutes;
    BERT-base is ``n_layers=12, d_model=768, d_ff=3072, n_heads=12,
    type_vocab=2``.
    """

    vocab: int  # V, the number of token ids
    n_layers: int = 2  # N, encoder layers
    d_model: int = 128  # C, width of the residual stream
    d_ff: int = 512  # inner width of the feed-forward networks
    n_heads: int = 4  # H, attention heads; must divide d_model
    dropout: float = 0.1  # one rate for every dropout
    max_len: int = 512  # rows of the learned position table (BERT: 512)
    type_vocab: int = 0  # token types (segments); 0: none; BERT: 2
    pad_id: int = PAD_ID  # padding: masked out as a key in attention
    activation: str = "gelu"  # layers.ACTIVATIONS; BERT's erf GELU
    norm_eps: float = BERT_NORM_EPS  # every LayerNorm's epsilon
    inner_dropout: bool = True  # dropout inside the FFN; BERT: none
    tie_embeddings: bool = True  # the MLM output reuses the embedding
    mlm_head: bool = True  # predict tokens (False: HF's BertModel)
    pooler: bool = True  # dense + tanh on position 0 (False: no pooled)
    kernel: str = "fused"  # attention.KERNELS

    def __post_init__(self) -> None:
        for name in ("vocab", "n_layers", "d_model", "d_ff", "n_heads",
                     "max_len"):  # fmt: skip
            check_int(name, getattr(self, name), low=1)
        check_int("type_vocab", self.type_vocab, low=0)
        check_real("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        for name in ("tie_embeddings", "mlm_head", "pooler", "inner_dropout"):
            check_bool(name, getattr(self, name))
        check_norm_eps(self.norm_eps)
        check_activation(self.activation)
        check_kernel(self.kernel)
        check_heads(self.d_model, self.n_heads)
        check_int("pad_id", self.pad_id)
        if not 0 <= self.pad_id < self.vocab:
            raise ValueError(
                f"pad_id {self.pad_id} is outside the vocabulary "
                f"[0, {self.vocab - 1}] (vocab={self.vocab})"
            )

    def to_dict(self) -> dict:
        return asdict(self)


class EncoderEmbedding(nn.Module):
    """BERT's input: token + token type + position vectors, then
    LayerNorm, then dropout (the Transformer of chapter 5 scales the
    token vectors by sqrt(d_model) and normalises nothing here).

    Without token types (``type_vocab=0``) the sum has two terms; with
    them and no ``token_types`` given, every token is of type 0.

    Shape:
        tokens: (B, L); token_types: (B, L) or None; output: (B, L, C).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        c = config
        self.token = nn.Embedding(c.vocab, c.d_model)
        self.position = nn.Embedding(c.max_len, c.d_model)
        self.token_type = (
            nn.Embedding(c.type_vocab, c.d_model) if c.type_vocab else None
        )
        self.norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, tokens: Tensor, token_types: Tensor | None) -> Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.token(tokens)  # (B, L, C)
        if self.token_type is not None:
            if token_types is None:
                token_types = torch.zeros_like(tokens)  # (B, L)
            x = x + self.token_type(token_types)
        x = x + self.position(positions)  # (L, C) broadcast over B
        return self.dropout(self.norm(x))


class MaskedLMHead(nn.Module):
    """Scores of every token id at every place: dense, activation,
    LayerNorm, then ``output``, a linear layer to the vocabulary (its
    weight the token embedding when tied; its bias its own).

    Shape:
        x: (B, L, C); output: (B, L, V).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        c = config
        self.dense = nn.Linear(c.d_model, c.d_model)
        self.activation = activation_module(c.activation)
        self.norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.output = nn.Linear(c.d_model, c.vocab)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.activation(self.dense(x)))
        return self.output(x)  # (B, L, V)


class Pooler(nn.Module):
    """One vector per sequence: tanh(W h_0 + b), h_0 the hidden state of
    the first position (BERT's [CLS]).

    Shape:
        x: (B, L, C); output: (B, C).
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # (B, C)


class EncoderModel(ModelBasics, nn.Module):
    """BERT's shape: :class:`EncoderEmbedding`, the post-LN encoder
    stack under the padding mask, the masked-LM head and the pooler.

    ``forward`` returns the masked-LM logits, so that ``fit`` with
    ``supervised_loss(nn.CrossEntropyLoss(reduction="sum"))`` trains it
    on the batches of :func:`~transformer_lite.lm.masking.mask_tokens`.
    Every position whose token is ``config.pad_id`` is masked out as a
    key (:meth:`padding_mask`); a padded row's real positions compute
    what the row computes unpadded.

    Shape:
        tokens, token_types: (B, L); output: (B, L, V).
        :meth:`hidden_states`: (B, L, C); :meth:`pooled`: (B, C).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = c = config
        self.check_ids = False  # True: check ids on a GPU, in graphs too
        self.embedding = EncoderEmbedding(c)
        self.encoder = Encoder(
            c.n_layers,
            c.d_model,
            c.n_heads,
            c.d_ff,
            c.dropout,
            norm_first=False,  # post-LN, as BERT
            activation=c.activation,
            inner_dropout=c.inner_dropout,
            norm_eps=c.norm_eps,
        )
        self.mlm_head = MaskedLMHead(c) if c.mlm_head else None
        self.pooler = Pooler(c.d_model) if c.pooler else None
        self._init_parameters()
        if c.tie_embeddings and self.mlm_head is not None:
            self.mlm_head.output.weight = self.embedding.token.weight
        set_attention_kernel(self, c.kernel)

    def _init_parameters(self) -> None:
        """:func:`~transformer_lite.layers.glorot_init`, except the three
        tables summed at the input: each starts N(0, 1/C), so that none
        outweighs the others (and the tied output's first scores, on a
        normalised hidden state, have unit variance)."""
        glorot_init(self, ["embedding"])
        e, std = self.embedding, self.config.d_model**-0.5
        for table in (e.token, e.position, e.token_type):
            if table is not None:
                nn.init.normal_(table.weight, std=std)

    def padding_mask(self, tokens: Tensor) -> Tensor:
        """True where a key is a real token (not ``config.pad_id``).

        Shape:
            tokens: (B, L); output: (B, 1, L).
        """
        return padding_mask(tokens, self.config.pad_id)  # (B, 1, L)

    def _check(self, tokens: Tensor, token_types: Tensor | None) -> None:
        """Shapes and dtypes always; the ids' range where reading them
        is free (:func:`~transformer_lite.tokens.check_ids_here`)."""
        c = self.config
        check_token_tensor(tokens, "tokens")
        if tokens.numel() == 0:
            raise ValueError(f"tokens is empty: shape {tuple(tokens.shape)}")
        if tokens.size(1) > c.max_len:
            raise ValueError(
                f"tokens has {tokens.size(1)} positions, more than the "
                f"position table holds (max_len={c.max_len})"
            )
        check_ids_here(tokens, c.vocab, "tokens", self.check_ids)
        if token_types is None:
            return
        if c.type_vocab == 0:
            raise ValueError(
                "this model has no token types (type_vocab=0): pass "
                "token_types=None, or build it with type_vocab >= 1"
            )
        check_token_tensor(token_types, "token_types")
        if token_types.shape != tokens.shape:
            raise ValueError(
                f"token_types must have the shape of tokens "
                f"{tuple(tokens.shape)}, got {tuple(token_types.shape)}"
            )
        check_ids_here(token_types, c.type_vocab, "token_types",
                       self.check_ids)  # fmt: skip

    def layer_outputs(
        self, tokens: Tensor, token_types: Tensor | None = None
    ) -> list[Tensor]:
        """The embeddings' output, then every layer's: N + 1 tensors
        (Hugging Face's ``output_hidden_states``), to probe each layer.

        Shape:
            tokens, token_types: (B, L); each output: (B, L, C).
        """
        self._check(tokens, token_types)
        mask = self.padding_mask(tokens)  # (B, 1, L)
        outputs = [self.embedding(tokens, token_types)]  # (B, L, C)
        for layer in self.encoder.layers:
            outputs.append(layer(outputs[-1], mask))  # (B, L, C)
        return outputs

    def hidden_states(
        self, tokens: Tensor, token_types: Tensor | None = None
    ) -> Tensor:
        """The last layer's output at every position.

        Shape:
            tokens, token_types: (B, L); output: (B, L, C).
        """
        self._check(tokens, token_types)
        x = self.embedding(tokens, token_types)  # (B, L, C)
        return self.encoder(x, self.padding_mask(tokens))

    def pooled(
        self, tokens: Tensor, token_types: Tensor | None = None
    ) -> Tensor:
        """The pooler's vector: tanh of a dense layer on the first
        position's hidden state (BERT's [CLS]).

        Shape:
            tokens, token_types: (B, L); output: (B, C).
        """
        if self.pooler is None:
            raise ValueError(
                "this model has no pooler (pooler=False): build it with "
                "pooler=True, or read hidden_states()[:, 0]"
            )
        return self.pooler(self.hidden_states(tokens, token_types))

    def forward(
        self, tokens: Tensor, token_types: Tensor | None = None
    ) -> Tensor:
        """The masked-LM scores of every token id at every position.

        Shape:
            tokens, token_types: (B, L); output: (B, L, V).
        """
        if self.mlm_head is None:
            raise ValueError(
                "this model has no masked-LM head (mlm_head=False): call "
                "hidden_states() or pooled()"
            )
        return self.mlm_head(self.hidden_states(tokens, token_types))


class EncoderClassifier(ModelBasics, nn.Module):
    """An :class:`EncoderModel` and a head on its pooled vector: dropout,
    then a linear layer to ``n_classes`` scores (BERT's fine-tuning).

    The encoder is the module passed in, not a copy: its weights are the
    classifier's and training changes them (pass ``copy.deepcopy(model)``
    to keep the pretrained one). Its masked-LM head, if it has one, stays
    in place unused: it gets no gradient, and ``count_parameters``
    counts it (build the encoder with ``mlm_head=False`` to drop it).

    Args:
        encoder: the model whose pooled vector is classified; it needs a
            pooler.
        n_classes: the number of classes.
        dropout: on the pooled vector; None: the encoder's rate.

    Shape:
        tokens, token_types: (B, L); output: (B, n_classes).
    """

    def __init__(
        self,
        encoder: EncoderModel,
        n_classes: int,
        dropout: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(encoder, EncoderModel):
            raise ValueError(
                "encoder must be an EncoderModel, got "
                f"{type(encoder).__name__}"
            )
        if encoder.pooler is None:
            raise ValueError(
                "the encoder has no pooler (pooler=False); the classifier "
                "reads the pooled vector: build the encoder with "
                "pooler=True"
            )
        check_int("n_classes", n_classes, low=1)
        if dropout is None:
            dropout = encoder.config.dropout
        check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.config.d_model, n_classes)
        glorot_init(self.head)  # the encoder keeps its weights
        self.head.to(encoder.device, encoder.embedding.token.weight.dtype)

    def forward(
        self, tokens: Tensor, token_types: Tensor | None = None
    ) -> Tensor:
        pooled = self.encoder.pooled(tokens, token_types)  # (B, C)
        return self.head(self.dropout(pooled))  # (B, n_classes)


def make_encoder(vocab: int, **config_fields) -> EncoderModel:
    """Build an :class:`EncoderModel`; keyword arguments are
    :class:`EncoderConfig` fields."""
    return EncoderModel(EncoderConfig(vocab, **config_fields))
