"""Shared fixtures: devices, dtypes and tolerances."""

import pytest
import torch

CUDA = torch.cuda.is_available()

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device")
    ),
]

# dtype -> (rtol, atol) for comparing against PyTorch's own modules.
TOLERANCES = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
}
DTYPES = list(TOLERANCES)


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=DTYPES, ids=["float64", "float32"])
def dtype(request) -> torch.dtype:
    return request.param


def assert_close(actual, expected, dtype, msg=""):
    torch.testing.assert_close(
        actual, expected, **TOLERANCES[dtype], msg=lambda m: f"{msg}\n{m}"
    )


def random_padding(lengths, max_len, device=None) -> torch.Tensor:
    """(B, 1, L) bool mask, True for the first lengths[b] positions."""
    positions = torch.arange(max_len, device=device)
    lengths = torch.as_tensor(lengths, device=device)
    return (positions < lengths[:, None]).unsqueeze(1)
