"""Tests for transformer_lite.bench.memory (chapter 8): ``peak_memory``
measures known allocations exactly, counts freed temporaries at their
peak, leaves out memory allocated before the call and what a device
keeps after its first use (cuBLAS's workspace), and keeps stderr quiet
and working."""

import os

import pytest
import torch

from transformer_lite.bench import memory
from transformer_lite.bench.memory import peak_memory


def test_peak_memory_sees_a_known_allocation():
    n = 3_000_000
    assert peak_memory(lambda: torch.empty(n, dtype=torch.uint8)) == n


def test_peak_memory_counts_freed_temporaries_at_their_peak():
    n = 1_000_000

    def two_temporaries_then_one():
        a = torch.empty(n, dtype=torch.uint8)
        b = torch.empty(2 * n, dtype=torch.uint8)
        del a, b  # both freed: 3n was the peak
        return torch.empty(n, dtype=torch.uint8)

    assert peak_memory(two_temporaries_then_one) == 3 * n


def test_memory_already_allocated_is_not_counted():
    held = torch.empty(5_000_000, dtype=torch.uint8)

    def free_then_allocate():
        held.resize_(0)  # frees 5 MB the function did not allocate
        return torch.empty(1_000_000, dtype=torch.uint8)

    assert peak_memory(free_then_allocate) == 1_000_000


def test_peak_memory_leaves_out_what_a_device_keeps_after_first_use(
    monkeypatch,
):
    """As cuBLAS's workspace on a GPU: allocated by the first matrix
    product and kept. Without the warm-up the first measurement would
    count it (chapter 8's first table did)."""
    workspace = []

    def first_matmul(device):
        if not workspace:
            workspace.append(torch.empty(2**20, dtype=torch.uint8))

    def fn():
        first_matmul("cpu")  # a matrix product inside fn
        return torch.empty(1000, dtype=torch.uint8)

    monkeypatch.setattr(memory, "warm_up_device", first_matmul)
    assert peak_memory(fn, warm_up=False) == 2**20 + 1000
    workspace.clear()
    assert peak_memory(fn) == 1000


def test_the_warm_up_products_run_inside_no_grad():
    """The benchmark and chapter 8 measure under ``torch.no_grad()``; the
    warm-up's backward pass must still run there (it raised 'element 0
    of tensors does not require grad' on the first GPU run)."""
    with torch.no_grad():
        memory.first_products(torch.device("cpu"))
        assert not torch.is_grad_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_peak_memory_on_cuda_inside_no_grad():
    with torch.no_grad():
        used = peak_memory(lambda: torch.ones(1000, device="cuda"), "cuda")
    assert used >= 4000


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_peak_memory_on_cuda_leaves_out_the_cublas_workspace():
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    a = torch.ones(64, 64, device="cuda", requires_grad=True)

    def step():
        (a @ a).sum().backward()

    assert peak_memory(step, "cuda") < 2**20  # a few 16 KiB tensors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_peak_memory_on_cuda():
    n = 64 * 2**20
    measured = peak_memory(
        lambda: torch.empty(n, dtype=torch.uint8, device="cuda"), "cuda"
    )
    assert n <= measured < n + 2**20  # the caching allocator rounds up


def test_peak_memory_keeps_stderr_quiet_and_working(capfd):
    """The profiler's C++ start/stop lines are silenced; descriptor 2 is
    restored afterwards."""
    assert peak_memory(lambda: torch.ones(1000)) >= 4000
    os.write(2, b"still here\n")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "still here" in err
