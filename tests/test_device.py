import torch

from transformer_lite.device import default_device, seed_everything


def test_default_device_is_usable():
    device = default_device()
    assert isinstance(device, torch.device)
    assert torch.ones(1, device=device).device.type == device.type


def test_device_can_be_overridden(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LITE_DEVICE", "cpu")
    assert default_device() == torch.device("cpu")


def test_seed_everything_repeats_runs():
    seed_everything(123)
    a = torch.randn(5)
    seed_everything(123)
    b = torch.randn(5)
    seed_everything(124)
    c = torch.randn(5)
    assert torch.equal(a, b) and not torch.equal(a, c)
    g = seed_everything(7)
    assert torch.equal(
        torch.randn(3, generator=g),
        torch.randn(3, generator=torch.Generator().manual_seed(7)),
    )
