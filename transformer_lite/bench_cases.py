"""The three measurements of the benchmark (chapter 8), each taken side
by side with the contenders alternating: A B C A B C ..., never
A A A B B B, so that a machine that is busy, warm or throttled slows them
all alike. :mod:`transformer_lite.bench` runs them and prints the tables.
"""

import contextlib
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from transformer_lite.attention import scaled_dot_product_attention
from transformer_lite.bench_models import (
    PAD_ID,
    Sizes,
    TorchReference,
    our_model,
    random_batch,
)
from transformer_lite.decoding import greedy_decode
from transformer_lite.device import seed_everything
from transformer_lite.efficient import (
    chunked_attention,
    peak_memory,
    set_fused_attention,
)

__all__ = [
    "alternate",
    "bench_attention",
    "bench_decoding",
    "bench_training",
]

BOS_ID = 1  # the first token of every decoded sequence
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


def bench_training(s: Sizes, device: torch.device, repeats: int) -> dict:
    """One training step of our model (plain and fused attention) and of
    ``nn.Transformer``, identical in size, weights count and dropout."""
    seed_everything(0)
    plain = our_model(s).to(device)
    fused = our_model(s).to(device)
    fused.load_state_dict(plain.state_dict())
    set_fused_attention(fused, True)
    reference = TorchReference(s).to(device)
    counts = {
        name: sum(p.numel() for p in m.parameters())
        for name, m in (("plain", plain), ("torch", reference))
    }
    if counts["plain"] != counts["torch"]:
        raise AssertionError(f"parameter counts differ: {counts}")
    src, tgt = random_batch(s, s.batch, device)  # (B, S), (B, T + 1)
    cast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )

    def step_of(model: nn.Module) -> Callable[[], None]:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        model.train()

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            with cast:
                logits = model(src, tgt[:, :-1])  # (B, T, V)
                loss = F.cross_entropy(
                    logits.flatten(0, 1),  # (B * T, V)
                    tgt[:, 1:].flatten(),  # (B * T,)
                    ignore_index=PAD_ID,
                )
            loss.backward()
            optimizer.step()

        return step

    steps = {
        "ours (plain)": step_of(plain),
        "ours (fused)": step_of(fused),
        "nn.Transformer": step_of(reference),
    }
    alternate(steps, 2, device)  # warm up: allocator, optimizer state
    with FlopCounterMode(display=False) as counter:
        steps["ours (plain)"]()
    flops = counter.get_total_flops()
    times = alternate(steps, repeats, device, "training step")
    tokens = s.batch * 2 * s.length  # source and target tokens
    result = {
        "parameters": counts["plain"],
        "flops_per_step": flops,
        "dtype": "bfloat16 autocast" if device.type == "cuda" else "float32",
    }
    for name, t in times.items():
        median = statistics.median(t)
        result[name] = _summary(t) | {
            "tokens_per_s": tokens / median,
            "tflops": flops / median / 1e12,
        }
    base = result["nn.Transformer"]["median_s"]
    for key, name in (("plain", "ours (plain)"), ("fused", "ours (fused)")):
        result[f"ratio_{key}"] = result[name]["median_s"] / base
        result[f"paired_ratio_{key}"] = _paired_ratio(
            times[name], times["nn.Transformer"]
        )
    return result


def bench_decoding(s: Sizes, device: torch.device, repeats: int) -> list:
    """Greedy decoding of ``decode_batch`` sequences, every prefix decoded
    again (``use_cache=False``) against the KV cache.

    At most ``DECODING_REPEATS`` rounds: decoding 256 tokens without the
    cache takes about ten seconds on two cores.
    """
    seed_everything(1)
    model = our_model(s).to(device).eval()
    src, _ = random_batch(s, s.decode_batch, device)  # (B, S)
    has_cache = "use_cache" in inspect.signature(greedy_decode).parameters
    repeats = min(repeats, DECODING_REPEATS)
    greedy_decode(model, src, None, 4, BOS_ID)  # warm up
    rows = []
    for new_tokens in s.decode_tokens:
        max_len = new_tokens + 1  # BOS, then the new tokens
        # eos_id=None: no early stop, both decode exactly max_len tokens
        decode = partial(greedy_decode, model, src, None, max_len, BOS_ID)
        if has_cache:
            contenders = {
                "recompute": partial(decode, eos_id=None, use_cache=False),
                "cached": partial(decode, eos_id=None, use_cache=True),
            }
        else:  # the KV cache is not there yet: measure what exists
            contenders = {"recompute": partial(decode, eos_id=None)}
        row = {"new_tokens": new_tokens, "batch": s.decode_batch}
        label = f"decoding {new_tokens} tokens"
        outputs = {}
        times = alternate(contenders, repeats, device, label, outputs)
        for name, t in times.items():
            row[name] = _summary(t)
        if has_cache:
            row["same_tokens"] = bool(
                torch.equal(outputs["recompute"], outputs["cached"])
            )
            row["speedup"] = (
                row["recompute"]["median_s"] / row["cached"]["median_s"]
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
