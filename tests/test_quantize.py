"""int8 dynamic quantisation (chapter 12): a copy with int8 linear
weights, a quarter of their bytes, logits close to float32; ONNX
Runtime's own pass over an exported file."""

import copy

import pytest
import torch
from torch import nn

from transformer_lite.model import make_model
from transformer_lite.shipping.quantize import quantize_int8, size_on_disk

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return make_model(40, 40, n_layers=2, d_model=64, d_ff=256, n_heads=4,
                      max_len=32).eval()  # fmt: skip


def batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (4, 9), generator=g)
    tgt = torch.randint(4, 40, (4, 7), generator=g)
    return src, tgt


def linears(model):
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_a_quantised_copy_leaves_the_model_alone(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = quantize_int8(model)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
        assert type(value) is torch.Tensor, name
    assert not quantized.training
    for layer in linears(quantized):
        assert layer.weight.qdata.dtype == torch.int8
        assert layer.weight.qdata.shape == layer.weight.shape
    embeddings = quantized.src_embed.weight
    assert torch.equal(embeddings, model.src_embed.weight)


def test_int8_logits_are_close_to_float32(model):
    src, tgt = batch()
    with torch.no_grad():
        expected = model(src, tgt)
        actual = quantize_int8(model)(src, tgt)
    error = (actual - expected).abs().max() / expected.abs().max()
    assert 0 < error < 0.05  # changed, but by rounding only
    agree = (actual.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree > 0.9


def test_int8_weights_take_about_a_quarter_of_the_bytes(model):
    weights = sum(m.weight.numel() for m in linears(model))
    saved = size_on_disk(model) - size_on_disk(quantize_int8(model))
    # each weight drops 3 of its 4 bytes; a scale per row comes back
    assert 0.9 * 3 * weights < saved < 3 * weights


def test_size_on_disk_of_files(tmp_path, model):
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    # the same bytes but for the archive's folder name, in each record
    assert size_on_disk(path) == pytest.approx(size_on_disk(model), rel=0.01)
    assert size_on_disk([path, path]) == 2 * path.stat().st_size


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match="nn.Module"):
        quantize_int8("model.pt")
    with pytest.raises(ValueError, match="no nn.Linear"):
        quantize_int8(nn.Sequential(nn.ReLU()))


def test_a_quantised_model_is_not_quantised_again(model):
    # Before: torchao's NotImplementedError.
    once = quantize_int8(model)
    with pytest.raises(ValueError, match="already quantised"):
        quantize_int8(once)


def test_only_a_float32_model_is_quantised(model):
    # Before: an AssertionError from inside torchao on float64.
    with pytest.raises(ValueError, match="takes a float32 model"):
        quantize_int8(copy.deepcopy(model).double())


def test_a_quantised_model_cannot_be_saved_as_a_checkpoint(model, tmp_path):
    # Before: saved, then load_checkpoint raised NotImplementedError.
    from transformer_lite.training.checkpoint import save_checkpoint

    path = tmp_path / "int8.pt"
    with pytest.raises(ValueError, match="quantise it after loading"):
        save_checkpoint(path, quantize_int8(model))
    assert not path.exists() and not list(tmp_path.iterdir())
