"""Where a training step's time goes.

``python -m transformer_lite.bench.profile`` (``make bench-profile``).

The benchmark's targets for the training step (fused attention at most
0.97 of ``nn.Transformer``, the best row at least 70% of the matrix
product's measured peak) are ratios of whole steps. When one is missed,
this profile says why: PyTorch's profiler records every operator of one
step of our model (``plain`` or ``fused`` attention, at the benchmark's
sizes), and each operator's own time (its children's excluded) is put in
one of a few groups:

- ``linear products``: ``mm`` and ``addmm``, the projections, the
  feed-forward layers and the generator, forward and backward;
- ``attention products``: ``bmm`` and ``baddbmm``, Q K^T and A V;
- ``fused attention``: PyTorch's fused kernel, forward and backward;
- ``attention, the rest``: every other operator on a 4-D tensor
  (B, H, L, L or D): the softmax, the mask, the dropout of the weights,
  the heads' split and merge;
- ``layer norm``, ``dropout`` (of the residual branches);
- ``optimizer``: everything inside ``optimizer.step()``;
- ``other``: element-wise arithmetic, copies, indexing, the loss.

From the same step it counts the floating-point operations of the
products (``FlopCounterMode``) and measures the machine's peak the way
the benchmark does (:func:`~transformer_lite.bench.cases.matmul_peak`).
The profiler slows the many small operators more than the few large
products, so the step is also timed without it, and the time that is not
the products' is that step's time less the products' profiled time.
Three findings follow:

- the **ceiling on the share of peak**: the step's operations done at
  the peak, plus the time that is not the products'. Were the products
  as fast as the peak, the step's share could not exceed this;
- **which kernel PyTorch ran** for ``F.scaled_dot_product_attention``:
  on the CPU its fused kernel takes no dropout, so in training with
  attention dropout it falls back to the same arithmetic as the plain
  path (``_scaled_dot_product_attention_math``);
- the **most fused attention can save**: the share of the plain step
  that attention's own work takes (its products and the rest of the
  4-D work); a fused kernel can remove at most that, and only if it
  costs nothing itself.
"""

import argparse
import statistics
import time
from collections import defaultdict
from functools import partial

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from transformer_lite.attention import set_attention_kernel
from transformer_lite.bench.cases import matmul_peak
from transformer_lite.bench.fixtures import (
    QUICK,
    Sizes,
    our_model,
    random_batch,
)
from transformer_lite.bench.memory import _silent_stderr
from transformer_lite.device import seed_everything
from transformer_lite.tokens import PAD_ID
from transformer_lite.training.batch import Batch
from transformer_lite.training.loss import LabelSmoothingLoss
from transformer_lite.training.objectives import seq2seq_loss
from transformer_lite.training.step import train_step

__all__ = ["GROUPS", "group_of", "profile_step", "main"]

GROUPS = (
    "linear products",
    "attention products",
    "fused attention",
    "attention, the rest",
    "layer norm",
    "dropout",
    "optimizer",
    "other",
)
_BY_NAME = {
    "aten::mm": "linear products",
    "aten::addmm": "linear products",
    "aten::bmm": "attention products",
    "aten::baddbmm": "attention products",
}
_BY_PART = (  # (part of an operator's name, its group), first match wins
    ("scaled_dot_product", "fused attention"),
    ("flash_attention", "fused attention"),
    ("layer_norm", "layer norm"),
    ("dropout", "dropout"),
    ("bernoulli", "dropout"),
)
_PRODUCTS = {"mm", "addmm", "bmm", "baddbmm"}  # FlopCounterMode's names


def group_of(name: str, in_optimizer: bool, rank: int) -> str:
    """The group of an operator named ``name`` (``aten::addmm``) whose
    first input has ``rank`` dimensions (0 when it has no tensor)."""
    if in_optimizer:
        return "optimizer"
    if name in _BY_NAME:
        return _BY_NAME[name]
    for part, group in _BY_PART:
        if part in name and (group != "dropout" or rank != 4):
            return group
    return "attention, the rest" if rank == 4 else "other"


def _rank(event) -> int:
    shapes = [shape for shape in event.input_shapes if shape]
    return len(shapes[0]) if shapes else 0


def _in_optimizer(event) -> bool:
    while event is not None:
        if event.name.startswith("Optimizer.step"):
            return True
        event = event.cpu_parent
    return False


def profile_step(
    s: Sizes, kernel: str, *, steps: int = 3, repeats: int = 7
) -> dict:
    """Profile ``steps`` training steps of our model with ``kernel``
    attention (``"plain"`` or ``"fused"``) at sizes ``s``, on the CPU.

    Returns the seconds per step of each group (``groups``), their sum
    (``step_s``), the median of ``repeats`` steps without the profiler
    (``unprofiled_s``), the attention kernels PyTorch ran
    (``sdpa_kernels``), the floating-point operations of one step (``flops``)
    and of its products (``product_flops``), the peak measured with
    ``repeats`` products (``peak_tflops``), and the two bounds of the
    module docstring (``ceiling``, ``attention_share``)."""
    if kernel not in ("plain", "fused"):
        raise ValueError(f"kernel must be 'plain' or 'fused', not {kernel!r}")
    if steps < 1 or repeats < 1:
        raise ValueError(f"steps and repeats must be >= 1: {steps}, {repeats}")
    device = torch.device("cpu")
    seed_everything(0)
    model = our_model(s)
    set_attention_kernel(model, kernel)
    src, tgt = random_batch(s, s.batch, device)  # (B, S), (B, T + 1)
    objective = seq2seq_loss(
        LabelSmoothingLoss(s.vocab, PAD_ID, 0.1, reduction="sum")
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    step = partial(
        train_step, model, Batch(src, tgt, PAD_ID), objective, optimizer
    )
    step()  # warm up: the allocator and the optimizer's state
    with FlopCounterMode(display=False) as counter:
        step()
    counts = counter.get_flop_counts()["Global"]
    product_flops = sum(
        n for op, n in counts.items() if op.__name__.split(".")[0] in _PRODUCTS
    )
    activities = [ProfilerActivity.CPU]
    prof = profile(activities=activities, record_shapes=True)
    with _silent_stderr():  # the profiler's C++ logs "profiler_start"
        with prof:
            for _ in range(steps):
                step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    unprofiled_s = statistics.median(times)
    kernels = sorted(
        {e.name for e in prof.events() if "scaled_dot_product_" in e.name}
        - {"aten::scaled_dot_product_attention"}
    )
    seconds = defaultdict(float)
    for event in prof.events():
        if event.name.startswith("aten::"):
            group = group_of(event.name, _in_optimizer(event), _rank(event))
            seconds[group] += event.self_cpu_time_total / 1e6 / steps
    groups = {g: seconds.get(g, 0.0) for g in GROUPS}
    step_s = sum(groups.values())
    peak = matmul_peak(device, repeats, s.matmul_size)["tflops"]
    flops = counter.get_total_flops()
    at_peak = flops / (peak * 1e12)  # every operation at the peak
    products = groups["linear products"] + groups["attention products"]
    products += groups["fused attention"]
    rest = max(unprofiled_s - products, 0.0)
    attention = groups["attention products"] + groups["fused attention"]
    attention += groups["attention, the rest"]
    return {
        "kernel": kernel,
        "groups": groups,
        "step_s": step_s,
        "unprofiled_s": unprofiled_s,
        "sdpa_kernels": kernels,
        "flops": flops,
        "product_flops": product_flops,
        "products_tflops": product_flops / products / 1e12,
        "peak_tflops": peak,
        "ceiling": at_peak / (at_peak + rest),
        "attention_share": attention / step_s,
    }


def _report(result: dict) -> str:
    step_s = result["step_s"]
    lines = [
        f"### {result['kernel']} attention: {step_s * 1e3:.1f} ms a step "
        "(operators' own time, under the profiler)",
        "",
        "| group | ms a step | share |",
        "|---|---|---|",
    ]
    for group, s in result["groups"].items():
        lines.append(f"| {group} | {s * 1e3:.1f} | {s / step_s:.1%} |")
    lines += [
        "",
        f"- the products: {result['product_flops'] / 1e9:.2f} GFLOP a step "
        f"at {result['products_tflops']:.3f} TFLOP/s; the measured peak "
        f"{result['peak_tflops']:.3f} TFLOP/s",
        f"- the step without the profiler: "
        f"{result['unprofiled_s'] * 1e3:.1f} ms (median)",
        f"- ceiling on the share of peak (every operation at the peak, the "
        f"rest as measured): {result['ceiling']:.2f}",
        "- PyTorch's attention kernels: "
        + (", ".join(f"`{k}`" for k in result["sdpa_kernels"]) or "none"),
        f"- attention's own work (its products and 4-D tensors): "
        f"{result['attention_share']:.1%} of the step",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lite.bench.profile",
        description=__doc__.split("\n\n")[2],
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    s = QUICK if args.quick else Sizes()
    print(
        f"B={s.batch}, S=T={s.length}, C={s.d_model}, {s.n_layers}+"
        f"{s.n_layers} layers, d_ff={s.d_ff}, H={s.n_heads}, V={s.vocab}, "
        f"float32, {torch.get_num_threads()} threads\n"
    )
    for kernel in ("plain", "fused"):
        print(_report(profile_step(s, kernel, steps=args.steps)))


if __name__ == "__main__":
    main()
