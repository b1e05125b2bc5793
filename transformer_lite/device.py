"""Where tensors live and how runs are made repeatable (all chapters)."""

import contextlib
import copy
import os
import random
from collections.abc import Iterator

import torch
from torch import nn

from transformer_lite.checks import check_int

__all__ = [
    "book_seed",
    "default_device",
    "eval_twin",
    "evaluating",
    "module_device",
    "no_tf32",
    "seed_everything",
]


def default_device() -> torch.device:
    """The best device available: CUDA, then Apple's MPS, then the CPU.

    Set the environment variable ``TRANSFORMER_LITE_DEVICE`` (for example to
    ``cpu``) to override the choice.
    """
    wanted = os.environ.get("TRANSFORMER_LITE_DEVICE")
    if wanted:
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def book_seed() -> int:
    """The book's seed: ``BOOK_SEED`` from the environment, 0 if unset.

    Every chapter reads it once and derives all of its seeds from it, so
    that ``BOOK_SEED=1`` reruns a chapter on another random path (see
    ``make seed-sweep``). An empty value counts as unset.

    Raises:
        ValueError: if ``BOOK_SEED`` is not a non-negative integer.
    """
    value = os.environ.get("BOOK_SEED", "").strip() or "0"
    try:
        seed = int(value)
    except ValueError:
        seed = -1
    if seed < 0:
        raise ValueError(
            f"BOOK_SEED must be a non-negative integer, got {value!r}"
        )
    return seed


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's, NumPy's (when installed) and torch's generators.

    Returns a ``torch.Generator`` seeded with the same value, for code that
    prefers an explicit generator to the global one.
    """
    check_int("seed", seed, low=0, high=2**64 - 1)  # torch's range
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # numpy is optional for the package
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s parameters (the first one's; a module
    split across devices is not supported), or the CPU if it has none."""
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """Run a block in eval mode (no dropout) under ``torch.no_grad()``,
    then put ``module`` back in the mode it was in."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield module
    finally:
        module.train(was_training)


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """Compute float32 matrix products and convolutions in full float32
    inside the block, then restore the previous settings.

    On NVIDIA GPUs since Ampere, cuDNN runs float32 convolutions in TF32
    by default (inputs rounded to 10 bits of fraction: errors near 1e-3),
    and cuBLAS does so for matrix products where
    ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`` is set (NVIDIA's container
    images set it). A comparison at float32 tolerances needs neither. On
    other devices the block runs unchanged.
    """
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def eval_twin(module: nn.Module) -> nn.Module:
    """``module`` itself when it and every submodule are in eval mode;
    otherwise a twin in eval mode: a shallow copy of every submodule, so
    that it shares every parameter, buffer and setting with ``module``.

    Unlike :func:`evaluating`, it never changes ``module``: another
    thread may be training it or decoding with it at the same time. The
    twin costs one Python object per submodule and no tensor memory.
    """
    if not any(m.training for m in module.modules()):
        return module
    twin = copy.copy(module)  # the same tensors, its own mode
    twin._modules = {
        name: None if child is None else eval_twin(child)
        for name, child in module._modules.items()
    }
    twin.training = False
    return twin
