import pytest
import torch

from transformer_lite.device import (
    book_seed,
    default_device,
    seed_everything,
)


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


def test_book_seed_reads_the_environment(monkeypatch):
    monkeypatch.delenv("BOOK_SEED", raising=False)
    assert book_seed() == 0
    monkeypatch.setenv("BOOK_SEED", "")
    assert book_seed() == 0
    monkeypatch.setenv("BOOK_SEED", " 2 ")
    assert book_seed() == 2


@pytest.mark.parametrize("value", ["one", "1.5", "-1", "0x1"])
def test_book_seed_refuses_what_is_not_a_seed(monkeypatch, value):
    monkeypatch.setenv("BOOK_SEED", value)
    with pytest.raises(ValueError, match="BOOK_SEED must be a non-negative"):
        book_seed()
