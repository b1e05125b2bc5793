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
# # 0. Preface
#
# This book builds the Transformer of "Attention Is All You Need"
# {cite:p}`vaswani2017attention` from its central formula up to a trained,
# fast translation model. Each chapter reads the same way: an equation,
# the few lines of code that implement it with the paper's symbols as
# variable names, and then a printed shape, a picture or a check that
# the code does what the prose says.
#
# ## Who it is for
#
# - **A reader working alone** who wants to know how attention really
#   works, not just that it works. Every step is small enough to follow,
#   and every number that matters is printed.
# - **A student in JupyterLab.** Each chapter is a notebook: change a
#   size, rerun a cell and watch what moves.
# - **A teacher in class.** The chapters stand on their own, each ends
#   with a summary and exercises, and each executes top to bottom on a
#   laptop CPU, so a chapter can be run live in front of a room.
# - **Anyone who needs a reference implementation they can trust.** The
#   companion package, `transformer_lite`, is small enough to read in an
#   afternoon, and it is tested against PyTorch itself
#   {cite:p}`paszke2019pytorch`.
#
# ## What is different about it
#
# - **Exact, not approximately right.** Every module in
#   `transformer_lite` that has a counterpart in PyTorch (scaled
#   dot-product attention, multi-head attention, the encoder and
#   decoder layers) gives the same numbers as PyTorch's own once the
#   weights are copied across, checked in float64 with tight
#   tolerances. The parts PyTorch does not have, such as the sinusoidal
#   table or the chunked kernel, are checked against the paper's
#   formula or the plain computation they replace. Where we
#   deliberately differ from PyTorch or from the paper, the prose says
#   so and a test pins the difference down.
# - **Every claim is checked.** When the text says "the rows sum to one"
#   or "the variance grows like $d_k$", an `assert` in the notebook
#   verifies it on every run. These cells are hidden in the HTML book
#   to keep the page readable; in the notebooks you can read (and
#   break) them.
# - **Offline, on a laptop CPU.** Nothing is downloaded while the book
#   runs: the data is generated or shipped with it, and every model is
#   trained from scratch. A GPU makes the chapters faster, never
#   different in kind.
# - **One source of truth.** The chapters import what they teach from
#   the package and display its source rather than pasting a copy, so
#   book and library cannot drift apart.
# - **Pictures you can question.** The interactive charts are drawn with
#   Altair {cite:p}`vanderplas2018altair`: hover over a cell of an
#   attention map to read its weight, or pick a head to see what it
#   looks at. Like the chapters of *Dive into Deep Learning*
#   {cite:p}`zhang2023dive`, each chapter ends with a summary and
#   exercises.

# %% [markdown]
# ## How to run it
#
# Everything goes through `make`, run from the repository root
# (`make help` lists the targets):
#
# - `make book` executes every chapter and builds the HTML book in
#   `_build/html`; open `index.html` there to read it.
# - `make test` checks everything: the package's unit tests, every
#   chapter executed as a test, the book build, and the built book
#   opened in a browser.
# - `make lab` opens the chapters in JupyterLab.
#
# Each target first creates `.venv` with the pinned requirements and
# the package when it is missing (`make install` does only that).
#
# The chapters are stored as plain Python files in the jupytext
# "percent" format (`notebooks/01_attention.py` and so on). Thanks to
# jupytext pairing, JupyterLab opens them as notebooks (if yours shows
# one as a text file, right-click it and choose *Open With → Notebook*);
# saving writes the `.py` file and a paired `.ipynb`. The `.py` file is
# the source: it is what the repository keeps and what you should diff.
#
# **CPU or GPU.** The same code runs on both. Each chapter asks
# `transformer_lite.default_device()` where to put its tensors, and
# that function picks CUDA if it is available, then Apple's MPS, then
# the CPU. Set the environment variable `TRANSFORMER_LITE_DEVICE` to
# override the choice, for example `TRANSFORMER_LITE_DEVICE=cpu make
# lab`. The whole rule fits on one screen:

# %%
import inspect
import os
import platform

import torch

import transformer_lite
from transformer_lite import default_device

print(inspect.getsource(default_device))

# %% [markdown]
# Every chapter starts by printing the versions it runs with and the
# device it chose, so that a result can always be traced back to its
# setting. On this machine:

# %%
device = default_device()
print(f"python           {platform.python_version()}")
print(f"torch            {torch.__version__}")
print(f"transformer_lite {transformer_lite.__version__}")
print(f"device           {device}")

# %% [markdown]
# ## The chapters
#
# 0. **Preface**: who the book is for, how to run it, the notation.
# 1. **[Attention](01_attention)**: the formula
#    $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$ worked by hand, why the
#    scores are divided by $\sqrt{d_k}$, and a cost that grows with the
#    square of the length.
# 2. **[Masks](02_masks)**: padding and causal masks, how they
#    combine, and the numerics of masking ($-\infty$, $-10^9$, half
#    precision).
# 3. **[Multi-head attention](03_multi_head_attention)**: learned
#    projections, heads and their shapes, checked equal to PyTorch's
#    `nn.MultiheadAttention`.
# 4. **[Positional encodings](04_positional_encoding)**: why attention
#    needs them, the sinusoidal table, and its relative-position
#    property.
# 5. **[The encoder/decoder stack](05_encoder_decoder)**: feed-forward
#    layers, residuals, LayerNorm placement, the full model, and its
#    parameter count against the paper.
# 6. **[Training](06_training)**: batches and masks, label smoothing,
#    the learning-rate schedule, one training step for every case, a
#    first model trained on the copy task, greedy decoding.
# 7. **[A real task offline: translating number
#    words](07_translation)**, with subword tokens, beam search, BLEU and
#    attention maps, all without a download.
# 8. **[Making it fast](08_making_it_fast)**: memory-efficient
#    attention, fused kernels, the KV cache, mixed precision and gradient
#    checkpointing, each measured.
# 9. **[Positions that generalise](09_positions_that_generalise)**:
#    RoPE, ALiBi, T5's bias and Shaw's relative keys behind one seam in
#    attention, and which of them still work on sequences four times
#    longer than any seen in training.
# 10. **[A decoder-only language model](10_language_model)**: the
#     decoder alone trained to predict the next token of Python's own
#     documentation, perplexity, sampling with temperature, top-k and
#     top-p, and Transformer-XL's memory of the previous segment.
# 11. **[The Vision Transformer and cross-modal
#     attention](11_vision_and_cross_modal)**: images as patch tokens, a
#     ViT against a CNN and logistic regression on real handwriting, and
#     an image encoder with the text decoder that reads handwritten
#     numbers aloud.
# 12. **[Shipping and scaling out](12_shipping_and_scaling_out)**: the
#     translator exported with `torch.export` and ONNX and run in ONNX
#     Runtime with the same tokens, eager, compiled, ONNX Runtime and
#     int8 side by side, and tensor-parallel and fully-sharded training
#     across two processes.
# 13. **[Pretraining and fine-tuning](13_pretraining_and_fine_tuning)**:
#     BERT's masked language modelling beside GPT's objective, a small
#     encoder pretrained on the book's corpus and fine-tuned with 1%,
#     10% and 100% of the labels, LoRA against full fine-tuning on a
#     held-out family of topics, a domain's tokenizer, and GPT-2's
#     published weights run in the book's classes.
# 14. **[Tables and time series](14_tables_and_time_series)**: what to
#     customise for a domain's own data, the FT-Transformer against
#     logistic regression and boosted trees on a clinical table, a patch
#     forecaster against the naive and linear forecasters on a synthetic
#     and a real economic series, walk-forward, with a leak measured.

# %% [markdown]
# ## Notation
#
# One legend for tensor shapes is used everywhere: in the prose, in
# the package's docstrings and in the `# (B, H, L, D)` comments on
# every line of code that changes a shape. Where the paper has a
# symbol for the same quantity, it is given too.
#
# | letter | meaning | in the paper |
# |---|---|---|
# | `B` | batch size | |
# | `S` | source length | |
# | `T` | target length | |
# | `L` | any sequence length (`Lq` queries, `Lk` keys) | $n$ |
# | `C` | model width, `d_model` | $d_{\text{model}}$ |
# | `H` | number of attention heads | $h$ |
# | `D` | head size, `d_k = d_model / H` | $d_k = d_v$ |
# | `V` | vocabulary size | |
#
# In the code, variables follow the paper's symbols: `d_model`, `d_k`,
# `h` or `n_heads`, `d_ff` for the inner width of the feed-forward
# layers, `n_layers` for $N$. The paper's base model has
# $d_{\text{model}} = 512$, $h = 8$ and $d_k = d_v = 64$.
#
# **Masks.** A mask is a boolean tensor, and **True means "may
# attend"**, the convention of PyTorch's
# `torch.nn.functional.scaled_dot_product_attention`.
# `nn.MultiheadAttention` and `nn.Transformer` use the opposite
# convention (True = masked out); the package converts in exactly one
# place, and [chapter 2](02_masks) explains why the choice matters.
#
# The package declares the same legend in its own docstring, so
# `help(transformer_lite)` shows it wherever you are.

# %% tags=["remove-cell"]
# The legend in the table above is the package's legend, word for word.
import re

from transformer_lite.masks import to_torch_attn_mask

LEGEND = {
    "B": "batch size",
    "S": "source length",
    "T": "target length",
    "L": "any sequence length (Lq queries, Lk keys)",
    "C": "model width, d_model",
    "H": "number of attention heads",
    "D": "head size, d_k = d_model / H",
    "V": "vocabulary size",
}
doc = transformer_lite.__doc__.replace("``", "").replace("**", "")
declared = dict(re.findall(r"^([A-Z])\s{2,}(\S.*?)\s*$", doc, re.MULTILINE))
assert declared == LEGEND, (declared, LEGEND)
assert "True = may attend" in doc

# The mask convention is PyTorch's: True lets a query see a key.
q = k = v = torch.eye(2, dtype=torch.float64)[None]  # (1, 2, 2)
only_first = torch.tensor([[True, False], [True, False]])
out = torch.nn.functional.scaled_dot_product_attention(
    q, k, v, attn_mask=only_first
)
assert torch.equal(out, v[:, :1].expand(1, 2, 2))
# ... and the one conversion to nn.MultiheadAttention's convention flips it.
assert torch.equal(to_torch_attn_mask(only_first), ~only_first)

# default_device: CUDA, then MPS, then the CPU; the variable overrides.
saved = os.environ.pop("TRANSFORMER_LITE_DEVICE", None)
try:
    mps = getattr(torch.backends, "mps", None)
    if torch.cuda.is_available():
        expected = "cuda"
    elif mps is not None and mps.is_available():
        expected = "mps"
    else:
        expected = "cpu"
    assert default_device().type == expected
    os.environ["TRANSFORMER_LITE_DEVICE"] = "cpu"
    assert default_device() == torch.device("cpu")
finally:
    os.environ.pop("TRANSFORMER_LITE_DEVICE", None)
    if saved is not None:
        os.environ["TRANSFORMER_LITE_DEVICE"] = saved
assert device == default_device()

# The paper's base model: d_model = 512, h = 8, d_k = d_model / h = 64.
base = transformer_lite.TransformerConfig(src_vocab=10, tgt_vocab=10)
assert (base.d_model, base.n_heads) == (512, 8)
assert base.d_model // base.n_heads == 64

# %% [markdown]
# ## How to read a chapter
#
# Run the cells in order. Each chapter seeds its random generators, so
# running it again gives the same numbers (timings excepted, and a GPU
# draws other random numbers than a CPU). All of a chapter's seeds come
# from one value, the environment variable `BOOK_SEED` (0 unless set;
# the book is built with 0). Below its title, each chapter shows a card
# of what it teaches and how long it takes; the first code cell after
# the card prints the versions, the device and the seed.
# Start Jupyter with `BOOK_SEED=1` and every chapter takes another random
# path. A claim checked on one seed would be a fact about that seed, so
# the checks are meant to hold for any seed; `make seed-sweep` reruns the
# chapters that train with seeds 1 and 2. Cells that end in a shape or a
# picture are meant to be changed: try a longer sequence, another seed, a
# bigger $d_k$, and rerun. If you change something a hidden
# `assert` depends on, it will tell you, and that is part of the point.
#
# Let us begin with the one operation the whole model is built around:
# [attention](01_attention).

# %% tags=["remove-cell"]
# Every chapter shows its card below the title, and the first code cell
# after it prints the versions, the device and the seed.
from pathlib import Path

chapters = sorted(Path().glob("[0-9][0-9]_*.py"))
assert len(chapters) >= 12, chapters
for path in chapters[1:]:
    cells = path.read_text().split("\n# %%")
    code = [c for c in cells if not c.startswith(" [markdown]")]
    assert "chapter_card(" in code[1], path  # code[0]: the file header
    setup = code[2]
    assert "BOOK_SEED={SEED}" in setup, path
    assert "torch.__version__" in setup and "device" in setup, path
