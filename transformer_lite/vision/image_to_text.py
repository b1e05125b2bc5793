"""From an image to words (chapter 11): a ViT encoder reads the image,
and its patch outputs are the memory that the decoder of chapter 5
attends to, word by word, through cross-attention.

Everything after the memory is the text model's: target embeddings and
positions, the :class:`~transformer_lite.layers.Decoder`, the output
projection, the key/value cache; :func:`~transformer_lite.decoding.\
greedy_decode` and :func:`~transformer_lite.decoding.beam_search` decode
it unchanged, asking the model for its memory mask
(:meth:`ImageToText.source_mask`: every patch may be attended to).
"""

import math
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from transformer_lite.checks import check_heads, check_int, check_real
from transformer_lite.layers import Decoder, glorot_init
from transformer_lite.model import TextDecoding
from transformer_lite.positional import SinusoidalPositionalEncoding
from transformer_lite.tokens import PAD_ID
from transformer_lite.vision.patches import (
    PatchPositions,
    _pair,
    check_images,
    window_mask,
)
from transformer_lite.vision.vit import VisionTransformer, ViTConfig

__all__ = ["ImageToText", "ImageToTextConfig"]


@dataclass
class ImageToTextConfig:
    """An image encoder (a :class:`ViTConfig`, whose ``n_classes`` is
    ignored) and the text decoder's sizes; the decoder has the
    encoder's width ``d_model``."""

    tgt_vocab: int  # V, the number of target token ids
    vision: ViTConfig = field(default_factory=ViTConfig)  # the encoder
    window: tuple[int, int] | None = None  # attention windows, in patches
    n_layers: int = 2  # decoder layers
    d_ff: int = 128  # inner width of the decoder's feed-forward networks
    n_heads: int = 4  # decoder heads; must divide d_model
    dropout: float = 0.1  # the decoder's dropout
    max_len: int = 32  # longest output, BOS and EOS included
    pad_id: int = PAD_ID  # padding id of the targets

    def __post_init__(self) -> None:
        if not isinstance(self.vision, ViTConfig):
            raise ValueError(
                f"vision must be a ViTConfig, got {type(self.vision)}"
            )
        for name in ("tgt_vocab", "n_layers", "d_ff", "n_heads", "max_len"):
            check_int(name, getattr(self, name), low=1)
        check_real("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        check_int("pad_id", self.pad_id, low=0, high=self.tgt_vocab - 1)
        if self.window is not None:
            self.window = _pair("window", self.window)
            window_mask(self.vision.grid, self.window)  # tiles the grid?
        check_heads(self.d_model, self.n_heads)

    @property
    def d_model(self) -> int:
        """C, the encoder's width and the decoder's."""
        return self.vision.d_model

    def to_dict(self) -> dict:
        return asdict(self)


class ImageToText(TextDecoding, nn.Module):
    """A ViT encoder (no class token, no head) and the Transformer's
    decoder: ``encode`` an image to memory, ``decode`` words from it.

    With ``config.window``, the encoder reads every window as an image
    of its own: each window gets a copy of the class token, and a token
    attends only to the tokens of its window. The memory is then the
    windows' class tokens, then the patches. It gets learned positions
    of its own (``memory_positions``, rows and columns of the whole
    grid, and ``window_positions`` for the class tokens), so that the
    decoder can tell the windows apart.

    Shares the Transformer's text side
    (:class:`~transformer_lite.model.TextDecoding`: ``decode``, with a
    ``cache``, and ``new_cache``) and speaks the rest of the interface
    that decoding uses: ``encode``, ``generator``, ``config``, and
    ``source_mask``.

    Shape:
        images: (B, K, Hi, Wi); tgt: (B, T) token ids; memory: (B, S, C),
        S = N patches, or n_windows + N; output: (B, T, V).
    """

    def __init__(self, config: ImageToTextConfig) -> None:
        super().__init__()
        self.config = c = config
        self.check_ids = False  # True: check ids on a GPU, in graphs too
        self.encoder = VisionTransformer(
            ViTConfig(**{**c.vision.to_dict(), "n_classes": 0})
        )
        self.memory_positions = PatchPositions(c.vision.grid, c.d_model, "2d")
        mask = None  # (n_windows + N, n_windows + N), or no mask
        if c.window is not None:
            mask = window_mask(c.vision.grid, c.window, class_tokens=True)
        self.register_buffer("window_mask", mask, persistent=False)
        self.n_windows = (
            0
            if mask is None
            else mask.size(0) - (self.memory_positions.n_patches)
        )
        self.window_positions = nn.Parameter(  # (n_windows, C)
            torch.randn(self.n_windows, c.d_model) * 0.02
        )
        self.tgt_embed = nn.Embedding(c.tgt_vocab, c.d_model)
        self.positional = SinusoidalPositionalEncoding(
            c.d_model, c.dropout, c.max_len
        )
        self.decoder = Decoder(
            c.n_layers,
            c.d_model,
            c.n_heads,
            c.d_ff,
            c.dropout,
            c.vision.norm_first,
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab)
        # the encoder is initialised by the ViT; the rest keep their own
        glorot_init(self, ["encoder", "memory_positions", "window_positions"])

    @classmethod
    def from_vit(
        cls, vit: VisionTransformer, config: ImageToTextConfig
    ) -> "ImageToText":
        """A model whose encoder starts from a trained ViT's patch
        embedding, class token and layers; on a larger image its
        positions start as copies of the ViT's
        (:meth:`~transformer_lite.vision.patches.PatchPositions.tiled`).
        The patch size, widths and layers must match."""
        model = cls(config)
        mine, theirs = config.vision, vit.config
        same = ("patch_size", "in_channels", "n_layers", "d_model")
        same += ("d_ff", "n_heads", "norm_first", "position")
        differ = [n for n in same if getattr(mine, n) != getattr(theirs, n)]
        if differ:
            raise ValueError(
                f"the ViT's {', '.join(differ)} differ from config.vision"
            )
        encoder = model.encoder
        encoder.patch_embed.load_state_dict(vit.patch_embed.state_dict())
        encoder.encoder.load_state_dict(vit.encoder.state_dict())
        with torch.no_grad():
            encoder.class_token.copy_(vit.class_token)
        encoder.positions = vit.positions.tiled(mine.grid)
        return model

    def source_mask(self, images: Tensor) -> Tensor:
        """Every memory position may be attended to: all True (B, 1, S).
        Checks ``images`` (decoding calls it for its memory mask)."""
        v = self.config.vision
        check_images(images, v.in_channels, v.image_size)
        S = self.n_windows + self.memory_positions.n_patches
        return torch.ones(
            images.size(0), 1, S, dtype=torch.bool, device=images.device
        )

    def encode(self, images: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Images (B, K, Hi, Wi) -> memory (B, S, C): the windows' class
        tokens (if any) and the patch outputs, plus the memory's
        positions. ``src_mask`` is accepted for the decoding interface;
        the encoder's own mask is the windows."""
        n = self.n_windows
        tokens = self.encoder.features(
            images, class_tokens=n, mask=self.window_mask
        )  # (B, n + N, C)
        windows = tokens[:, :n] + self.window_positions  # (B, n, C)
        patches = self.memory_positions(tokens[:, n:])  # (B, N, C)
        return torch.cat([windows, patches], dim=1)  # (B, n + N, C)

    def embed_target(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """Target embeddings times sqrt(d_model), plus positions."""
        x = self.tgt_embed(tokens) * math.sqrt(self.config.d_model)
        return self.positional(x, offset)  # (B, T, C)

    def forward(self, images: Tensor, tgt: Tensor) -> Tensor:
        if images.size(0) != tgt.size(0):
            raise ValueError(
                f"images and tgt must share the batch size, got "
                f"{tuple(images.shape)} and {tuple(tgt.shape)}"
            )
        src_mask = self.source_mask(images)  # (B, 1, N)
        memory = self.encode(images)  # (B, N, C)
        hidden = self.decode(memory, src_mask, tgt)  # (B, T, C)
        return self.logits(hidden)  # (B, T, V)
