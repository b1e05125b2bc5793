"""The Vision Transformer (chapter 11): an image as a sequence of patch
tokens, a learned class token in front, learned positions, and the
encoder of chapter 5, unchanged (Dosovitskiy et al., 2021).

The class token's output, after the encoder's final LayerNorm (pre-LN),
goes through one linear layer to the class scores.
"""

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from transformer_lite.checks import (
    check_bool,
    check_heads,
    check_int,
    check_real,
)
from transformer_lite.layers import Encoder, glorot_init
from transformer_lite.model import ModelBasics
from transformer_lite.vision.patches import (
    POSITION_KINDS,
    PatchEmbedding,
    PatchPositions,
    _pair,
    check_images,
    patch_grid,
)

__all__ = ["ViTConfig", "VisionTransformer"]


@dataclass
class ViTConfig:
    """Every size and switch of a :class:`VisionTransformer`.

    The defaults suit scikit-learn's 8x8 digits on a CPU: a 4x4 grid of
    2x2-pixel patches, 4 pre-LN layers of width 64.
    """

    image_size: tuple[int, int] = (8, 8)  # (Hi, Wi) pixels
    patch_size: tuple[int, int] = (2, 2)  # (P_h, P_w) pixels
    in_channels: int = 1  # K, 1 for grey images
    n_classes: int = 10  # classes; 0: no head (an image encoder)
    n_layers: int = 4  # N, encoder layers
    d_model: int = 64  # C, width of every token
    d_ff: int = 128  # inner width of the feed-forward networks
    n_heads: int = 4  # H; must divide d_model
    dropout: float = 0.1  # one rate for every dropout
    norm_first: bool = True  # pre-LN, as the ViT paper
    position: str = "1d"  # learned positions: see POSITION_KINDS

    def __post_init__(self) -> None:
        self.image_size = _pair("image_size", self.image_size)
        self.patch_size = _pair("patch_size", self.patch_size)
        patch_grid(self.image_size, self.patch_size)
        for name in ("in_channels", "n_layers", "d_model", "d_ff", "n_heads"):
            check_int(name, getattr(self, name), low=1)
        check_int("n_classes", self.n_classes, low=0)
        check_real("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        check_bool("norm_first", self.norm_first)
        if self.position not in POSITION_KINDS:
            raise ValueError(
                f"position must be one of {POSITION_KINDS}, got "
                f"{self.position!r}"
            )
        check_heads(self.d_model, self.n_heads)

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w), the patches per column and per row."""
        return patch_grid(self.image_size, self.patch_size)

    def to_dict(self) -> dict:
        return asdict(self)


class VisionTransformer(ModelBasics, nn.Module):
    """Patch tokens, a class token, learned positions, the encoder stack
    and a linear head on the class token's output.

    Shape:
        images: (B, K, Hi, Wi); output: (B, n_classes) class scores.
        :meth:`features`: (B, 1 + N, C), or (B, N, C) without the class
        token.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbedding(
            c.patch_size, c.in_channels, c.d_model
        )
        self.class_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.positions = PatchPositions(c.grid, c.d_model, c.position)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = Encoder(
            c.n_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first
        )
        self.head = nn.Linear(c.d_model, c.n_classes) if c.n_classes else None
        glorot_init(self, ["positions", "class_token"])  # keep their own

    def features(
        self,
        images: Tensor,
        *,
        class_tokens: int = 1,
        mask: Tensor | None = None,
    ) -> Tensor:
        """The encoder's output at every token: ``class_tokens`` copies
        of the class token first (one, the classifier's; none; or one
        per attention window), then the patches row by row. ``mask``
        (True = may attend) restricts the self-attention, e.g. to
        windows (:func:`~transformer_lite.vision.patches.window_mask`).

        Images of any floating dtype (scikit-learn's digits are float64)
        are cast to the model's.

        Shape:
            mask: (L, L) or (B, L, L), L = class_tokens + N;
            output: (B, L, C).
        """
        c = self.config
        check_images(images, c.in_channels, c.image_size)
        check_int("class_tokens", class_tokens, low=0)
        images = images.to(self.class_token.dtype)
        B, L = images.size(0), class_tokens + self.positions.n_patches
        if mask is not None:
            check_window_mask(mask, B, L)
        x = self.positions(self.patch_embed(images))  # (B, N, C)
        if class_tokens:  # the class token carries no position
            cls = self.class_token.expand(B, class_tokens, -1)
            x = torch.cat([cls, x], dim=1)  # (B, class_tokens + N, C)
        if mask is not None:
            mask = mask.to(x.device).expand(B, L, L)  # (B, L, L)
        return self.encoder(self.dropout(x), mask)

    def forward(self, images: Tensor) -> Tensor:
        if self.head is None:
            raise ValueError(
                "this ViT has no head (n_classes=0): call features()"
            )
        return self.head(self.features(images)[:, 0])  # (B, n_classes)


def check_window_mask(mask: object, batch: int, length: int) -> None:
    """Raise a ``ValueError`` unless ``mask`` is a bool (L, L) or
    (B, L, L) tensor for ``length`` tokens and a batch of ``batch``."""
    shapes = ((length, length), (batch, length, length), (1, length, length))
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        what = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a bool tensor (True = may attend), "
                         f"got {what}")  # fmt: skip
    if tuple(mask.shape) not in shapes:
        raise ValueError(
            f"mask must have shape ({length}, {length}) or ({batch}, "
            f"{length}, {length}) for {length} tokens (class tokens and "
            f"patches), got {tuple(mask.shape)}"
        )
