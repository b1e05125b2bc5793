import os
import subprocess
import sys

import pytest
import torch

from transformer_lite.device import (
    book_seed,
    default_device,
    no_tf32,
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


def test_tf32_is_off_in_the_tests():
    """conftest.py pins it: float32 tolerances assume float32 arithmetic."""
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False


def test_tf32_stays_off_under_nvidias_container_setting():
    override = os.environ | {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    # The variable does turn TF32 on for cuBLAS, on any build of torch ...
    probe = "import torch; print(torch.backends.cuda.matmul.allow_tf32)"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=override,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "True"
    # ... and the test suite turns it off again.
    test = f"{__file__}::test_tf32_is_off_in_the_tests"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        env=override,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_tf32_turns_tf32_off_inside_and_restores_it():
    torch.backends.cudnn.allow_tf32 = True
    try:
        with no_tf32():
            assert not torch.backends.cuda.matmul.allow_tf32
            assert not torch.backends.cudnn.allow_tf32
        assert torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32 = False


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
