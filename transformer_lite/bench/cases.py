"""The three measurements of the benchmark (chapter 8), each taken side
by side with the contenders alternating: A B C A B C ..., never
A A A B B B, so that a machine that is busy, warm or throttled slows them
all alike. :mod:`transformer_lite.bench` runs them and prints the tables.
"""

import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from transformer_lite.attention import (
    scaled_dot_product_attention,
    set_attention_kernel,
)
from transformer_lite.bench.fixtures import (
    Sizes,
    TorchReference,
    our_model,
    random_batch,
)
from transformer_lite.bench.memory import peak_memory
from transformer_lite.chunked import chunked_attention
from transformer_lite.decoding import greedy_decode
from transformer_lite.device import seed_everything
from transformer_lite.tokens import BOS_ID, PAD_ID
from transformer_lite.training.batch import Batch
from transformer_lite.training.loss import LabelSmoothingLoss
from transformer_lite.training.objectives import seq2seq_loss
from transformer_lite.training.step import TrainOptions, train_step

__all__ = [
    "alternate",
    "matmul_peak",
    "bench_attention",
    "bench_decoding",
    "bench_training",
]

DECODING_REPEATS = 3  # the most rounds of decoding (the slowest case)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(
    contenders: dict[str, Callable[[], object]],
    repeats: int,
    device: torch.device,
    label: str = "",
    results: dict | None = None,
) -> dict[str, list[float]]:
    """Time each contender ``repeats`` times, in turns: A B C A B C ...

    Returns the seconds of every call, per contender. With a ``label``,
    reports each round on stderr (a long run shows that it is alive);
    a ``results`` dict receives each contender's last return value.
    """
    times = {name: [] for name in contenders}
    for round_ in range(repeats):
        if label:
            print(f"{label}: {round_ + 1}/{repeats}", file=sys.stderr)
        for name, fn in contenders.items():
            _synchronize(device)
            start = time.perf_counter()
            result = fn()
            _synchronize(device)
            times[name].append(time.perf_counter() - start)
            if results is not None:
                results[name] = result
    return times


def _summary(times: list[float]) -> dict:
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
    }


def _paired_ratio(times: list[float], base: list[float]) -> float:
    """The median of the round-by-round ratios: each pair was measured
    seconds apart, so a burst of load on a shared machine hits both."""
    return statistics.median(a / b for a, b in zip(times, base, strict=True))


def matmul_peak(device: torch.device, repeats: int, size: int) -> dict:
    """This machine's practical limit, measured now: products of two
    ``size`` x ``size`` matrices on the same threads (float32 on the CPU,
    bfloat16 on a GPU), in TFLOP/s, from the median of ``repeats`` (as
    the training rows are, so that load affects both alike) and from the
    best."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device).manual_seed(3)
    a, b = (
        torch.randn(size, size, generator=g, device=device, dtype=dtype)
        for _ in range(2)
    )
    product = partial(torch.mm, a, b)
    times = alternate({"matmul": product}, repeats + 1, device)["matmul"]
    times = times[1:]  # the first call warms up
    flop = 2 * size**3
    return {
        "size": size,
        "dtype": str(dtype).removeprefix("torch."),
        "tflops": flop / statistics.median(times) / 1e12,
        "best_tflops": flop / min(times) / 1e12,
    }


def _compiled(model: nn.Module) -> nn.Module:
    """``torch.compile`` of the model's forward pass (inductor); the
    training step around it stays eager."""
    return torch.compile(model)


def bench_training(
    s: Sizes, device: torch.device, repeats: int, compile: bool = True
) -> dict:
    """One training step (the package's ``train_step``) of our model,
    plain and fused attention, and of ``nn.Transformer``, identical in
    size, parameter count and dropout; with ``compile``, also each model
    under ``torch.compile``. The first (compiling) call is timed apart and
    never enters the medians."""
    seed_everything(0)
    plain = our_model(s).to(device)
    models = {"ours (plain)": plain, "ours (fused)": our_model(s)}
    models["nn.Transformer"] = TorchReference(s)
    if compile:
        models["ours (compiled)"] = our_model(s)
        models["nn.Transformer (compiled)"] = TorchReference(s)
    for name, model in models.items():
        model.to(device)
        same = plain if name.startswith("ours") else models["nn.Transformer"]
        model.load_state_dict(same.state_dict())
    set_attention_kernel(models["ours (fused)"], "fused")
    counts = {
        name: sum(p.numel() for p in m.parameters())
        for name, m in models.items()
    }
    if len(set(counts.values())) != 1:
        raise AssertionError(f"parameter counts differ: {counts}")
    src, tgt = random_batch(s, s.batch, device)  # (B, S), (B, T + 1)
    batch = Batch(src, tgt, PAD_ID)
    objective = seq2seq_loss(
        LabelSmoothingLoss(s.vocab, PAD_ID, 0.1, reduction="sum")
    )
    amp_dtype = torch.bfloat16 if device.type == "cuda" else None
    options = TrainOptions(amp_dtype=amp_dtype)

    def step_of(model: nn.Module) -> Callable[[], float]:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        return partial(
            train_step,
            model,
            batch,
            objective,
            optimizer,
            options=options,
        )

    steps = {}
    compile_s = {}
    for name, model in models.items():
        if "compiled" in name:
            model = _compiled(model)
        steps[name] = step_of(model)
        _synchronize(device)
        start = time.perf_counter()
        steps[name]()  # the first call compiles (when compiled)
        _synchronize(device)
        if "compiled" in name:
            compile_s[name] = time.perf_counter() - start
    alternate(steps, 1, device)  # warm up: allocator, optimizer state
    with FlopCounterMode(display=False) as counter:
        steps["ours (plain)"]()
    flops = counter.get_total_flops()
    times = alternate(steps, repeats, device, "training step")
    tokens = s.batch * 2 * s.length  # source and target tokens
    result = {
        "parameters": counts["ours (plain)"],
        "flops_per_step": flops,
        "dtype": "bfloat16 autocast" if amp_dtype else "float32",
        "compile_s": compile_s,
        "contenders": list(steps),
    }
    for name, t in times.items():
        median = statistics.median(t)
        result[name] = _summary(t) | {
            "tokens_per_s": tokens / median,
            "tflops": flops / median / 1e12,
        }
    base = result["nn.Transformer"]["median_s"]
    for name in steps:
        result[name]["ratio"] = result[name]["median_s"] / base
        result[name]["paired_ratio"] = _paired_ratio(
            times[name], times["nn.Transformer"]
        )
    for key, name in (("plain", "ours (plain)"), ("fused", "ours (fused)")):
        result[f"ratio_{key}"] = result[name]["ratio"]
        result[f"paired_ratio_{key}"] = result[name]["paired_ratio"]
    return result


def bench_decoding(
    s: Sizes, device: torch.device, repeats: int, compile: bool = True
) -> list:
    """Greedy decoding of ``decode_batch`` sequences, every prefix decoded
    again (``use_cache=False``) against the KV cache, and with
    ``compile`` the cached decoding with ``torch.compile`` of the
    model's ``decode`` (shapes marked dynamic: the cache grows each
    step). Compilation is timed apart, in the first call.

    At most ``DECODING_REPEATS`` rounds: decoding 256 tokens without the
    cache takes about ten seconds on two cores.
    """
    seed_everything(1)
    model = our_model(s).to(device).eval()
    src, _ = random_batch(s, s.decode_batch, device)  # (B, S)
    repeats = min(repeats, DECODING_REPEATS)
    greedy_decode(model, src, max_len=4, bos_id=BOS_ID)  # warm up
    compiled = None
    if compile:
        compiled = our_model(s).to(device).eval()
        compiled.load_state_dict(model.state_dict())
        compiled.decode = torch.compile(compiled.decode, dynamic=True)
    rows = []
    for new_tokens in s.decode_tokens:
        # BOS, then the new tokens; eos_id=None: no early stop, so every
        # contender decodes exactly max_len tokens.
        options = dict(max_len=new_tokens + 1, bos_id=BOS_ID)
        contenders = {
            "recompute": partial(greedy_decode, model, src, **options),
            "cached": partial(
                greedy_decode, model, src, use_cache=True, **options
            ),
        }
        row = {"new_tokens": new_tokens, "batch": s.decode_batch}
        if compiled is not None:
            contenders["compiled"] = partial(
                greedy_decode, compiled, src, use_cache=True, **options
            )
            start = time.perf_counter()
            contenders["compiled"]()  # compiles, for new shapes
            _synchronize(device)
            row["compile_s"] = time.perf_counter() - start
        label = f"decoding {new_tokens} tokens"
        outputs = {}
        times = alternate(contenders, repeats, device, label, outputs)
        for name, t in times.items():
            row[name] = _summary(t)
        row["same_tokens"] = all(
            torch.equal(outputs["recompute"], out) for out in outputs.values()
        )
        row["speedup"] = (
            row["recompute"]["median_s"] / row["cached"]["median_s"]
        )
        if compiled is not None:
            row["compiled_speedup"] = (
                row["recompute"]["median_s"] / row["compiled"]["median_s"]
            )
        rows.append(row)
    return rows


def bench_attention(s: Sizes, device: torch.device, repeats: int) -> list:
    """Attention alone (no mask, no gradient) at growing lengths: peak
    memory and time of plain, chunked and fused attention."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device).manual_seed(2)
    rows = []
    for L in s.attention_lengths:
        shape = (1, s.attention_heads, L, s.head_size)  # (B, H, L, D)
        q, k, v = (
            torch.randn(shape, generator=g, device=device, dtype=dtype)
            for _ in range(3)
        )
        contenders = {
            "plain": partial(scaled_dot_product_attention, q, k, v),
            "chunked": partial(
                chunked_attention,
                q,
                k,
                v,
                chunk_size=s.chunk_size,
                query_chunk_size=s.query_chunk_size,
            ),
            "fused": partial(F.scaled_dot_product_attention, q, k, v),
        }
        row = {"length": L, "dtype": str(dtype).removeprefix("torch.")}
        with torch.no_grad():
            for name, fn in contenders.items():
                row[name] = {"peak_bytes": peak_memory(fn, device)}
            label = f"attention L={L}"
            times = alternate(contenders, repeats, device, label)
            for name, t in times.items():
                row[name] |= _summary(t)
        row["plain_over_chunked_memory"] = (
            row["plain"]["peak_bytes"] / row["chunked"]["peak_bytes"]
        )
        rows.append(row)
    return rows
