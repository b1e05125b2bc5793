"""Data-parallel training on several processes (chapter 7).

``torchrun --nproc_per_node=N script.py`` starts N copies of a training
script and tells each, through environment variables, its ``RANK`` (0 to
N - 1), the ``WORLD_SIZE`` N and where to meet (``MASTER_ADDR``,
``MASTER_PORT``). Every process builds the same model and the same
sequence of global batches (same seeds); each takes its own share of the
rows of every batch (:func:`shard`), and ``DistributedDataParallel``
averages the gradients over the processes during ``backward``, so that
every process takes the same optimizer step.

The loss needs care: a batch's loss is a mean over its non-pad target
tokens, and the shares hold different numbers of them. The one training
step (:func:`~transformer_lite.training.step.train_step`) sums each
share's loss and divides by the token count of the whole batch, so that
its step equals one process's step on the whole batch
(``tests/test_distributed.py`` checks it).
"""

import datetime
import os
import warnings

import torch
import torch.distributed as dist
from torch import Tensor

from transformer_lite.checks import check_real
from transformer_lite.training.batch import Batch, Examples

__all__ = [
    "init_distributed",
    "is_main_process",
    "shard",
    "world",
]


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` when no process
    group is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main_process() -> bool:
    """True on rank 0, the one that prints and saves."""
    return world()[0] == 0


def init_distributed(
    backend: str | None = None, *, timeout: float | None = None
) -> torch.device:
    """Join the process group that ``torchrun`` describes in the
    environment, if any, and return this process's device.

    Args:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (CUDA); None picks nccl
            when CUDA is available, gloo otherwise.
        timeout: seconds to wait for the other processes, when joining
            and in each collective, before raising; None: torch's
            default (10 minutes for nccl, 30 for gloo).

    Returns:
        ``cuda:LOCAL_RANK`` with CUDA, else the CPU. A single process
        (no ``WORLD_SIZE`` > 1 in the environment) joins nothing. When
        this machine runs more processes (``LOCAL_WORLD_SIZE``) than it
        has GPUs, every one of them trains on the CPU with gloo, with a
        warning: NCCL needs a GPU of its own for each process.

    Raises:
        ValueError: ``backend="nccl"`` with fewer GPUs than processes.
    """
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if cuda and max(processes, local_rank + 1) > torch.cuda.device_count():
        gpus = torch.cuda.device_count()
        message = (
            f"{processes} processes on this machine but {gpus} CUDA "
            f"device(s): NCCL needs one GPU per process"
        )
        if backend == "nccl":
            raise ValueError(
                f"{message}; start torchrun with --nproc_per_node={gpus}"
            )
        if local_rank == 0:
            warnings.warn(
                f"{message}, so every process trains on the CPU (gloo); "
                f"--nproc_per_node={gpus} trains on the GPU",
                RuntimeWarning,
                stacklevel=2,
            )
        cuda, backend = False, "gloo"
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if timeout is not None:
        timeout = datetime.timedelta(seconds=check_real("timeout", timeout))
        if timeout.total_seconds() <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if several and not dist.is_initialized():
        dist.init_process_group(
            backend or ("nccl" if cuda else "gloo"), timeout=timeout
        )
    return device


def shard(batch: Batch | Examples, rank: int, world_size: int):
    """This rank's share of a global batch: a contiguous block of rows,
    the blocks differing in size by one row at most.

    Shape:
        batch.src: (B, S) -> (about B / world_size, S); likewise tgt, or
        each of the inputs and the targets of :class:`Examples`.
    """
    rows = batch.src if isinstance(batch, Batch) else batch.targets
    B = rows.size(0)
    if not 0 <= rank < world_size or B < world_size:
        raise ValueError(
            f"cannot give rank {rank} of {world_size} a share of a batch "
            f"of {B} rows (need 0 <= rank < world_size <= B)"
        )

    def share(x: Tensor) -> Tensor:
        return x.tensor_split(world_size)[rank]  # (about B / W, ...)

    if isinstance(batch, Examples):
        return Examples(tuple(share(x) for x in batch.inputs),
                        share(batch.targets), batch.ignore_index,
                        batch.starts_stream)  # fmt: skip
    return Batch(share(batch.src), share(batch.tgt), batch.pad_id)
