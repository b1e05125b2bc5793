# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 8. Making it fast
#
# The model of the previous chapters is exact and readable. This chapter
# makes it cheap. We measure where time and memory go, then take the
# standard remedies one at a time, each with the same three steps: the
# idea (an equation where there is one), the few lines of the package
# that implement it, and a measurement on this machine, taken side by
# side with the thing it replaces.
#
# | remedy | what it saves | section |
# |---|---|---|
# | chunked attention, the online softmax | memory of attention | 2 |
# | fused kernels (FlashAttention) | memory and time of attention | 3 |
# | the key/value cache | time of generation | 4 |
# | mixed precision | time and memory of everything | 5 |
# | gradient checkpointing | memory of training | 6 |
# | sliding-window attention | memory and time of long inputs | 7 |
# | model parallelism | the limits of one device | 8 |
# | compilation (`torch.compile`) | time of everything, kernels fused | 9 |
# | what it all bought | every ratio above, side by side | 10 |
#
# All numbers below were measured while this page was built. Timings on a
# shared machine wobble, so the hidden checks assert only relations that
# survive the wobble (equal outputs, memory ratios, a speed-up with a wide
# margin), never a number of milliseconds.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(8)

# %%
import contextlib
import inspect
import io
import math
import os
import platform
import statistics
import textwrap
import time
from unittest import mock

# peak_memory (below) reads the PyTorch profiler, whose C++ side logs a
# line at every start and stop; level 6 keeps it quiet. It must be set
# before the profiler first runs.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import altair as alt
import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch._inductor.exc
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import transformer_lite
from transformer_lite import (
    Encoder,
    MultiHeadAttention,
    attend,
    causal_mask,
    chunked,
    decoding,
    default_device,
    make_model,
    padding_mask,
    scaled_dot_product_attention,
    seed_everything,
)
from transformer_lite.attention import KERNELS
from transformer_lite.bench.cases import bench_attention, bench_decoding
from transformer_lite.bench.fixtures import Sizes, our_model, random_batch
from transformer_lite.bench.memory import peak_memory
from transformer_lite.cache import KVCache
from transformer_lite.chunked import chunked_attention
from transformer_lite.decoding import greedy_decode
from transformer_lite.device import book_seed
from transformer_lite.lm import generate, make_lm
from transformer_lite.masks import local_mask
from transformer_lite.tasks.copy_task import copy_task_batches
from transformer_lite.tokens import PAD_ID
from transformer_lite.training import (
    Batch,
    LabelSmoothingLoss,
    TrainOptions,
    seq2seq_loss,
)
from transformer_lite.training.step import (
    autocast,
    grad_scaler,
    take_step,
    train_step,
)
from transformer_lite.viz import mask_chart

SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
seed_everything(SEED)
device = default_device()
# peak_memory reads CUDA's own counters, or the CPU profiler; on another
# accelerator (Apple's MPS) the memory measurements run on the CPU.
measure_on = device if device.type in ("cpu", "cuda") else torch.device("cpu")
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"transformer_lite {transformer_lite.__version__}")
print(f"device: {device}; memory measured on: {measure_on}")
print(f"BOOK_SEED={SEED}")

# %% [markdown]
# One more setting. On the CPU we time with a single thread, as
# [chapter 1](01_attention) did. Chunked attention and incremental
# decoding run hundreds of small operations, and with two threads every
# one of them ends with the threads waiting for each other; on a busy
# machine one thread that was paused makes the other spin. A single
# thread is far less disturbed, and every contender gets the same
# conditions.

# %%
if device.type == "cpu":
    torch.set_num_threads(1)
print("threads:", torch.get_num_threads())


def quietly(fn, *args, **kwargs):
    """Call fn; the benchmark's progress lines on stderr are dropped."""
    with contextlib.redirect_stderr(io.StringIO()):
        return fn(*args, **kwargs)


def synchronize():
    """Wait for the device, so that a timer measures finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def seconds(fn, repeats=3):
    """Median seconds of `repeats` calls of fn, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


MiB = 2**20
speedups = []  # (remedy, what was compared, measured ratio), for the end

# %% [markdown]
# ## 1. Three ways to compute attention
#
# [Chapter 1](01_attention) measured the cost of plain attention: the
# $(L, L)$ matrices of scores and weights make memory grow as $L^2$, and
# the time too once they dominate. Here are three contenders that compute
# the same function:
#
# - **plain**: the package's `scaled_dot_product_attention`, the formula
#   one operation per line, which builds both $(L, L)$ matrices;
# - **chunked**: `transformer_lite.chunked.chunked_attention`, the same
#   formula in plain PyTorch but visiting the keys a chunk at a time, so
#   that no $(L, L)$ matrix ever exists (section 2 derives it);
# - **fused**: PyTorch's `F.scaled_dot_product_attention`, one call into
#   a kernel written in C++ or CUDA (section 3).
#
# The package's benchmark, `python -m transformer_lite.bench`, measures
# exactly this, and the chapter calls its function rather than keeping
# a second copy: one head of width $D = 64$ at lengths 512 to 8192, no
# mask and no gradient. For each contender it records the peak memory
# (`bench.memory.peak_memory`: CUDA's peak counter, or on the CPU the
# profiler's log of every allocation and free) and then times it, the
# contenders taking turns. On a GPU the meter first runs a few small
# matrix products: the first one allocates cuBLAS's workspace, tens of MiB
# kept for good, which would otherwise be charged to whichever contender
# ran first. Its sizes and the function:

# %%
sizes = Sizes()  # the benchmark's own sizes
print({name: getattr(sizes, name) for name in (
    "attention_lengths", "attention_heads", "head_size", "chunk_size",
    "query_chunk_size")})
print("bench_attention" + str(inspect.signature(bench_attention)))
print(inspect.getdoc(bench_attention))

# %%
# NBVAL_IGNORE_OUTPUT
start = time.perf_counter()
attention_rows = quietly(bench_attention, sizes, measure_on, repeats=1)
names = ("plain", "chunked", "fused")
lengths = [row["length"] for row in attention_rows]
attention_ms = {n: [1e3 * r[n]["median_s"] for r in attention_rows]
                for n in names}
attention_mib = {n: [r[n]["peak_bytes"] / MiB for r in attention_rows]
                 for n in names}
table = pd.DataFrame(
    {"L": lengths}
    | {f"{n} (ms)": attention_ms[n] for n in names}
    | {f"{n} (MiB)": attention_mib[n] for n in names}
).set_index("L")
print(f"dtype {attention_rows[0]['dtype']}, measured in "
      f"{time.perf_counter() - start:.1f} s")
table.round(1)

# %% tags=["remove-input"]
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, marker in zip(names, "osd", strict=True):
    ax.plot(lengths, attention_ms[name], marker + "-", label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("sequence length $L$")
ax.set_ylabel("time per call (ms)")
ax.set_title(f"Attention time, one head, $D = {sizes.head_size}$, "
             f"on {measure_on.type}")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# All three do the same $2L^2D$ multiply-adds, and at long lengths all
# three slow down steeply; on the CPU plain attention's time roughly
# quadruples per doubling. At short lengths the times are small and
# noisy; at long ones the fused kernel, which does the same work in one
# call, is faster than plain attention (where the chunked loop falls
# between the two varies with the machine and its load, so we claim
# nothing about it). Time is not where they differ most, though.
# Memory is, and that needs the idea behind the chunks.

# %% tags=["remove-cell"]
def growth(xs, ys):
    """Least-squares slope of log y against log x: p in y ~ x^p."""
    fit = statistics.linear_regression([math.log(x) for x in xs],
                                       [math.log(y) for y in ys])
    return fit.slope


# The benchmark measured what the prose says, and no contender skipped.
assert lengths == [512, 1024, 2048, 4096, 8192]
assert all(r["plain"]["peak_bytes"] > 0 for r in attention_rows)
assert all(t > 0 for n in names for t in attention_ms[n])
# the fused kernel is faster than plain at the longest length (in every
# run of the sweep; by more on a GPU)
assert attention_ms["fused"][-1] < attention_ms["plain"][-1], attention_ms
if device.type == "cpu":
    # plain attention's time grows about as L^2 at the longest lengths;
    # the other two at least faster than linearly (one timing each, so
    # only loose bounds: a busy machine can delay any single call)
    assert growth(lengths[-3:], attention_ms["plain"][-3:]) > 1.5
    for _n in names:
        assert attention_ms[_n][-1] > 4 * attention_ms[_n][-3], _n

# %% [markdown]
# ## 2. The online softmax
#
# Take one query and its scores $s_1, \dots, s_n$ against $n$ keys, with
# values $v_1, \dots, v_n$. Attention returns
#
# $$
# o = \frac{\sum_j e^{s_j} v_j}{\sum_j e^{s_j}}
#   = \frac{\sum_j e^{s_j - m} v_j}{\sum_j e^{s_j - m}},
# $$
#
# and the second form holds for any shift $m$, because $e^{-m}$ cancels.
# A softmax chooses $m = \max_j s_j$, so that no exponent is positive and
# nothing overflows. That seems to need every score before the first
# exponential: the maximum of all of them. The online softmax
# of {cite:t}`milakov2018online` shows that it does not.
#
# Visit the keys in chunks. After the chunks seen so far, keep three
# things for the query: the largest score seen, $m$; the sum of
# exponentials *relative to that maximum*, $\ell$; and the weighted sum of
# values relative to it, $o$:
#
# $$
# m = \max_{j\ \text{seen}} s_j, \qquad
# \ell = \sum_{j\ \text{seen}} e^{s_j - m}, \qquad
# o = \sum_{j\ \text{seen}} e^{s_j - m}\, v_j .
# $$
#
# Start with $m = -\infty$, $\ell = 0$, $o = 0$. A new chunk $J$ brings
# scores $s_J$. The maximum can only grow:
#
# $$
# m_{\text{new}} = \max\big(m_{\text{old}},\ \max_{j \in J} s_j\big).
# $$
#
# Every term already summed was computed against $m_{\text{old}}$, and
# $e^{s_j - m_{\text{new}}} = e^{s_j - m_{\text{old}}}\,
# e^{m_{\text{old}} - m_{\text{new}}}$. So one factor,
#
# $$
# \alpha = e^{m_{\text{old}} - m_{\text{new}}} \le 1,
# $$
#
# moves the whole old sum to the new maximum, and the chunk's own terms
# are added on top:
#
# $$
# \ell_{\text{new}} = \alpha\, \ell_{\text{old}}
#   + \sum_{j \in J} e^{s_j - m_{\text{new}}}, \qquad
# o_{\text{new}} = \alpha\, o_{\text{old}}
#   + \sum_{j \in J} e^{s_j - m_{\text{new}}}\, v_j .
# $$
#
# After the last chunk, $m$ is the maximum of all scores, $\ell$ and $o$
# are exactly the denominator and numerator above, and the output is
# $o / \ell$. Nothing is approximated: the rescaling is an identity.
# Nothing overflows either, since every exponent is at most zero. And
# the state per query is two numbers and one vector of width $D_v$,
# whatever the number of keys. Here it is for one query, 10 keys and
# chunks of 4, with the symbols as names:

# %%
seed_everything(SEED + 1)
d_k, d_v, L_k, chunk = 4, 3, 10, 4
q = 3 * torch.randn(d_k, dtype=torch.float64)  # (D,), one query
K = torch.randn(L_k, d_k, dtype=torch.float64)  # (Lk, D)
V = torch.randn(L_k, d_v, dtype=torch.float64)  # (Lk, Dv)

m, ell, o = -math.inf, 0.0, torch.zeros(d_v, dtype=torch.float64)
print("keys    max of chunk   m_new    alpha      ell")
for start in range(0, L_k, chunk):
    stop = min(start + chunk, L_k)
    s_J = K[start:stop] @ q / math.sqrt(d_k)  # (c,), this chunk's scores
    m_new = max(m, s_J.max().item())
    alpha = math.exp(m - m_new)  # rescales what was summed so far
    p = torch.exp(s_J - m_new)  # (c,)
    ell = alpha * ell + p.sum().item()
    o = alpha * o + p @ V[start:stop]  # (Dv,)
    m = m_new
    print(f"{start:2d}..{stop - 1:<2d} {s_J.max().item():12.3f} "
          f"{m:8.3f} {alpha:8.4f} {ell:8.4f}")
online = o / ell  # (Dv,)
s = K @ q / math.sqrt(d_k)  # (Lk,), all scores at once, for comparison
print("online  ", online.numpy().round(6))
print("softmax ", (s.softmax(dim=0) @ V).numpy().round(6))

# %% tags=["remove-cell"]
# The loop is exact: the same output as the one-shot softmax, m is the
# overall maximum and ell the softmax denominator relative to it.
torch.testing.assert_close(online, s.softmax(dim=0) @ V, rtol=0, atol=1e-12)
assert m == s.max().item()
assert abs(ell - torch.exp(s - s.max()).sum().item()) < 1e-12
ref, _ = scaled_dot_product_attention(q[None], K, V)  # (1, Dv)
torch.testing.assert_close(online, ref[0], rtol=0, atol=1e-12)

# %% [markdown]
# Each time a chunk holds a new maximum, $\alpha < 1$ shrinks what was
# summed before; when it does not, $\alpha = 1$ (and for the first chunk
# $\alpha = e^{-\infty} = 0$: there is nothing to rescale yet). The
# package's version does the same for every query at once: `m`, `ell`
# and `o` become tensors with one row per query, and a mask enters as
# $-\infty$ scores, whose exponentials are exactly zero. Here is its
# inner loop, `_online_softmax`. `chunked_attention` calls it for each
# block of queries through `_attend_block`, a wrapper that switches
# autocast off, so that the sums are kept in float32 (or float64):

# %%
print(inspect.getsource(chunked._online_softmax))

# %% tags=["remove-cell"]
_wrapper = inspect.getsource(chunked._attend_block)
assert "full_precision(" in _wrapper and "_online_softmax(" in _wrapper
assert "_attend_block" in inspect.getsource(chunked.chunked_attention)

# %% [markdown]
# Two details go beyond the derivation. While a query has seen only
# masked keys its maximum is still $-\infty$, and $e^{-\infty - (-\infty)}$
# would be NaN, so the shift is replaced by 0 there; a query that may
# attend to nothing ends with $\ell = 0$ and gets a zero output, the
# package's rule from [chapter 2](02_masks). And 16-bit inputs are
# accumulated in float32. `chunked_attention` also splits the *queries*
# into blocks (`query_chunk_size`), so the working memory is one block of
# queries times one chunk of keys, whatever $L$ is.
#
# It must equal plain attention, with masks and with gradients. A check
# in float64, with a causal mask combined with padding, chunks that do
# not divide the length, and a query row that may attend to nothing:

# %%
seed_everything(SEED + 2)
B, H, L, D = 2, 3, 50, 16
q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64, device=measure_on,
                       requires_grad=True) for _ in range(3))
keep = torch.tensor([[True] * L, [True] * 35 + [False] * 15],
                    device=measure_on)  # (B, L): row 1 has 15 pad tokens
mask = (keep[:, None, None, :]
        & causal_mask(L, measure_on)[:, None])  # (B, 1, L, L)
mask[0, 0, 7] = False  # query 7 of the first row sees nothing
plain, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, L, D)
chunked = chunked_attention(q, k, v, mask, chunk_size=16,
                            query_chunk_size=24)  # (B, H, L, D)
grads_plain = torch.autograd.grad(plain.sum(), (q, k, v))
grads_chunked = torch.autograd.grad(chunked.sum(), (q, k, v))
print(f"largest |chunked - plain|: {(chunked - plain).abs().max():.1e}")
grad_difference = max((a - b).abs().max().item()
                      for a, b in zip(grads_chunked, grads_plain, strict=True))
print(f"largest gradient difference: {grad_difference:.1e}")

# %% tags=["remove-cell"]
torch.testing.assert_close(chunked, plain, rtol=0, atol=1e-12)
for _a, _b in zip(grads_chunked, grads_plain, strict=True):
    torch.testing.assert_close(_a, _b, rtol=0, atol=1e-12)
assert (chunked[0, :, 7] == 0).all() and not chunked.isnan().any()

# %% [markdown]
# Now the memory, from the benchmark run of section 1:

# %% tags=["remove-input"]
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, marker in zip(names, "osd", strict=True):
    ax.plot(lengths, attention_mib[name], marker + "-", label=name)
ax.plot(lengths, [attention_mib["plain"][-1] * (x / lengths[-1]) ** 2
                  for x in lengths], "k--", lw=1, label="$cL^2$")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("sequence length $L$")
ax.set_ylabel("peak memory (MiB)")
ax.set_title("Peak memory of attention, one head")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
saving = attention_mib["plain"][-1] / attention_mib["chunked"][-1]
print(f"L = {lengths[-1]}: plain {attention_mib['plain'][-1]:.0f} MiB, "
      f"chunked {attention_mib['chunked'][-1]:.1f} MiB, "
      f"{saving:.0f} times less")
speedups.append(("chunked attention", f"peak memory, L = {lengths[-1]}",
                 saving))


# %% tags=["remove-cell"]
_bytes = {n: [r[n]["peak_bytes"] for r in attention_rows] for n in names}
_itemsize = torch.empty(0, dtype=getattr(
    torch, attention_rows[0]["dtype"])).element_size()
# plain holds the scores and the weights, two (L, L) matrices, at its peak
assert all(b >= 2 * x * x * _itemsize
           for x, b in zip(lengths, _bytes["plain"], strict=True))
assert abs(growth(lengths[-3:], _bytes["plain"][-3:]) - 2) < 0.2
# chunked: several times less at the longest length (the benchmark's own
# target is 8x), and at most linear growth
assert _bytes["chunked"][-1] * 8 <= _bytes["plain"][-1], _bytes
assert growth(lengths[-3:], _bytes["chunked"][-3:]) < 1.0
# the fused kernel never stores the matrix either
assert _bytes["fused"][-1] * 8 <= _bytes["plain"][-1], _bytes

# %% [markdown]
# Plain attention follows the $L^2$ line: at $L = 8192$ its two float32
# matrices alone are $2 \cdot 8192^2 \cdot 4$ bytes, 512 MiB, for one head
# of one sequence. Chunked attention stays almost flat: what grows is the
# output, $L \times D$, linear in $L$; its working set of one query block
# times one key chunk is fixed. The same work, a fraction of the memory.
# This is the idea of memory-efficient attention
# {cite:p}`rabe2021self`:
# attention does not need $O(L^2)$ memory.
#
# For training, the backward pass needs the weights again. Storing them
# would bring the $L^2$ back, so `chunked_attention(..., recompute=True)`
# keeps only each block's output and recomputes its weights during the
# backward pass: activation checkpointing (section 6) applied inside one
# function, as FlashAttention's backward pass does.
#
# ## 3. Fused kernels
#
# On a GPU, chunking in Python is not enough. Each of the dozen small
# operations in the loop above is a separate kernel launch that reads
# its inputs from the GPU's main memory (HBM) and writes its result back.
# {cite:t}`dao2022flashattention` observed that attention on a GPU is limited
# by this
# memory traffic, not by arithmetic. **FlashAttention** runs the whole
# online-softmax loop inside *one* kernel: a block of threads loads a
# tile of queries into fast on-chip memory, streams tiles of $K$ and
# $V$ through it, keeps $m$, $\ell$ and $o$ in registers, and writes only
# the final output (and, for the backward pass, each row's
# $m + \log \ell$). The $(L, L)$ matrix never reaches main memory; the
# backward pass recomputes it tile by tile. The arithmetic is the same;
# the bytes moved drop from $O(L^2)$ to $O(L^2 D^2 / M)$ for on-chip
# memory of $M$ numbers, many times fewer since $D^2$ is well below $M$,
# and that is what makes it fast.
#
# PyTorch's `F.scaled_dot_product_attention` chooses among several
# implementations ("backends") at every call:
#
# | backend | device | used when |
# |---|---|---|
# | `FLASH_ATTENTION` | CUDA | 16-bit inputs; no mask, or `is_causal=True` |
# | `EFFICIENT_ATTENTION` | CUDA | float32 too; accepts any mask |
# | `CUDNN_ATTENTION` | recent NVIDIA GPUs | NVIDIA's own fused kernel |
# | `MATH` | any | the formula in ordinary operations: the fallback |
#
# `EFFICIENT_ATTENTION` is memory-efficient attention
# {cite:p}`rabe2021self` as implemented in xFormers: the same tiling, with more
# freedom in
# dtypes and masks and somewhat less speed than flash.
#
# On the CPU, PyTorch has a fused C++ kernel built on the same tiling
# (`_scaled_dot_product_flash_attention_for_cpu`). The context manager
# `torch.nn.attention.sdpa_kernel` restricts the choice. The choice is
# made at every call, from the device, the dtype, the mask and even the
# mask's shape, and the profiler shows which kernel actually ran. On this
# device, for a causal mask given in three equivalent shapes:

# %%
def kernels_used(fn):
    """Names of the attention operations fn ran, from the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sorted({e.key for e in prof.key_averages()
                   if "attention" in e.key and e.key != (
                       "aten::scaled_dot_product_attention")})


seed_everything(SEED + 3)
q, k, v = torch.randn(3, 1, 4, 256, 64, device=device)  # 3 x (B, H, L, D)
tril = causal_mask(256, device)  # (1, L, L), bool
masks = {
    "no mask": None,
    "mask (L, L)": tril[0],
    "mask (1, L, L)": tril,
    "mask (1, 1, L, L)": tril[None],
}
used = {
    case: kernels_used(
        lambda m=m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    for case, m in masks.items()
}
with sdpa_kernel(SDPBackend.MATH):
    used["MATH forced"] = kernels_used(
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=tril[0]))
for case, ops in used.items():
    print(f"{case:18s} {ops}")

# %% tags=["remove-cell"]
MATH_OP = "aten::_scaled_dot_product_attention_math"
CPU_FLASH_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"
assert used["MATH forced"] == [MATH_OP]
assert used["no mask"] != used["MATH forced"]
if device.type == "cpu":
    for _case in ("no mask", "mask (L, L)", "mask (1, 1, L, L)"):
        assert used[_case] == [CPU_FLASH_OP], used
    assert used["mask (1, L, L)"] == [MATH_OP], used

# %% [markdown]
# When this page is built on a CPU, the same causal mask runs the fused
# kernel as an $(L, L)$ or a $(1, 1, L, L)$ tensor, but silently falls
# back to the MATH backend as $(1, L, L)$: the fused CPU kernel takes
# masks with two or four dimensions only. Nothing warns about it; the
# profiler is how to find out.

# %% [markdown]
# `MultiHeadAttention(kernel="fused")` calls this function instead of the
# hand-written one ([chapter 3](03_multi_head_attention)) and applies the
# package's rule for a query row that may attend to nothing. It gives
# the kernel its mask with a head axis, $(B, 1, L_q, L_k)$, a shape the
# CPU kernel and CUDA's memory-efficient and cuDNN kernels take. CUDA's
# flash kernel takes no `attn_mask` at all (the table above): a call with
# a mask never reaches it, whatever the mask's shape, and only a call
# with no mask or with `is_causal=True` is eligible. The two paths must
# agree, with a causal-and-padding mask, and so must the kernel and the
# MATH fallback:

# %%
seed_everything(SEED + 4)
C, h = 64, 4
attn_plain = MultiHeadAttention(C, h, dropout=0.0).to(device).eval()
attn_fused = MultiHeadAttention(C, h, dropout=0.0, kernel="fused")
attn_fused = attn_fused.to(device).eval()
attn_fused.load_state_dict(attn_plain.state_dict())
tokens = torch.randint(1, 9, (2, 40), device=device)  # (B, L)
tokens[1, 25:] = PAD_ID  # padding in the second row
x = torch.randn(2, 40, C, device=device)  # (B, L, C)
mask = padding_mask(tokens, PAD_ID) & causal_mask(40, device)  # (B, L, L)
with torch.no_grad():
    module_ops = kernels_used(lambda: attn_fused(x, x, x, mask))
    y_plain = attn_plain(x, x, x, mask)  # (B, L, C)
    y_fused = attn_fused(x, x, x, mask)  # (B, L, C)
    out_kernel = F.scaled_dot_product_attention(q, k, v, attn_mask=tril[0])
    with sdpa_kernel(SDPBackend.MATH):
        out_math = F.scaled_dot_product_attention(q, k, v,
                                                  attn_mask=tril[0])
print('MultiHeadAttention(kernel="fused") ran', module_ops)
print(f"fused vs hand-written module: {(y_fused - y_plain).abs().max():.1e}")
print(f"fused kernel vs MATH:         "
      f"{(out_kernel - out_math).abs().max():.1e}")

# %% tags=["remove-cell"]
torch.testing.assert_close(y_fused, y_plain, rtol=1e-4, atol=1e-5)
assert MATH_OP not in module_ops  # the module's (B, 1, L, L) mask fuses
torch.testing.assert_close(out_kernel, out_math, rtol=1e-4, atol=1e-5)
_ours, _ = scaled_dot_product_attention(q, k, v, tril)
torch.testing.assert_close(out_kernel, _ours, rtol=1e-4, atol=1e-5)

# %% [markdown]
# Any mask tensor, though, rules FlashAttention out on a GPU: it takes no
# mask but the causal one, given as a flag. When causality is the only
# constraint (a decoder over a batch without padding), the module takes
# `is_causal=True` instead of a mask and hands the kernel none at all:

# %%
with torch.no_grad():
    causal_ops = kernels_used(lambda: attn_fused(x, x, x, is_causal=True))
    y_causal = attn_fused(x, x, x, is_causal=True)  # (B, L, C)
    y_masked = attn_plain(x, x, x, causal_mask(40, device))  # (B, L, C)
print("is_causal=True ran", causal_ops)
print(f"is_causal vs a causal mask: {(y_causal - y_masked).abs().max():.1e}")

# %% tags=["remove-cell"]
torch.testing.assert_close(y_causal, y_masked, rtol=1e-4, atol=1e-5)
assert MATH_OP not in causal_ops
if device.type == "cpu":
    assert causal_ops == [CPU_FLASH_OP], causal_ops

# %% [markdown]
# The package's own causal-only calls take this path. The decoder-only
# language model of [chapter 10](10_language_model) runs each of its
# blocks with `is_causal=True`. When it generates with a KV cache, the
# prompt (as many queries as keys) goes the same way, and each later
# step, one query that may see every cached key, needs no mask at all;
# a chunk of several new queries after cached keys is the one case that
# gets a mask tensor, since the kernel's `is_causal` aligns queries with
# the first keys, not the last. The encoder-decoder's decoder keeps its
# mask: its targets are padded, so causality is not its only constraint.
# Watching the kernel's arguments during one pass and one cached
# generation of a small language model:

# %%
seed_everything(SEED + 5)
lm = make_lm(50, n_layers=2, d_model=64, n_heads=4, dropout=0.0)
lm = lm.to(device).eval()  # fused attention is the model's default
ids = torch.randint(4, 50, (2, 32), device=device)  # (B, L)
kernel = F.scaled_dot_product_attention
kernel_args = []


def spy(*args, **kwargs):
    kernel_args.append((kwargs.get("is_causal", False),
                        kwargs.get("attn_mask") is None))
    return kernel(*args, **kwargs)


with mock.patch.object(F, "scaled_dot_product_attention", spy):
    lm(ids)  # 2 blocks
    generate(lm, ids[:, :8], 4, temperature=0)  # prompt, then 3 steps
lm_ops = kernels_used(lambda: lm(ids))
print("(is_causal, no mask tensor) per call:", kernel_args)
print("one pass ran", lm_ops)

# %% tags=["remove-cell"]
assert kernel_args == [(True, True)] * 4 + [(False, True)] * 6
assert MATH_OP not in lm_ops
if device.type == "cpu":
    assert lm_ops == [CPU_FLASH_OP], lm_ops

# %%
# NBVAL_IGNORE_OUTPUT
fused_speedup = attention_ms["plain"][-1] / attention_ms["fused"][-1]
fused_saving = attention_mib["plain"][-1] / attention_mib["fused"][-1]
print(f"L = {lengths[-1]}, fused against plain: {fused_speedup:.1f} times "
      f"faster, {fused_saving:.0f} times less memory")
speedups.append(("fused kernel", f"time, L = {lengths[-1]}", fused_speedup))
speedups.append(("fused kernel", f"peak memory, L = {lengths[-1]}",
                 fused_saving))

# %% tags=["remove-cell"]
# At the longest length: faster than plain (in every run of the sweep;
# against chunked, one timing each on a shared machine is no claim) and
# the least memory of all three (the same bytes in every run).
assert fused_speedup > 1, attention_ms
assert _bytes["fused"][-1] < min(_bytes["plain"][-1], _bytes["chunked"][-1])

# %% [markdown]
# On this machine, at the longest length, the fused kernel is faster
# than plain attention and needs the least memory of the three
# contenders. On a GPU the gap in time is much wider than on a CPU,
# because there the plain version is limited by memory traffic, which is
# exactly what fusion removes: {cite:t}`dao2022flashattention`
# measured attention several times faster than the standard
# implementation on a GPU, and FlashAttention-2
# {cite:p}`dao2023flashattention` is about twice as fast again. The
# training step of the benchmark, `python -m transformer_lite.bench`,
# compares the whole model with `kernel="fused"` against
# `nn.Transformer`; on a GPU it runs under bfloat16 autocast, the
# subject of section 5.
#
# ### One seam for three kernels
#
# Three kernels now compute the same attention: chapter 1's formula,
# section 2's online softmax and PyTorch's fused kernel.
# `MultiHeadAttention` knows none of them. Its `forward`
# ([chapter 3](03_multi_head_attention)) ends in one call, `attend`, the
# only function in the package that picks a kernel. It also holds what
# the kernels share or lack: the causal rule when the queries are the
# *last* of the keys (a cache), the things a kernel cannot do (neither
# the fused nor the chunked kernel forms the weights; the chunked one
# has none to drop out) and the one case in which the fused kernel is
# told `is_causal` rather than handed a mask:

# %%
attend_source = inspect.getsource(attend)
print(attend_source[attend_source.index("    check_kernel(kernel)"):])

# %% [markdown]
# A module picks its kernel with `kernel=`, a whole model with
# `set_attention_kernel`. The same module under each kernel, with the
# causal-and-padding mask from above, and then with a key/value cache
# (section 4) fed 30 positions and then 10, the second chunk's queries
# being the last 10 of 40 keys:

# %%
kernel_gaps = []
with torch.no_grad():
    for name in KERNELS:
        attn = MultiHeadAttention(C, h, dropout=0.0, kernel=name)
        attn.load_state_dict(attn_plain.state_dict())
        attn = attn.to(device).eval()
        cache = KVCache()
        pieces = [attn(c, c, c, cache=cache, is_causal=True)
                  for c in (x[:, :30], x[:, 30:])]  # fmt: skip
        kernel_gaps.append((
            name,
            (attn(x, x, x, mask) - y_plain).abs().max().item(),
            (torch.cat(pieces, dim=1) - y_masked).abs().max().item(),
            attn.why_not_fused,
        ))
pd.DataFrame(kernel_gaps, columns=["kernel", "masked: gap to plain",
                                   "cached, causal: gap to plain",
                                   "why_not_fused"])

# %% tags=["remove-cell"]
for _name, _masked, _cached, _why in kernel_gaps:
    assert _masked < 1e-5 and _cached < 1e-5, kernel_gaps
    assert (_why == "") == (_name == "fused"), kernel_gaps

# %% [markdown]
# ## 4. The key/value cache
#
# Generation is sequential: to produce token $t + 1$ the decoder needs
# tokens $1..t$. Greedy decoding as written in [chapter 6](06_training)
# runs the decoder over the whole prefix at every step. In each layer,
# step $t$ projects all $t$ positions to queries, keys and values,
# $O(t\,C^2)$, and attends among them, $O(t^2 C)$. Summed over $n$ steps
# that is
#
# $$
# \sum_{t=1}^{n} \big(t\,C^2 + t^2 C\big) = O(n^2 C^2 + n^3 C),
# $$
#
# yet the keys and values of tokens $1..t-1$ are the same at every step:
# a causal decoder never lets an old position see a new one. Caching them
# leaves one new position per step: project it, $O(C^2)$, and let it
# attend over the $t$ cached keys, $O(t\,C)$; in total
# $O(n\,C^2 + n^2 C)$, one power of $n$ less. The encoder's memory is
# fixed too, so cross-attention projects it to keys and values once.
#
# The package keeps, per attention module, a `KVCache` that appends:

# %%
print(inspect.getsource(KVCache.update))

# %% [markdown]
# `greedy_decode(..., use_cache=True)` makes one cache per decoding
# (`model.new_cache()`) and feeds the model only the newest token, with
# a mask that hides padding among the cached keys, the last row of
# the full decoder's target mask:

# %%
print(inspect.getsource(decoding._cached_next_token_logits))

# %% [markdown]
# First the work, counted: a hook on the decoder records how many
# positions it is given at each step.

# %%
seed_everything(SEED + 5)
kv_sizes = Sizes(vocab=100, d_model=64, n_layers=2, d_ff=256, n_heads=4,
                 length=16, decode_batch=4,
                 decode_tokens=(16, 32, 64, 128))
model = our_model(kv_sizes).to(device).eval()
src, _ = random_batch(kv_sizes, kv_sizes.decode_batch, device)  # (B, S)
positions = []
hook = model.decoder.register_forward_pre_hook(
    lambda module, args: positions.append(args[0].size(1)))
n_new = 32
outputs, computed = {}, {}
for use_cache in (False, True):
    positions.clear()
    outputs[use_cache] = greedy_decode(
        model,
        src,
        max_len=n_new + 1,
        bos_id=1,
        use_cache=use_cache,
    )  # (B, n + 1)
    computed[use_cache] = list(positions)  # positions given, per step
    print(f"use_cache={use_cache!s:5}: the decoder computed "
          f"{sum(positions)} positions for {n_new} new tokens")
hook.remove()

# %% tags=["remove-cell"]
assert torch.equal(outputs[True], outputs[False])
# recomputing: 1 + 2 + ... + n positions; cached: one per step
assert computed[False] == list(range(1, n_new + 1))
assert computed[True] == [1] * n_new
assert sum(computed[False]) == 528 and sum(computed[True]) == 32

# %% [markdown]
# 528 positions against 32, for the same tokens. The tokens must be the
# same in every case, including a batch whose rows stop at different
# steps: an end token that only some rows emit, after which their
# positions hold padding.

# %%
free = greedy_decode(model, src, max_len=20, bos_id=1)  # (B, 20)
eos_id = int(free[0, 5])  # a token the first row emits; some rows stop
stopped = {use_cache: greedy_decode(
    model,
    src,
    max_len=20,
    bos_id=1,
    eos_id=eos_id,
    use_cache=use_cache,
)
           for use_cache in (False, True)}
print(stopped[True])

# %% tags=["remove-cell"]
assert torch.equal(stopped[True], stopped[False])
_ends = [(row == eos_id).nonzero()[0, 0].item() if (row == eos_id).any()
         else None for row in stopped[True]]
assert len(set(_ends)) > 1  # rows stopped at different steps (or not)
assert (stopped[True] == model.config.pad_id).any()  # padded after eos

# %% [markdown]
# Now the time. The benchmark's decoding measurement takes a model and a
# list of output lengths and times greedy decoding with and without the
# cache, in turns; we give it a small model (the sizes above) so that the
# uncached runs stay short.

# %%
# NBVAL_IGNORE_OUTPUT
decoding_rows = quietly(bench_decoding, kv_sizes, device, repeats=2,
                        compile=False)
new_tokens = [row["new_tokens"] for row in decoding_rows]
per_sequence = {
    name: [1e3 * row[name]["median_s"] / row["batch"]
           for row in decoding_rows]
    for name in ("recompute", "cached")
}
pd.DataFrame({"new tokens": new_tokens,
              "recompute (ms)": per_sequence["recompute"],
              "cached (ms)": per_sequence["cached"],
              "speed-up": [row["speedup"] for row in decoding_rows],
              "same tokens": [row["same_tokens"] for row in decoding_rows],
              }).set_index("new tokens").round(2)

# %% tags=["remove-input"]
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(new_tokens, per_sequence["recompute"], "o-",
        label="recompute every prefix")
ax.plot(new_tokens, per_sequence["cached"], "s-", label="KV cache")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("tokens generated per sequence")
ax.set_ylabel("time per sequence (ms)")
ax.set_title(f"Greedy decoding, batch of {kv_sizes.decode_batch}, "
             f"on {device.type}")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
cache_speedup = decoding_rows[-1]["speedup"]
print(f"{new_tokens[-1]} tokens: the cache is {cache_speedup:.1f} times "
      "faster")
speedups.append(("KV cache", f"greedy decoding, {new_tokens[-1]} tokens",
                 cache_speedup))

# %% tags=["remove-cell"]
assert all(row["same_tokens"] for row in decoding_rows)
# The speedups are timings of a few repeats: printed, not asserted (a
# loaded machine turned 2.0-3.6x at 128 tokens into 1.2x in one run).

# %% [markdown]
# The recomputing time grows faster than the cached one, and the gap
# widens with every token: over the chapter's sweep (nine runs on two
# quiet cores) the cache was 2.0 to 3.6 times faster at 128 tokens. These
# are timings of two repeats each, so a busy machine can hide the gap at
# the shortest lengths; the tokens, though, are the same every time.
# The cached time is not quite linear either:
# each step still attends over all $t$ cached keys, and `torch.cat`
# copies the cache to append one position, both $O(t\,C)$. With a model
# this small much of each step is fixed overhead (Python, one call per
# layer); larger models and longer outputs widen the gap further. On a
# GPU a tiny model is limited by kernel launches, which both variants
# make in equal number, so there the cache pays off only for larger
# models and longer sequences.
#
# The cache costs memory: per layer, keys and values for every past
# position, $2 \cdot B \cdot L \cdot C$ numbers. For the paper's base
# model ($N = 6$, $C = 512$) in float32, one sequence of 1000 tokens
# holds $2 \cdot 6 \cdot 1000 \cdot 512 \cdot 4$ bytes, about 23 MiB, in
# its self-attention caches; serving many long sequences at once, the
# cache rather than the weights fills the GPU. Multi-query attention
# {cite:p}`shazeer2019fast` and grouped-query attention
# {cite:p}`ainslie2023gqa`
# shrink it by sharing keys and values among heads.

# %% tags=["remove-cell"]
assert abs(2 * 6 * 1000 * 512 * 4 / MiB - 23.4) < 0.1

# %% [markdown]
# ## 5. Mixed precision
#
# Our models have so far computed in float32: 4 bytes, 8 exponent bits
# and 23 bits of fraction. Two 16-bit formats halve the bytes, and modern
# hardware multiplies them much faster (on a GPU's tensor cores, several
# times faster than float32). They split their 16 bits differently:

# %%
rows = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    info = torch.finfo(dtype)
    fraction_bits = round(-math.log2(info.eps))
    rows.append({"dtype": str(dtype).removeprefix("torch."),
                 "bits": info.bits,
                 "exponent bits": info.bits - 1 - fraction_bits,
                 "fraction bits": fraction_bits,
                 "largest": f"{info.max:.6g}",
                 "smallest normal": f"{info.tiny:.4g}",
                 "eps": f"{info.eps:.3g}"})
pd.DataFrame(rows).set_index("dtype")

# %% tags=["remove-cell"]
assert [r["exponent bits"] for r in rows] == [8, 8, 5]
assert [r["fraction bits"] for r in rows] == [23, 7, 10]
assert torch.finfo(torch.float16).max == 65504
assert torch.finfo(torch.bfloat16).tiny == torch.finfo(torch.float32).tiny

# %% [markdown]
# **bfloat16** {cite:p}`kalamkar2019study` keeps float32's exponent, so it
# spans the same range, $10^{-38}$ to $3 \cdot 10^{38}$, with only 8 bits
# of precision: about 2 to 3 significant digits. **float16** has more
# precision (11 bits) but a 5-bit exponent: nothing above 65504, and
# nothing below $6 \cdot 10^{-5}$ at full precision. Gradients are often
# far smaller than that. Here are a few typical sizes in both formats:

# %%
g = torch.tensor([1e-3, 1e-5, 1e-7, 1e-9])  # sizes of gradient entries
scale = 2.0**16
print("float32          ", g.numpy())
print("bfloat16         ", g.bfloat16().float().numpy())
print("float16          ", g.half().float().numpy())
print("float16, scaled  ", ((g * scale).half().float() / scale).numpy())

# %% tags=["remove-cell"]
assert g.half()[-1] == 0  # 1e-9 underflows to zero in float16
assert torch.allclose(g.bfloat16().float(), g, rtol=1e-2)
torch.testing.assert_close((g * scale).half().float() / scale, g,
                           rtol=1e-3, atol=0)

# %% [markdown]
# In float16, $10^{-9}$ becomes zero and $10^{-7}$ keeps one significant
# bit: the update they carry is lost. **Loss scaling**
# {cite:p}`micikevicius2018mixed` multiplies the loss by a large factor $S$
# before the
# backward pass. The chain rule is linear, so every gradient is
# multiplied by $S$ too and moves up into float16's range; dividing the
# gradients by $S$ (in float32) before the optimizer step restores their
# values. `torch.amp.GradScaler` picks $S$ on the fly: it starts at
# $2^{16}$, halves it and skips the step when a gradient overflows to
# infinity, and doubles it after 2000 steps without overflow. bfloat16
# needs none of this: with float32's range, what does not underflow in
# float32 does not underflow in bfloat16.
#
# Mixed precision does not convert the model. Under `torch.autocast` the
# parameters, their gradients and the optimizer's state stay float32;
# operations that gain from 16 bits and tolerate them (matrix products)
# run in 16 bits, and those that need range or accumulate long sums
# (on a GPU: the softmax, LayerNorm, the loss) run in float32. On the
# CPU, autocast leaves the softmax and LayerNorm in the dtype of their
# input; our loss always computes its `log_softmax` in float32.
#
# **Masks need care.** A 16-bit score matrix must still hide masked
# keys. [Chapter 2](02_masks) showed the trap: $-10^9$ does not exist in
# float16, and `masked_fill` refuses it. The package fills with
# `torch.finfo(scores.dtype).min`, the most negative finite number of
# *whatever dtype the scores have*, and zeroes the weights of a query
# row with nothing to attend to:

# %%
source = inspect.getsource(scaled_dot_product_attention)
print(source[source.index("    if mask is not None:"):
             source.index("    if dropout is not None:")])
try:
    torch.zeros(2, dtype=torch.float16).masked_fill(
        torch.tensor([True, False]), -1e9)
except RuntimeError as error:
    print("float16 and -1e9:", error)

# %% [markdown]
# So a whole model under bfloat16 autocast stays finite even on a batch
# built to be awkward: right padding, left padding (the first two target
# queries of row 1 see only padding) and a source that is all padding.

# %%
awkward = Batch(
    torch.tensor([[1, 5, 6, 7, 2], [1, 5, 2, 0, 0], [0, 0, 0, 0, 0]]),
    torch.tensor([[1, 5, 6, 7, 2, 0], [0, 0, 1, 9, 4, 2],
                  [1, 3, 3, 2, 0, 0]]),
    PAD_ID,
).to(device)
seed_everything(SEED + 6)
tiny = make_model(12, 12, n_layers=2, d_model=32, d_ff=64, n_heads=4,
                  dropout=0.0).to(device).eval()
loss_fn = LabelSmoothingLoss(12, PAD_ID, smoothing=0.0)
with torch.no_grad():
    full = loss_fn(tiny(awkward.src, awkward.tgt_in), awkward.tgt_out)
    with autocast(device, torch.bfloat16):
        logits = tiny(awkward.src, awkward.tgt_in)  # (B, T, V), bfloat16
        half = loss_fn(logits, awkward.tgt_out)
print(f"logits {logits.dtype}, all finite: {logits.isfinite().all().item()}")
print(f"loss: float32 {full.item():.4f}, bfloat16 autocast {half.item():.4f}")

# %% tags=["remove-cell"]
assert not awkward.tgt_mask[1, 0].any() and not awkward.src_mask[2].any()
assert logits.dtype == torch.bfloat16 and logits.isfinite().all()
assert abs(half.item() - full.item()) < 0.05 * full.item()

# %% [markdown]
# Mixed precision is an option of the package's one training step,
# `train_step` of [chapter 6](06_training), not a second copy of it:
# `TrainOptions(amp_dtype=...)` wraps the forward pass and the
# objective in `autocast(device, dtype)` (a context that does nothing
# for `None`), and `scaler` takes a `grad_scaler(device, dtype)`, which
# scales the loss for float16 on CUDA and otherwise passes it through
# unchanged (float16 on other devices is refused with an explanation,
# once, when the step checks its arguments). The lines that differ from
# a float32 step are few:

# %%
step_source = inspect.getsource(take_step)
body = step_source[step_source.index("    device = module_device"):]
print(textwrap.dedent(body))

# %% [markdown]
# Now a short run on the copy task of [chapter 6](06_training), twice
# from the same seed on the same batches: once in float32, once under
# bfloat16 autocast.

# %%
# NBVAL_IGNORE_OUTPUT
V_copy, n_steps = 20, 100
batches = copy_task_batches(n_steps, 32, 10, V_copy, SEED + 7,
                            min_len=5, device=device)
curves, step_seconds = {}, {}
for name, amp_dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
    seed_everything(SEED + 8)
    model = make_model(V_copy, V_copy, n_layers=2, d_model=32, d_ff=64,
                       n_heads=4, dropout=0.0).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3,
                                 betas=(0.9, 0.98))
    scaler = grad_scaler(device, amp_dtype)  # passes the loss through
    objective = seq2seq_loss(
        LabelSmoothingLoss(V_copy, PAD_ID, 0.0, reduction="sum"))
    options = TrainOptions(amp_dtype=amp_dtype)
    curves[name], times = [], []
    for batch in batches:
        synchronize()
        start = time.perf_counter()
        curves[name].append(train_step(model, batch, objective, optimizer,
                                       options=options, scaler=scaler))
        synchronize()
        times.append(time.perf_counter() - start)
    step_seconds[name] = statistics.median(times[10:])
    print(f"{name:9s} loss {curves[name][0]:.3f} -> "
          f"{curves[name][-1]:.3f}, {1e3 * step_seconds[name]:.1f} ms "
          "per step")

# %% tags=["remove-input"]
frame = pd.DataFrame([
    {"step": i, "precision": name, "loss": loss}
    for name, curve in curves.items() for i, loss in enumerate(curve)
])
alt.Chart(frame, title="Copy task: float32 and bfloat16 autocast, "
          "same seed").mark_line().encode(
    x=alt.X("step:Q", title="optimizer step"),
    y=alt.Y("loss:Q", title="training loss (nats per token)"),
    color=alt.Color("precision:N", title="precision"),
    strokeDash=alt.StrokeDash("precision:N", title="precision"),
    tooltip=["precision:N", "step:Q", alt.Tooltip("loss:Q", format=".3f")],
).properties(width=420, height=240)

# %% tags=["remove-cell"]
_first = {n: statistics.mean(c[:10]) for n, c in curves.items()}
_last = {n: statistics.mean(c[-10:]) for n, c in curves.items()}
for _n in curves:  # both learn: the loss falls by nearly half (~3.0 to
    assert _last[_n] < 0.6 * _first[_n], (_n, _first, _last)  # ~1.6)
# ... and bfloat16 tracks float32: same start, end within a margin
assert abs(_first["bfloat16"] - _first["float32"]) < 0.05
assert abs(_last["bfloat16"] - _last["float32"]) < 0.35 * _last["float32"]
assert all(math.isfinite(x) for c in curves.values() for x in c)

# %%
# NBVAL_IGNORE_OUTPUT
amp_speedup = step_seconds["float32"] / step_seconds["bfloat16"]
print(f"training step, float32 / bfloat16 time: {amp_speedup:.2f}")
speedups.append(("bfloat16 autocast", "training step time (tiny model)",
                 amp_speedup))

# %% [markdown]
# The two curves start together and stay close; rounding to 8 bits of
# precision makes them drift apart a little. Speed is another matter.
# Here bfloat16 gains nothing (the ratio above): at these sizes this
# CPU's bfloat16 matrix products are no faster than float32 ones, and
# autocast adds a cast before each of them. The payoff comes with large
# matrix products on hardware built for 16-bit arithmetic: GPUs with
# tensor cores (there float16 and bfloat16 products run several times
# faster than float32), and CPUs with bfloat16 instructions. Memory
# falls as well, because most activations saved for the backward pass
# are stored in 16 bits; section 6 measures it.
#
# ## 6. Gradient checkpointing
#
# The backward pass needs the activations of the forward pass: each
# layer's inputs, its attention weights, the hidden layer of its
# feed-forward network. Training therefore holds the activations of all
# $N$ layers at once, and for long sequences that, not the weights, is
# what fills memory. Gradient checkpointing
# {cite:p}`chen2016training` keeps
# only each layer's *input* during the forward pass. In the backward
# pass it runs the layer's forward again, from that input, just before
# it needs the activations, and frees them once the layer's gradients
# are done. Memory for activations drops from all $N$ layers to one layer
# plus $N$ inputs; the price is a second forward pass, on paper about a
# third more time, since a backward pass costs about two forward passes.
# In the package it is one attribute per stack, read in `forward`:

# %%
print(inspect.getsource(Encoder.forward))

# %% [markdown]
# Dropout is random, so the recomputed forward pass must draw the same
# dropout masks as the first one; `torch.utils.checkpoint` saves and
# restores the random state for that. We measure one training step
# (forward, loss, backward) of a 4+4-layer model on a batch of 4
# sequences of 128 tokens, with and without checkpointing: its peak
# memory, its time, and its gradients.

# %%
# NBVAL_IGNORE_OUTPUT
seed_everything(SEED + 9)
V_ck = 100
model = make_model(V_ck, V_ck, n_layers=4, d_model=64, d_ff=256, n_heads=4,
                   dropout=0.1).to(measure_on)
src = torch.randint(1, V_ck, (4, 128), device=measure_on)  # (B, S)
tgt = torch.randint(1, V_ck, (4, 129), device=measure_on)  # (B, T + 1)


def training_step(amp_dtype=None):
    torch.manual_seed(SEED + 10)  # the same dropout masks in every run
    with autocast(measure_on, amp_dtype):
        logits = model(src, tgt[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    loss.backward()


checkpointed = {}
for on in (False, True):
    model.encoder.checkpointing = model.decoder.checkpointing = on
    model.zero_grad(set_to_none=True)
    peak = peak_memory(training_step, measure_on)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    step_time = seconds(training_step, repeats=2)
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as flops:  # the arithmetic done
        training_step()
    checkpointed[on] = {"peak MiB": peak / MiB, "step ms": 1e3 * step_time,
                        "GFLOP": flops.get_total_flops() / 1e9,
                        "grads": grads}
model.encoder.checkpointing = model.decoder.checkpointing = False
model.zero_grad(set_to_none=True)
bf16_peak = peak_memory(lambda: training_step(torch.bfloat16), measure_on)
print(f"without checkpointing, under bfloat16 autocast: {bf16_peak / MiB:.1f}"
      " MiB")
pd.DataFrame({on: {k: v for k, v in r.items() if k != "grads"}
              for on, r in checkpointed.items()}).T.rename_axis(
    "checkpointing").round(1)

# %%
# NBVAL_IGNORE_OUTPUT
ck_saving = (checkpointed[False]["peak MiB"]
             / checkpointed[True]["peak MiB"])
ck_cost = checkpointed[True]["step ms"] / checkpointed[False]["step ms"]
ck_work = checkpointed[True]["GFLOP"] / checkpointed[False]["GFLOP"]
print(f"checkpointing: {ck_saving:.1f} times less memory, "
      f"{ck_work:.2f} times the arithmetic, {ck_cost:.2f} times the time")
speedups.append(("checkpointing", "peak memory of a training step",
                 ck_saving))
speedups.append(("checkpointing", "time of a training step (a cost)",
                 1 / ck_cost))

# %% tags=["remove-cell"]
# Exactly the same gradients (dropout included), much less memory.
for _a, _b in zip(checkpointed[False]["grads"], checkpointed[True]["grads"],
                  strict=True):
    assert torch.equal(_a, _b)
assert ck_saving > 2, checkpointed
# bfloat16 autocast alone saves memory too: ~1.4x on the CPU and a GPU
# alike (attention scores stay float32; CUDA's autocast rules, emulated
# on the CPU in tests/test_mixed_precision.py, gave the same 0.69). One
# bound holds for both, with a margin.
_bf16_ratio = bf16_peak / (checkpointed[False]["peak MiB"] * MiB)
assert _bf16_ratio < 0.85, _bf16_ratio
if measure_on.type == "cpu":
    assert _bf16_ratio < 0.75, _bf16_ratio  # ~1.4x
assert bf16_peak > checkpointed[True]["peak MiB"] * MiB  # "by less"
# Recomputing is extra work: counted, not timed (a time depends on the
# machine's load), one more forward pass of the layers in three.
assert 1.2 < ck_work < 1.45, ck_work
assert model.training  # checkpointing acts only in training mode

# %% [markdown]
# The gradients are identical, bit for bit, dropout included. Memory
# falls several times over, and the step does about a third more
# arithmetic (counted by PyTorch's `FlopCounterMode`: the layers' forward
# pass runs twice, and a backward pass costs about two forward passes),
# so it takes longer; the time ratio above is this run's, on a machine
# whose load we do not control. bfloat16 autocast alone
# (section 5) also lowers the peak, by less: about 1.4 times, on a CPU
# and on a GPU alike. The attention scores, the largest activations at
# this length, stay in float32 even under autocast (the package computes
# them so, that nothing overflows), and what they save for the backward
# pass keeps 4 bytes a number.
# Checkpointing every layer is the extreme; checkpointing every
# $\sqrt{N}$-th layer gives memory $O(\sqrt{N})$ for one extra forward
# pass {cite:p}`chen2016training`. It pays
# whenever memory, not time, decides what fits: a longer sequence, a
# bigger batch, a deeper model on the same device.
#
# ## 7. Sliding-window attention
#
# Every remedy so far computes exact, full attention. The cheapest
# attention is the one not computed at all. In sliding-window (local)
# attention each position attends only to its $w$ most recent
# positions, itself included. [Chapter 2](02_masks) built the mask:

# %%
mask_chart(local_mask(16, 4),
           title="Sliding-window causal mask, L = 16, w = 4")

# %% [markdown]
# A causal mask allows $L(L+1)/2$ pairs; a window allows at most $w$ per
# query, about $L w$ in all. As a mask alone this saves nothing: the plain
# function still computes all $L^2$ scores and throws most of them away.
# The saving is real only when the computation skips what the mask
# forbids. For one block of queries $i \in [a, b)$ the allowed keys are
# $j \in [a - w + 1, b)$, a band of at most $b - a + w - 1$ keys. Attending
# block by block over that band only:

# %%
def sliding_window_attention(q, k, v, w, block=256):
    """Causal attention over the last w positions, computing only the
    band of keys each block of queries can see.

    Shape: q, k, v: (..., L, D); output: (..., L, D).
    """
    L = q.size(-2)
    outputs = []
    for a in range(0, L, block):
        b = min(a + block, L)
        lo = max(0, a - w + 1)  # the first key any query in [a, b) sees
        i = torch.arange(a, b, device=q.device).unsqueeze(1)  # (Lb, 1)
        j = torch.arange(lo, b, device=q.device)  # (Lband,)
        band = (j <= i) & (j > i - w)  # (Lb, Lband), True = may attend
        out, _ = scaled_dot_product_attention(
            q[..., a:b, :], k[..., lo:b, :], v[..., lo:b, :], band
        )  # (..., Lb, D)
        outputs.append(out)
    return torch.cat(outputs, dim=-2)  # (..., L, D)


seed_everything(SEED + 11)
L, w = 4096, 256
q, k, v = torch.randn(3, 1, 1, L, 64, device=measure_on)  # (B, H, L, D)
window = local_mask(L, w, measure_on)  # (1, L, L)
with torch.no_grad():
    masked, _ = scaled_dot_product_attention(q, k, v, window)
    banded = sliding_window_attention(q, k, v, w)
print(f"largest |banded - masked|: {(banded - masked).abs().max():.1e}")
print(f"allowed pairs: window {window.sum().item():,}, causal "
      f"{L * (L + 1) // 2:,}, all {L * L:,}")

# %% tags=["remove-cell"]
torch.testing.assert_close(banded, masked, rtol=1e-5, atol=1e-5)
assert window.sum().item() == L * w - w * (w - 1) // 2

# %%
# NBVAL_IGNORE_OUTPUT
with torch.no_grad():
    full_call = lambda: scaled_dot_product_attention(q, k, v, window)
    band_call = lambda: sliding_window_attention(q, k, v, w)
    window_mib = {"masked": peak_memory(full_call, measure_on) / MiB,
                  "banded": peak_memory(band_call, measure_on) / MiB}
    window_ms = {"masked": 1e3 * seconds(full_call, repeats=2),
                 "banded": 1e3 * seconds(band_call, repeats=2)}
window_time = window_ms["masked"] / window_ms["banded"]
window_memory = window_mib["masked"] / window_mib["banded"]
print(f"L = {L}, w = {w}: masked full {window_ms['masked']:.0f} ms, "
      f"{window_mib['masked']:.0f} MiB; banded {window_ms['banded']:.0f} "
      f"ms, {window_mib['banded']:.1f} MiB")
speedups.append(("sliding window", f"time, L = {L}, w = {w}", window_time))
speedups.append(("sliding window", f"peak memory, L = {L}, w = {w}",
                 window_memory))

# %% tags=["remove-cell"]
assert window_memory > 8, window_mib
if device.type == "cpu":
    assert window_time > 2, window_ms  # ~15x measured

# %% [markdown]
# Both cost and memory now grow as $L\,w$ instead of $L^2$. What is
# lost is reach: one layer sees only $w$ positions back. Stacking layers
# restores some of it, since layer $n$ can draw on positions up to about
# $n(w - 1)$ back through the layers below; Mistral 7B
# {cite:p}`jiang2023mistral` uses a window of 4096 this way. Sliding windows
# are the simplest
# **sparse attention** pattern. The Sparse Transformer
# {cite:p}`child2019generating` adds strided positions; Longformer
# {cite:p}`beltagy2020longformer` and BigBird {cite:p}`zaheer2020big` add a few
# global tokens that see and are
# seen by every position. A further family replaces the softmax by a
# kernel approximation or a low-rank projection to reach linear cost
# (Linformer {cite:p}`wang2020linformer`; Performer
# {cite:p}`choromanski2021rethinking`),
# at the price of computing something other than exact attention.
#
# ## 8. When one device is not enough: model parallelism
#
# Everything above makes one device go further. Large models also need several.
# **Data parallelism** gives every device a full copy of the model and a share
# of each batch, and averages the gradients ([chapter 7](07_translation) trains
# this way with `torch.distributed`); it speeds training up but does not shrink
# the model's footprint. ZeRO
# {cite:p}`rajbhandari2020zero` and PyTorch's FSDP
# shard the optimizer state, gradients and weights across the data-parallel
# devices and gather each layer only while it runs. **Tensor parallelism**
# (Megatron-LM {cite:p}`shoeybi2019megatron`) splits each weight matrix:
# attention heads, and the columns then rows of the feed-forward network,
# go to different devices, with one all-reduce per block in the forward
# pass and another in the backward; it needs fast links between the
# devices. **Pipeline parallelism** (GPipe
# {cite:p}`huang2019gpipe`) gives each
# device a range of layers and keeps them all busy by streaming micro-batches
# through the stages. For very long sequences, **sequence (context)
# parallelism** splits the positions, passing blocks of keys and values around
# a ring of devices while each computes the online softmax of section 2 for its
# own queries (Ring Attention {cite:p}`liu2023ring`). These schemes pay off
# only with several devices, so this chapter times none of them. They do
# run on a CPU, though, in processes that talk over `gloo`:
# the data-parallel training of [chapter 7](07_translation) is checked on
# two processes against one (`tests/test_distributed.py`), and
# [chapter 12](12_shipping_and_scaling_out) runs tensor parallelism and
# FSDP on two, checks their logits and gradients against one process and
# measures the parameter memory each process holds.
#
# ## 9. Compilation
#
# Every remedy so far changed the algorithm. `torch.compile` changes how
# the same algorithm runs. TorchDynamo reads the Python of `forward` and
# records its tensor operations as a graph; the inductor backend then
# fuses neighbouring element-wise operations (the scale, the mask, the
# softmax, dropout, the residual additions) into generated kernels, C++
# with OpenMP on a CPU and Triton on a GPU, and on a GPU it can replay
# the whole graph as one CUDA graph, so that the device no longer waits
# for Python to launch each small kernel.
#
# A graph has to be known before it runs. Anything in `forward` that asks
# a tensor for its *value*, such as `int(tokens.max())`, `if mask.all():`
# or `.item()`, makes the CPU wait for the device and cuts the graph in
# two. Our model checks token ids against its vocabulary only where
# that reads no device: on the CPU, and outside a graph being compiled
# (`torch.compiler.is_compiling()`); on a GPU, `model.check_ids = True`
# turns the check on for debugging. Shapes and dtypes are checked
# everywhere, from what the host knows. So `fullgraph=True`, which
# refuses any such cut, takes the whole model,
# and the compiled model computes what the eager one does. (Inductor
# builds its kernels with the machine's C++ compiler, for the vector
# units it finds; where that build fails, the cell below says why and
# the chapter goes on without it.)

# %%
# NBVAL_IGNORE_OUTPUT
seed_everything(SEED + 11)
V_c = 50
eager = make_model(V_c, V_c, n_layers=2, d_model=64, d_ff=128, n_heads=4,
                   dropout=0.0).to(device).eval()
src = torch.randint(1, V_c, (16, 32), device=device)  # (B, S)
tgt = torch.randint(1, V_c, (16, 32), device=device)  # (B, T)
# A graph break is a bug of ours and stops the chapter; a C++ build that
# fails on this machine's compiler or CPU is reported, and we go on.
BACKEND_FAILURES = (torch._dynamo.exc.BackendCompilerFailed,
                    torch._inductor.exc.InductorError)
torch._dynamo.reset()
compiled = torch.compile(eager, fullgraph=True)
with torch.no_grad():
    eager_logits = eager(src, tgt)  # (B, T, V)
    eager_ms = 1e3 * seconds(lambda: eager(src, tgt), repeats=5)
    start = time.perf_counter()
    try:
        compiled_logits = compiled(src, tgt)  # the first call compiles
    except BACKEND_FAILURES as error:  # not a graph break: the C++ build
        compiled_logits, compile_failure = None, error
    else:
        compile_failure = None
    compile_seconds = time.perf_counter() - start
if compile_failure is None:
    with torch.no_grad():
        compiled_ms = 1e3 * seconds(lambda: compiled(src, tgt), repeats=5)
    compile_gap = ((compiled_logits - eager_logits).abs().max()
                   / eager_logits.abs().max()).item()
    print(f"compiled in {compile_seconds:.1f} s; largest difference from "
          f"eager: {compile_gap:.1e} of the largest logit")
    print(f"forward pass: eager {eager_ms:.2f} ms, compiled "
          f"{compiled_ms:.2f} ms")
else:
    reason = str(compile_failure).strip().splitlines()[0][:200]
    print("inductor could not build its kernels on this machine "
          f"({type(compile_failure).__name__}: {reason}); the rest of "
          "the chapter does not need them")

# %% tags=["remove-cell"]
if compile_failure is None:  # the same function, summed in another order
    assert compile_gap < 1e-5, compile_gap

# %% [markdown]
# What it buys depends on where it runs, and the benchmark measures it
# side by side with everything else: `make bench` compiles the training
# step of both our model and `nn.Transformer`, and the cached decoding
# step, and reports the compile time apart from the medians.
#
# ## 10. What it all bought, on this machine
#
# Every ratio the chapter measured, old over new, so that larger is
# better and a ratio below 1 is a slowdown (for checkpointing, the
# price paid for its memory):

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{platform.machine()}, {torch.get_num_threads()} thread(s), "
      f"device {device}")
pd.DataFrame(speedups, columns=["remedy", "measured on", "ratio"]
             ).set_index("remedy").round(2)

# %% [markdown]
# On a GPU the picture changes in degree, not in kind; the benchmark
# (`python -m transformer_lite.bench`) measures it wherever it runs.
# The memory ratios carry over, since they are properties of the
# algorithms. Fused attention gains much more time than on a CPU, because
# a GPU's plain attention is limited by memory traffic, the very thing
# fusion removes. bfloat16 (or float16 with loss scaling) runs matrix
# products on tensor cores, several times faster than float32, which
# often makes mixed precision the largest single speed-up for training
# there. The cache
# matters most where generation is limited by memory bandwidth, with large
# models, long outputs and many sequences at once. Checkpointing trades
# the same third of extra compute for memory that lets a larger batch or
# a longer sequence fit.
#
# ## Summary
#
# - Plain attention stores two $(L, L)$ matrices: 512 MiB for one
#   float32 head at $L = 8192$. Its memory grows as $L^2$.
# - The online softmax keeps a running maximum $m$, sum $\ell$ and
#   output $o$ per query, rescaled by $\alpha = e^{m_{\text{old}} -
#   m_{\text{new}}}$ when the maximum grows; it is exact, and it lets
#   `chunked_attention` visit the keys in chunks, with flat memory,
#   equal to plain attention in value and gradient.
# - Fused kernels (FlashAttention and its relatives) run that loop in
#   one kernel, so the matrix never reaches main memory;
#   `F.scaled_dot_product_attention` picks flash, memory-efficient,
#   cuDNN or math on a GPU, and a fused C++ kernel on the CPU. CUDA's
#   flash kernel takes no mask: a masked call runs memory-efficient or
#   cuDNN attention at best. `MultiHeadAttention(kernel="fused")` uses
#   it and equals the hand-written path; `attend` is the one function
#   that picks among the three kernels.
# - The KV cache turns $O(n^2)$ projections of a generated sequence into
#   $O(n)$; `greedy_decode(..., use_cache=True)` gives the same tokens
#   and computed 32 positions instead of 528 for 32 tokens.
# - bfloat16 has float32's range and 8 bits of precision; float16 has
#   more precision, less range, and needs loss scaling. Masks filled
#   with `torch.finfo(dtype).min` stay correct in both;
#   `transformer_lite.training.step` trains under autocast, and the
#   bfloat16 loss curve follows the float32 one.
# - Gradient checkpointing (`encoder.checkpointing = True`) gives the
#   same gradients with several times less activation memory, for one
#   extra forward pass.
# - Sliding-window attention computes only a band of width $w$: cost
#   and memory $O(Lw)$, at the price of reach.
# - Beyond one device: data, tensor, pipeline and sequence parallelism.
#
# ## Exercises
#
# 1. **Chunk size.** At $L = 4096$, measure the peak memory of
#    `chunked_attention(q, k, v, chunk_size=c, query_chunk_size=c)` for
#    $c = 64, 128, \dots, 4096$ with `bench.memory.peak_memory`, under
#    `torch.no_grad()`. Predict the curve first: which tensors of shape
#    $(c, c)$ exist at once? Plot memory and time against $c$; where does
#    the time stop improving, and why does $c = L$ bring plain
#    attention's memory back?
# 2. **Fewer checkpoints.** Checkpoint only every second layer of the
#    encoder and decoder: subclass `Encoder`, or write a loop with
#    `torch.utils.checkpoint.checkpoint` around pairs of layers. Assert
#    that the gradients still equal the plain ones, and measure peak
#    memory and time for "none", "every layer" and "every second
#    layer". Which would you choose for $N = 16$ layers?
# 3. **float16 without a scaler.** On the copy task of section 5, cast
#    the gradients to float16 and back after each `backward` (this
#    imitates float16 training on a CPU) and train with and without
#    multiplying the loss by $2^{12}$ first (divide the gradients by it
#    again before the step). Count the gradient entries that became
#    exactly zero in each case, and compare the loss curves. Then try a
#    factor of $2^{24}$: what happens, and what would `GradScaler` do?

# %% [markdown]
# ## Graded exercises
#
# Eight exercises, each followed by a check that runs with its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then open
# them. The classroom edition (the teaching page) hands out the same
# exercises without the solutions, and nbgrader scores them. Everything
# runs on the CPU, in float64 wherever values are compared.

# %% tags=["exercise-setup"]
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from transformer_lite import Encoder, MultiHeadAttention, causal_mask
from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
    expect_tensor,
)

torch.manual_seed(8)  # the modules' initial weights
gen = torch.Generator().manual_seed(8)  # every input below
f64 = torch.float64
# exercise 8.3: one attention module, C = 16, H = 4, D = 4, and a
# sequence x of B = 2 rows of L = 8 positions
mha = MultiHeadAttention(16, 4, dropout=0.0).to(f64).eval()
x = torch.randn(2, 8, 16, generator=gen, dtype=f64)  # (B, L, C)
# exercise 8.4: five encoder layers with dropout, in training mode, and
# a padded batch: row 1 has two padding positions
encoder = Encoder(5, 16, 2, 32, dropout=0.1).to(f64).train()
src = torch.randn(2, 6, 16, generator=gen, dtype=f64)  # (B, S, C)
src_mask = torch.ones(2, 1, 6, dtype=torch.bool)  # (B, 1, S)
src_mask[1, :, 4:] = False


def outputs_and_grads(forward):
    """Run forward() on a fresh copy of src under a fixed seed (the same
    dropout masks every time); return its output and the gradients of
    the input and of every parameter of the encoder."""
    encoder.zero_grad(set_to_none=True)
    inputs = src.clone().requires_grad_()
    torch.manual_seed(80)
    out = forward(inputs)  # (B, S, C)
    out.square().sum().backward()
    grads = [inputs.grad] + [p.grad for p in encoder.parameters()]
    return out.detach(), grads


def saved_tensors(forward):
    """How many tensors autograd keeps for the backward pass of
    forward(), counted outside any checkpoint."""
    count = 0

    def pack(tensor):
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward(src.clone().requires_grad_())
    return count


# %% [markdown]
# ### Exercise 8.1: one step of the online softmax (2 points)
#
# Write `online_step(m, ell, o, s, v)`, the state of the online softmax
# after one more chunk of keys. For $L_q$ queries the state is the
# running maximum `m` $(\dots, L_q, 1)$, the running sum `ell`
# $(\dots, L_q, 1)$ and the running output `o` $(\dots, L_q, D_v)$. The
# chunk brings the scaled scores `s` $(\dots, L_q, c)$ of its $c$ keys
# and their values `v` $(\dots, c, D_v)$. Return the new
# `(m, ell, o)`, by the update of section 2:
#
# $$
# m' = \max\big(m, \max_j s_j\big), \quad \alpha = e^{m - m'}, \quad
# \ell' = \alpha \ell + \sum_j e^{s_j - m'}, \quad
# o' = \alpha\, o + e^{s - m'} v .
# $$
#
# The scores are finite, and the state starts at $m = -\infty$,
# $\ell = 0$, $o = 0$; the output is $o / \ell$ after the last chunk.

# %% tags=["solution", "hide-input"]
def online_step(m, ell, o, s, v):
    ### BEGIN SOLUTION
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., Lq, 1)
    alpha = torch.exp(m - m_new)  # moves the old sums to the new maximum
    p = torch.exp(s - m_new)  # (..., Lq, c)
    ell_new = alpha * ell + p.sum(dim=-1, keepdim=True)  # (..., Lq, 1)
    o_new = alpha * o + p @ v  # (..., Lq, Dv)
    return m_new, ell_new, o_new
    ### END SOLUTION


# %% tags=["check"]
# two chunks for B = 2 rows of Lq = 3 queries; the second chunk's scores
# are larger, so the maximum grows and alpha < 1 must rescale
s1 = torch.randn(2, 3, 4, generator=gen, dtype=f64)  # (B, Lq, c)
s2 = torch.randn(2, 3, 5, generator=gen, dtype=f64) + 3.0
v1 = torch.randn(2, 4, 6, generator=gen, dtype=f64)  # (B, c, Dv)
v2 = torch.randn(2, 5, 6, generator=gen, dtype=f64)
start = (torch.full((2, 3, 1), -math.inf, dtype=f64),
         torch.zeros(2, 3, 1, dtype=f64),
         torch.zeros(2, 3, 6, dtype=f64))  # fmt: skip
s, v = torch.cat([s1, s2], dim=-1), torch.cat([v1, v2], dim=-2)
with exercise("8.1"):
    m, ell, o = online_step(*online_step(*start, s1, v1), s2, v2)
    expect_close("o / ell after two chunks", o / ell,
                 torch.softmax(s, dim=-1) @ v,
                 hint="when the maximum grows, rescale both ell and o by "
                 "alpha = exp(m_old - m_new)")  # fmt: skip

# %% tags=["check"]
with exercise("8.1"):
    m, ell, o = online_step(*online_step(*start, s1, v1), s2, v2)
    expect_close("m after two chunks", m, s.amax(dim=-1, keepdim=True),
                 hint="m is the largest score seen so far: the maximum "
                 "of the old m and the chunk's largest score")  # fmt: skip
    expect_close("ell after two chunks", ell,
                 torch.exp(s - s.amax(dim=-1, keepdim=True)).sum(
                     dim=-1, keepdim=True),
                 hint="ell sums exp(s - m) over every key seen, taken "
                 "against the current maximum m")  # fmt: skip

# %% [markdown]
# ### Exercise 8.2: attention over chunks of keys (2 points)
#
# Write `online_attention(q, k, v, chunk)`, the output
# $\mathrm{softmax}(q k^\top / \sqrt{d_k})\, v$ computed with
# `online_step`, visiting the keys `chunk` at a time, so that no more
# than $L_q \times \mathit{chunk}$ scores exist at once. Shapes: `q`
# $(\dots, L_q, D)$, `k` $(\dots, L_k, D)$, `v` $(\dots, L_k, D_v)$;
# output $(\dots, L_q, D_v)$. `chunk` need not divide $L_k$, and may
# exceed it. The second check uses scores in the thousands, whose
# exponential overflows even float64.

# %% tags=["solution", "hide-input"]
def online_attention(q, k, v, chunk):
    ### BEGIN SOLUTION
    q = q / math.sqrt(q.size(-1))  # scaled once, before the products
    m = q.new_full((*q.shape[:-1], 1), -math.inf)  # (..., Lq, 1)
    ell = q.new_zeros((*q.shape[:-1], 1))  # (..., Lq, 1)
    o = q.new_zeros((*q.shape[:-1], v.size(-1)))  # (..., Lq, Dv)
    for start in range(0, k.size(-2), chunk):
        k_J = k[..., start : start + chunk, :]  # (..., c, D)
        v_J = v[..., start : start + chunk, :]  # (..., c, Dv)
        s = q @ k_J.transpose(-2, -1)  # (..., Lq, c)
        m, ell, o = online_step(m, ell, o, s, v_J)
    return o / ell  # (..., Lq, Dv)
    ### END SOLUTION


# %% tags=["check"]
import torch.nn.functional as F

from transformer_lite import chunked_attention, scaled_dot_product_attention
from transformer_lite.attention import attend, fused_attention

q = torch.randn(2, 3, 7, 8, generator=gen, dtype=f64)  # (B, H, Lq, D)
k = torch.randn(2, 3, 23, 8, generator=gen, dtype=f64)  # (B, H, Lk, D)
v = torch.randn(2, 3, 23, 5, generator=gen, dtype=f64)  # (B, H, Lk, Dv)
want, _ = scaled_dot_product_attention(q, k, v)  # (B, H, Lq, Dv)
step_of_8_1 = online_step
widths = []  # the number of keys of each chunk the answer visits


def counting_step(m, ell, o, s, v):
    """The online_step of exercise 8.1, counting each chunk's keys."""
    widths.append(s.size(-1))
    return step_of_8_1(m, ell, o, s, v)


online_step = counting_step  # while the check runs
try:
    with exercise("8.2", after=["8.1"], twins=[
            chunked_attention, scaled_dot_product_attention, attend,
            fused_attention, F.scaled_dot_product_attention,
            torch.softmax, torch.Tensor.softmax, F.softmax]):
        for chunk, chunks in ((5, [5, 5, 5, 5, 3]), (64, [23])):
            widths.clear()
            expect_close(f"online_attention(q, k, v, {chunk})",
                         online_attention(q, k, v, chunk), want,
                         hint="divide the scores by sqrt(d_k), visit "
                         "every key with range(0, Lk, chunk) and keep "
                         "the last, shorter chunk")  # fmt: skip
            expect_equal(f"the chunks of online_attention(q, k, v, "
                         f"{chunk}), in keys", widths, chunks,
                         hint="call online_step once per chunk of at "
                         "most `chunk` keys, never on all the scores at "
                         "once")  # fmt: skip
finally:
    online_step = step_of_8_1

# %% tags=["check"]
hot = 2000 * q  # scores in the thousands: exp(s) is inf in float64
want = chunked_attention(hot, k, v, chunk_size=5)  # (B, H, Lq, Dv)
step_of_8_1, online_step = online_step, counting_step
widths.clear()
try:
    with exercise("8.2", after=["8.1"], twins=[
            chunked_attention, scaled_dot_product_attention, attend,
            fused_attention, F.scaled_dot_product_attention,
            torch.softmax, torch.Tensor.softmax, F.softmax]):
        expect_close("online_attention(2000 q, k, v, 5)",
                     online_attention(hot, k, v, 5), want,
                     hint="never exponentiate a score itself: subtract "
                     "the running maximum first (online_step "
                     "does)")  # fmt: skip
        expect_equal("the chunks of online_attention(2000 q, k, v, 5), "
                     "in keys", widths, [5, 5, 5, 5, 3],
                     hint="call online_step once per chunk of at most "
                     "`chunk` keys, never on all the scores at "
                     "once")  # fmt: skip
finally:
    online_step = step_of_8_1

# %% [markdown]
# ### Exercise 8.3: a cached step equals the uncached one (2 points)
#
# Write `cached_attention(mha, x_new, cache)`: causal self-attention of
# $n$ new positions `x_new` $(B, n, C)$ that follow the $t$ positions
# whose keys and values `cache` holds, a pair `(K, V)` of shape
# $(B, H, t, D)$, or `None` when $t = 0$. Use only the four projections
# `mha.w_q`, `mha.w_k`, `mha.w_v`, `mha.w_o` of the `MultiHeadAttention`
# `mha` and its sizes `mha.h` ($H$) and `mha.d_k` ($D$): project the new
# positions, split them into heads, append their keys and values to the
# cached ones, and let new query $i$, at position $t + i$, attend to the
# keys $0, \dots, t + i$. Return the output, $(B, n, C)$, and the new
# cache `(K, V)`, both of shape $(B, H, t + n, D)$. Fed a sequence in
# pieces, the outputs must equal `mha` on the whole sequence under a
# causal mask.

# %% tags=["solution", "hide-input"]
def cached_attention(mha, x_new, cache):
    ### BEGIN SOLUTION
    B, n, C = x_new.shape
    H, D = mha.h, mha.d_k

    def split(y):
        return y.view(B, n, H, D).transpose(1, 2)  # (B, H, n, D)

    q = split(mha.w_q(x_new))  # (B, H, n, D)
    K, V = split(mha.w_k(x_new)), split(mha.w_v(x_new))
    if cache is not None:
        K = torch.cat([cache[0], K], dim=2)  # (B, H, t + n, D)
        V = torch.cat([cache[1], V], dim=2)
    t = K.size(2) - n  # positions cached before this step
    scores = q @ K.transpose(-2, -1) / math.sqrt(D)  # (B, H, n, t + n)
    i = torch.arange(t, t + n).unsqueeze(1)  # (n, 1), query positions
    j = torch.arange(t + n)  # (t + n,), key positions
    scores = scores.masked_fill(j > i, -math.inf)
    out = scores.softmax(dim=-1) @ V  # (B, H, n, D)
    out = out.transpose(1, 2).reshape(B, n, C)  # (B, n, C)
    return mha.w_o(out), (K, V)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.cache import KVCache

with torch.no_grad():
    want = mha(x, x, x, causal_mask(8))  # (B, L, C), no cache
with torch.no_grad(), exercise("8.3", twins=[
        MultiHeadAttention.forward, MultiHeadAttention.split_heads,
        MultiHeadAttention.merge_heads, KVCache.update, attend,
        scaled_dot_product_attention, chunked_attention, fused_attention,
        F.scaled_dot_product_attention]):
    cache, pieces = None, []
    for a, b in ((0, 3), (3, 4), (4, 8)):  # pieces of 3, 1 and 4
        out, cache = cached_attention(mha, x[:, a:b], cache)
        pieces.append(out)
    expect_close("the outputs of pieces 3, 1, 4, concatenated",
                 torch.cat(pieces, dim=1), want,
                 hint="new query i sits at position t + i: it may see "
                 "every cached key and the new keys up to its own, the "
                 "bottom-right block of the causal mask")  # fmt: skip

# %% tags=["check"]
with torch.no_grad():
    keys = mha.w_k(x).view(2, 8, 4, 4).transpose(1, 2)  # (B, H, L, D)
    values = mha.w_v(x).view(2, 8, 4, 4).transpose(1, 2)
hint = ("the cache holds keys and values split into heads, (B, H, t, D): "
        "view as (B, n, H, D), transpose, and append along dim=2")
with torch.no_grad(), exercise("8.3", twins=[
        MultiHeadAttention.forward, MultiHeadAttention.split_heads,
        MultiHeadAttention.merge_heads, KVCache.update, attend,
        scaled_dot_product_attention, chunked_attention, fused_attention,
        F.scaled_dot_product_attention]):
    _, cache = cached_attention(mha, x[:, :5], None)
    _, (K, V) = cached_attention(mha, x[:, 5:], cache)
    expect_close("the cached K after 5 + 3 positions", K, keys, hint=hint)
    expect_close("the cached V after 5 + 3 positions", V, values,
                 hint=hint)  # fmt: skip

# %% [markdown]
# ### Exercise 8.4: checkpointed segments (2 points)
#
# Write `checkpointed_layers(layers, x, mask, every)`: run the encoder
# layers `layers` (each called as `layer(x, mask)`) one after another,
# in segments of `every` consecutive layers (the last segment may be
# shorter), each segment wrapped in one call
# `checkpoint(segment, x, mask, use_reentrant=False)`. The forward pass
# then keeps only each segment's inputs, and the backward pass
# recomputes the rest. Output and gradients must equal those of a
# plain pass, dropout included: `checkpoint` replays the random state.

# %% tags=["solution", "hide-input"]
def checkpointed_layers(layers, x, mask, every):
    ### BEGIN SOLUTION
    def segment(part):
        def run(h, mask):
            for layer in part:
                h = layer(h, mask)  # (B, S, C)
            return h

        return run

    for start in range(0, len(layers), every):
        run = segment(layers[start : start + every])
        x = checkpoint(run, x, mask, use_reentrant=False)  # (B, S, C)
    return x
    ### END SOLUTION


# %% tags=["check"]
def plain_pass(h):
    for layer in encoder.layers:
        h = layer(h, src_mask)  # (B, S, C)
    return h


def in_segments_of_2(h):
    return checkpointed_layers(encoder.layers, h, src_mask, 2)


want_out, want_grads = outputs_and_grads(plain_pass)
hint = ("run the segments in order, each in one call "
        "checkpoint(segment, x, mask, use_reentrant=False) over its "
        "own layers; checkpoint replays dropout's random state itself")
with exercise("8.4"):
    out, grads = outputs_and_grads(in_segments_of_2)
    expect_close("the output", out, want_out, atol=1e-12, hint=hint)
    for n, (got, wanted) in enumerate(zip(grads, want_grads,
                                          strict=True)):  # fmt: skip
        expect(got is not None, f"gradient {n} (0: the input) is None",
               hint=hint)  # fmt: skip
        expect_close(f"gradient {n} (0: the input)", got, wanted,
                     atol=1e-12, hint=hint)  # fmt: skip

# %% tags=["check"]
plain_count = saved_tensors(plain_pass)
with exercise("8.4"):
    for every, segments in ((1, 5), (2, 3), (5, 1)):
        count = saved_tensors(lambda h, e=every: checkpointed_layers(
            encoder.layers, h, src_mask, e))  # fmt: skip
        expect(segments <= count <= 2 * segments,
               f"with every={every} the forward pass kept {count} tensors "
               f"(without checkpointing: {plain_count}); expected the "
               f"inputs of {segments} segment(s) only",
               hint="wrap each segment, not each layer nor the whole "
               "stack, in one checkpoint call")  # fmt: skip

# %% [markdown]
# ### Exercise 8.5: attention weights in 16 bits (2 points)
#
# Write `attention_weights(q, k, mask)` for inputs of any floating
# dtype, following the package's casting rules: compute in
# `torch.promote_types(q.dtype, torch.float32)` (float32 for 16-bit
# inputs, otherwise q's own dtype); divide `q` by $\sqrt{d_k}$ *before*
# the product; fill forbidden scores with the `torch.finfo(...).min` of
# that dtype; take the softmax; set the weights of forbidden keys to 0,
# so that a row with no allowed key is all zeros; and return the weights
# in q's dtype. Shapes: `q` $(\dots, L_q, D)$, `k` $(\dots, L_k, D)$,
# `mask` bool, True = may attend, broadcasting to
# $(\dots, L_q, L_k)$; output $(\dots, L_q, L_k)$.

# %% tags=["solution", "hide-input"]
def attention_weights(q, k, mask):
    ### BEGIN SOLUTION
    dtype = torch.promote_types(q.dtype, torch.float32)
    scaled = q.to(dtype) / math.sqrt(q.size(-1))  # scale first
    scores = scaled @ k.to(dtype).transpose(-2, -1)  # (..., Lq, Lk)
    scores = scores.masked_fill(~mask, torch.finfo(dtype).min)
    weights = scores.softmax(dim=-1).masked_fill(~mask, 0.0)
    return weights.to(q.dtype)  # (..., Lq, Lk)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.scores import scaled_query, score_dtype

q32 = torch.randn(2, 5, 8, generator=gen)  # (B, L, D)
k32 = torch.randn(2, 5, 8, generator=gen)
pad = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # (B, L)
mask = pad[:, None, :] & causal_mask(5)  # (B, L, L)
mask[0, 2] = False  # query 2 of row 0 may attend to nothing
dtypes = (torch.float16, torch.bfloat16, f64)
wants = [scaled_dot_product_attention(q32.to(dtype), k32.to(dtype),
                                      k32.to(dtype), mask)[1]
         for dtype in dtypes]  # fmt: skip
with exercise("8.5", twins=[
        scaled_dot_product_attention, attend, scaled_query, score_dtype,
        F.scaled_dot_product_attention]):
    for dtype, want in zip(dtypes, wants, strict=True):
        q, k = q32.to(dtype), k32.to(dtype)
        got = expect_tensor(f"the weights for {dtype} inputs",
                            attention_weights(q, k, mask), dtype=dtype,
                            finite=False,
                            hint="return the weights in the inputs' "
                            "dtype")  # fmt: skip
        expect_close(f"the weights for {dtype} inputs", got, want,
                     atol=1e-3,
                     hint="fill with torch.finfo(dtype).min of the "
                     "scores' dtype, and zero the forbidden weights after "
                     "the softmax: a row with no allowed key is all "
                     "zeros")  # fmt: skip

# %% tags=["check"]
# |q @ k^T| reaches 2.7e5, and 9.7e4 even after dividing q by sqrt(d_k):
# both pass float16's largest value, 65504, so scores kept in float16
# become inf, whether q is divided before the product or after.
q = (200 * q32).half()  # (B, L, D)
k = (200 * k32).half()
_, want = scaled_dot_product_attention(q, k, k, mask)  # (B, L, L)
with exercise("8.5", twins=[
        scaled_dot_product_attention, attend, scaled_query, score_dtype,
        F.scaled_dot_product_attention]):
    expect_close("the weights for large float16 inputs",
                 attention_weights(q, k, mask), want, atol=1e-3,
                 hint="compute the scores in float32: q @ k^T of float16 "
                 "inputs passes 65504, float16's largest value, and "
                 "becomes inf")  # fmt: skip

# %% [markdown]
# ### Exercise 8.6: the rules of loss scaling (2 points)
#
# With loss scaling, the loss is multiplied by $S$ before the backward
# pass, so the gradients arrive multiplied by $S$. Write
# `unscale(grads, scale)`: for a list of gradient tensors (float16 or
# float32), return the list divided by `scale`, **in float32**, and
# `found_inf`, `True` if any entry of any gradient is infinite or NaN.
# Then write `update_scale(scale, good_steps, found_inf,
# growth_interval)`, the rule of `torch.amp.GradScaler`: after an
# overflow, halve the scale and reset the count of good steps to 0 (the
# optimizer step is skipped); otherwise add one good step, and when
# `growth_interval` good steps in a row are reached, double the scale
# and reset the count. Return `(scale, good_steps)`.

# %% tags=["solution", "hide-input"]
def unscale(grads, scale):
    ### BEGIN SOLUTION
    unscaled = [g.float() / scale for g in grads]  # float32 first
    found_inf = any(not torch.isfinite(g).all() for g in unscaled)
    return unscaled, found_inf
    ### END SOLUTION


def update_scale(scale, good_steps, found_inf, growth_interval):
    ### BEGIN SOLUTION
    if found_inf:
        return scale / 2, 0
    good_steps += 1
    if good_steps == growth_interval:
        return scale * 2, 0
    return scale, good_steps
    ### END SOLUTION


# %% tags=["check"]
g = torch.tensor([1e-3, 1e-5, 1e-7, 1e-9])  # float32 gradients
S = 2.0**16
# what torch.amp.GradScaler runs to unscale and to update its scale
with exercise("8.6", twins=[
        torch._amp_foreach_non_finite_check_and_unscale_,
        torch._amp_update_scale_]):
    grads, found_inf = unscale([(g * S).half(), g * S], S)
    for n, got in enumerate(grads):
        got = expect_tensor(f"unscaled gradient {n}", got,
                            dtype=torch.float32,
                            hint="cast to float32, then divide")  # fmt: skip
        expect_close(f"unscaled gradient {n}", got, g, atol=0, rtol=1e-3,
                     hint="cast to float32 first, then divide: g / S in "
                     "float16 underflows to 0 below 6e-8")  # fmt: skip
    expect_equal("found_inf for finite gradients", found_inf, False,
                 hint="found_inf is a bool, True only if some entry is "
                 "inf or NaN")  # fmt: skip
    for bad in (math.inf, -math.inf, math.nan):
        _, found_inf = unscale([g.half(), torch.tensor([1.0, bad]).half()],
                               S)  # fmt: skip
        expect_equal(f"found_inf with a {bad} entry", found_inf, True,
                     hint="look at every gradient, and count NaN as well "
                     "as +-inf (torch.isfinite)")  # fmt: skip

# %% tags=["check"]
growth = (1, 1, math.inf, 1, 1, 1, 1, 1, math.nan, 1, 1, 1, 1)
param = nn.Parameter(torch.ones(3))
sgd = torch.optim.SGD([param], lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=3)
torchs = []  # (scale, step skipped) after each of torch's steps
for g in growth:
    before = param.detach().clone()
    sgd.zero_grad()
    scaler.scale((param * g).sum()).backward()
    scaler.step(sgd)
    scaler.update()
    torchs.append((scaler.get_scale(), torch.equal(param, before)))
with exercise("8.6", twins=[
        torch._amp_foreach_non_finite_check_and_unscale_,
        torch._amp_update_scale_]):
    scale, good_steps, ours = 16.0, 0, []
    for g in growth:
        _, found_inf = unscale([torch.full((3,), g * scale)], scale)
        scale, good_steps = update_scale(scale, good_steps, found_inf, 3)
        ours.append((scale, found_inf))
    expect_equal("(scale, step skipped) after each step", ours, torchs,
                 hint="halve the scale and reset the count after inf or "
                 "NaN; double it only after growth_interval good steps "
                 "in a row, then reset the count")  # fmt: skip

# %% [markdown]
# ### Exercise 8.7: predict, then run (1 point)
#
# Decide before you run the cell below it. A decoder that recomputes
# the whole prefix at every step (no cache) forms, in each
# self-attention layer, one score per query and key: $t \times t$ of
# them at step $t$. Greedy decoding of $T = 32$ tokens and of $T = 64$
# tokens: by about what factor does the number of scores the
# uncached decoder's self-attention computes grow when $T$ doubles?
# Set `prediction` to one of the strings `"2x"`, `"4x"`, `"8x"` or
# `"16x"`; then run the experiment, which counts them (and the cached
# decoder's too), and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "8x"
### END SOLUTION

# %% [markdown]
# The experiment: a tiny untrained translator, decoding one source
# greedily, with a hook that counts the entries of every self-attention
# weight matrix its decoder forms.

# %%
from transformer_lite import Transformer, TransformerConfig
from transformer_lite.decoding import greedy_decode

torch.manual_seed(87)
tiny = Transformer(TransformerConfig(12, 12, n_layers=1, d_model=16,
                                     d_ff=32, n_heads=2, dropout=0.0))
tiny = tiny.eval()  # fmt: skip
self_attn = tiny.decoder.layers[0].self_attn
self_attn.keep_weights = True  # so its weights (B, H, Lq, Lk) are kept
n_scores = []
counter = self_attn.register_forward_hook(
    lambda module, args, out: n_scores.append(
        module.weights.size(-2) * module.weights.size(-1)))
source = torch.randint(3, 12, (1, 6), generator=gen)  # (1, S)
counted = {}
for use_cache in (False, True):
    for T in (32, 64):
        n_scores.clear()
        greedy_decode(tiny, source, max_len=T + 1, bos_id=1,
                      use_cache=use_cache)  # fmt: skip
        counted[use_cache, T] = sum(n_scores)
counter.remove()
self_attn.keep_weights = False
growth = {use_cache: counted[use_cache, 64] / counted[use_cache, 32]
          for use_cache in (False, True)}  # fmt: skip
for use_cache in (False, True):
    print(f"use_cache={use_cache!s:5}: {counted[use_cache, 32]:6d} scores "
          f"for 32 tokens, {counted[use_cache, 64]:6d} for 64: "
          f"{growth[use_cache]:.2f} times as many")

# %% tags=["check", "hide-input"]
with exercise("8.7", prediction=True):
    expect(prediction in ("2x", "4x", "8x", "16x"),
           f"prediction is {prediction!r}: choose one of \"2x\", \"4x\", "
           f"\"8x\" or \"16x\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(6 < growth[False] < 10 and prediction == "8x",
           f"without the cache the scores grew {growth[False]:.2f} "
           f"times, not {prediction}",
           hint="step t forms t * t scores, and 1 + 4 + ... + T^2 is "
           "about T^3 / 3: doubling T multiplies it by about 8. The "
           "cache leaves one query a step, t scores, about T^2 / 2 in "
           "all: 4 times as many when T doubles")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 8.8: which kernel takes the mask? (2 points, written)
#
# The encoder-decoder's decoder attends over a *padded* batch of
# targets, under a causal mask combined with the padding mask. On an
# NVIDIA GPU, with 16-bit inputs, can its self-attention run
# PyTorch's flash kernel? In two to four sentences: say which kernel
# would run, and why a fused kernel can be told causality by a flag,
# `is_causal=True`, when an arbitrary mask has to be handed to it as a
# tensor.

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# No: CUDA's flash kernel takes no mask tensor, only `is_causal=True`,
# so a call with the decoder's causal-and-padding mask is sent to the
# memory-efficient or the cuDNN kernel (or, failing those, to MATH,
# which forms the whole score matrix). Causality is a rule on the
# indices, key $j$ allowed for query $i$ when $j \le i$, which the kernel
# evaluates itself inside each tile, and it can skip every tile above
# the diagonal; an arbitrary mask is data, one entry per query and key
# for each row of the batch, which a kernel must read from main memory
# tile by tile, and the flash kernel was not written to. (Without
# padding, say with sequences packed to the same length, the decoder
# could pass `is_causal=True` and reach flash.)
#
# *Rubric (2 points).* 1 point: no, the flash kernel accepts no mask,
# so the masked call runs memory-efficient or cuDNN attention (MATH
# accepted as the fallback). 1 point: causality is computed from the
# positions inside the kernel (no tensor, whole tiles skipped), while
# a padding mask is per-batch data of shape about $(B, L_q, L_k)$ that
# must be loaded.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 1
# message: Hint: when the maximum grows, rescale both ell and o
# def online_step(m, ell, o, s, v):
#     m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
#     alpha = torch.exp(m - m_new)
#     p = torch.exp(s - m_new)
#     ell_new = alpha * ell + p.sum(dim=-1, keepdim=True)
#     o_new = o + p @ v
#     return m_new, ell_new, o_new

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def online_step(m, ell, o, s, v):
#     return m, ell, o

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def online_attention(q, k, v, chunk):
#     return chunked_attention(q, k, v, chunk_size=chunk)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def online_attention(q, k, v, chunk):
#     return torch.zeros(*q.shape[:-1], v.size(-1), dtype=v.dtype)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def cached_attention(mha, x_new, cache):
#     from transformer_lite.cache import KVCache
#     kv = KVCache()
#     if cache is not None:
#         kv.key, kv.value = cache
#     out = mha(x_new, x_new, x_new, cache=kv, is_causal=True)
#     return out, (kv.key, kv.value)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def cached_attention(mha, x_new, cache):
#     B, n, C = x_new.shape
#     empty = torch.zeros(B, mha.h, n, mha.d_k, dtype=x_new.dtype)
#     return torch.zeros_like(x_new), (empty, empty)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def checkpointed_layers(layers, x, mask, every):
#     return x

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def attention_weights(q, k, mask):
#     return scaled_dot_product_attention(q, k, k, mask)[1]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def attention_weights(q, k, mask):
#     shape = (*q.shape[:-1], k.size(-2))
#     return torch.zeros(shape, dtype=q.dtype)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: delegate
# def unscale(grads, scale):
#     grads = [g.float().clone() for g in grads]
#     found_inf = torch.zeros(1)
#     torch._amp_foreach_non_finite_check_and_unscale_(
#         grads, found_inf, torch.full((1,), 1.0 / scale))
#     return grads, bool(found_inf)
#
#
# def update_scale(scale, good_steps, found_inf, growth_interval):
#     scale_t = torch.full((1,), float(scale))
#     tracker = torch.full((1,), good_steps, dtype=torch.int32)
#     torch._amp_update_scale_(scale_t, tracker,
#                              torch.full((1,), float(found_inf)),
#                              2.0, 0.5, growth_interval)
#     return float(scale_t), int(tracker)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def unscale(grads, scale):
#     return list(grads), False
#
#
# def update_scale(scale, good_steps, found_inf, growth_interval):
#     return scale, good_steps
