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
# # 12. Shipping and scaling out
#
# [Chapter 7](07_translation) trained a translator and
# [chapter 8](08_making_it_fast) made it fast, but both times the model
# lived inside a Python process with PyTorch loaded, and both times it
# fitted on one device. This chapter removes each of those conditions in
# turn, measured on the chapter 7 translator with its outputs checked:
#
# - **export**: the model leaves Python as graphs (`torch.export`, then
#   ONNX) and translates in another runtime, ONNX Runtime, with the same
#   tokens as PyTorch (`shipping/export.py`, `shipping/runtime.py`);
# - **speed and size**: eager PyTorch, `torch.compile`, ONNX Runtime and
#   int8 quantisation side by side, latency, throughput, bytes on disk
#   and accuracy (`shipping/quantize.py`);
# - **scaling out**: when a model no longer fits on one device, it is
#   split, by tensor parallelism (each layer's matrices cut across the
#   devices) or by fully-sharded data parallelism (each parameter cut
#   across them); both run here on two CPU processes and give the
#   gradients of one (`shipping/parallel.py`).
#
# The shape legend is the book's: B batch, S source length, T target
# length, C = `d_model`, H heads, D = `d_k`, V vocabulary.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(12)

# %%
import collections
import inspect
import platform
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import altair as alt
import matplotlib.pyplot as plt
import onnx
import onnxruntime
import pandas as pd
import torch
from matplotlib.patches import Rectangle
from torch import nn

import transformer_lite
from transformer_lite import default_device, seed_everything
from transformer_lite.decoding import beam_search, greedy_decode
from transformer_lite.device import book_seed
from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.shipping.export import (
    DecoderStep,
    export_onnx,
    export_programs,
)
from transformer_lite.shipping.parallel import (
    local_parameter_bytes,
    run_split,
    tensor_parallel_plan,
)
from transformer_lite.shipping.quantize import quantize_int8, size_on_disk
from transformer_lite.shipping.runtime import (
    CompiledTransformer,
    OnnxTransformer,
)
from transformer_lite.tasks import numbers
from transformer_lite.tasks.metrics import scores
from transformer_lite.tasks.trainer import (
    TranslateConfig,
    train,
    train_tokenizers,
)
from transformer_lite.tasks.translator import Translator
from transformer_lite.tokens import BOS_ID, EOS_ID

device = default_device()
SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
seed_everything(SEED)
print(f"python {platform.python_version()}, torch {torch.__version__}")
print(f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}")
print(f"transformer_lite {transformer_lite.__version__}, device: {device}")
print(f"BOOK_SEED={SEED}")
torch.set_num_threads(1)  # small models: one thread is fastest
scratch = tempfile.TemporaryDirectory(prefix="chapter12-")  # removed at exit
workdir = Path(scratch.name)


def show(*objects) -> None:
    """Print the source code of package classes, methods or functions."""
    for obj in objects:
        print(textwrap.dedent(inspect.getsource(obj)))


# %% [markdown]
# ## The model to ship
#
# The translator of [chapter 7](07_translation), trained by the same
# function as the command line, on German number words, with fewer
# steps (400) so that the chapter stays quick. Everything that follows
# is measured on this model and its held-out numbers.

# %%
config = TranslateConfig(seed=SEED, steps=400, n_test=300)
splits = numbers.number_splits(config.n_train, config.n_valid,
                               config.n_test, config.max_digits,
                               config.seed)
train_pairs, valid_pairs, test_pairs = (
    numbers.number_pairs(splits[name], config.pair)
    for name in ("train", "valid", "test"))
tokenizers = train_tokenizers(train_pairs, config)
at_least = round(config.digits_share * config.n_train)
balanced = numbers.balance_digits(splits["train"], at_least)
result = train(numbers.number_pairs(balanced, config.pair), config,
               workdir / "checkpoints", valid_pairs, tokenizers,
               device="cpu", progress=False)
translator = result.translator
model = translator.model.eval()
src_tok, tgt_tok = translator.src_tokenizer, translator.tgt_tokenizer
sources = [s for s, _ in test_pairs]
references = [t for _, t in test_pairs]
print(f"{model.count_parameters():,} parameters, trained in "
      f"{result.seconds:.0f} s")

# %% [markdown]
# ## What a graph is, and what `torch.export` captures
#
# An eager PyTorch model is a Python program: each line runs when it is
# reached, and the next line can depend on anything, a value read from a
# tensor, a Python dictionary, the time of day. A **graph** is the
# program's operations alone, written down as data: nodes (a matrix
# product, a softmax) and the tensors that flow between them. A graph can
# be saved, inspected, optimised as a whole and run by a program that
# has never heard of Python.
#
# `torch.export` {cite:p}`ansel2024pytorch` makes one by running the
# model once on example inputs and recording every operation on
# tensors. Two kinds of Python deserve a look:
#
# - **data-dependent control flow** it refuses, rather than guessing:
#   `if x.sum() > 0:` takes one branch for these inputs, and the graph
#   would silently take it for every input;
# - **Python loops** it records, unrolled: a loop of four steps becomes
#   four copies of its body, fixed at four.

# %% tags=["remove-stderr"]
class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # reads a value: the graph cannot hold it
            return x
        return -x


try:
    torch.export.export(Branchy(), (torch.ones(3),))
    refused = None
except Exception as err:  # torch's UserError, with a long explanation
    refused = type(err).__name__
print("refused:", refused)


class Loop(nn.Module):
    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def forward(self, x):
        for _ in range(self.steps):
            x = torch.tanh(x)
        return x


unrolled = {
    n: sum(node.op == "call_function" for node in
           torch.export.export(Loop(n), (torch.ones(3),)).graph.nodes)
    for n in (2, 4)
}
print("operations in the graph of a loop of n steps:", unrolled)

# %% tags=["remove-cell"]
assert refused is not None
assert unrolled == {2: 2, 4: 4}

# %% [markdown]
# Decoding is exactly such a loop: it runs until every sentence has
# emitted end-of-sequence, a count that depends on the tokens produced.
# So the translator is exported as three graphs, each a plain function
# of tensors, and the loop stays outside them:
#
# - `encoder`: source ids (B, S) to memory (B, S, C);
# - `cross`: memory to every decoder layer's cross-attention keys and
#   values, computed once per sentence;
# - `step`: **one cached decoder step**: the newest token, the masks,
#   and the self-attention keys and values of the positions so far go
#   in; the next-token logits and the keys and values grown by one
#   position come out.
#
# The key/value cache of [chapter 8](08_making_it_fast) becomes the
# step's inputs and outputs, so a loop over the graphs does what
# `use_cache=True` does, with the same arithmetic.

# %%
show(DecoderStep.forward)

# %% [markdown]
# The masks are built from padding inside the model, so the graph holds
# no value-reading check: the model checks its token ids in eager mode
# on the CPU, and leaves the check out of a graph being compiled or
# exported (the exported runtimes check ids at their own door).
# **Dynamic shapes** tell `torch.export` which sizes may vary:
# the batch, the source length and the step's position, each up to the
# model's `max_len`; without them the graph would accept only the
# example's sizes.

# %%
start = time.perf_counter()
programs = export_programs(model)
export_seconds = time.perf_counter() - start
for name, program in programs.items():
    ops = collections.Counter(  # aten.linear.default -> linear
        getattr(node.target, "__name__", str(node.target)).split(".")[0]
        for node in program.graph.nodes if node.op == "call_function")
    print(f"{name:8s} {sum(ops.values()):4d} operations; most used:",
          ", ".join(f"{op} {n}" for op, n in ops.most_common(4)))

# %% [markdown]
# ## ONNX, and the same translation from another runtime
#
# ONNX is a file format for such graphs, with a fixed set of operators
# that many runtimes implement: ONNX Runtime on CPUs and GPUs, TensorRT
# on NVIDIA GPUs, others on phones and in browsers. The dynamo exporter
# (`torch.onnx.export(..., dynamo=True)`) translates the exported
# programs operator by operator; each file carries its weights.

# %%
start = time.perf_counter()
paths = export_onnx(model, workdir, stem="de-en", programs=programs)
onnx_seconds = time.perf_counter() - start
print(f"torch.export {export_seconds:.0f} s, ONNX {onnx_seconds:.0f} s")
op_counts = []
for name, path in paths.items():
    graph = onnx.load(path).graph
    counted = collections.Counter(node.op_type for node in graph.node)
    op_counts += [{"graph": name, "operator": op, "count": n}
                  for op, n in counted.items()]
    print(f"{path.name}: {len(graph.node)} nodes, inputs "
          f"{[i.name for i in graph.input][:4]}...")
ops = pd.DataFrame(op_counts)

# %%
alt.Chart(ops, title="Operators in the three ONNX graphs").mark_bar().encode(
    x=alt.X("count:Q", title="nodes"),
    y=alt.Y("operator:N", sort="-x", title="ONNX operator"),
    color=alt.Color("graph:N", title="graph"),
    tooltip=["graph", "operator", "count"],
).properties(width=420, height=320)

# %% [markdown]
# The step's matrix products (`MatMul`, `Gemm`) are the projections of
# the [chapter 3](03_multi_head_attention) attention and the
# feed-forward layers; `Concat` appends the new keys and values to the
# cache.
#
# `OnnxTransformer` runs the three files in ONNX Runtime and answers the
# calls that decoding makes of a model (`encode`, a cached `decode`,
# `new_cache`), so the package's own greedy and beam search loops run
# unchanged over the graphs. The tokens can then differ from PyTorch's
# only where the two runtimes round differently.

# %%
graphs = OnnxTransformer(workdir, model.config, stem="de-en", threads=1)
held_out = src_tok.encode_batch(sources)  # (B, S), padded
decode = dict(max_len=40, bos_id=BOS_ID, eos_id=EOS_ID)
same_greedy = torch.equal(
    greedy_decode(graphs, held_out, use_cache=True, **decode),
    greedy_decode(model, held_out, use_cache=True, **decode))
same_beam = torch.equal(beam_search(graphs, held_out, beam_size=4, **decode),
                        beam_search(model, held_out, beam_size=4, **decode))
onnx_translator = Translator(graphs, src_tok, tgt_tok)
example = sources[:3]
for text, a, b in zip(example, translator.translate(example),
                      onnx_translator.translate(example), strict=True):
    print(f"{text} -> PyTorch: {a!r}; ONNX Runtime: {b!r}")
print(f"same tokens on {len(sources)} held-out numbers: greedy "
      f"{same_greedy}, beam {same_beam}")

# %% tags=["remove-cell"]
assert same_greedy and same_beam

# %% [markdown]
# The command line does the same:
#
# ```
# python -m transformer_lite.tasks.translate export        # de-en.*.onnx
# python -m transformer_lite.tasks.translate --runtime onnx "zwölf"
# ```
#
# ## Speed, size and accuracy, side by side
#
# Four ways to run the same translator, measured in one run on the same
# held-out numbers with beam search (k = 4), one thread each:
#
# - **eager**: the PyTorch model, as in chapter 7;
# - **compiled**: the same three graphs in PyTorch, the decoder step
#   compiled by inductor, the compiler behind `torch.compile`, into fused
#   C++ kernels. It compiles the exported step ahead of time
#   (AOTInductor), once for every batch size and length; `torch.compile`
#   just in time would compile again for positions 0 and 1, whose sizes
#   it specialises, at a cost of minutes on two cores;
# - **ONNX Runtime**: the exported files;
# - **int8**: the eager model with every linear layer's weights stored as
#   8-bit integers, one scale per output row, and its inputs quantised
#   on the fly, row by row (torchao's dynamic quantisation; embeddings
#   and LayerNorms stay float32).
#
# Latency is the time to translate one sentence alone; throughput the
# sentences per second when all are translated in one batch.

# %%
int8_model = quantize_int8(model)
start = time.perf_counter()
compiled = CompiledTransformer(model, programs=programs)
compile_seconds = time.perf_counter() - start

int8_path = workdir / "de-en-int8.pt"
torch.save(int8_model.state_dict(), int8_path)
float_path = workdir / "de-en-float.pt"
torch.save(model.state_dict(), float_path)
runtimes = {
    "eager": (model, size_on_disk(float_path)),
    "compiled (inductor)": (compiled, size_on_disk(float_path)),
    "ONNX Runtime": (graphs, size_on_disk(list(paths.values()))),
    "int8 (torchao)": (int8_model, size_on_disk(int8_path)),
}
LATENCY_SENTENCES = 10
rows, outputs = [], {}
for name, (runner, size) in runtimes.items():
    shipped = Translator(runner, src_tok, tgt_tok)
    start = time.perf_counter()
    for text in sources[:LATENCY_SENTENCES]:
        shipped.translate([text])
    latency = (time.perf_counter() - start) / LATENCY_SENTENCES
    start = time.perf_counter()
    outputs[name] = shipped.translate(sources)
    seconds = time.perf_counter() - start
    measured = scores(outputs[name], references)
    rows.append({
        "runtime": name,
        "latency (ms)": 1000 * latency,
        "sentences/s": len(sources) / seconds,
        "size (KB)": size / 1000,
        "exact match (%)": measured["exact match"],
        "BLEU": measured["BLEU"],
    })
table = pd.DataFrame(rows).set_index("runtime")
eager = table.loc["eager"]
table["speed-up"] = table["sentences/s"] / eager["sentences/s"]
print(f"compiling the step took {compile_seconds:.0f} s")
table.round(2)  # NBVAL_IGNORE_OUTPUT

# %% tags=["remove-cell"]
assert outputs["ONNX Runtime"] == outputs["eager"]
compiled_row = table.loc["compiled (inductor)"]
assert abs(compiled_row["exact match (%)"] - eager["exact match (%)"]) < 1
int8_row = table.loc["int8 (torchao)"]
assert int8_row["exact match (%)"] > eager["exact match (%)"] - 10, table
_onnx_size = table.loc["ONNX Runtime", "size (KB)"]
assert eager["size (KB)"] < _onnx_size < 1.2 * eager["size (KB)"], table

# %% [markdown]
# The sizes, unlike the times, are the same on every run: they depend
# only on the shapes. Where the int8 file's bytes go:

# %%
def linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


float_weights = sum(m.weight.nbytes for m in linears(model))
int8_entries = sum(m.weight.qdata.nbytes for m in linears(int8_model))
int8_weights = int8_entries + sum(  # a float32 scale, int8 zero point a row
    m.weight.scale.nbytes + m.weight.zero_point.nbytes
    for m in linears(int8_model))
weight_ratio = int8_weights / float_weights
int8_file = size_on_disk(int8_path)
file_shrink = size_on_disk(float_path) / int8_file
print(f"linear weights: float32 {float_weights / 1000:.0f} KB, int8 "
      f"{int8_weights / 1000:.0f} KB ({weight_ratio:.3f} of the bytes)")
print(f"checkpoint: {file_shrink:.2f} times smaller; the int8 entries are "
      f"{int8_entries / int8_file:.0%} of the int8 file")

# %% tags=["remove-cell"]
assert 0.25 < weight_ratio < 0.27, weight_ratio  # "about a quarter"
assert 3.0 < file_shrink < 3.4, file_shrink  # "3.2 times, not 4"
assert 0.7 < int8_entries / int8_file < 0.8  # "three quarters"

# %% [markdown]
# What the table says, on this machine (the numbers move from run to
# run; the checks hidden above hold for any seed):
#
# - **ONNX Runtime translates every number exactly as eager PyTorch
#   does** (asserted above): the same tokens, so the same scores. The
#   compiled step fuses operations and so rounds differently, which may
#   change a near-tie in the beam; its accuracy stays within a point.
#   They differ in time. A small model decoded one token at a time
#   spends much of each step in per-operator overhead (Python, dispatch,
#   small allocations), which a graph runtime and fused kernels are
#   built to remove. The time columns are this run's, on this machine
#   under its present load, and no check asserts them: a timing is a
#   benchmark's to measure, side by side in one run (`make bench`), not
#   a test's.
# - The ONNX files are a little larger than the PyTorch checkpoint (by
#   less than a fifth):
#   the encoder's and the step's each carry the positional table they
#   use, and the format has its own overhead.
# - **int8** stores the linear layers' weights in about a quarter of
#   the bytes (0.26: one byte per weight, plus each row's scale and zero
#   point). The file shrinks 3.2 times, not 4, because not everything
#   is quantised: the embeddings, LayerNorms and biases stay float32,
#   and with the scales and the file's own overhead they make a quarter
#   of the int8 file (the int8 entries, the other three quarters).
#   Accuracy barely moves (the check above
#   allows ten points; over the book's sweep of seeds and CPU kernels
#   int8 changed the exact match by at most half a point). On the
#   2-core CPUs we ran it on, torchao's int8 path in eager mode was
#   *slower*: quantising each input and the integer kernel's overhead
#   can cost more than the saved memory traffic on matrices this small.
#   int8 pays where weights dominate the time: large models,
#   memory-bound devices, or compiled kernels.
# - Compilation is not free: the warm-up above is paid once per
#   process, before the compiled row's first sentence.
#
# ### Where TensorRT fits
#
# TensorRT is NVIDIA's compiler for its GPUs. It reads the same ONNX
# files, fuses layers, picks the fastest kernel for each shape range
# and can run in float16 or int8. With the `tensorrt` package and a GPU:
#
# ```
# trtexec --onnx=de-en.step.onnx --saveEngine=de-en.step.plan --fp16 \
#   --minShapes=token:1x1,tgt_mask:1x1x1,... \
#   --optShapes=token:32x1,... --maxShapes=token:512x1,...
# ```
#
# or from Python, ONNX Runtime's TensorRT provider on the same files:
# `OnnxTransformer`'s sessions with
# `providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"]`.
# The cell below runs it only when a GPU and the provider are present.

# %%
providers = onnxruntime.get_available_providers()
if torch.cuda.is_available() and "TensorrtExecutionProvider" in providers:
    session = onnxruntime.InferenceSession(
        str(paths["encoder"]), providers=["TensorrtExecutionProvider"])
    print("TensorRT runs the encoder:", session.get_providers())
else:
    print("no NVIDIA GPU with TensorRT here: skipped "
          f"(providers: {', '.join(providers)})")

# %% [markdown]
# ## When a model stops fitting
#
# Training holds four things per parameter in memory: the parameter
# itself, its gradient, and Adam's two moment estimates
# {cite:p}`kingma2015adam`, each 4 bytes in float32, so **16 bytes per
# parameter** before a single activation. Activations (what the forward
# pass keeps for the backward one) grow with the batch. For $s$ tokens
# per sequence, batch $b$, width $h$ and $a$ heads, in 16-bit precision
# {cite:p}`korthikanti2023reducing`, an attention sublayer keeps
# $11sbh + 5as^2b$ bytes, a feed-forward one $19sbh$ and a LayerNorm
# $2sbh$: an encoder layer (one attention, one feed-forward, two
# LayerNorms) keeps $sbh\,(34 + 5as/h)$. A decoder layer adds a
# cross-attention and a third LayerNorm, $sbh\,(47 + 10as/h)$ when source
# and target have the same length; it is not two encoder layers. In
# float32, twice these.

# %%
def layer_activations(config, tokens_per_batch=25_000, seq=50):
    """Bytes of activations one encoder layer and one decoder layer keep
    for the backward pass (Korthikanti et al., 16-bit), source and target
    both ``seq`` tokens long."""
    b = tokens_per_batch / seq
    sbh = seq * b * config.d_model
    ash = config.n_heads * seq / config.d_model  # a s / h
    encoder = sbh * (34 + 5 * ash)  # attention, feed-forward, 2 norms
    decoder = sbh * (47 + 10 * ash)  # 2 attentions, feed-forward, 3 norms
    return encoder, decoder


def training_memory(config, tokens_per_batch=25_000, seq=50):
    """Bytes of parameters, gradients, Adam states and activations
    (the Korthikanti et al. estimate, float32) for one training step."""
    n = config.n_parameters()
    encoder, decoder = layer_activations(config, tokens_per_batch, seq)
    layers = config.n_layers * (encoder + decoder)
    return {"parameters": 4 * n, "gradients": 4 * n, "Adam": 8 * n,
            "activations": 2 * layers}


base = TransformerConfig(37_000, 37_000, tie_embeddings=True)
big = replace(base, d_model=1024, d_ff=4096, n_heads=16)
memory = pd.DataFrame({
    name: {k: v / 2**30 for k, v in training_memory(c).items()}
    for name, c in (("base", base), ("big", big))
}).T
memory["total"] = memory.sum(axis=1)
encoder_layer, decoder_layer = layer_activations(base)
print(f"a decoder layer keeps {decoder_layer / encoder_layer:.2f} times an "
      "encoder layer's activations")
print(f"parameters: base {base.n_parameters() / 1e6:.0f} M, "
      f"big {big.n_parameters() / 1e6:.0f} M; GiB for one step:")
memory.round(2)

# %% tags=["remove-cell"]
assert 60e6 < base.n_parameters() < 66e6  # the paper: 65 M
assert 200e6 < big.n_parameters() < 220e6  # the paper: 213 M
assert memory.loc["big", "total"] > 3 * memory.loc["base", "total"] / 2
for _c in (base, big):  # "about 1.45 times", for both sizes
    _enc, _dec = layer_activations(_c)
    assert 1.44 < _dec / _enc < 1.46, _dec / _enc
_states_bytes = {"base": 16 * base.n_parameters(),
                 "big": 16 * big.n_parameters()}
assert 0.95e9 < _states_bytes["base"] < 1.05e9  # "1.0 GB"
assert 3.35e9 < _states_bytes["big"] < 3.45e9  # "3.4 GB"
_states = memory[["parameters", "gradients", "Adam"]].sum(axis=1)
assert (memory["activations"] > 5 * _states).all()  # "several times"
assert 13.5 < memory.loc["base", "activations"] / _states["base"] < 14.5
assert 7.8 < memory.loc["big", "activations"] / _states["big"] < 8.8

# %% [markdown]
# A decoder layer keeps about 1.45 times an encoder layer's activations.
# For the paper's models (65 M and 213 M parameters) the parameters,
# gradients and Adam states take 1.0 GB for base and 3.4 GB for big
# (16 bytes each; the table counts GiB, $2^{30}$ bytes); the activations
# of a batch of 25,000 tokens take several times more (the table: about
# 14 times as much for base, 8 for big), which is why the paper
# spread each batch over 8 GPUs (data parallelism, chapter 7). A model
# a hundred times larger does not fit even with a batch of one
# sentence, and then the model itself must be split. Four ways, in one
# picture: each box is a device; the colours are what it holds.

# %%
def parallelism_picture():
    schemes = {
        "data parallel": [["L1", "L2", "L3", "L4"]] * 2,
        "tensor parallel": [["L1a", "L2a", "L3a", "L4a"],
                            ["L1b", "L2b", "L3b", "L4b"]],
        "pipeline parallel": [["L1", "L2"], ["L3", "L4"]],
        "fully sharded (FSDP)": [["L1a", "L2a", "L3a", "L4a"],
                                 ["L1b", "L2b", "L3b", "L4b"]],
    }
    notes = {
        "data parallel": "whole model on each;\nhalf the batch each;"
                         "\nall-reduce gradients",
        "tensor parallel": "half of every matrix;\nsame batch;\n"
                           "all-reduce in each layer",
        "pipeline parallel": "half the layers each;\nactivations passed "
                             "on;\nmicro-batches fill the pipe",
        "fully sharded (FSDP)": "half of every parameter;\nhalf the batch;"
                                "\ngather a layer, use, free",
    }
    colours = {"a": "tab:blue", "b": "tab:orange", "": "tab:gray"}
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.4))
    for ax, (name, devices) in zip(axes, schemes.items(), strict=True):
        for d, layers in enumerate(devices):
            ax.add_patch(Rectangle((d * 1.1, 0), 1, 4.4, fill=False))
            for i, layer in enumerate(layers):
                colour = colours[layer[2:] if len(layer) > 2 else ""]
                ax.add_patch(Rectangle((d * 1.1 + 0.1, 0.15 + i * 1.05),
                                       0.8, 0.9, color=colour, alpha=0.6))
                ax.text(d * 1.1 + 0.5, 0.6 + i * 1.05, layer,
                        ha="center", va="center", fontsize=8)
            ax.text(d * 1.1 + 0.5, -0.35, f"device {d}", ha="center",
                    fontsize=8)
        ax.text(1.05, 5.4, notes[name], ha="center", va="center",
                fontsize=8)
        ax.set_xlim(-0.1, 2.2)
        ax.set_ylim(-0.6, 6.2)
        ax.set_title(name, fontsize=10)
        ax.axis("off")
    fig.suptitle("Four ways to split training across two devices "
                 "(L1-L4: layers; a, b: halves of a layer)")
    fig.tight_layout()
    return fig


parallelism_picture()
plt.show()

# %% [markdown]
# ### Tensor parallelism: which matrices split which way
#
# Megatron-LM's split {cite:p}`shoeybi2019megatron` cuts each block so
# that its forward pass needs one all-reduce. In multi-head attention,
# $W^Q$, $W^K$ and $W^V$ are split **by columns**: with two devices,
# device 0 computes heads 1 to H/2 and device 1 the rest, each attending
# on its own, since heads never mix until $W^O$. $W^O$ is split **by
# rows**: each device multiplies its heads' outputs by its rows and gets
# a partial sum of the full output; **one all-reduce** adds the two. The
# feed-forward block the same way: $W_1$ by columns (each device holds
# half of the $d_{ff}$ hidden units, and the ReLU acts on each unit
# alone), $W_2$ by rows, one all-reduce. The backward pass needs one
# more per block, at its entrance: each device's share of the columns
# gives only a partial gradient of the block's input, and an all-reduce
# sums them. Megatron names the pair $f$ (identity forward, all-reduce
# backward, at the entrance) and $g$ (all-reduce forward, identity
# backward, at the exit): two all-reduces per block in a training step.
#
# Megatron also splits the input embedding and the output layer along
# the vocabulary, each device holding the rows of V/2 tokens; ours keeps
# them whole on each device, as it keeps the LayerNorms: the plan below
# splits only the attention and feed-forward blocks.

# %%
plan = tensor_parallel_plan(model)
for name in ("encoder.layers.0.self_attn.w_q",
             "encoder.layers.0.self_attn.w_o",
             "encoder.layers.0.feed_forward.w_1",
             "encoder.layers.0.feed_forward.w_2"):
    print(f"{name:36s} {type(plan[name]).__name__}")
print(f"{len(plan)} linear layers split in all")

# %% [markdown]
# PyTorch's engine does the work: `init_device_mesh("cpu", (2,))` names
# the processes, `parallelize_module` with `ColwiseParallel` and
# `RowwiseParallel` cuts the weights and inserts the all-reduces. One
# change in our attention made it possible: `split_heads` counts the
# heads from the tensor (C / D), not from `n_heads`, since a process
# holds only its share of the columns.
#
# Both schemes are started here in two new processes
# (`torch.multiprocessing`, the gloo backend on the CPU). Each builds
# the translator from the same weights, splits it, runs one forward
# and backward pass on the same batch, and sends back the full logits,
# the full gradients and the bytes of parameters it holds. The
# comparison is made in float64: in float32, a ReLU input within
# rounding of zero can fall on the other side of the kink in one
# process, and that unit's gradient with it.

# %%
exact = TransformerConfig(**{**model.config.to_dict(), "dropout": 0.0})
single = Transformer(exact).double()
single.load_state_dict(model.state_dict())
batch_src = src_tok.encode_batch(sources[:8])  # (B, S)
batch_tgt = tgt_tok.encode_batch(references[:8])  # (B, T)
logits = single(batch_src, batch_tgt)  # (B, T, V)
logits.square().mean().backward()
start = time.perf_counter()
ranks = run_split(single, batch_src, batch_tgt, kinds=("tensor", "fsdp"))
split_seconds = time.perf_counter() - start
worst = {}
for kind in ("tensor", "fsdp"):
    worst[kind] = max(
        max((r[kind]["grads"][name] - p.grad).abs().max().item()
            for name, p in single.named_parameters())
        for r in ranks)
    same = all(torch.allclose(r[kind]["logits"], logits, rtol=1e-10,
                              atol=1e-10) for r in ranks)
    print(f"{kind:6s}: logits equal {same}, largest gradient difference "
          f"{worst[kind]:.1e}")
print(f"2 processes, both schemes: {split_seconds:.0f} s")

# %% tags=["remove-cell"]
assert all(w < 1e-10 for w in worst.values()), worst
for r in ranks:
    for kind in ("tensor", "fsdp"):
        torch.testing.assert_close(r[kind]["logits"], logits, rtol=1e-10,
                                   atol=1e-10)

# %% [markdown]
# ### FSDP: memory per process
#
# Fully-sharded data parallelism {cite:p}`zhao2023pytorch` (ZeRO stage 3
# {cite:p}`rajbhandari2020zero`) keeps on each process only its shard of
# every parameter (and so of its gradient and Adam states). Just before
# a unit runs, the processes all-gather its full weights; right after,
# they free them; in the backward pass the gradients are
# reduce-scattered back to the shards. The package makes each encoder
# and decoder layer one unit (`fully_shard`, FSDP2), and the model
# itself the root unit, which holds the rest (embeddings, final
# LayerNorms, output layer): it is sharded like the others. Beyond the
# shards, more than one unit's full weights exist at a time: FSDP2
# prefetches, gathering the next unit's weights while the current one
# computes, so that communication overlaps computation, and it keeps
# the root's gathered from the end of the forward pass into the
# backward, which starts with them.

# %%
whole = local_parameter_bytes(single)
fsdp_bytes = [r["fsdp"]["local_bytes"] for r in ranks]
tensor_bytes = [r["tensor"]["local_bytes"] for r in ranks]
per_rank = pd.DataFrame({
    "one process": [whole / 1e6, None],
    "FSDP": [b / 1e6 for b in fsdp_bytes],
    "tensor parallel": [b / 1e6 for b in tensor_bytes],
}, index=["rank 0", "rank 1"])
print("parameter memory per process (MB, float64):")
per_rank.round(3)

# %% tags=["remove-cell"]
assert sum(fsdp_bytes) == whole
assert all(abs(b - whole / 2) < 0.01 * whole for b in fsdp_bytes)
assert all(whole / 2 < b < whole for b in tensor_bytes)

# %% [markdown]
# FSDP halves the parameters held by each process, exactly (every
# parameter is held once in all). Tensor parallelism halves only the
# split matrices: the embeddings and the output layer, a large share of
# so small a model, stay whole on each.
#
# ## Summary
#
# - `torch.export` records a model's tensor operations as a graph; it
#   refuses data-dependent branches and unrolls Python loops. So a
#   translator ships as three graphs (encoder, cross-attention keys and
#   values, one cached decoder step), with the decoding loop outside and
#   the key/value cache passed in and out, and dynamic batch and
#   lengths.
# - The ONNX files of those graphs run in ONNX Runtime, and the
#   package's own greedy and beam search over them give the same tokens
#   as PyTorch on every held-out number; the command line exports and
#   translates with them (`export`, `--runtime onnx`).
# - Side by side: a graph runtime or a compiled step removes per-operator
#   overhead at no cost in accuracy; int8 weights take about a quarter
#   of the bytes (the file, 3.2 times less, since embeddings, LayerNorms
#   and biases stay float32) at almost no cost in accuracy, and on a
#   small model on this CPU they are slower, not faster.
# - A model stops fitting when 16 bytes per parameter plus activations
#   exceed a device. Tensor parallelism splits $W^Q, W^K, W^V, W_1$ by
#   columns and $W^O, W_2$ by rows, one all-reduce per block in the
#   forward pass and one in the backward (Megatron's $g$ and $f$), and
#   here keeps the embeddings and output layer whole; FSDP shards every
#   parameter, the root unit's too, and gathers a unit (prefetching the
#   next) when it runs. Both gave
#   the single process's logits and gradients in float64, and FSDP
#   halved each process's parameters.
#
# ## Exercises
#
# 1. **Without the cache.** Export a step that takes the whole prefix
#    and no cache. Compare its ONNX file, its latency and its tokens.
# 2. **int8 in ONNX Runtime.** ONNX Runtime has its own dynamic
#    quantisation (`onnxruntime.quantization.quantize_dynamic`). Apply
#    it to the step graph (you may need its pre-processing pass, which
#    runs shape inference) and add a row to the table.
# 3. **Where the time goes.** Profile one eager beam step with
#    `torch.profiler`. What share is matrix products, and what share is
#    everything else? Relate it to the speed-ups in the table.
# 4. **Pipeline parallelism.** Put the encoder on one process and the
#    decoder on the other, sending the memory between them
#    (`torch.distributed.send`/`recv`). Why is one process idle half of
#    the time, and how do micro-batches help?

# %% [markdown]
# ## Graded exercises
#
# Eleven exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then
# open them. The classroom edition (the teaching page) hands out the
# same exercises with the solutions removed, and nbgrader scores them.

# %% tags=["exercise-setup"]
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
    expect_tensor,
)

gen = torch.Generator().manual_seed(12)
# (out, in): a float32 weight matrix whose third row is all zeros
W = torch.randn(6, 10, generator=gen)
W[2] = 0.0
b = torch.randn(6, generator=gen)  # its bias
X = torch.randn(4, 10, generator=gen)  # (N, in): inputs, row by row
# (B, L, C): inputs of the tensor-parallel exercises, in float64
x = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)

# %% [markdown]
# ### Exercise 12.1: int8 weights, one scale per row (2 points)
#
# Symmetric int8 quantisation stores a row $w$ of a weight matrix as
# integers $q = \mathrm{round}(w / s)$ in $[-127, 127]$ and one float
# scale $s = \max_j |w_j| / 127$, so that the row's largest entry
# becomes $\pm 127$. Write `quantize_rows(w)` for a matrix of shape
# (out, in): it returns `(q, scale)`, `q` an int8 tensor of the same
# shape and `scale` of shape (out, 1), in `w`'s dtype. A row of zeros
# gets the scale 1 (and $q = 0$). PyTorch's own quantisers
# (`torch.quantize_per_channel`, `torch.fake_quantize_per_channel_affine`)
# do not serve your code.

# %% tags=["solution", "hide-input"]
def quantize_rows(w):
    ### BEGIN SOLUTION
    amax = w.abs().amax(dim=-1, keepdim=True)  # (out, 1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(w / scale).clamp(-127, 127)  # (out, in)
    return q.to(torch.int8), scale
    ### END SOLUTION


# %% tags=["check"]
want_scale = W.abs().amax(dim=-1, keepdim=True) / 127  # (out, 1)
want_scale[2] = 1.0  # the row of zeros
with exercise("12.1", twins=[torch.quantize_per_channel,
                             torch.fake_quantize_per_channel_affine]):
    q, scale = quantize_rows(W)
    expect_tensor("q", q, shape=W.shape, dtype=torch.int8,
                  hint="store q as int8 integers: .to(torch.int8), after "
                  "rounding")  # fmt: skip
    expect_close("scale", scale, want_scale,
                 hint="one scale per row: the row's largest |w| divided "
                 "by 127, and 1 for a row of zeros (0 / 0 is "
                 "NaN)")  # fmt: skip

# %% tags=["check"]
want_scale = W.abs().amax(dim=-1, keepdim=True) / 127  # (out, 1)
want_scale[2] = 1.0
# PyTorch's own fake quantisation: round(w / s), clamped, times s
fake = torch.fake_quantize_per_channel_affine(
    W, want_scale.flatten(), torch.zeros(6, dtype=torch.int32), 0,
    -127, 127)  # fmt: skip
with exercise("12.1", twins=[torch.quantize_per_channel,
                             torch.fake_quantize_per_channel_affine]):
    expect_equal("q", quantize_rows(W)[0],
                 (fake / want_scale).round().to(torch.int8),
                 hint="round to the nearest integer (torch.round); "
                 ".to(torch.int8) alone cuts toward zero")  # fmt: skip

# %% [markdown]
# ### Exercise 12.2: back to floats, and the error (1 point)
#
# Write `dequantize(q, scale)`, the floats $\hat w = q s$ in `scale`'s
# dtype. Rounding moves each entry by at most half a step, so
# $|w - \hat w| \le s / 2$ entry by entry; the check confirms it.

# %% tags=["solution", "hide-input"]
def dequantize(q, scale):
    ### BEGIN SOLUTION
    return q.to(scale.dtype) * scale  # (out, in)
    ### END SOLUTION


# %% tags=["check"]
# W quantised by PyTorch's own fake quantisation (the integers, their
# scales, and the floats they stand for), not by your quantize_rows
s_W = W.abs().amax(dim=-1, keepdim=True) / 127  # (out, 1)
s_W[2] = 1.0  # the row of zeros
W_hat = torch.fake_quantize_per_channel_affine(
    W, s_W.flatten(), torch.zeros(6, dtype=torch.int32), 0, -127, 127)
q_W = (W_hat / s_W).round().to(torch.int8)  # (out, in)
with exercise("12.2"):
    w_hat = dequantize(q_W, s_W)
    expect_close("dequantize(q, scale)", w_hat, W_hat, atol=1e-7,
                 dtype=torch.float32,
                 hint="multiply the integers by their row's scale, in "
                 "floating point")  # fmt: skip
    expect(bool(((W - w_hat).abs() <= s_W / 2 + 1e-7).all()),
           "some entry moved by more than half its row's step",
           hint="multiply by the scale, do not divide")  # fmt: skip
    expect_tensor("dequantize(q, scale.double())",
                  dequantize(q_W, s_W.double()), dtype=torch.float64,
                  hint="the floats come out in the scale's dtype: "
                  "q.to(scale.dtype)")  # fmt: skip

# %% [markdown]
# ### Exercise 12.3: an int8 linear layer (2 points)
#
# Dynamic quantisation quantises the inputs too, row by row, when they
# arrive. Write `int8_linear(x, q_w, s_w, bias)` for inputs $x$ of
# shape (N, in) and a weight quantised by `quantize_rows`: quantise
# $x$ with `quantize_rows`, multiply the integers in int32,
# $A = q_x q_w^\top$, and scale back, $y_{no} = A_{no}\, s_{x,n}\,
# s_{w,o} + b_o$, of shape (N, out). Since $x = \hat x + e_x$ and
# $W = \hat W + e_W$, the error is
# $x e_W^\top + e_x \hat W^\top$, so
# $|y_{no} - (x W^\top + b)_{no}| \le \frac{s_{w,o}}{2} \|x_n\|_1 +
# \frac{s_{x,n}}{2} \|\hat W_o\|_1$; the second check confirms it.
# Multiply the integers yourself: neither a float product of the
# dequantised tensors (`F.linear`) nor the package's `quantize_int8`
# serves your code.

# %% tags=["solution", "hide-input"]
def int8_linear(x, q_w, s_w, bias):
    ### BEGIN SOLUTION
    q_x, s_x = quantize_rows(x)  # (N, in), (N, 1)
    A = q_x.to(torch.int32) @ q_w.to(torch.int32).T  # (N, out), exact
    return A.to(s_x.dtype) * s_x * s_w.T + bias  # (N, out)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.shipping.quantize import quantize_int8

# W and X quantised by PyTorch's fake quantisation, not by quantize_rows
zeros = torch.zeros(6, dtype=torch.int32)
s_W = W.abs().amax(dim=-1, keepdim=True) / 127  # (out, 1)
s_W[2] = 1.0  # the row of zeros
W_hat = torch.fake_quantize_per_channel_affine(
    W, s_W.flatten(), zeros, 0, -127, 127)  # fmt: skip
q_W = (W_hat / s_W).round().to(torch.int8)  # (out, in)
s_X = X.abs().amax(dim=-1, keepdim=True) / 127  # (N, 1)
X_hat = torch.fake_quantize_per_channel_affine(
    X, s_X.flatten(), zeros[:4], 0, -127, 127)  # fmt: skip
want = F.linear(X_hat, W_hat, b)  # (N, out)
with exercise("12.3", after=["12.1"], twins=[F.linear, quantize_int8]):
    expect_close("int8_linear(X, q_w, s_w, b)", int8_linear(X, q_W, s_W, b),
                 want, atol=1e-5,
                 hint="multiply the integers in int32 (int8 products "
                 "overflow), then scale by s_x, one per row of x, and "
                 "s_w, one per output")  # fmt: skip

# %% tags=["check"]
from transformer_lite.shipping.quantize import quantize_int8

s_X = X.abs().amax(dim=-1, keepdim=True) / 127  # (N, 1)
bound = (s_W.T / 2 * X.abs().sum(-1, keepdim=True)
         + s_X / 2 * W_hat.abs().sum(-1))  # (N, out)
exact = F.linear(X, W, b)  # (N, out), in float32
with exercise("12.3", after=["12.1"], twins=[F.linear, quantize_int8]):
    error = (int8_linear(X, q_W, s_W, b) - exact).abs()
    expect(bool((error <= bound + 1e-5).all()),
           "the int8 result is further from the float one than rounding "
           "allows", hint="quantise x row by row with its own scales, "
           "and add the bias unquantised")  # fmt: skip

# %% [markdown]
# ### Exercise 12.4: a column-parallel linear layer (1 point)
#
# Split $y = x W + b$ over $n$ devices by the columns of $W$ (in
# $\times$ out): device $i$ holds columns $i \cdot \mathit{out}/n$ to
# $(i+1) \cdot \mathit{out}/n$ and the same slice of $b$, and computes
# its slice of $y$ from the whole $x$. `nn.Linear` keeps $W^\top$, so
# a column of $W$ is a row of `linear.weight`. Write
# `column_parallel(x, linear, n)`, returning the list of the $n$
# devices' outputs, each of shape $(\dots, \mathit{out}/n)$, each
# computed on its device: a slice of the whole output $y$, which no
# device holds, is not one.

# %% tags=["solution", "hide-input"]
def column_parallel(x, linear, n):
    ### BEGIN SOLUTION
    weights = linear.weight.chunk(n, dim=0)  # n x (out / n, in)
    biases = linear.bias.chunk(n, dim=0)  # n x (out / n,)
    return [F.linear(x, w_i, b_i)  # (..., out / n)
            for w_i, b_i in zip(weights, biases, strict=True)]  # fmt: skip
    ### END SOLUTION


# %% tags=["check"]
torch.manual_seed(12)
up = nn.Linear(8, 12).double()
with torch.no_grad():
    y = up(x)  # (B, L, out): the whole output, which no device holds
with exercise("12.4"):
    for n in (3, 2):
        parts = column_parallel(x, up, n)
        expect_equal(f"len(column_parallel(x, up, {n}))", len(parts), n)
        width = 12 // n
        for i, part in enumerate(parts):
            name = f"column_parallel(x, up, {n})[{i}]"
            expect_close(name, part, y[..., i * width : (i + 1) * width],
                         hint="device i holds rows i * out / n ... of "
                         "linear.weight, shape (out, in), and the same "
                         "slice of the bias: split along dim 0")  # fmt: skip
            expect(part.untyped_storage().nbytes()
                   == part.numel() * part.element_size(),
                   f"{name} is a slice of a wider tensor, not a device's "
                   "own output", hint="compute each device's slice from "
                   "its own rows of the weight; do not compute the whole "
                   "output and cut it")  # fmt: skip

# %% [markdown]
# ### Exercise 12.5: a row-parallel linear layer (1 point)
#
# The input now arrives split along its last axis, as
# `column_parallel` leaves it: `x_parts` holds $n$ tensors of shape
# $(\dots, \mathit{in}/n)$. Device $i$ holds rows
# $i \cdot \mathit{in}/n$ to $(i+1) \cdot \mathit{in}/n$ of $W$ (the
# matching columns of `linear.weight`) and computes a partial output of
# the full width; one all-reduce adds them up. Write
# `row_parallel(x_parts, linear)`, returning the list of the $n$
# partial outputs, each of shape $(\dots, \mathit{out})$, whose sum is
# `linear(x)`. The bias is added once, on device 0.

# %% tags=["solution", "hide-input"]
def row_parallel(x_parts, linear):
    ### BEGIN SOLUTION
    n = len(x_parts)
    weights = linear.weight.chunk(n, dim=1)  # n x (out, in / n)
    parts = [x_i @ w_i.T  # (..., out), a partial sum
             for x_i, w_i in zip(x_parts, weights, strict=True)]  # fmt: skip
    parts[0] = parts[0] + linear.bias
    return parts
    ### END SOLUTION


# %% tags=["check"]
torch.manual_seed(12)
down = nn.Linear(12, 8).double()
h = torch.randn(2, 3, 12, generator=gen, dtype=torch.float64)
h_parts = list(h.chunk(3, dim=-1))  # 3 x (B, L, in / 3)
with torch.no_grad():
    # device i's partial output: the layer on its slice of h alone (the
    # rest zeros), without the bias except on device 0
    alone = [torch.cat([h_j if j == i else torch.zeros_like(h_j)
                        for j, h_j in enumerate(h_parts)], dim=-1)
             for i in range(3)]  # fmt: skip
    partials = [down(h_i) - (down.bias if i else 0.0)
                for i, h_i in enumerate(alone)]  # fmt: skip
    y = down(h)  # (B, L, out)
with exercise("12.5"):
    parts = row_parallel(h_parts, down)
    expect_equal("len(row_parallel(...))", len(parts), 3)
    for i, part in enumerate(parts):
        expect_close(f"row_parallel(...)[{i}]", part, partials[i],
                     hint="add the bias once, on device 0 only: the "
                     "all-reduce sums the partial outputs, so a bias on "
                     "every device counts n times; device i multiplies "
                     "its slice of x by columns i * in / n ... of "
                     "linear.weight")  # fmt: skip
    expect_close("the sum of row_parallel(...)", sum(parts), y,
                 hint="the partial outputs add up to the layer's "
                 "output")  # fmt: skip

# %% [markdown]
# ### Exercise 12.6: the feed-forward block split (2 points)
#
# Megatron-LM splits a feed-forward block $\max(0, x W_1 + b_1) W_2 +
# b_2$ with one all-reduce: $W_1$ by columns, so that each device holds
# $d_{ff}/n$ hidden units and applies the ReLU to them alone, then
# $W_2$ by rows. Write `parallel_feed_forward(x, ff, n)` from your two
# functions, for a `FeedForward` `ff` (layers `ff.w_1`, `ff.w_2`),
# returning the $n$ devices' partial outputs before the all-reduce,
# each of shape $(B, L, C)$: their sum is the block's output. (The
# block's own `forward` does not serve your code.)

# %% tags=["solution", "hide-input"]
def parallel_feed_forward(x, ff, n):
    ### BEGIN SOLUTION
    hidden = [torch.relu(h_i)  # (B, L, d_ff / n) on device i
              for h_i in column_parallel(x, ff.w_1, n)]  # fmt: skip
    return row_parallel(hidden, ff.w_2)  # n x (B, L, C), to all-reduce
    ### END SOLUTION


# %% tags=["check", "points-2"]
from transformer_lite import FeedForward


def shard(linear, rows=slice(None), columns=slice(None), bias=True):
    """A device's share of ``linear``: an nn.Linear holding the rows and
    columns of its weight (of W^T), and the bias of those rows, or
    none."""
    weight = linear.weight[rows, columns]  # (out share, in share)
    part = nn.Linear(weight.size(1), weight.size(0), bias=bias,
                     dtype=weight.dtype)  # fmt: skip
    with torch.no_grad():
        part.weight.copy_(weight)
        if bias:
            part.bias.copy_(linear.bias[rows])
    return part


torch.manual_seed(12)
ff = FeedForward(8, 12, dropout=0.0).double()
devices = {}  # n: what device i computes, as a FeedForward of its own
for n in (2, 3):
    devices[n] = []
    for i in range(n):
        units = slice(i * 12 // n, (i + 1) * 12 // n)  # its hidden units
        block = FeedForward(8, 12 // n, dropout=0.0)
        block.w_1 = shard(ff.w_1, rows=units)  # columns of W_1
        block.w_2 = shard(ff.w_2, columns=units, bias=i == 0)  # rows of W_2
        devices[n].append(block)
with torch.no_grad():
    want = {n: [block(x) for block in blocks]
            for n, blocks in devices.items()}  # fmt: skip
    y = ff(x)  # (B, L, C)
with exercise("12.6", after=["12.4", "12.5"], twins=[FeedForward.forward]):
    for n in (2, 3):
        parts = parallel_feed_forward(x, ff, n)
        expect_equal(f"len(parallel_feed_forward(x, ff, {n}))",
                     len(parts), n)  # fmt: skip
        expect_close(f"the sum of parallel_feed_forward(x, ff, {n})",
                     sum(parts), y,
                     hint="W_1 by columns, the ReLU on each device's "
                     "hidden units, W_2 by rows: the partial outputs add "
                     "up to the block's")  # fmt: skip
        for i, part in enumerate(parts):
            expect_close(f"parallel_feed_forward(x, ff, {n})[{i}]", part,
                         want[n][i],
                         hint="device i's partial output comes from its "
                         "own d_ff / n hidden units alone (and b_2 on "
                         "device 0 only); it is not the whole block's "
                         "output")  # fmt: skip

# %% [markdown]
# ### Exercise 12.7: attention heads split (2 points)
#
# In multi-head attention, $W^Q$, $W^K$ and $W^V$ split by columns give
# each device whole heads: its $C/n$ columns are $H/n$ heads of
# $D = C/H$. Each device attends with its heads alone, and $W^O$ split
# by rows, with one all-reduce, mixes them. Write
# `parallel_attention(x, mha, n)`: the self-attention of `mha` (a
# `MultiHeadAttention`, layers `mha.w_q`, `mha.w_k`, `mha.w_v`,
# `mha.w_o`, head size `mha.d_k`) on $x$ of shape $(B, L, C)$, no
# mask, computed this way; $n$ divides $H$. Return the $n$ devices'
# partial outputs before the all-reduce, each of shape $(B, L, C)$.
# (The module's own `forward` does not serve your code.)

# %% tags=["solution", "hide-input"]
def parallel_attention(x, mha, n):
    ### BEGIN SOLUTION
    B, L, _ = x.shape
    D = mha.d_k
    qs, ks, vs = (column_parallel(x, w, n)  # n x (B, L, C / n)
                  for w in (mha.w_q, mha.w_k, mha.w_v))  # fmt: skip
    heads = []
    for q, k, v in zip(qs, ks, vs, strict=True):  # device by device
        q, k, v = (t.view(B, L, -1, D).transpose(1, 2)  # (B, H/n, L, D)
                   for t in (q, k, v))  # fmt: skip
        s = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H / n, L, L)
        out = s.softmax(dim=-1) @ v  # (B, H / n, L, D)
        heads.append(out.transpose(1, 2).reshape(B, L, -1))  # (B, L, C/n)
    return row_parallel(heads, mha.w_o)  # n x (B, L, C), to all-reduce
    ### END SOLUTION


# %% tags=["check", "points-2"]
from transformer_lite import MultiHeadAttention

torch.manual_seed(12)
mha = MultiHeadAttention(8, 4, dropout=0.0).double()
devices = {}  # n: device i's heads, a MultiHeadAttention of its own
for n in (2, 4):
    devices[n] = []
    for i in range(n):
        heads = slice(i * 8 // n, (i + 1) * 8 // n)  # its H / n heads
        block = MultiHeadAttention(8, 4, dropout=0.0)
        # (shard, from the check of exercise 12.6): W^Q, W^K and W^V by
        # columns, W^O by rows; the heads are counted from the columns
        block.w_q, block.w_k, block.w_v = (
            shard(w, rows=heads) for w in (mha.w_q, mha.w_k, mha.w_v))
        block.w_o = shard(mha.w_o, columns=heads, bias=i == 0)
        devices[n].append(block)
with torch.no_grad():
    want = {n: [block(x, x, x) for block in blocks]
            for n, blocks in devices.items()}  # fmt: skip
    y = mha(x, x, x)  # (B, L, C)
with exercise("12.7", after=["12.4", "12.5"],
              twins=[MultiHeadAttention.forward]):
    for n in (2, 4):
        parts = parallel_attention(x, mha, n)
        expect_equal(f"len(parallel_attention(x, mha, {n}))", len(parts),
                     n)  # fmt: skip
        expect_close(f"the sum of parallel_attention(x, mha, {n})",
                     sum(parts), y,
                     hint="a device's C / n columns are H / n whole heads "
                     "of D = C / H: split them into heads, attend, merge, "
                     "then W^O by rows; the partial outputs add up to the "
                     "module's")  # fmt: skip
        for i, part in enumerate(parts):
            expect_close(f"parallel_attention(x, mha, {n})[{i}]", part,
                         want[n][i],
                         hint="device i's partial output comes from its "
                         "own H / n heads alone (and W^O's bias on device "
                         "0 only); it is not the whole module's "
                         "output")  # fmt: skip

# %% [markdown]
# ### Exercise 12.8: FSDP's shards (2 points)
#
# FSDP2 cuts every parameter along its first axis as `torch.chunk` does:
# with $c = \lceil \mathit{rows}/n \rceil$, rank $r$ holds rows $r c$
# to $\min((r + 1) c, \mathit{rows})$, which leaves the last ranks
# short, or empty. Write `fsdp_shards(param, n)`, the list of the $n$
# ranks' shards (an empty one has 0 rows and the other axes of
# `param`), cut by slicing (`torch.chunk` itself does not serve your
# code). Then write `bytes_per_rank(model, n)`: for each rank, the
# bytes of its shards of all the parameters of `model`.

# %% tags=["solution", "hide-input"]
def fsdp_shards(param, n):
    ### BEGIN SOLUTION
    c = math.ceil(param.size(0) / n)  # rows per rank
    return [param[r * c : (r + 1) * c] for r in range(n)]
    ### END SOLUTION


def bytes_per_rank(model, n):
    ### BEGIN SOLUTION
    held = [0] * n
    for p in model.parameters():
        for r, shard in enumerate(fsdp_shards(p, n)):
            held[r] += shard.numel() * shard.element_size()
    return held
    ### END SOLUTION


# %% tags=["check"]
with exercise("12.8", twins=[torch.chunk, torch.Tensor.chunk]):
    for rows, n in ((10, 4), (5, 4), (1, 2), (8, 2)):
        param = torch.arange(rows * 3).view(rows, 3)
        shards = fsdp_shards(param, n)
        chunks = param.chunk(n)  # may be fewer than n
        want = [len(c) for c in chunks] + [0] * (n - len(chunks))
        expect_equal(f"rows of fsdp_shards(({rows}, 3), {n})",
                     [len(s) for s in shards], want,
                     hint="c = ceil(rows / n) rows per rank, the last "
                     "ranks short or empty, as torch.chunk cuts: not the "
                     "near-equal split of torch.tensor_split")  # fmt: skip
        expect_equal(f"the shapes of fsdp_shards(({rows}, 3), {n})",
                     [tuple(s.shape[1:]) for s in shards], [(3,)] * n,
                     hint="an empty shard keeps the other axes: "
                     "param[r * c : (r + 1) * c] has shape (0, 3) past "
                     "the end")  # fmt: skip
        expect_equal("torch.cat(shards)", torch.cat(shards), param,
                     hint="the shards, in rank order, are the parameter "
                     "again")  # fmt: skip

# %% tags=["check"]
from transformer_lite import FeedForward

torch.manual_seed(12)
small = FeedForward(5, 6, dropout=0.0).double()  # 71 parameters
single = FeedForward(5, 6, dropout=0.0)  # the same, in float32
with exercise("12.8", twins=[torch.chunk, torch.Tensor.chunk]):
    # rows per rank: w_1 (6, 5) 2, 2, 2, 0; b_1 (6,) the same;
    # w_2 (5, 6) 2, 2, 1, 0; b_2 (5,) the same; 8 bytes each
    expect_equal("bytes_per_rank(small, 4)", bytes_per_rank(small, 4),
                 [208, 208, 152, 0],
                 hint="add up, rank by rank, its shard of every parameter "
                 "(fsdp_shards): elements times element_size(), 8 bytes "
                 "in float64")  # fmt: skip
    # in float32 over 3 ranks: w_1 2, 2, 2 rows of 5; b_1 2, 2, 2;
    # w_2 2, 2, 1 rows of 6; b_2 2, 2, 1; 4 bytes each
    expect_equal("bytes_per_rank(single, 3)", bytes_per_rank(single, 3),
                 [104, 104, 76],
                 hint="count the bytes of the parameters as they are: "
                 "element_size() is 4 in float32")  # fmt: skip

# %% [markdown]
# ### Exercise 12.9: predict, then run (1 point)
#
# Decide before you run the cell below it. It saves a small
# translator's weights twice with `torch.save`: once in float32, and
# once with every `nn.Linear` weight stored as int8 integers beside a
# float32 scale per row, as exercise 12.1 quantises them; embeddings,
# LayerNorms and biases stay float32. The translator has vocabularies
# of 1,000 tokens on each side (not tied), $d_{model} = 64$,
# $d_{ff} = 256$, and two layers in the encoder and two in the
# decoder. By what factor is the int8 file smaller than the float32
# one? Set `prediction` to whichever of the numbers 4, 3 or 2 is
# nearest; then run the experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = 2
### END SOLUTION

# %% [markdown]
# The experiment: the translator, its two files (in memory) and their
# bytes. A file's size depends on its tensors' shapes and dtypes, not
# on their values, so the untrained weights serve.

# %%
import io

from transformer_lite.model import Transformer, TransformerConfig

torch.manual_seed(12)
small_translator = Transformer(TransformerConfig(
    1000, 1000, n_layers=2, d_model=64, d_ff=256, n_heads=4))
float_state = small_translator.state_dict()
int8_state = dict(float_state)  # the linear weights replaced below
for name, module in small_translator.named_modules():
    if isinstance(module, nn.Linear):
        w = module.weight.detach()  # (out, in)
        s = w.abs().amax(dim=1) / 127  # (out,): one scale per row
        fake = torch.fake_quantize_per_channel_affine(
            w, s, torch.zeros(w.size(0), dtype=torch.int32), 0, -127, 127)
        int8_state[f"{name}.weight"] = (fake / s[:, None]).round().to(
            torch.int8)  # (out, in)
        int8_state[f"{name}.scale"] = s
file_bytes = {}
for kind, state in (("float32", float_state), ("int8", int8_state)):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    file_bytes[kind] = buffer.getbuffer().nbytes
    print(f"{kind:8s} {file_bytes[kind]:>10,} bytes")
shrink = file_bytes["float32"] / file_bytes["int8"]
print(f"the int8 file is {shrink:.2f} times smaller")

# %% tags=["check", "hide-input"]
nearest = min((4, 3, 2), key=lambda factor: abs(factor - shrink))
with exercise("12.9", prediction=True):
    expect(prediction in (4, 3, 2),
           f"prediction is {prediction!r}: choose one of the numbers 4, "
           "3 or 2")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(prediction == nearest,
           f"the file shrank {shrink:.2f} times, nearest {nearest}, not "
           f"{prediction!r}",
           hint="int8 makes the linear weights 4 times smaller, and only "
           "those: the two embedding tables (2 x 1,000 x 64 numbers), the "
           "biases and the LayerNorms stay float32, about 133,000 of the "
           "model's 426,000 numbers, against 293,000 in linear weights; "
           "4 x 426,000 bytes over 293,000 + 4 x 133,000 is about 2. A "
           "small model with a large vocabulary shrinks least")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 12.10: predict, then run (1 point)
#
# Decide before you run the cell below it. The package's
# `tensor_parallel` splits a translator over two processes as the
# chapter's plan says: $W^Q$, $W^K$, $W^V$ and $W_1$ by columns, $W^O$
# and $W_2$ by rows, in every attention and feed-forward block; the
# embeddings, LayerNorms and output layer stay whole on each process.
# The translator below has one encoder layer and one decoder layer.
# How many all-reduces does one forward pass run? Set `prediction` to
# a whole number; then run the experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = 5
### END SOLUTION

# %% [markdown]
# The experiment: PyTorch's fake process group (from its test
# utilities) stands in for two processes in this one. Its collectives
# return at once, without a second process to add anything, so the
# outputs are not the split model's; but every collective the engine
# issues still goes through PyTorch's dispatcher, where a dispatch
# mode counts them.

# %%
import collections

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.shipping.parallel import tensor_parallel


class CountCollectives(TorchDispatchMode):
    """Counts the collectives (all-reduce, all-gather, ...) that run."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, op = func.name().split("::")
        if namespace == "_c10d_functional" and not op.startswith("_"):
            self.counts[op] += 1
        return func(*args, **(kwargs or {}))


dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
try:
    torch.manual_seed(12)
    split = Transformer(TransformerConfig(
        50, 50, n_layers=1, d_model=16, d_ff=32, n_heads=2)).eval()
    tensor_parallel(split, init_device_mesh("cpu", (2,)))
    src = torch.randint(3, 50, (2, 5), generator=gen)  # (B, S)
    tgt = torch.randint(3, 50, (2, 4), generator=gen)  # (B, T)
    with torch.no_grad(), CountCollectives() as collectives:
        split(src, tgt)  # (B, T, V)
finally:
    dist.destroy_process_group()
all_reduces = collectives.counts["all_reduce"]
print("collectives in one forward pass:", dict(collectives.counts))

# %% tags=["check", "hide-input"]
with exercise("12.10", prediction=True):
    expect(isinstance(prediction, int) and prediction >= 0,
           f"prediction is {prediction!r}: give a whole number, such as "
           "3")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(prediction == all_reduces,
           f"the forward pass ran {all_reduces} all-reduces, not "
           f"{prediction!r}",
           hint="one per block, after its row-parallel layer (W^O or "
           "W_2): the column-parallel layers need none, since each process "
           "computes whole heads or hidden units from the whole input. An "
           "encoder layer has two blocks (self-attention, feed-forward), "
           "a decoder layer three (with cross-attention): 2 + 3 = 5, "
           "where the split linear layers number 16")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 12.11: why the loop stays outside (2 points, written)
#
# The chapter exported the translator as three graphs and left greedy
# and beam search in Python, calling the step graph once for every
# token. In two to four sentences: why could `torch.export` not take
# `greedy_decode`, loop and all, as one graph, and what does exporting
# one cached decoder step instead give the programs that run it?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# `torch.export` records the tensor operations of one run on example
# inputs: a Python loop is unrolled to the number of steps that run
# took, and a branch that reads a tensor's value is refused. Greedy
# decoding stops when every sentence has emitted end-of-sequence, so
# both its number of steps and its stopping test depend on the tokens
# it produces, which no fixed graph can hold. One cached step, with the
# keys and values of the positions so far as inputs and outputs and
# dynamic batch and positions, is the same computation at every
# position, so any loop outside the graph, in Python or in another
# runtime, can call it as often as a sentence needs; greedy and beam
# search share it, at the cost of a call, and the cache passing in and
# out, for every token.
#
# *Rubric (2 points).* 1 point: the loop's length (or its stopping
# test) depends on the generated tokens, and export unrolls loops to a
# fixed count or refuses value-dependent control flow. 1 point: one step
# graph serves every position (with the cache in and out, or dynamic
# shapes), so any decoding loop (greedy, beam, any runtime) can drive
# it; naming a cost of it (a call per token) is not required.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 5
# message: Hint: add the bias once
# def row_parallel(x_parts, linear):
#     n = len(x_parts)
#     weights = linear.weight.chunk(n, dim=1)
#     return [F.linear(x_i, w_i, linear.bias)
#             for x_i, w_i in zip(x_parts, weights, strict=True)]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def quantize_rows(w):
#     amax = w.abs().amax(dim=-1, keepdim=True)  # (out, 1)
#     scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
#     zero = torch.zeros(w.size(0), dtype=torch.int32)
#     fake = torch.fake_quantize_per_channel_affine(
#         w, scale.flatten(), zero, 0, -127, 127)
#     return (fake / scale).round().to(torch.int8), scale

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def quantize_rows(w):
#     return w.to(torch.int8), torch.ones(w.size(0), 1, dtype=w.dtype)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def dequantize(q, scale):
#     return q.to(scale.dtype)  # the integers, unscaled

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def int8_linear(x, q_w, s_w, bias):
#     q_x, s_x = quantize_rows(x)  # a float product of the dequantised
#     return F.linear(q_x.to(s_x.dtype) * s_x, q_w.to(s_w.dtype) * s_w,
#                     bias)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def int8_linear(x, q_w, s_w, bias):
#     return bias.expand(x.size(0), -1)  # the bias alone

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def column_parallel(x, linear, n):
#     return list(linear(x).chunk(n, dim=-1))  # the whole output, cut

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def row_parallel(x_parts, linear):
#     y = linear(torch.cat(x_parts, dim=-1))  # the whole, on device 0
#     return [y] + [torch.zeros_like(y) for _ in x_parts[1:]]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: delegate
# def parallel_feed_forward(x, ff, n):
#     return [ff(x)] + [torch.zeros_like(x) for _ in range(n - 1)]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def parallel_feed_forward(x, ff, n):
#     y = ff.w_2(torch.relu(ff.w_1(x)))  # the whole block, on device 0
#     return [y] + [torch.zeros_like(y) for _ in range(n - 1)]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 7
# kind: delegate
# def parallel_attention(x, mha, n):
#     return [mha(x, x, x)] + [torch.zeros_like(x) for _ in range(n - 1)]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 7
# kind: trivial
# def parallel_attention(x, mha, n):
#     return [mha.w_o(mha.w_v(x)) / n for _ in range(n)]  # no attention

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 8
# kind: delegate
# def fsdp_shards(param, n):
#     chunks = list(param.chunk(n))  # may be fewer than n
#     return chunks + [param[:0]] * (n - len(chunks))
#
#
# def bytes_per_rank(model, n):
#     held = [0] * n
#     for p in model.parameters():
#         for r, shard in enumerate(fsdp_shards(p, n)):
#             held[r] += shard.numel() * shard.element_size()
#     return held

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 8
# kind: trivial
# def fsdp_shards(param, n):
#     return [param] + [param[:0]] * (n - 1)  # everything on rank 0
#
#
# def bytes_per_rank(model, n):
#     return [208, 208, 152, 0]  # the numbers of the check
