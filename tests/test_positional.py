import math

import pytest
import torch

from transformer_lite.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)


@pytest.mark.parametrize("max_len, d_model", [(1, 2), (7, 4), (50, 16)])
def test_table_is_the_papers_formula(max_len, d_model):
    table = sinusoidal_table(max_len, d_model, dtype=torch.float64)
    assert table.shape == (max_len, d_model)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(
                math.sin(angle), abs=1e-12
            )
            assert table[pos, 2 * i + 1].item() == pytest.approx(
                math.cos(angle), abs=1e-12
            )


def test_offset_is_a_fixed_rotation():
    """PE(pos + k) = R_k PE(pos), with R_k independent of pos."""
    d_model, k = 8, 5
    table = sinusoidal_table(64, d_model, dtype=torch.float64)
    freqs = 1 / 10000 ** (torch.arange(0, d_model, 2).double() / d_model)
    rotated = torch.empty_like(table[:-k])
    sin, cos = table[:-k, 0::2], table[:-k, 1::2]
    c, s = torch.cos(k * freqs), torch.sin(k * freqs)
    rotated[:, 0::2] = sin * c + cos * s
    rotated[:, 1::2] = cos * c - sin * s
    torch.testing.assert_close(rotated, table[k:], rtol=0, atol=1e-12)


def test_encoding_adds_the_table(device):
    pe = SinusoidalPositionalEncoding(6, dropout=0.0, max_len=10).to(device)
    x = torch.randn(2, 4, 6, device=device)
    expected = x + sinusoidal_table(10, 6).to(device)[:4]
    torch.testing.assert_close(pe(x), expected)
    assert "table" not in pe.state_dict()  # a fixed function of the shape


def test_too_long_a_sequence_is_a_clear_error():
    pe = SinusoidalPositionalEncoding(6, max_len=10)
    with pytest.raises(ValueError, match=r"length 11 .*max_len=10"):
        pe(torch.randn(1, 11, 6))
    learned = LearnedPositionalEmbedding(6, max_len=3)
    with pytest.raises(ValueError, match=r"length 4 .*max_len=3"):
        learned(torch.randn(1, 4, 6))
    with pytest.raises(ValueError, match="d_model=6"):
        pe(torch.randn(1, 4, 5))


@pytest.mark.parametrize("args", [(0, 4), (4, 3), (4, 0), (2.0, 4)])
def test_table_rejects_bad_sizes(args):
    with pytest.raises(ValueError):
        sinusoidal_table(*args)


def test_learned_embedding_adds_one_vector_per_position():
    learned = LearnedPositionalEmbedding(4, dropout=0.0, max_len=8)
    x = torch.zeros(2, 5, 4)
    torch.testing.assert_close(learned(x)[1], learned.embedding.weight[:5])
    assert sum(p.numel() for p in learned.parameters()) == 8 * 4


def test_learned_positions_start_at_the_offset():
    learned = LearnedPositionalEmbedding(6, dropout=0.0, max_len=10)
    x = torch.randn(2, 3, 6)
    expected = x + learned.embedding.weight[4:7]
    torch.testing.assert_close(learned(x, offset=4), expected)
    with pytest.raises(ValueError, match=r"length 11 .*max_len=10"):
        learned(x, offset=8)
    nothing = NoPositionalEncoding(6, dropout=0.0, max_len=10)
    assert torch.equal(nothing(x, offset=7), x)
