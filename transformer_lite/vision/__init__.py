"""Vision tier (chapter 11): images as patch tokens, the Vision
Transformer classifier, and an image-to-text model whose memory is the
ViT's patch outputs, read by the decoder of chapter 5.

Built on the core only; nothing in the core imports this package.
"""

from transformer_lite.vision.image_to_text import (
    ImageToText,
    ImageToTextConfig,
)
from transformer_lite.vision.patches import (
    POSITION_KINDS,
    PatchEmbedding,
    PatchPositions,
    check_images,
    patch_grid,
    to_patches,
    window_mask,
)
from transformer_lite.vision.vit import VisionTransformer, ViTConfig

__all__ = [
    "POSITION_KINDS",
    "ImageToText",
    "ImageToTextConfig",
    "PatchEmbedding",
    "PatchPositions",
    "ViTConfig",
    "VisionTransformer",
    "check_images",
    "patch_grid",
    "to_patches",
    "window_mask",
]
