"""Rotary position embedding, RoPE (Su et al., 2021; chapter 9).

Each query and key is cut into D/2 pairs of coordinates, and pair i of
the vector at position m is turned by the angle :math:`m\\,\\theta_i`,

.. math::

    \\begin{pmatrix} x'_{2i} \\\\ x'_{2i+1} \\end{pmatrix} =
    \\begin{pmatrix} \\cos m\\theta_i & -\\sin m\\theta_i \\\\
                     \\sin m\\theta_i & \\cos m\\theta_i \\end{pmatrix}
    \\begin{pmatrix} x_{2i} \\\\ x_{2i+1} \\end{pmatrix},
    \\qquad \\theta_i = \\mathrm{base}^{-2i/D},

the rotation :math:`M_{-m}` in the notation of chapter 4, whose
:math:`M_k` turns the other way. A rotation preserves lengths and
:math:`(M_{-m} q)^\\top (M_{-n} k) = q^\\top M_{m-n} k`: the score of a
query at m and a key at n depends on the positions only through the
offset n - m. Nothing is added to the embeddings and nothing is learned.
"""

import torch
from torch import Tensor

from transformer_lite.checks import check_int, check_real
from transformer_lite.positional import RelativePosition

__all__ = ["RotaryEmbedding", "rotary_angles", "rotate_pairs"]


def rotary_angles(
    positions: Tensor, d_k: int, base: float = 10000.0, dtype=None
) -> Tensor:
    """The angle :math:`m\\,\\theta_i` of every position m and pair i.

    Args:
        positions: integer positions m.
        d_k: head size D (even).
        base: the wavelength scale, 10000 as in the sinusoidal table.
        dtype: a floating dtype (default: float32).

    Shape:
        positions: (L,); output: (L, D/2).
    """
    dtype = dtype or torch.float32
    two_i = torch.arange(0, d_k, 2, device=positions.device, dtype=dtype)
    theta = base ** (-two_i / d_k)  # (D/2,)
    return positions.to(dtype).unsqueeze(-1) * theta  # (L, D/2)


def rotate_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """Turn each pair (x[2i], x[2i+1]) of ``x`` by ``angles[..., i]``.

    Computed in float32 (or float64) and returned in x's dtype.

    Shape:
        x: (..., L, D); angles: (L, D/2); output: (..., L, D).
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    cos, sin = angles.to(dtype).cos(), angles.to(dtype).sin()  # (L, D/2)
    x_even = x[..., 0::2].to(dtype)  # (..., L, D/2)
    x_odd = x[..., 1::2].to(dtype)  # (..., L, D/2)
    turned = torch.stack(
        (x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1
    )  # (..., L, D/2, 2)
    return turned.flatten(-2).to(x.dtype)  # (..., L, D)


class RotaryEmbedding(RelativePosition):
    """RoPE: rotate queries and keys by their positions inside attention.

    Keys are rotated before they enter a key/value cache, so a cached
    key keeps the rotation of its own position. One module (it has no
    parameters) serves every layer of a stack.

    Args:
        d_k: head size D; must be even.
        base: the wavelength scale (10000 in the paper).

    Shape:
        x: (B, H, L, D); positions: (L,); output: (B, H, L, D).
    """

    def __init__(self, d_k: int, base: float = 10000.0) -> None:
        super().__init__()
        if check_int("d_k", d_k, low=2) % 2:
            raise ValueError(
                f"RoPE rotates pairs of coordinates: the head size d_k "
                f"must be even, got {d_k}"
            )
        self.d_k = d_k
        self.base = check_real("base", base, low=1.0)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        angles = rotary_angles(positions, self.d_k, self.base, dtype)
        return rotate_pairs(x, angles)  # (B, H, L, D)

    def extra_repr(self) -> str:
        return f"d_k={self.d_k}, base={self.base}"
