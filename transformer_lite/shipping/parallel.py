"""Split one model across processes (chapter 12): tensor parallelism
and fully-sharded data parallelism (FSDP2), with PyTorch's own engine.

Tensor parallel (Megatron-LM's split of the blocks): in every attention
block W^Q, W^K and W^V are split by columns, so each process computes
whole heads of its own; W^O is split by rows, and one all-reduce sums
the processes' partial outputs. The feed-forward block likewise: W_1 by
columns (each process holds a slice of the d_ff hidden units), W_2 by
rows, one all-reduce. That is one all-reduce per block in the forward
pass; the backward pass needs one more, summing the partial gradients
of the block's input (Megatron's f and g). Megatron-LM also splits the
embeddings and the output projection along the vocabulary; here they
stay whole on every process, as do the LayerNorms.

Fully sharded: each process holds 1/N of every parameter, the root
unit's (embeddings, final norms, output projection) included, gathers a
unit's full weights just before using them (FSDP2 prefetches the next
unit's) and frees them after; the gradients are reduce-scattered back
to the shards.

:func:`spawn` starts the processes (gloo, on the CPU) from Python.
"""

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.schemes import scheme

__all__ = [
    "compare_worker",
    "full_tensor",
    "local_parameter_bytes",
    "run_split",
    "shard_model",
    "spawn",
    "tensor_parallel",
    "tensor_parallel_plan",
]


def tensor_parallel_plan(model: Transformer) -> dict[str, object]:
    """Which linear layer splits how: ``{"encoder.layers.0.self_attn.w_q":
    ColwiseParallel(), ...}``, columns for W^Q, W^K, W^V and W_1, rows
    for W^O and W_2, in every attention and feed-forward block."""
    plan = {}
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(model, stack).layers):
            prefix = f"{stack}.layers.{i}"
            blocks = ["self_attn"]
            if hasattr(layer, "cross_attn"):
                blocks.append("cross_attn")
            for block in blocks:
                for w in ("w_q", "w_k", "w_v"):
                    plan[f"{prefix}.{block}.{w}"] = ColwiseParallel()
                plan[f"{prefix}.{block}.w_o"] = RowwiseParallel()
            plan[f"{prefix}.feed_forward.w_1"] = ColwiseParallel()
            plan[f"{prefix}.feed_forward.w_2"] = RowwiseParallel()
    return plan


def _check_split(model: Transformer, mesh: DeviceMesh) -> None:
    if not isinstance(model, Transformer):
        raise ValueError(
            f"model must be a Transformer, got {type(model).__name__}"
        )
    c, n = model.config, mesh.size()
    if c.n_heads % n or c.d_ff % n:
        raise ValueError(
            f"{n} processes must divide n_heads ({c.n_heads}) and d_ff "
            f"({c.d_ff})"
        )
    if not scheme(c.position).absolute:
        raise ValueError(
            "tensor parallelism here splits heads of absolute-position "
            f"models; got position={c.position!r}"
        )


def tensor_parallel(model: Transformer, mesh: DeviceMesh) -> Transformer:
    """Split ``model``'s attention and feed-forward blocks across the
    processes of ``mesh`` (:func:`tensor_parallel_plan`), in place.
    Every process must pass the same weights and the same inputs."""
    _check_split(model, mesh)
    return parallelize_module(model, mesh, tensor_parallel_plan(model))


def shard_model(model: Transformer, mesh: DeviceMesh) -> Transformer:
    """FSDP2, in place: each encoder and decoder layer is one unit
    (gathered and freed together), the rest of the model another."""
    if not isinstance(model, Transformer):
        raise ValueError(
            f"model must be a Transformer, got {type(model).__name__}"
        )
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_tensor(x: Tensor) -> Tensor:
    """The whole tensor of a DTensor (gathered: every process must call
    it, in the same order), or ``x`` itself."""
    return x.full_tensor() if isinstance(x, DTensor) else x


def local_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this process holds (its shards only)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def _split_run(spec: dict, kind: str, world_size: int) -> dict:
    """Build the model of ``spec``, split it (``kind``), run one forward
    and backward pass; the full logits, gradients and local bytes."""
    dtype = spec["state"]["generator.weight"].dtype  # float64 to compare
    model = Transformer(TransformerConfig(**spec["config"])).to(dtype)
    model.load_state_dict(spec["state"])
    mesh = init_device_mesh("cpu", (world_size,))
    split = tensor_parallel if kind == "tensor" else shard_model
    split(model, mesh)
    local = local_parameter_bytes(model)
    logits = model(spec["src"], spec["tgt"])  # (B, T, V)
    logits.square().mean().backward()
    grads = {
        name: full_tensor(p.grad).detach().clone()
        for name, p in model.named_parameters()
    }
    return {
        "logits": full_tensor(logits).detach().clone(),
        "grads": grads,
        "local_bytes": local,
    }


def compare_worker(rank: int, world_size: int, store: str, job: str) -> None:
    """One process of :func:`spawn`: for each kind in ``job`` (a file
    from ``torch.save``: ``config``, ``state``, ``src``, ``tgt`` and
    ``kinds``, of "tensor" and "fsdp"), build the model, split it, run
    one forward and backward pass (loss: the mean square of the logits)
    and save the full logits, gradients and this process's parameter
    bytes to ``job`` + ``.rank<r>``, as ``{kind: result}``."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*returned a view tensor")
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size
    )
    try:
        spec = torch.load(job, weights_only=True)
        results = {
            kind: _split_run(spec, kind, world_size) for kind in spec["kinds"]
        }
        torch.save(results, f"{job}.rank{rank}")
    finally:
        dist.destroy_process_group()


def spawn(
    worker: Callable[..., None], *args: object, world_size: int = 2
) -> None:
    """Run ``worker(rank, world_size, store, *args)`` in ``world_size``
    new processes (``torch.multiprocessing``, start method spawn) and
    wait for all; ``store`` is a fresh file through which they meet.
    A process that fails raises here."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(
            worker,
            args=(world_size, store, *args),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )


def run_split(
    model: Transformer,
    src: Tensor,
    tgt: Tensor,
    *,
    kinds: tuple[str, ...] = ("tensor", "fsdp"),
) -> list[dict[str, dict]]:
    """Split ``model`` over 2 processes, once for each of ``kinds``
    ("tensor", "fsdp"), with :func:`compare_worker`; returns each
    process's results, ``{kind: {"logits", "grads", "local_bytes"}}``.
    One start of the processes serves every kind."""
    for kind in kinds:
        if kind not in ("tensor", "fsdp"):
            raise ValueError(
                f"kinds must hold 'tensor' or 'fsdp', got {kind!r}"
            )
    with tempfile.TemporaryDirectory() as tmp:
        job = str(Path(tmp) / "job.pt")
        spec = {
            "config": model.config.to_dict(),
            "state": model.state_dict(),
            "src": src,
            "tgt": tgt,
            "kinds": list(kinds),
        }
        torch.save(spec, job)
        spawn(compare_worker, job)
        return [
            torch.load(f"{job}.rank{r}", weights_only=True) for r in range(2)
        ]
