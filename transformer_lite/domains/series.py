"""Time series as patches (chapter 14): PatchTST (Nie et al., 2023), "A
Time Series is Worth 64 Words", on RevIN's normalised windows (Kim et
al., 2022); its baselines live in :mod:`~transformer_lite.domains.baselines`.

A forecaster reads a window of L past values of C channels and writes
the next H:

1. channel independence: each channel is a series of its own,
   (B, L, C) -> (B C, L), all read by the same weights;
2. RevIN: each window minus its mean, over its standard deviation,
   (x - mu) / sigma per series and channel, undone on the forecast;
3. patches of P values every S steps, the end padded with S copies of
   the last value, N = (L - P) // S + 2 of them;
4. each patch a token: a linear map P -> C plus a learned position;
5. chapter 5's encoder over the N tokens (no mask, or a causal one);
6. all N outputs flattened, one linear map to the H values.

Where we differ from the paper: LayerNorm (the paper's encoder uses
BatchNorm), pre-LN.
"""

from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_lite.checks import (
    check_bool,
    check_heads,
    check_int,
    check_real,
)
from transformer_lite.layers import Encoder, glorot_init
from transformer_lite.masks import causal_mask
from transformer_lite.model import ModelBasics

__all__ = [
    "Moments",
    "PatchForecaster",
    "RevIN",
    "check_window",
    "n_patches",
    "to_patches",
]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def reads_values(x: Tensor, always: bool = False) -> bool:
    """Whether to read ``x``'s values here: always on the CPU outside a
    compiled graph; on a GPU (a sync point) only when asked."""
    cpu = x.device.type == "cpu" and not torch.compiler.is_compiling()
    return always or cpu


def check_window(
    x: object,
    name: str = "x",
    *,
    length: int | None = None,
    channels: int | None = None,
    values: bool = True,
) -> None:
    """Raise a ``ValueError`` naming what is wrong unless ``x`` is a
    (B, L, C) floating tensor, with L = ``length`` and C = ``channels``
    when given; with ``values``, also that it holds no NaN or infinity
    (reading them waits for a GPU)."""
    want = f"(B, {length or 'L'}, {channels or 'C'})"
    if not isinstance(x, Tensor) or x.dtype not in FLOATS:
        what = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"{name} must be a {want} tensor of floating-point values, "
            f"got {what}"
        )
    wrong_length = length is not None and x.dim() == 3 and x.size(1) != length
    wrong_channels = (
        channels is not None and x.dim() == 3 and x.size(2) != channels
    )
    if x.dim() != 3 or wrong_length or wrong_channels:
        raise ValueError(
            f"{name} must have shape {want}: batch, time, channels, got "
            f"{tuple(x.shape)}"
        )
    if values and x.numel():
        bad = ~torch.isfinite(x)
        if bool(bad.any()):  # a sync point on a GPU
            b, t, c = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name} holds {float(x[b, t, c])} at batch {b}, time {t}, "
                f"channel {c}: every value must be a finite number (fill "
                "or drop missing values before the model)"
            )


class Moments(NamedTuple):
    """A window's mean and standard deviation, per series and channel.

    Shape:
        mean, std: (B, 1, C).
    """

    mean: Tensor
    std: Tensor


class RevIN(nn.Module):
    """Reversible instance normalisation (Kim et al., 2022): each input
    window is standardised by its own statistics over time, and the
    forecast is mapped back with the same ones.

    .. math::

        z = \\gamma \\frac{x - \\mu}{\\sqrt{\\sigma^2 + \\epsilon}} + \\beta,
        \\qquad \\hat y = \\frac{y - \\beta}{\\gamma}
        \\sqrt{\\sigma^2 + \\epsilon} + \\mu

    The statistics come from the input window only, never from the
    values to be forecast. A level or a scale that shifts from one
    window to the next is then no longer something to learn.

    Args:
        n_channels: C; the affine gamma and beta have one value each.
        eps: added to the variance (a constant window has none).
        affine: learn gamma and beta (starting at 1 and 0); False: none.

    Shape:
        x: (B, L, C); z: (B, L, C); y and the forecast: (B, H, C).
    """

    def __init__(
        self, n_channels: int, eps: float = 1e-5, affine: bool = True
    ) -> None:
        super().__init__()
        check_int("n_channels", n_channels, low=1)
        self.eps = check_real("eps", eps, low=0.0)
        if self.eps == 0.0:
            raise ValueError(
                "eps must be positive: a constant window has no variance"
            )
        check_bool("affine", affine)
        self.gamma = nn.Parameter(torch.ones(n_channels)) if affine else None
        self.beta = nn.Parameter(torch.zeros(n_channels)) if affine else None

    def normalise(self, x: Tensor) -> tuple[Tensor, Moments]:
        """The standardised window and the moments that undo it."""
        mean = x.mean(dim=1, keepdim=True)  # (B, 1, C)
        var = x.var(dim=1, keepdim=True, unbiased=False)  # (B, 1, C)
        std = torch.sqrt(var + self.eps)
        z = (x - mean) / std
        if self.gamma is not None:
            z = z * self.gamma + self.beta
        return z, Moments(mean, std)

    def denormalise(self, y: Tensor, moments: Moments) -> Tensor:
        """``y`` back in the window's own level and scale."""
        if self.gamma is not None:
            y = (y - self.beta) / self.gamma
        return y * moments.std + moments.mean


def n_patches(length: int, patch_len: int, stride: int) -> int:
    """N = (L - P) // S + 2: the patches of a window of L values, its
    end padded with S copies of the last value."""
    if length < patch_len:
        raise ValueError(
            f"a window of {length} values is shorter than one patch of "
            f"{patch_len}: choose input_len >= patch_len"
        )
    return (length - patch_len) // stride + 2


def to_patches(series: Tensor, patch_len: int, stride: int) -> Tensor:
    """Patches of ``patch_len`` values every ``stride`` steps, after S
    copies of the last value are appended (so the window's last values
    also start a patch).

    Shape:
        series: (B, L); output: (B, N, P), N = :func:`n_patches`.
    """
    n_patches(series.size(-1), patch_len, stride)
    last = series[:, -1:].expand(-1, stride)  # (B, S)
    padded = torch.cat([series, last], dim=1)  # (B, L + S)
    return padded.unfold(1, patch_len, stride)  # (B, N, P)


class PatchForecaster(ModelBasics, nn.Module):
    """Forecast H values of C channels from L, PatchTST's way (see the
    module's docstring for the six steps).

    Args:
        input_len: L, the window read.
        horizon: H, the values forecast.
        n_channels: C.
        patch_len, stride: P and S (16 and 8 in the paper).
        d_model, n_heads, n_layers, d_ff, dropout: the encoder's sizes.
        causal: a causal mask over the patches: patch k's output reads
            patches 0..k only (RevIN's moments still come from the whole
            window, and the head reads every patch).
        revin: normalise each window (True, the paper) or not.
        affine: RevIN's learned gamma and beta.

    Attributes:
        check_values: also read the inputs' values (NaN) on a GPU, where
            it costs a sync point; on the CPU they are always read.

    Shape:
        x: (B, L, C); output: (B, H, C).
        :meth:`encode`: (B', N, P) patches -> (B', N, C_model).
    """

    def __init__(
        self,
        input_len: int,
        horizon: int,
        n_channels: int = 1,
        *,
        patch_len: int = 16,
        stride: int = 8,
        d_model: int = 128,
        n_heads: int = 16,
        n_layers: int = 3,
        d_ff: int = 256,
        dropout: float = 0.2,
        causal: bool = False,
        revin: bool = True,
        affine: bool = True,
    ) -> None:
        super().__init__()
        for name, value in [
            ("input_len", input_len),
            ("horizon", horizon),
            ("n_channels", n_channels),
            ("patch_len", patch_len),
            ("stride", stride),
            ("d_model", d_model),
            ("n_heads", n_heads),
            ("n_layers", n_layers),
            ("d_ff", d_ff),
        ]:
            check_int(name, value, low=1)
        check_heads(d_model, n_heads)
        check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        check_bool("causal", causal)
        check_bool("revin", revin)
        self.input_len, self.horizon = input_len, horizon
        self.n_channels = n_channels
        self.patch_len, self.stride = patch_len, stride
        self.n_patches = n_patches(input_len, patch_len, stride)
        self.causal = causal
        self.revin = RevIN(n_channels, affine=affine) if revin else None
        self.embed = nn.Linear(patch_len, d_model)
        N = self.n_patches
        self.positions = nn.Parameter(torch.randn(N, d_model) * 0.02)
        self.dropout = nn.Dropout(dropout)
        self.encoder = Encoder(
            n_layers, d_model, n_heads, d_ff, dropout, norm_first=True
        )
        self.head = nn.Linear(N * d_model, horizon)
        self.check_values = False
        glorot_init(self, ["positions", "revin"])

    def encode(self, patches: Tensor) -> Tensor:
        """The encoder's output at every patch token.

        Shape:
            patches: (B', N, P); output: (B', N, d_model).
        """
        x = self.embed(patches) + self.positions  # (B', N, d_model)
        mask = None
        if self.causal:
            mask = causal_mask(self.n_patches, patches.device)  # (1, N, N)
        return self.encoder(self.dropout(x), mask)

    def forward(self, x: Tensor) -> Tensor:
        check_window(
            x,
            length=self.input_len,
            channels=self.n_channels,
            values=reads_values(x, self.check_values),
        )
        x = x.to(self.embed.weight.dtype)
        B, L, C = x.shape
        moments = None
        if self.revin is not None:
            x, moments = self.revin.normalise(x)
        series = x.transpose(1, 2).reshape(B * C, L)  # (B C, L)
        patches = to_patches(series, self.patch_len, self.stride)
        h = self.encode(patches)  # (B C, N, d_model)
        y = self.head(h.flatten(1))  # (B C, H)
        y = y.view(B, C, self.horizon).transpose(1, 2)  # (B, H, C)
        if moments is not None:
            y = self.revin.denormalise(y, moments)
        return y
