"""Images as sequences of tokens (chapter 11): cut an image into
non-overlapping patches, flatten each and project it to ``d_model``
(:class:`PatchEmbedding`), then add a learned position per patch
(:class:`PatchPositions`), as the Vision Transformer does (Dosovitskiy
et al., 2021).

Images are (B, K, Hi, Wi): K channels (1 for grey), Hi x Wi pixels. A
patch is P_h x P_w pixels; the image holds an h x w grid of them,
h = Hi / P_h and w = Wi / P_w, read row by row into N = h * w tokens.
"""

import torch
from torch import Tensor, nn

from transformer_lite.checks import check_int

__all__ = [
    "POSITION_KINDS",
    "PatchEmbedding",
    "PatchPositions",
    "check_images",
    "patch_grid",
    "to_patches",
    "window_mask",
]

POSITION_KINDS = ("1d", "2d")  # a vector per patch; a row plus a column


def _pair(name: str, value: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value!r}")
    for i, v in enumerate(value):
        check_int(f"{name}[{i}]", v, low=1)
    return tuple(value)


def patch_grid(
    image_size: int | tuple[int, int], patch_size: int | tuple[int, int]
) -> tuple[int, int]:
    """(h, w): patches per column and per row of an image. Raises a
    ``ValueError`` unless the patches tile the image exactly."""
    Hi, Wi = _pair("image_size", image_size)
    Ph, Pw = _pair("patch_size", patch_size)
    if Hi % Ph or Wi % Pw:
        raise ValueError(
            f"patches of {Ph}x{Pw} pixels must tile the {Hi}x{Wi} image "
            "exactly"
        )
    return Hi // Ph, Wi // Pw


def check_images(
    images: object, channels: int, image_size: tuple[int, int]
) -> None:
    """Raise a ``ValueError`` unless ``images`` is a floating-point
    tensor of shape (B, ``channels``, Hi, Wi), (Hi, Wi) = ``image_size``."""
    Hi, Wi = image_size
    if not isinstance(images, Tensor) or not images.is_floating_point():
        what = images.dtype if isinstance(images, Tensor) else type(images)
        raise ValueError(f"images must be a floating-point tensor, got {what}")
    if images.dim() != 4 or tuple(images.shape[1:]) != (channels, Hi, Wi):
        raise ValueError(
            f"images must have shape (B, {channels}, {Hi}, {Wi}), got "
            f"{tuple(images.shape)}"
        )
    if images.size(0) == 0:
        raise ValueError("images is an empty batch")


def to_patches(images: Tensor, patch_size: int | tuple[int, int]) -> Tensor:
    """Cut images into flattened patches, row by row; each patch lists
    its pixels channel first, then row, then column (as ``F.unfold``).

    Shape:
        images: (B, K, Hi, Wi); output: (B, N, K * P_h * P_w).
    """
    B, K, Hi, Wi = images.shape
    Ph, Pw = _pair("patch_size", patch_size)
    h, w = patch_grid((Hi, Wi), (Ph, Pw))
    x = images.reshape(B, K, h, Ph, w, Pw)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, h, w, K, P_h, P_w)
    return x.reshape(B, h * w, K * Ph * Pw)  # (B, N, K*P_h*P_w)


class PatchEmbedding(nn.Module):
    """Flattened patches times one matrix: x_p E + b, a token per patch.

    The same as a convolution whose kernel and stride are the patch
    size (``nn.Conv2d(K, C, P, stride=P)``), written as the paper's
    equation.

    Args:
        patch_size: P, or (P_h, P_w).
        in_channels: K, channels of the image.
        d_model: C, width of each token.

    Shape:
        images: (B, K, Hi, Wi); output: (B, N, C), N = h * w.
    """

    def __init__(
        self,
        patch_size: int | tuple[int, int],
        in_channels: int,
        d_model: int,
    ) -> None:
        super().__init__()
        self.patch_size = _pair("patch_size", patch_size)
        check_int("in_channels", in_channels, low=1)
        check_int("d_model", d_model, low=1)
        Ph, Pw = self.patch_size
        self.proj = nn.Linear(in_channels * Ph * Pw, d_model)

    def forward(self, images: Tensor) -> Tensor:
        patches = to_patches(images, self.patch_size)  # (B, N, K*P_h*P_w)
        return self.proj(patches)  # (B, N, C)


class PatchPositions(nn.Module):
    """Learned positions for an h x w grid of patches, added to the
    patch tokens.

    ``kind="1d"``: one vector per patch, N = h * w of them, which know
    nothing of rows and columns until training teaches them (the ViT
    paper's choice). ``kind="2d"``: a vector per row plus one per
    column, h + w of them.

    Args:
        grid: (h, w), patches per column and per row.
        d_model: C.
        kind: one of :data:`POSITION_KINDS`.

    Shape:
        x: (B, N, C); output: (B, N, C); :meth:`table`: (N, C).
    """

    def __init__(
        self, grid: tuple[int, int], d_model: int, kind: str = "1d"
    ) -> None:
        super().__init__()
        if kind not in POSITION_KINDS:
            raise ValueError(
                f"kind must be one of {POSITION_KINDS}, got {kind!r}"
            )
        self.grid = h, w = _pair("grid", grid)
        check_int("d_model", d_model, low=1)
        self.n_patches = h * w  # N
        self.kind = kind
        std = 0.02  # small, as the paper's initialisation
        if kind == "1d":
            self.patches = nn.Parameter(torch.randn(h * w, d_model) * std)
        else:
            self.rows = nn.Parameter(torch.randn(h, d_model) * std)
            self.columns = nn.Parameter(torch.randn(w, d_model) * std)

    def table(self) -> Tensor:
        """Every patch's position vector, row by row: (N, C)."""
        if self.kind == "1d":
            return self.patches
        grid = self.rows[:, None] + self.columns[None]  # (h, w, C)
        return grid.flatten(0, 1)  # (N, C)

    def forward(self, x: Tensor) -> Tensor:
        N = self.grid[0] * self.grid[1]
        if x.dim() != 3 or x.size(1) != N:
            raise ValueError(
                f"x must be (B, {N}, C) patch tokens, got {tuple(x.shape)}"
            )
        return x + self.table()

    def tiled(self, grid: tuple[int, int]) -> "PatchPositions":
        """New positions for a larger grid, made of copies of these: the
        patch at (i, j) starts from the one at (i mod h, j mod w). A
        model trained on one digit can so start reading a row of them
        (chapter 11); training then tells the copies apart."""
        h, w = self.grid
        H, W = _pair("grid", grid)
        if H % h or W % w:
            raise ValueError(
                f"a {H}x{W} grid is not made of whole {h}x{w} grids"
            )
        d_model = self.table().size(-1)
        tiled = PatchPositions((H, W), d_model, self.kind)
        with torch.no_grad():
            if self.kind == "1d":
                table = self.patches.view(h, w, d_model)
                table = table.repeat(H // h, W // w, 1)  # (H, W, C)
                tiled.patches.copy_(table.flatten(0, 1))
            else:
                tiled.rows.copy_(self.rows.repeat(H // h, 1))
                tiled.columns.copy_(self.columns.repeat(W // w, 1))
        return tiled.to(self.table().device)


def window_mask(
    grid: tuple[int, int],
    window: tuple[int, int],
    *,
    class_tokens: bool = False,
) -> Tensor:
    """Attention inside windows only: True where two tokens belong to the
    same ``window`` (h_w x w_w patches) of the ``grid``; the windows tile
    the grid. With ``class_tokens``, the tokens start with one class
    token per window (window k's first), which belongs to its window. An
    encoder under this mask reads each window as if it were an image of
    its own.

    Shape:
        output: (L, L), L = N patches (row by row), plus one class
        token per window first.
    """
    h, w = _pair("grid", grid)
    hw, ww = _pair("window", window)
    if h % hw or w % ww:
        raise ValueError(
            f"windows of {hw}x{ww} patches must tile the {h}x{w} grid"
        )
    rows = torch.arange(h).repeat_interleave(w)  # (N,) each patch's row
    columns = torch.arange(w).repeat(h)  # (N,)
    cell = (rows // hw) * (w // ww) + columns // ww  # (N,) its window
    if class_tokens:
        n_windows = (h // hw) * (w // ww)
        cell = torch.cat([torch.arange(n_windows), cell])  # (L,)
    return cell[:, None] == cell[None]  # (L, L)
