"""Peak memory of a computation, on the CPU or a GPU (chapter 8)."""

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

__all__ = ["peak_memory", "warm_up_device"]


@contextlib.contextmanager
def _silent_stderr() -> Iterator[None]:
    """Send file descriptor 2 to the null device for a moment: C++ code
    writes there directly, past ``sys.stderr``."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2: nothing to silence
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def warm_up_device(device: torch.device) -> None:
    """Allocate what ``device`` keeps for good after its first use, so
    that :func:`peak_memory` does not count it in a measurement.

    On CUDA that is cuBLAS's workspace (tens of MiB on recent GPUs),
    allocated by the first matrix product of each thread that runs one:
    the forward pass's thread and autograd's, in every dtype's kernels.
    A product with a bias (``F.linear``, cuBLASLt), forward and backward,
    in float32, bfloat16 and float16 allocates them all. On the CPU
    there is nothing to do.
    """
    if device.type != "cuda":
        return
    first_products(device)
    torch.cuda.synchronize(device)


def first_products(device: torch.device) -> None:
    """One small product with a bias, forward and backward, in each of
    float32, bfloat16 and float16 on ``device``. Autograd is switched on
    for it: callers measure inside ``torch.no_grad()``."""
    with torch.enable_grad():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            a = torch.ones(
                16, 16, device=device, dtype=dtype, requires_grad=True
            )
            F.linear(a, a, a[0]).sum().backward()


def peak_memory(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    warm_up: bool = True,
) -> int:
    """Bytes in use at the peak while ``fn()`` runs, above what was
    already allocated when it started (its result included).

    On CUDA this is ``torch.cuda.max_memory_allocated``. On the CPU, the
    PyTorch profiler records every allocation and free of tensor memory
    (``profile_memory=True``); their running sum, in time order, is the
    memory in use, and its maximum is the peak.

    Args:
        fn: the computation, called once with no arguments.
        device: where ``fn`` allocates: ``"cpu"`` or a CUDA device.
        warm_up: first run :func:`warm_up_device`, so that memory the
            device would keep after ``fn``'s first matrix product (not
            ``fn``'s own) is left out.
    """
    device = torch.device(device)
    if warm_up:
        warm_up_device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu":
        raise ValueError(f"peak_memory supports cpu and cuda, got {device}")
    p = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _silent_stderr():  # the profiler's C++ logs "profiler_start"
        p.start()
    try:
        fn()
    finally:
        with _silent_stderr():
            p.stop()
    events = [
        e
        for e in p.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type().name == "CPU"
    ]
    events.sort(key=lambda e: e.start_ns())
    in_use, peak = 0, 0
    for event in events:
        in_use += event.nbytes()  # > 0 allocation, < 0 free
        peak = max(peak, in_use)
    return peak
