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
tokens, and the shares hold different numbers of them. Each process
therefore sums the loss over its own tokens and divides by the token count
of the whole global batch; times N, because DDP averages (divides by N)
where this needs a sum. The step then equals one process's step on the
global batch (:func:`train_step`; ``tests/test_distributed.py`` checks it).
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from transformer_lite.training import Batch

__all__ = [
    "init_distributed",
    "is_main_process",
    "shard",
    "train_step",
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


def init_distributed(backend: str | None = None) -> torch.device:
    """Join the process group that ``torchrun`` describes in the
    environment, if any, and return this process's device.

    Args:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (CUDA); None picks nccl
            when CUDA is available, gloo otherwise.

    Returns:
        ``cuda:LOCAL_RANK`` with CUDA, else the CPU. A single process
        (no ``WORLD_SIZE`` > 1 in the environment) joins nothing.
    """
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if several and not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if cuda else "gloo"))
    return device


def shard(batch: Batch, rank: int, world_size: int) -> Batch:
    """This rank's share of a global batch: a contiguous block of rows,
    the blocks differing in size by one row at most.

    Shape:
        batch.src: (B, S) -> (about B / world_size, S); likewise tgt.
    """
    B = batch.src.size(0)
    if not 0 <= rank < world_size or B < world_size:
        raise ValueError(
            f"cannot give rank {rank} of {world_size} a share of a batch "
            f"of {B} rows (need 0 <= rank < world_size <= B)"
        )
    src = batch.src.tensor_split(world_size)[rank]  # (B / N, S)
    tgt = batch.tgt.tensor_split(world_size)[rank]  # (B / N, T + 1)
    return Batch(src, tgt, batch.pad_id)


def train_step(
    model: nn.Module,
    batch: Batch,
    loss_fn: nn.Module,
    optimizer: Optimizer,
    scheduler: LRScheduler | None = None,
    clip_norm: float | None = 1.0,
) -> float:
    """One optimizer step on a global batch, alone or data-parallel.

    With a process group (``model`` wrapped in
    ``DistributedDataParallel``), this process uses its :func:`shard` of
    ``batch``; the gradients are then those of the mean loss over all the
    batch's non-pad target tokens, as for one process on the whole batch.

    Args:
        loss_fn: returns the **sum** over non-pad tokens, e.g.
            ``LabelSmoothingLoss(..., reduction="sum")``.
        clip_norm: clip the gradient norm to this; None: no clipping.

    Returns:
        the batch's mean loss per non-pad target token (all processes).
    """
    rank, world_size = world()
    device = next(model.parameters()).device
    n_tokens = batch.n_tokens  # of the global batch: known on every rank
    if n_tokens == 0:
        raise ValueError("the batch holds no target tokens")
    local = shard(batch, rank, world_size) if world_size > 1 else batch
    local = local.to(device)
    logits = model(local.src, local.tgt_in, local.src_mask, local.tgt_mask)
    loss_sum = loss_fn(logits, local.tgt_out)  # logits: (B / N, T, V)
    optimizer.zero_grad(set_to_none=True)
    (loss_sum * world_size / n_tokens).backward()  # DDP: mean over ranks
    if clip_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    total = loss_sum.detach()
    if world_size > 1:
        dist.all_reduce(total)  # sum over ranks
    return float(total) / n_tokens
