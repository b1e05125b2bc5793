"""Peak memory of a computation, on the CPU or a GPU (chapter 8)."""

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["peak_memory"]


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


def peak_memory(
    fn: Callable[[], object], device: torch.device | str = "cpu"
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
    """
    device = torch.device(device)
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
