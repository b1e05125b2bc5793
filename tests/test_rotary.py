"""RoPE (chapter 9): the rotation equals its complex-number form, keeps
lengths, and makes a query-key score depend on the offset only."""

import pytest
import torch

from transformer_lite import TransformerConfig
from transformer_lite.rotary import (
    RotaryEmbedding,
    rotary_angles,
    rotate_pairs,
)

D = 16


def complex_rotation(x: torch.Tensor, positions: torch.Tensor):
    """Su et al.'s form: pair i is the complex number x[2i] + i x[2i+1],
    multiplied by exp(i m theta_i), theta_i = 10000^(-2i/D)."""
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = positions.double()[:, None] * theta  # (L, D/2)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], D // 2, 2))
    turned = z * torch.polar(torch.ones_like(angle), angle)  # (.., L, D/2)
    return torch.view_as_real(turned).flatten(-2)  # (..., L, D)


def test_rotation_equals_the_complex_number_form():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, D, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 17, 300, 4096])
    rope = RotaryEmbedding(D)
    turned = rope.rotate(x, positions)
    expected = complex_rotation(x, positions)
    torch.testing.assert_close(turned, expected, rtol=0, atol=1e-12)
    # position 0 is no rotation; every rotation keeps the length
    torch.testing.assert_close(turned[..., 0, :], x[..., 0, :])
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))


def test_score_depends_only_on_the_offset():
    """(M_m q) . (M_n k) is the same for every m with n - m fixed, on
    random vectors, and changes with the offset."""
    g = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(D)
    q, k = torch.randn(2, 5, D, generator=g, dtype=torch.float64)
    for offset in (-9, -1, 0, 3, 40):
        m = torch.tensor([0, 7, 100, 1000, 3])  # (5,)
        n = m + offset + 9  # keep n >= 0
        scores = (rope.rotate(q, m) * rope.rotate(k, n)).sum(-1)  # (5,)
        m2 = m + 123
        again = (rope.rotate(q, m2) * rope.rotate(k, m2 + offset + 9)).sum(-1)
        torch.testing.assert_close(again, scores, rtol=0, atol=1e-10)
    near = (rope.rotate(q, m) * rope.rotate(k, m + 1)).sum(-1)
    far = (rope.rotate(q, m) * rope.rotate(k, m + 2)).sum(-1)
    assert (near - far).abs().min() > 1e-6


def test_half_precision_rotates_in_float32_and_returns_its_dtype():
    x = torch.randn(1, 2, 5, D)
    positions = torch.arange(5)
    angles = rotary_angles(positions, D)
    for dtype in (torch.float16, torch.bfloat16):
        turned = rotate_pairs(x.to(dtype), angles)
        assert turned.dtype == dtype
        full = rotate_pairs(x.to(dtype).float(), angles)
        torch.testing.assert_close(turned.float(), full.to(dtype).float())


def test_odd_head_sizes_are_refused():
    with pytest.raises(ValueError, match="d_k must be even, got 5"):
        RotaryEmbedding(5)
    with pytest.raises(ValueError, match="head size .* even, got 3"):
        TransformerConfig(10, 10, d_model=12, n_heads=4, position="rope")
