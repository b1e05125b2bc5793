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
# # 3. Multi-head attention
#
# [Chapter 1](01_attention) built one attention function: every query
# looks at every key and takes a weighted average of the values.
# [Chapter 2](02_masks) decided which keys a query may look at. This
# chapter runs several of those attentions side by side, each in its own
# slice of the model width, and glues the results back together. That is
# *multi-head attention*, the block the Transformer uses once in every
# encoder layer and twice in every decoder layer.
#
# We will
#
# * read the paper's two formulas and see why splitting one attention
#   into $h$ heads adds no matrix multiplications, and what it does add;
# * follow a tensor through every reshape, with a table of shapes and the
#   same shapes asserted on a real tensor;
# * write the class out for reading, then prove it equals the package's
#   `MultiHeadAttention`;
# * count its parameters against the paper's base model;
# * build four heads by hand that each watch a different relation, and
#   draw what they attend to;
# * load weights from PyTorch's `nn.MultiheadAttention` and show that the
#   two agree to rounding, forward and backward, with masks;
# * switch on the fused kernel and check it computes the same thing.
#
# The code taught here lives in `transformer_lite/attention.py`
# (`MultiHeadAttention`) and `transformer_lite/interop.py`
# (`from_torch_mha`).

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(3)

# %%
import inspect
import math
import platform

import pandas as pd
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import transformer_lite
from transformer_lite import (
    MultiHeadAttention,
    causal_mask,
    default_device,
    padding_mask,
    scaled_dot_product_attention,
    seed_everything,
    target_mask,
)
from transformer_lite.device import book_seed
from transformer_lite.interop import from_torch_mha
from transformer_lite.masks import to_torch_attn_mask
from transformer_lite.viz import heads_chart

SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
seed_everything(SEED + 3)
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"transformer_lite {transformer_lite.__version__}")
device = default_device()
print(f"device: {device}, BOOK_SEED={SEED}")

# %% [markdown]
# ## Why several heads?
#
# One attention gives each query a single probability distribution over
# the keys, and its output is one weighted average of the values. An
# average blurs: if a word needs the word just before it *and* the first
# word of the sentence, a single head has to split its weight between
# them and returns a mixture of the two.
#
# Multi-head attention asks $h$ questions at once. Each head $i$ has its
# own projections $W^Q_i, W^K_i \in \mathbb{R}^{d_{\text{model}} \times
# d_k}$ and $W^V_i \in \mathbb{R}^{d_{\text{model}} \times d_v}$, so it
# compares queries and keys in its own learned subspace and forms its own
# distribution (section 3.2.2 of the paper,
# {cite:p}`vaswani2017attention`):
#
# $$
# \mathrm{head}_i = \mathrm{Attention}(Q W^Q_i,\; K W^K_i,\; V W^V_i),
# \qquad i = 1, \dots, h
# $$
#
# $$
# \mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots,
# \mathrm{head}_h)\, W^O, \qquad W^O \in \mathbb{R}^{h d_v \times
# d_{\text{model}}}
# $$
#
# The heads are narrow: $d_k = d_v = d_{\text{model}} / h$. The paper's
# base model has $d_{\text{model}} = 512$ and $h = 8$, so each head works
# in 64 dimensions and the concatenation is 512 wide again.

# %%
d_model, h = 512, 8
d_k = d_v = d_model // h
print(f"d_model = {d_model}, h = {h}, d_k = d_v = {d_k}, "
      f"concat width h * d_v = {h * d_v}")

# %% tags=["remove-cell"]
assert (d_k, d_v, h * d_v) == (64, 64, d_model)


# %% [markdown]
# Narrow heads are what make the extra questions cheap. Stacked side by
# side, the $h$ matrices $W^Q_i$ form one $d_{\text{model}} \times
# d_{\text{model}}$ matrix, exactly the size of a single full-width
# head's projection. The scores cost $h \cdot L_q L_k d_k = L_q L_k
# d_{\text{model}}$ multiply-adds, again the same as one head. Counting
# every multiply-add of the matrix products (two floating-point
# operations each), with $W^Q$ and $W^O$ applied to the $L_q$ queries and
# $W^K$, $W^V$ to the $L_k$ keys and values, gives
#
# $$
# \text{FLOPs} = \underbrace{2 \cdot 2 B (L_q + L_k)
# d_{\text{model}}^2}_{W^Q, W^K, W^V, W^O} + \underbrace{2 \cdot 2 B L_q
# L_k d_{\text{model}}}_{Q K^\top \text{ and weights} \cdot V},
# $$
#
# which in self-attention ($L_q = L_k = L$) is $8BLd_{\text{model}}^2 +
# 4BL^2d_{\text{model}}$, with no $h$ anywhere. PyTorch's FLOP counter,
# which counts matrix products only, agrees whatever the number of
# heads:

# %%
def count_flops(n_heads, B=2, L=10, C=64):
    """FLOPs of one self-attention forward pass, counted by PyTorch."""
    attn = MultiHeadAttention(C, n_heads, dropout=0.0)
    x = torch.randn(B, L, C)  # (B, L, C)
    with FlopCounterMode(display=False) as counter:
        attn(x, x, x)
    return counter.get_total_flops()


B, L, C = 2, 10, 64
for n_heads in (1, 2, 4, 8, 16):
    print(f"h = {n_heads:>2}: {count_flops(n_heads):,} FLOPs")
print(f"formula: {4 * 2 * B * L * C**2 + 2 * 2 * B * L * L * C:,} FLOPs")

# %% tags=["remove-cell"]
flops = {n: count_flops(n) for n in (1, 2, 4, 8, 16)}
assert len(set(flops.values())) == 1, flops
assert flops[1] == 4 * 2 * B * L * C**2 + 2 * 2 * B * L * L * C
# Cross-attention: W^Q, W^O see Lq positions, W^K, W^V see Lk.
Lq, Lk = 3, 10
cross = MultiHeadAttention(C, 4, dropout=0.0)
with FlopCounterMode(display=False) as counter:
    cross(torch.randn(B, Lq, C), torch.randn(B, Lk, C), torch.randn(B, Lk, C))
assert counter.get_total_flops() == (
    2 * 2 * B * (Lq + Lk) * C**2 + 2 * 2 * B * Lq * Lk * C
)

# %% [markdown]
# The matrix products are not the whole bill, though. Every head keeps
# its own $L_q \times L_k$ table of scores, so the score tensor is
# (B, H, Lq, Lk): its memory, the masking and the softmax all grow
# linearly with $h$. With the short sequences of this chapter that is a
# rounding error next to the projections; at long lengths the scores
# dominate, which is what chapter 8's fused and chunked attention are
# about. The scaling is the exception: the package divides $Q$ by
# $\sqrt{d_k}$ *before* the product (chapter 1), so it divides the
# $B L_q d_{\text{model}}$ entries of $Q$ once, however many heads
# share them, where scaling the scores would divide $B h L_q L_k$.

# %%
def score_elements(n_heads, B=2, L=10, C=64):
    """Elements in the (B, H, Lq, Lk) weights of one forward pass."""
    attn = MultiHeadAttention(C, n_heads, dropout=0.0)
    attn.keep_weights = True
    x = torch.randn(B, L, C)  # (B, L, C)
    attn(x, x, x)
    return attn.weights.numel()


for n_heads in (1, 2, 4, 8, 16):
    print(f"h = {n_heads:>2}: {score_elements(n_heads):,} score elements")

# %% tags=["remove-cell"]
assert all(
    score_elements(n) == n * score_elements(1) == n * B * L * L
    for n in (1, 2, 4, 8, 16)
)

# %% [markdown]
# To see which steps grow, count the elements that each one is handed
# in a masked forward pass. A `TorchFunctionMode` sees every torch call
# made inside it, and on the `meta` device tensors have shapes but no
# numbers, so the count computes nothing (and draws no random numbers).

# %%
class ElementCounter(TorchFunctionMode):
    """Counts the elements that the scaling, masking and softmax see."""

    STEPS = {"div": "scaling", "masked_fill": "masking", "softmax": "softmax"}

    def __init__(self):
        super().__init__()
        self.elements = dict.fromkeys(self.STEPS.values(), 0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        step = self.STEPS.get(getattr(func, "__name__", ""))
        if step is not None:
            self.elements[step] += args[0].numel()
        return func(*args, **(kwargs or {}))


def step_elements(n_heads, B=2, L=10, C=64):
    """Elements each step sees in one causal self-attention pass."""
    with torch.device("meta"):
        attn = MultiHeadAttention(C, n_heads, dropout=0.0)
        x = torch.randn(B, L, C)  # (B, L, C)
        with ElementCounter() as counter:
            attn(x, x, x, causal_mask(L))
    return counter.elements


for n_heads in (1, 2, 4, 8, 16):
    print(f"h = {n_heads:>2}: {step_elements(n_heads)}")

# %% tags=["remove-cell"]
# Scaling: Q's B L C entries once, for every h. Masking (the fill before
# the softmax and the zeros after it) and the softmax: h B L^2 each.
for n in (1, 2, 4, 8, 16):
    assert step_elements(n) == {
        "scaling": B * L * C, "masking": 2 * n * B * L * L,
        "softmax": n * B * L * L,
    }, (n, step_elements(n))

# %% [markdown]
# What the paper found in practice (Table 3): with the cost held fixed,
# one head translated 0.9 BLEU worse than eight, and very many tiny heads
# (32 heads of 16 dimensions) lost quality again.
#
# ## Splitting into heads: the shapes
#
# In code nobody builds $h$ small matrices. We apply the big
# $d_{\text{model}} \times d_{\text{model}}$ projection once and then
# *reinterpret* its last axis as $H$ blocks of $D$ numbers: block $i$ is
# head $i$. The whole computation is a sequence of reshapes around
# chapter 1's attention, with queries of length $L_q$ and keys and values
# of length $L_k$ (equal in self-attention, different in the decoder's
# cross-attention):
#
# | step | operation | shape |
# |---|---|---|
# | 0 | input (queries; keys and values alike with $L_k$) | (B, Lq, C) |
# | 1 | projection $x W^Q$ (and $W^K$, $W^V$) | (B, L, C) |
# | 2 | `view`: split C into H heads of D | (B, L, H, D) |
# | 3 | `transpose(1, 2)`: heads before positions | (B, H, L, D) |
# | 4 | scores $Q K^\top / \sqrt{d_k}$ | (B, H, Lq, Lk) |
# | 5 | softmax, then weights @ V | (B, H, Lq, D) |
# | 6 | `transpose(1, 2)` + `reshape`: concatenate heads | (B, Lq, C) |
# | 7 | output projection $W^O$ | (B, Lq, C) |
#
# Step 3 is what lets one batched matrix product serve all heads: with
# the head axis in front, `@` treats (B, H) as batch dimensions and
# multiplies (Lq, D) by (D, Lk) for every example and every head at once.
#
# Now the same steps on a real tensor: a batch of 2, five queries
# attending over seven keys, at the paper's width.

# %%
B, Lq, Lk = 2, 5, 7
mha = MultiHeadAttention(d_model, h, dropout=0.0).to(device)
x_q = torch.randn(B, Lq, d_model, device=device)  # (B, Lq, C)
x_kv = torch.randn(B, Lk, d_model, device=device)  # (B, Lk, C)

q_proj = mha.w_q(x_q)  # (B, Lq, C)
q_split = q_proj.view(B, Lq, h, d_k)  # (B, Lq, H, D)
q = q_split.transpose(1, 2)  # (B, H, Lq, D)
k = mha.w_k(x_kv).view(B, Lk, h, d_k).transpose(1, 2)  # (B, H, Lk, D)
v = mha.w_v(x_kv).view(B, Lk, h, d_k).transpose(1, 2)  # (B, H, Lk, D)
scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, Lq, Lk)
weights = scores.softmax(dim=-1)
heads = weights @ v  # (B, H, Lq, D)
concat = heads.transpose(1, 2).reshape(B, Lq, d_model)  # (B, Lq, C)
out = mha.w_o(concat)  # (B, Lq, C)

walk = {
    "0 input": x_q,
    "1 projection": q_proj,
    "2 view": q_split,
    "3 transpose": q,
    "4 scores": scores,
    "5 weights @ V": heads,
    "6 concat": concat,
    "7 W^O": out,
}
for step, tensor in walk.items():
    print(f"{step:<15} {tuple(tensor.shape)}")

# %% tags=["remove-cell"]
H, D, C = h, d_k, d_model
table = {
    "0 input": (B, Lq, C),
    "1 projection": (B, Lq, C),
    "2 view": (B, Lq, H, D),
    "3 transpose": (B, H, Lq, D),
    "4 scores": (B, H, Lq, Lk),
    "5 weights @ V": (B, H, Lq, D),
    "6 concat": (B, Lq, C),
    "7 W^O": (B, Lq, C),
}
assert {s: tuple(t.shape) for s, t in walk.items()} == table
assert tuple(k.shape) == tuple(v.shape) == (B, H, Lk, D)
torch.testing.assert_close(out, mha(x_q, x_kv, x_kv))


# %% [markdown]
# The last line of the hidden check above confirms that these eight lines
# compute exactly what `mha(x_q, x_kv, x_kv)` computes.
#
# Two details of the walk deserve a second look.
#
# **The view is the formula.** Splitting the projection's last axis into
# blocks means that head $i$ uses rows $iD, \dots, (i+1)D - 1$ of the
# `nn.Linear` weight: those rows *are* $W^Q_i$ (transposed, as
# `nn.Linear` stores its weight as (out, in)). So we can also compute the
# paper's formula literally, one head at a time with chapter 1's
# function, concatenate, and get the same result:

# %%
def head_slice(linear, i):
    """Rows i*D .. (i+1)*D of a projection: head i's own W_i."""
    rows = slice(i * d_k, (i + 1) * d_k)
    return linear.weight[rows], linear.bias[rows]  # (D, C), (D,)


head_outputs = []
for i in range(h):
    q_i = x_q @ head_slice(mha.w_q, i)[0].T + head_slice(mha.w_q, i)[1]
    k_i = x_kv @ head_slice(mha.w_k, i)[0].T + head_slice(mha.w_k, i)[1]
    v_i = x_kv @ head_slice(mha.w_v, i)[0].T + head_slice(mha.w_v, i)[1]
    head_i, _ = scaled_dot_product_attention(q_i, k_i, v_i)  # (B, Lq, D)
    head_outputs.append(head_i)
concat_loop = torch.cat(head_outputs, dim=-1)  # (B, Lq, C)
print("one head at a time:", tuple(concat_loop.shape),
      "| all heads at once:", tuple(concat.shape))

# %% tags=["remove-cell"]
torch.testing.assert_close(concat_loop, concat)
torch.testing.assert_close(mha.w_o(concat_loop), out)

# %% [markdown]
# **The reshape after the transpose.** `transpose` does not move any
# numbers; it only changes the strides, so `heads.transpose(1, 2)` is no
# longer laid out contiguously in memory. `view` refuses such a tensor,
# while `reshape` copies it when it must. That is why step 2 may use
# `view` (the projection's output is contiguous) but step 6 uses
# `reshape`:

# %%
merged = heads.transpose(1, 2)  # (B, Lq, H, D)
print("contiguous after transpose:", merged.is_contiguous())
try:
    merged.view(B, Lq, d_model)
except RuntimeError as err:
    print("view fails:", str(err)[:60], "...")

# %% tags=["remove-cell"]
assert q_proj.is_contiguous() and not merged.is_contiguous()
try:
    merged.view(B, Lq, d_model)
except RuntimeError:
    pass
else:
    raise AssertionError("view of a transposed tensor should fail")


# %% [markdown]
# ## The module, written out
#
# Here is the whole thing as a class to read: four `nn.Linear`
# projections, and a `forward` that follows the table line by line. The
# attention itself is chapter 1's `scaled_dot_product_attention`, which
# treats every leading axis as a batch axis and so handles all heads at
# once. A mask of shape (B, Lq, Lk) gets a head axis of size 1, so that
# every head obeys the same mask.

# %%
class TeachingMHA(nn.Module):
    """Multi-head attention, one step per line (for reading)."""

    def __init__(self, d_model: int, h: int):
        super().__init__()
        assert d_model % h == 0, "d_model must be a multiple of h"
        self.h = h
        self.d_k = d_model // h
        self.w_q = nn.Linear(d_model, d_model)  # W^Q_1 .. W^Q_h, stacked
        self.w_k = nn.Linear(d_model, d_model)  # W^K_1 .. W^K_h
        self.w_v = nn.Linear(d_model, d_model)  # W^V_1 .. W^V_h
        self.w_o = nn.Linear(d_model, d_model)  # W^O

    def forward(self, query, key, value, mask=None):
        B, Lq, C = query.shape
        Lk = key.size(1)
        q = self.w_q(query)  # (B, Lq, C)
        k = self.w_k(key)  # (B, Lk, C)
        v = self.w_v(value)  # (B, Lk, C)
        q = q.view(B, Lq, self.h, self.d_k).transpose(1, 2)  # (B, H, Lq, D)
        k = k.view(B, Lk, self.h, self.d_k).transpose(1, 2)  # (B, H, Lk, D)
        v = v.view(B, Lk, self.h, self.d_k).transpose(1, 2)  # (B, H, Lk, D)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, Lq or 1, Lk)
        x, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, Lq, D)
        x = x.transpose(1, 2).reshape(B, Lq, C)  # (B, Lq, C)
        return self.w_o(x)  # (B, Lq, C)


# %% [markdown]
# The attribute names match the package's, so `load_state_dict` copies
# the teaching module's weights straight into `MultiHeadAttention`. We
# compare the two with a padding mask on the keys: the second example's
# last three keys are padding.

# %%
PAD_ID = 0
src = torch.randint(1, 10, (B, Lk), device=device)  # token ids, (B, Lk)
src[1, -3:] = PAD_ID
key_mask = padding_mask(src, PAD_ID)  # (B, 1, Lk), True = may attend

teaching = TeachingMHA(d_model, h).to(device)
mha.load_state_dict(teaching.state_dict())
mha.eval()
out_teaching = teaching(x_q, x_kv, x_kv, key_mask)  # (B, Lq, C)
out_package = mha(x_q, x_kv, x_kv, key_mask)  # (B, Lq, C)
print("largest difference:",
      f"{(out_teaching - out_package).abs().max().item():.1e}")

# %% tags=["remove-cell"]
torch.testing.assert_close(out_teaching, out_package)
# the mask matters: without it the output differs
assert not torch.allclose(out_package, mha(x_q, x_kv, x_kv), atol=1e-4)

# %% [markdown]
# The package's version is the same code with checks that explain
# themselves (shapes, masks, arguments), an optional dropout on the
# weights, and the two switches we meet below: `keep_weights` and
# `kernel`. Its `forward` reads in five steps: project the queries; project
# the keys and values (or take them from a cache, chapter 8); place the
# queries at their positions (chapter 9's relative schemes, none here);
# `attend`; merge the heads and project with $W^O$. Everything that
# knows *how* attention is computed (which kernel, the causal rule, a
# row with nothing to attend to) sits behind the one call to `attend`:

# %%
print(inspect.getsource(MultiHeadAttention.forward))


# %% [markdown]
# ## Counting parameters
#
# Each of the four projections is a $d_{\text{model}} \times
# d_{\text{model}}$ weight plus a bias of $d_{\text{model}}$, so
#
# $$
# N_{\text{MHA}} = 4\,(d_{\text{model}}^2 + d_{\text{model}}),
# $$
#
# and $h$ does not appear: heads divide the width, they do not add
# weights. For the base model, $4 \cdot (512^2 + 512) = 1{,}050{,}624$.

# %%
def n_params(module):
    return sum(p.numel() for p in module.parameters())


formula = 4 * (d_model**2 + d_model)
print(f"formula:                     {formula:,}")
for n_heads in (1, 8, 16):
    attn = MultiHeadAttention(d_model, n_heads)
    print(f"MultiHeadAttention, h = {n_heads:<3}  {n_params(attn):,}")
print(f"nn.MultiheadAttention, h = 8 "
      f"{n_params(nn.MultiheadAttention(d_model, 8)):,}")

# %% tags=["remove-cell"]
assert formula == 1_050_624
assert n_params(MultiHeadAttention(512, 8)) == formula
assert all(n_params(MultiHeadAttention(512, n)) == formula
           for n in (1, 2, 4, 8, 16, 32))
assert n_params(nn.MultiheadAttention(512, 8, batch_first=True)) == formula
assert 18 * formula == 18_911_232

# %% [markdown]
# The base model has one attention block in each of its 6 encoder layers
# and two (self- and cross-attention) in each of its 6 decoder layers:
# 18 blocks, $18 \times 1{,}050{,}624 = 18{,}911{,}232$ parameters.
# [Chapter 5](05_encoder_decoder) counts the rest of the model.
#
# ## What the heads look at
#
# Trained Transformers grow heads with recognisable jobs: heads that look
# at the previous or the next token, heads that find a word's syntactic
# partner, heads that park their weight on a separator token
# {cite:p}`voita2019analyzing,clark2019what`. Training is chapter 6's
# business, so
# here we *set* the weights by hand to give four heads four different
# jobs, and then look at what they attend to.
#
# Each token's input vector is two one-hot codes: its position in
# dimensions 0-7 and its word in dimensions 8-15 (the other 16 dimensions
# stay zero). With $d_{\text{model}} = 32$ and $h = 4$, each head has
# $d_k = 8$ dimensions, enough to hold either code.

# %%
words = "the cat sat on the mat".split()
vocab = sorted(set(words))
L, d_model_toy, h_toy = len(words), 32, 4
d_k_toy = d_model_toy // h_toy
POS, WORD = 0, 8  # where the position and word codes start in a vector

x_toy = torch.zeros(1, L, d_model_toy)  # (B, L, C) with B = 1
for i, word in enumerate(words):
    x_toy[0, i, POS + i] = 1.0
    x_toy[0, i, WORD + vocab.index(word)] = 1.0
print("vocabulary:", vocab)

# %% [markdown]
# A head's query and key projections decide *which* keys match a query:
# the score is large when the projected query and key point the same
# way. Four small building blocks, each (D, C) or (D, D):
# `read_pos` and `read_word` copy a code into the head's 8 dimensions,
# `prev` turns "position $p$" into "position $p-1$", and `first` turns
# any position into "position 0". The four heads:
#
# | head | query asks for | key offers | so each word attends to |
# |---|---|---|---|
# | same word | its word | its word | every occurrence of itself |
# | previous | position $p-1$ | its position | the word before it |
# | next | position $p+1$ | its position | the word after it |
# | first | position 0 | its position | the first word |
#
# Every head's values copy the word code, so a head's output is the word
# (or the mixture of words) it attended to. The factor `beta` makes a
# match score 8 after division by $\sqrt{d_k}$, which turns the softmax
# into an almost hard choice.

# %%
read_pos = torch.eye(d_k_toy, d_model_toy).roll(POS, dims=1)  # (D, C)
read_word = torch.eye(d_k_toy, d_model_toy).roll(WORD, dims=1)  # (D, C)
prev = torch.eye(d_k_toy).roll(1, dims=1)  # (D, D): e_p -> e_{p-1}
first = torch.zeros(d_k_toy, d_k_toy)
first[0] = 1.0  # (D, D): any e_p -> e_0
beta = 8 * math.sqrt(d_k_toy)

head_names = ["same word", "previous", "next", "first"]
w_q = [read_word, prev @ read_pos, prev.T @ read_pos, first @ read_pos]
w_k = [read_word, read_pos, read_pos, read_pos]
w_v = [read_word] * h_toy

toy = MultiHeadAttention(d_model_toy, h_toy, dropout=0.0, bias=False)
with torch.no_grad():
    toy.w_q.weight.copy_(beta * torch.cat(w_q))  # (C, C): heads stacked
    toy.w_k.weight.copy_(torch.cat(w_k))
    toy.w_v.weight.copy_(torch.cat(w_v))
    toy.w_o.weight.copy_(torch.eye(d_model_toy))
toy = toy.to(device).eval()
x_toy = x_toy.to(device)

# %% [markdown]
# To draw the weights we need the module to hand them over. Keeping the
# (B, H, Lq, Lk) weight tensor of every forward pass would hold memory
# that nobody asked for (in a long training run, for every layer), so
# `MultiHeadAttention` keeps them only when asked: set `keep_weights =
# True` and the next forward pass stores a detached copy in `weights`.
# By default `weights` stays `None`.

# %%
toy(x_toy, x_toy, x_toy)
print("weights by default:", toy.weights)
toy.keep_weights = True
out_toy = toy(x_toy, x_toy, x_toy)  # (1, L, C)
print("weights when asked:", tuple(toy.weights.shape), "(B, H, Lq, Lk)")

# %% tags=["remove-cell"]
fresh = MultiHeadAttention(d_model_toy, h_toy)
assert fresh.keep_weights is False and fresh.weights is None
fresh(x_toy.cpu(), x_toy.cpu(), x_toy.cpu())
assert fresh.weights is None
assert toy.weights.shape == (1, h_toy, L, L)
assert not toy.weights.requires_grad

# %% [markdown]
# One heatmap per head, rows are queries and columns keys. Hover over a
# cell to read its weight.

# %%
heads_chart(
    toy.weights[0],
    words,
    words,
    head_names=head_names,
    title="Four hand-built heads on 'the cat sat on the mat'",
)

# %% [markdown]
# Each head draws its own pattern, computed in the same pass. "Same word"
# splits the weight of both *the*s evenly between them. "Previous" and
# "next" are diagonals shifted by one. Their edge rows show what a head
# does when nothing matches: the first word has no predecessor (and the
# last no successor), every score is zero, and the softmax spreads the
# weight evenly. "First" sends every query to position 0.
#
# Because the values carry word codes, each head's slice of the output is
# the word it found, and the four slices sit side by side in the
# concatenation (here $W^O$ is the identity, so nothing mixes them):

# %%
per_head = out_toy[0].view(L, h_toy, d_k_toy)[..., : len(vocab)]  # (L,H,V)
found = per_head.argmax(dim=-1)  # (L, H)
pd.DataFrame(
    [[vocab[j] for j in row] for row in found.tolist()],
    index=pd.Index(words, name="query"),
    columns=head_names,
)

# %% tags=["remove-cell"]
w_toy = toy.weights[0].cpu()  # (H, L, L)
the = [i for i, w in enumerate(words) if w == "the"]
for i, word in enumerate(words):
    same = [j for j, w in enumerate(words) if w == word]
    assert torch.allclose(w_toy[0, i, same].sum(), torch.tensor(1.0),
                          atol=2e-3)
    if i > 0:
        assert w_toy[1, i].argmax() == i - 1 and w_toy[1, i, i - 1] > 0.99
    if i < L - 1:
        assert w_toy[2, i].argmax() == i + 1 and w_toy[2, i, i + 1] > 0.99
    assert w_toy[3, i, 0] > 0.99
torch.testing.assert_close(w_toy[0, 0, the], torch.tensor([0.5, 0.5]),
                           atol=2e-3, rtol=0)
# the unmatched edge rows are uniform
torch.testing.assert_close(w_toy[1, 0], torch.full((L,), 1 / L))
torch.testing.assert_close(w_toy[2, L - 1], torch.full((L,), 1 / L))
assert [vocab[j] for j in found[1:, 1].tolist()] == words[:-1]
assert [vocab[j] for j in found[:-1, 2].tolist()] == words[1:]
assert all(vocab[j] == "the" for j in found[:, 3].tolist())

# %% [markdown]
# (The first row of "previous" and the last row of "next" read *the* only
# because the uniform mixture contains *the* twice.) Real heads are far
# less tidy than these, and many are redundant, but the mechanism is the
# one shown here: every head chooses its keys with its own slice of $W^Q$
# and $W^K$.
#
# ## Equal to PyTorch's `nn.MultiheadAttention`
#
# PyTorch ships the same block as `nn.MultiheadAttention`. It stores the
# three input projections differently: not as three `nn.Linear`, but as
# one packed parameter `in_proj_weight` of shape (3C, C), the rows of
# $W^Q$, then $W^K$, then $W^V$, with one packed bias of length 3C. Only
# the output projection is a separate `nn.Linear`, `out_proj`. Packing
# lets self-attention compute $Q$, $K$ and $V$ with one matrix product.

# %%
torch_mha = nn.MultiheadAttention(
    d_model, h, dropout=0.0, batch_first=True
)
for name, p in torch_mha.named_parameters():
    print(f"{name:<16} {tuple(p.shape)}")

# %% [markdown]
# Loading those weights into ours means cutting the packed matrix into
# three (C, C) blocks along its rows. That is all `from_torch_mha` does
# (besides refusing the few `nn.MultiheadAttention` options our module
# does not have):

# %%
print(inspect.getsource(from_torch_mha))
print(inspect.getsource(transformer_lite.interop._load_mha))

# %%
ours = from_torch_mha(torch_mha)
w_q_torch, w_k_torch, w_v_torch = torch_mha.in_proj_weight.chunk(3)
print("W^Q block equals ours.w_q.weight:",
      torch.equal(w_q_torch, ours.w_q.weight))

# %% tags=["remove-cell"]
for mine, theirs in zip(
    (ours.w_q, ours.w_k, ours.w_v),
    torch_mha.in_proj_weight.chunk(3),
    strict=True,
):
    assert torch.equal(mine.weight, theirs)
for mine, theirs in zip(
    (ours.w_q, ours.w_k, ours.w_v),
    torch_mha.in_proj_bias.chunk(3),
    strict=True,
):
    assert torch.equal(mine.bias, theirs)
assert torch.equal(ours.w_o.weight, torch_mha.out_proj.weight)
assert torch.equal(ours.w_o.bias, torch_mha.out_proj.bias)

# %% [markdown]
# Now the two modules must compute the same function, and the same
# gradients. We compare them in float64, where rounding errors are near
# $10^{-16}$ relative, so anything that differs by more than about
# $10^{-12}$ would be a real difference, not noise. Both modules are
# created in the default float32, the weights copied, and then both are
# moved to float64 with `.double()`: the copies are exact, and every
# later operation runs in double precision. (Apple's MPS has no float64,
# so there these checks run on the CPU.)
#
# One more difference to bridge: the masks. Ours say True = *may attend*;
# `nn.MultiheadAttention` takes `attn_mask` (Lq, Lk) and
# `key_padding_mask` (B, Lk) where True = *masked out*. The flip lives in
# one function, `to_torch_attn_mask` ([chapter 2](02_masks)).

# %%
exact = device if device.type != "mps" else torch.device("cpu")
torch_mha = torch_mha.double().to(exact).eval()
ours = ours.double().to(exact).eval()


def compare(query, key, value, mask, **torch_masks):
    """Largest output and gradient differences, ours vs PyTorch's."""
    inputs = [t.detach().clone().requires_grad_() for t in (query, key,
                                                            value)]
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    y_ours = ours(*inputs, mask)  # (B, Lq, C)
    y_torch, _ = torch_mha(*twins, need_weights=False, **torch_masks)
    grad_out = torch.randn_like(y_ours)
    ours.zero_grad()
    torch_mha.zero_grad()
    (y_ours * grad_out).sum().backward()
    (y_torch * grad_out).sum().backward()
    w_qkv = (ours.w_q, ours.w_k, ours.w_v)
    pairs = [
        (y_ours, y_torch),
        (torch.cat([w.weight.grad for w in w_qkv]),  # (3C, C)
         torch_mha.in_proj_weight.grad),
        (torch.cat([w.bias.grad for w in w_qkv]),  # (3C,)
         torch_mha.in_proj_bias.grad),
        (ours.w_o.weight.grad, torch_mha.out_proj.weight.grad),
        (ours.w_o.bias.grad, torch_mha.out_proj.bias.grad),
    ]
    pairs += list(zip([t.grad for t in inputs], [t.grad for t in twins],
                      strict=True))
    return {
        "output": (y_ours - y_torch).abs().max().item(),
        "gradients": max((a - b).abs().max().item() for a, b in pairs[1:]),
    }


# %% [markdown]
# **Self-attention in a decoder**: a batch of two target sequences of
# length $T = 6$, the second one padded at the end, under the causal mask
# and the padding mask at once. In our convention that is one (B, T, T)
# `target_mask`; PyTorch takes the causal part as `attn_mask` and the
# padding as `key_padding_mask`.

# %%
T, S = 6, 9
tgt = torch.randint(1, 10, (B, T), device=exact)  # (B, T) token ids
tgt[1, -2:] = PAD_ID
x_tgt = torch.randn(B, T, d_model, device=exact, dtype=torch.float64)

mask_self = target_mask(tgt, PAD_ID)  # (B, T, T), True = may attend
torch_causal = to_torch_attn_mask(causal_mask(T, exact)[0])  # (T, T)
torch_padding = to_torch_attn_mask(padding_mask(tgt, PAD_ID)[:, 0])
diff_self = compare(x_tgt, x_tgt, x_tgt, mask_self,
                    attn_mask=torch_causal, key_padding_mask=torch_padding)
print({name: f"{value:.1e}" for name, value in diff_self.items()})

# %% [markdown]
# **Cross-attention**: the same six target positions now query a source
# of length $S = 9$ (so $L_q \ne L_k$), whose second sequence has four
# padding tokens.

# %%
src = torch.randint(1, 10, (B, S), device=exact)  # (B, S) token ids
src[1, -4:] = PAD_ID
x_src = torch.randn(B, S, d_model, device=exact, dtype=torch.float64)

mask_cross = padding_mask(src, PAD_ID)  # (B, 1, S)
diff_cross = compare(
    x_tgt, x_src, x_src, mask_cross,
    key_padding_mask=to_torch_attn_mask(mask_cross[:, 0]),  # (B, S)
)
print({name: f"{value:.1e}" for name, value in diff_cross.items()})

# %% tags=["remove-cell"]
for diffs in (diff_self, diff_cross):
    assert diffs["output"] < 1e-12 and diffs["gradients"] < 1e-12, diffs
# the masks are honoured: without them both sides change
no_mask = compare(x_tgt, x_src, x_src, None)
assert no_mask["output"] < 1e-12
assert not torch.allclose(ours(x_tgt, x_src, x_src),
                          ours(x_tgt, x_src, x_src, mask_cross))
# a mismatch would be visible: a mask the torch side does not get
wrong = compare(x_tgt, x_tgt, x_tgt, mask_self, attn_mask=torch_causal)
assert wrong["output"] > 1e-3, wrong

# %% [markdown]
# Outputs and all gradients (weights and biases of the input and output
# projections, and the three inputs) agree to within $10^{-12}$, in fact
# to a few times $10^{-16}$ to $10^{-15}$ in the runs above: our readable
# lines and PyTorch's packed implementation are the same function.
#
# ## The fused path
#
# Chapter 1's function builds the full (B, H, Lq, Lk) weight tensor in
# memory. PyTorch's `F.scaled_dot_product_attention` computes the same
# result with fused kernels that never store it; which one runs depends
# on the device, the dtype and the mask (chapter 8 has the table).
# `MultiHeadAttention(kernel="fused")` switches to it; chapter 8
# measures what it buys, and adds a third kernel, `"chunked"`.
# Here we only check that it computes the same thing, in float64 and with
# the causal-and-padding mask from above.
#
# Which kernel does that check exercise? Not FlashAttention: the CUDA
# flash kernel takes 16-bit inputs only, and no mask. On the CPU, the
# float64 call runs PyTorch's fused C++ kernel for the CPU,
# `_scaled_dot_product_flash_attention_for_cpu`. It is what
# `torch.nn.attention.sdpa_kernel` calls the `FLASH_ATTENTION` backend
# on a CPU, it accepts float64 and a mask, and it is the kernel
# PyTorch picks here (a hidden cell checks this with the profiler). On
# a CUDA GPU no fused kernel takes float64, so there the same check
# runs PyTorch's `MATH` backend, the formula in ordinary operations.

# %%
plain = MultiHeadAttention(d_model, h, dropout=0.0)
fused = MultiHeadAttention(d_model, h, dropout=0.0, kernel="fused")
fused.load_state_dict(plain.state_dict())
plain = plain.double().to(exact).eval()
fused = fused.double().to(exact).eval()

y_plain = plain(x_tgt, x_tgt, x_tgt, mask_self)  # (B, T, C)
y_fused = fused(x_tgt, x_tgt, x_tgt, mask_self)  # (B, T, C)
print(f"fused vs hand-written: {(y_fused - y_plain).abs().max():.1e}")

# %% tags=["remove-cell"]
torch.testing.assert_close(y_fused, y_plain, rtol=0, atol=1e-12)
assert fused.weights is None


# The kernel that ran, from the profiler: the fused CPU kernel on a CPU
# (which the FLASH_ATTENTION backend alone accepts in float64, as does
# MATH alone), MATH on CUDA, where no fused kernel takes float64.
def _attention_ops(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sorted({e.key for e in prof.key_averages()
                   if "attention" in e.key and e.key != (
                       "aten::scaled_dot_product_attention")})


_CPU_FUSED = "aten::_scaled_dot_product_flash_attention_for_cpu"
_MATH = "aten::_scaled_dot_product_attention_math"
_ran = _attention_ops(lambda: fused(x_tgt, x_tgt, x_tgt, mask_self))
if exact.type == "cpu":
    assert _ran == [_CPU_FUSED], _ran
    for _backend, _op in ((SDPBackend.FLASH_ATTENTION, _CPU_FUSED),
                          (SDPBackend.MATH, _MATH)):
        with sdpa_kernel(_backend):
            _y = fused(x_tgt, x_tgt, x_tgt, mask_self)
            _only = _attention_ops(
                lambda: fused(x_tgt, x_tgt, x_tgt, mask_self))
        assert _only == [_op], (_backend, _only)
        torch.testing.assert_close(_y, y_plain, rtol=0, atol=1e-12)
elif exact.type == "cuda":
    assert _ran == [_MATH], _ran

# %% [markdown]
# A fused kernel never forms the weights, so there is nothing to keep:
# with `keep_weights = True` the module takes the hand-written kernel
# for that pass, and the weights are there to draw. The module says
# which kernel it will not run, and why, in `why_not_fused` (empty when
# the fused kernel runs), as `nn.MultiheadAttention` explains when it
# leaves its fast path.

# %%
print("why not fused:", repr(fused.why_not_fused))
fused.keep_weights = True
fused(x_tgt, x_tgt, x_tgt, mask_self)
print("fused module, keep_weights=True:", tuple(fused.weights.shape))
print("why not fused:", repr(fused.why_not_fused))

# %% tags=["remove-cell"]
assert fused.weights.shape == (B, h, T, T)
assert "keep_weights" in fused.why_not_fused
# causal: no weight on the future; padding: none on padded keys
assert (fused.weights.triu(diagonal=1) == 0).all()
assert (fused.weights[1, :, :, -2:] == 0).all()

# %% [markdown]
# ## Errors that explain themselves
#
# The heads must split the width evenly, so $d_{\text{model}}$ has to be a
# multiple of $h$. Asking for 6 heads of a 512-wide model fails at once,
# with a message that names both numbers, instead of a cryptic `view`
# error deep inside the first forward pass:

# %%
try:
    MultiHeadAttention(d_model=512, n_heads=6)
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# Inputs of the wrong width are caught the same way:

# %%
try:
    mha(torch.randn(2, 5, 256, device=device), x_kv, x_kv)
except ValueError as err:
    print("ValueError:", err)

# %% tags=["remove-cell"]
try:
    MultiHeadAttention(d_model=512, n_heads=6)
except ValueError as err:
    assert "512" in str(err) and "6" in str(err)
else:
    raise AssertionError("expected a ValueError")
try:
    mha(torch.randn(2, 5, 256, device=device), x_kv, x_kv)
except ValueError as err:
    assert "256" in str(err) and "512" in str(err)
else:
    raise AssertionError("expected a ValueError")

# %% [markdown]
# ## Summary
#
# * Multi-head attention runs $h$ attentions in parallel, each in its own
#   $d_k = d_{\text{model}}/h$ dimensional subspace, concatenates them and
#   mixes them with $W^O$. Each head forms its own distribution over the
#   keys, so one layer can follow several relations at once.
# * Splitting into heads is a `view` and a `transpose`, (B, L, C) to
#   (B, H, L, D); merging is a `transpose` and a `reshape` back. Rows
#   $iD \dots (i+1)D-1$ of the big projection's `weight` (stored by
#   `nn.Linear` as (out, in)) are head $i$'s $W_i$, transposed.
# * The matrix products and the size do not depend on $h$: the FLOPs
#   are $4B(L_q + L_k)d_{\text{model}}^2 + 4BL_qL_kd_{\text{model}}$
#   ($8BLd_{\text{model}}^2 + 4BL^2d_{\text{model}}$ in self-attention)
#   and the parameters $4(d_{\text{model}}^2 + d_{\text{model}})$,
#   1,050,624 in the base model. The (B, H, Lq, Lk) scores, their
#   masking and softmax do grow with $h$.
# * `keep_weights = True` stores the last (B, H, Lq, Lk) weights for
#   pictures; by default nothing is kept.
# * `from_torch_mha` cuts PyTorch's packed `in_proj_weight` (3C, C) into
#   $W^Q, W^K, W^V$; ours then equals `nn.MultiheadAttention` to within
#   $10^{-12}$ in float64, forward and backward, with causal, padding and
#   cross-attention masks (flipped by `to_torch_attn_mask`).
# * `kernel="fused"` calls `F.scaled_dot_product_attention` and gives the
#   same result; chapter 8 measures it. Every kernel sits behind one
#   function, `attend`.
#
# ## Exercises
#
# 1. **The formula, literally.** Write `LoopMHA`, which holds `h`
#    separate `nn.Linear(d_model, d_k)` for each of $W^Q_i$, $W^K_i$,
#    $W^V_i$ (use `nn.ModuleList`) and one `nn.Linear(d_model, d_model)`
#    for $W^O$, and whose `forward` loops over the heads and concatenates.
#    Fill it from a `MultiHeadAttention` with `head_slice` above and
#    assert both give the same output. Then time both at $h = 64$: which
#    is slower, and why?
# 2. **Heads can be shuffled.** Pick a permutation `perm` of the heads.
#    In the paper's notation ($xW$) head $i$ owns a *column* block of
#    $W^Q$, $W^K$, $W^V$ and a *row* block of $W^O$; `nn.Linear` stores
#    the transpose, so in code reorder the row blocks of `w_q.weight`,
#    `w_k.weight`, `w_v.weight` (and their biases) and the *column*
#    blocks of `w_o.weight` the same way, and show that the output does
#    not change. Why must $W^O$'s blocks move along the other axis?
#    What does this say about the meaning of "head 3" in a trained model?
# 3. **A fifth job.** Give the toy a head that makes every word attend to
#    the word *two* places back. You will need $h = 5$, so choose a
#    `d_model_toy` that 5 divides and whose head size still holds the
#    6 positions (40 keeps $d_k = 8$). Draw it with
#    `heads_chart` and assert the shifted diagonal. What do the first two
#    rows look like, and why?

# %% [markdown]
# ## Graded exercises
#
# Eight exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then
# open them. The classroom edition (the teaching page) hands out the
# same exercises with the solutions removed, and nbgrader scores them.
# The module `mha` below is the reference most checks compare with:
# $C = 12$ and $H = 3$ heads of $D = 4$, in float64.

# %% tags=["exercise-setup"]
import copy

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from transformer_lite import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
    expect_tensor,
)
from transformer_lite.masks import to_torch_attn_mask

gen = torch.Generator().manual_seed(3)
torch.manual_seed(3)  # the initial weights of the modules below
B, Lq, Lk, C, H = 2, 3, 5, 12, 3
D = C // H
mha = MultiHeadAttention(C, H, dropout=0.0).double().eval()
x_q = torch.randn(B, Lq, C, generator=gen, dtype=torch.float64)
x_kv = torch.randn(B, Lk, C, generator=gen, dtype=torch.float64)
# the second sequence of keys ends in two padding tokens (id 0)
tokens = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 0, 0]])
key_mask = padding_mask(tokens, 0)  # (B, 1, Lk), True = may attend
# PyTorch's module, whose weights exercise 3.5 loads
torch_mha = nn.MultiheadAttention(C, H, dropout=0.0, batch_first=True)
torch_mha = torch_mha.double().eval()
perm = [2, 0, 1]  # a new order of the three heads, for exercise 3.6

# %% [markdown]
# ### Exercise 3.1: split into heads (1 point)
#
# Write `split_heads(x, H)`: reshape a projection of shape $(B, L, C)$
# into $(B, H, L, D)$ with $D = C / H$, so that head $i$ holds columns
# $iD, \dots, (i+1)D - 1$ of every position.

# %% tags=["solution", "hide-input"]
def split_heads(x, H):
    ### BEGIN SOLUTION
    B, L, C = x.shape
    x = x.view(B, L, H, C // H)  # (B, L, H, D)
    return x.transpose(1, 2)  # (B, H, L, D)
    ### END SOLUTION


# %% tags=["check"]
with exercise("3.1", twins=[MultiHeadAttention.split_heads]):
    got = split_heads(x_kv, H)
    expect_tensor("split_heads(x_kv, H)", got, shape=(B, H, Lk, D),
                  hint="the result is (B, H, L, D): heads before "
                  "positions")  # fmt: skip
    expect_close("split_heads(x_kv, H)", got, mha.split_heads(x_kv),
                 hint="view as (B, L, H, D) first, then swap the head and "
                 "position axes with transpose(1, 2); a direct view to "
                 "(B, H, L, D) mixes positions into heads")  # fmt: skip

# %% [markdown]
# ### Exercise 3.2: merge the heads (1 point)
#
# Write `merge_heads(x)`, the inverse of `split_heads`: from
# $(B, H, L, D)$ back to $(B, L, C)$ with $C = HD$, the heads
# concatenated along the last axis in order.

# %% tags=["solution", "hide-input"]
def merge_heads(x):
    ### BEGIN SOLUTION
    B, H, L, D = x.shape
    x = x.transpose(1, 2)  # (B, L, H, D)
    return x.reshape(B, L, H * D)  # (B, L, C)
    ### END SOLUTION


# %% tags=["check"]
heads = torch.randn(B, H, Lq, D, generator=gen, dtype=torch.float64)
with exercise("3.2", twins=[MultiHeadAttention.merge_heads]):
    expect_close("merge_heads(heads)", merge_heads(heads),
                 mha.merge_heads(heads),
                 hint="transpose(1, 2) back to (B, L, H, D), then reshape "
                 "to (B, L, C); view refuses the transposed "
                 "tensor")  # fmt: skip
    # the package splits, so that this check is about merging only
    expect_close("merge_heads(mha.split_heads(x_kv))",
                 merge_heads(mha.split_heads(x_kv)), x_kv,
                 hint="merging must undo splitting exactly")  # fmt: skip

# %% [markdown]
# ### Exercise 3.3: multi-head attention (2 points)
#
# Write `multi_head_attention(mha, query, key, value, mask=None)`, the
# forward pass of the module `mha` spelled out: project with its
# `w_q`, `w_k`, `w_v`, split into `mha.h` heads, attend with chapter 1's
# `scaled_dot_product_attention`, merge, and project with `w_o`. The
# inputs are $(B, L_q, C)$ and $(B, L_k, C)$, the output
# $(B, L_q, C)$. A mask of shape $(B, L_q, L_k)$ or $(B, 1, L_k)$ is
# shared by all heads.

# %% tags=["solution", "hide-input"]
def multi_head_attention(mha, query, key, value, mask=None):
    ### BEGIN SOLUTION
    q = split_heads(mha.w_q(query), mha.h)  # (B, H, Lq, D)
    k = split_heads(mha.w_k(key), mha.h)  # (B, H, Lk, D)
    v = split_heads(mha.w_v(value), mha.h)  # (B, H, Lk, D)
    if mask is not None:
        mask = mask.unsqueeze(1)  # (B, 1, Lq or 1, Lk)
    x, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, Lq, D)
    return mha.w_o(merge_heads(x))  # (B, Lq, C)
    ### END SOLUTION


# %% tags=["check"]
import torch.nn.functional as F

with exercise("3.3", after=["3.1", "3.2"], twins=[
        MultiHeadAttention.forward, F.multi_head_attention_forward]):
    expect_close("multi_head_attention(mha, x_q, x_kv, x_kv)",
                 multi_head_attention(mha, x_q, x_kv, x_kv),
                 mha(x_q, x_kv, x_kv),
                 hint="queries come from `query`, keys and values from "
                 "`key` and `value`; apply w_o after merging the "
                 "heads")  # fmt: skip

# %% tags=["check"]
with exercise("3.3", after=["3.1", "3.2"], twins=[
        MultiHeadAttention.forward, F.multi_head_attention_forward]):
    expect_close("multi_head_attention(mha, x_q, x_kv, x_kv, key_mask)",
                 multi_head_attention(mha, x_q, x_kv, x_kv, key_mask),
                 mha(x_q, x_kv, x_kv, key_mask),
                 hint="give the (B, 1, Lk) mask a head axis, "
                 "mask.unsqueeze(1), so that it broadcasts over "
                 "(B, H, Lq, Lk)")  # fmt: skip

# %% [markdown]
# ### Exercise 3.4: what the heads cost (2 points)
#
# Write `mha_parameters(C, bias=True)`, the number of parameters of a
# multi-head attention block of width $C$ (four $C \times C$
# projections, each with a bias of $C$ when `bias`), and
# `mha_flops(B, Lq, Lk, C)`, the floating-point operations of its
# matrix products in one forward pass: the four projections ($W^Q$
# and $W^O$ act on the $L_q$ queries, $W^K$ and $W^V$ on the $L_k$
# keys) and the two products of attention, $QK^\top$ and the weights
# times $V$. A multiply-add counts as 2 FLOPs. Neither number depends
# on $H$: the checks count them on modules with different numbers of
# heads. Count from the sizes alone: do not build a module.

# %% tags=["solution", "hide-input"]
def mha_parameters(C, bias=True):
    ### BEGIN SOLUTION
    return 4 * (C * C + (C if bias else 0))
    ### END SOLUTION


def mha_flops(B, Lq, Lk, C):
    ### BEGIN SOLUTION
    projections = 2 * 2 * B * (Lq + Lk) * C * C
    attention = 2 * 2 * B * Lq * Lk * C
    return projections + attention
    ### END SOLUTION


# %% tags=["check"]
with exercise("3.4", twins=[MultiHeadAttention.__init__]):
    for width, n_heads, bias in ((12, 3, True), (64, 8, True),
                                 (64, 1, False)):  # fmt: skip
        module = MultiHeadAttention(width, n_heads, bias=bias)
        want = sum(p.numel() for p in module.parameters())
        expect_equal(f"mha_parameters({width}, bias={bias})",
                     mha_parameters(width, bias), want,
                     hint="four C x C weights, plus four biases of length "
                     "C when bias is True; H does not appear")  # fmt: skip
    expect_equal("mha_parameters(512)", mha_parameters(512),
                 sum(p.numel() for p in nn.MultiheadAttention(512, 8)
                     .parameters()),
                 hint="PyTorch's packed module has the same four "
                 "projections")  # fmt: skip


# %% tags=["check"]
def counted_flops(B, Lq, Lk, C, n_heads):
    """FLOPs of one forward pass, counted by PyTorch."""
    module = MultiHeadAttention(C, n_heads, dropout=0.0)
    query, kv = torch.randn(B, Lq, C), torch.randn(B, Lk, C)
    with FlopCounterMode(display=False) as counter:
        module(query, kv, kv)
    return counter.get_total_flops()


shapes = (((2, 5, 5, 16), 4), ((3, 2, 7, 24), 6), ((3, 2, 7, 24), 1))
counted = [counted_flops(*shape, n_heads) for shape, n_heads in shapes]
with exercise("3.4", twins=[MultiHeadAttention.__init__]):
    for (shape, _), want in zip(shapes, counted, strict=True):
        expect_equal(f"mha_flops{shape}", mha_flops(*shape), want,
                     hint="W^Q and W^O see Lq positions, W^K and W^V see "
                     "Lk; Q K^T and weights @ V cost B Lq Lk C "
                     "multiply-adds each; a multiply-add is 2 "
                     "FLOPs")  # fmt: skip

# %% [markdown]
# ### Exercise 3.5: weights from PyTorch (2 points)
#
# `nn.MultiheadAttention` packs $W^Q$, $W^K$, $W^V$ into one
# `in_proj_weight` of shape $(3C, C)$ (their rows, in that order) and
# their biases into one `in_proj_bias` of length $3C$; `out_proj` is
# an `nn.Linear` like our `w_o`. Write `load_torch_mha(ours, theirs)`,
# which copies the weights of `theirs` into our `MultiHeadAttention`
# `ours` in place (under `torch.no_grad()`) and returns `ours`. The
# checks load `torch_mha`; the second compares the two modules on a
# causal self-attention (PyTorch reads a bool mask as True = masked
# out).

# %% tags=["solution", "hide-input"]
def load_torch_mha(ours, theirs):
    ### BEGIN SOLUTION
    weights = theirs.in_proj_weight.chunk(3, dim=0)  # 3 x (C, C)
    biases = theirs.in_proj_bias.chunk(3)  # 3 x (C,)
    with torch.no_grad():
        for linear, w, b in zip((ours.w_q, ours.w_k, ours.w_v), weights,
                                biases, strict=True):  # fmt: skip
            linear.weight.copy_(w)
            linear.bias.copy_(b)
        ours.w_o.weight.copy_(theirs.out_proj.weight)
        ours.w_o.bias.copy_(theirs.out_proj.bias)
    return ours
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.interop import _load_mha, from_torch_mha

reference = from_torch_mha(torch_mha)  # the package's loader
fresh = MultiHeadAttention(C, H, dropout=0.0).double()
with exercise("3.5", twins=[from_torch_mha, _load_mha]):
    ours = load_torch_mha(fresh, torch_mha).eval()
    for name in "qkv":
        expect_close(f"ours.w_{name}.weight",
                     getattr(ours, f"w_{name}").weight,
                     getattr(reference, f"w_{name}").weight,
                     hint="in_proj_weight holds W^Q, W^K, W^V one below "
                     "the other: cut it into three (C, C) blocks along "
                     "dim 0")  # fmt: skip

# %% tags=["check"]
fresh = MultiHeadAttention(C, H, dropout=0.0).double()
x = torch.randn(B, Lk, C, generator=gen, dtype=torch.float64)  # (B, L, C)
tril = causal_mask(Lk)[0]  # (L, L), True = may attend
want, _ = torch_mha(x, x, x, attn_mask=to_torch_attn_mask(tril))
with exercise("3.5", twins=[from_torch_mha, _load_mha]):
    ours = load_torch_mha(fresh, torch_mha).eval()
    expect_close("ours(x, x, x, tril)", ours(x, x, x, tril),
                 want.detach(),
                 hint="copy the biases too (in_proj_bias in three "
                 "pieces, then out_proj.bias), and out_proj.weight into "
                 "w_o")  # fmt: skip

# %% [markdown]
# ### Exercise 3.6: the heads can be shuffled (2 points)
#
# The heads of a layer have no order: renumber them, and the layer
# computes the same function. Write `shuffle_heads(mha, perm)`, which
# returns a *new* module (leave `mha` as it is: `copy.deepcopy`) whose
# head $i$ is head `perm[i]` of `mha`. In `nn.Linear`'s (out, in)
# layout head $i$ owns rows $iD, \dots, (i+1)D - 1$ of `w_q.weight`,
# `w_k.weight`, `w_v.weight` and of their biases, and the same
# *columns* of `w_o.weight`, which reads the concatenated heads. The
# first check confirms that the weights moved and the output did not;
# the second that each head went where `perm` sends it.

# %% tags=["solution", "hide-input"]
def shuffle_heads(mha, perm):
    ### BEGIN SOLUTION
    D = mha.d_k
    rows = torch.cat([torch.arange(p * D, (p + 1) * D) for p in perm])
    new = copy.deepcopy(mha)
    with torch.no_grad():
        for linear in (new.w_q, new.w_k, new.w_v):
            linear.weight.copy_(linear.weight[rows])  # (C, C)
            linear.bias.copy_(linear.bias[rows])  # (C,)
        new.w_o.weight.copy_(new.w_o.weight[:, rows])  # (C, C)
    return new
    ### END SOLUTION


# %% tags=["check"]
with exercise("3.6"):
    shuffled = shuffle_heads(mha, perm)
    expect(not torch.equal(shuffled.w_q.weight, mha.w_q.weight),
           "shuffle_heads(mha, perm) left the rows of w_q.weight where "
           "they were",
           hint="move the row blocks of w_q, w_k, w_v (and the column "
           "blocks of w_o) of the copy")  # fmt: skip
    expect_close("shuffle_heads(mha, perm)(x_kv, x_kv, x_kv, key_mask)",
                 shuffled(x_kv, x_kv, x_kv, key_mask),
                 mha(x_kv, x_kv, x_kv, key_mask),
                 hint="w_o reads the concatenated heads: move the column "
                 "blocks of w_o.weight the same way as the row blocks of "
                 "w_q, w_k, w_v; w_o's bias stays")  # fmt: skip

# %% tags=["check"]
with exercise("3.6"):
    shuffled = shuffle_heads(mha, perm)
    q_new = shuffled.split_heads(shuffled.w_q(x_kv))  # (B, H, Lk, D)
    q_old = mha.split_heads(mha.w_q(x_kv))  # (B, H, Lk, D)
    expect_close("shuffled.split_heads(shuffled.w_q(x_kv))", q_new,
                 q_old[:, perm],
                 hint="head i of the new module is head perm[i] of mha: "
                 "its rows are perm[i] * D to (perm[i] + 1) * D - 1; and "
                 "do not change mha itself")  # fmt: skip
    expect(shuffled is not mha
           and shuffled.w_q.weight is not mha.w_q.weight,
           "shuffle_heads should return a new module",
           hint="copy.deepcopy(mha), then reorder the copy's "
           "weights")  # fmt: skip

# %% [markdown]
# ### Exercise 3.7: predict, then run (1 point)
#
# Decide before you run the cell below it. Exercise 3.4 showed that
# the parameters and the FLOPs of the matrix products do not depend on
# the number of heads. Now take a self-attention block of width
# $C = 64$ on one sequence of $L = 128$ positions, and go from $H = 1$
# head of $D = 64$ to $H = 8$ heads of $D = 8$. How many attention
# weights does the block form (the (B, H, L, L) tensor it keeps with
# `keep_weights = True`)? Set `prediction` to one of the strings
# `"an eighth"`, `"the same"` or `"8 times as many"`; then run the
# experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "8 times as many"
### END SOLUTION

# %% [markdown]
# The experiment: the same input through a block of one head and a
# block of eight, counting parameters, FLOPs and weights.

# %%
x_long = torch.randn(1, 128, 64, generator=gen)  # (B, L, C)
cost = {}
for n_heads in (1, 8):
    block = MultiHeadAttention(64, n_heads, dropout=0.0)
    block.keep_weights = True
    with FlopCounterMode(display=False) as counter:
        block(x_long, x_long, x_long)
    cost[n_heads] = (sum(p.numel() for p in block.parameters()),
                     counter.get_total_flops(),
                     block.weights.numel())  # fmt: skip
print("  H  parameters      FLOPs   weights")
for n_heads, (n_p, n_f, n_w) in cost.items():
    print(f"{n_heads:3d} {n_p:11,} {n_f:10,} {n_w:9,}")
weights_ratio = cost[8][2] / cost[1][2]
answer = {1 / 8: "an eighth", 1.0: "the same", 8.0: "8 times as many"}
outcome = answer.get(weights_ratio, f"x{weights_ratio:g}")
print("the weights of 8 heads, against one:", outcome)

# %% tags=["check", "hide-input"]
with exercise("3.7", prediction=True):
    expect(prediction in ("an eighth", "the same", "8 times as many"),
           f"prediction is {prediction!r}: choose one of \"an eighth\", "
           f"\"the same\" or \"8 times as many\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(prediction == outcome,
           f"eight heads formed {cost[8][2]:,} weights and one head "
           f"{cost[1][2]:,} ({outcome}), not {prediction!r}",
           hint="the heads split the width C, not the sequence: each "
           "head has its own (L, L) table of weights, however narrow it "
           "is, so the weights (their memory, masking and softmax) grow "
           "with H while the parameters and the products stay "
           "put")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 3.8: rows or columns? (2 points, written)
#
# In the paper's notation ($xW$) head $i$ owns a *column* block of
# $W^Q$, $W^K$ and $W^V$, but a *row* block of $W^O$. In two to four
# sentences: why is head $i$'s part of $W^O$ a block of rows (write
# $\mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O$ as a
# sum over the heads), and where are the two blocks in the `weight` of
# the package's `nn.Linear` layers `w_q` and `w_o`?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# Column $j$ of $xW^Q$ is $x$ times column $j$ of $W^Q$, so the $D$
# features of head $i$, columns $iD, \dots, (i+1)D - 1$ of the
# projection, come from those columns of $W^Q$. $W^O$ works the other
# way round: row $j$ of $W^O$ multiplies feature $j$ of the
# concatenation, and features $iD, \dots, (i+1)D - 1$ are head $i$'s
# output, so $\mathrm{Concat}(\mathrm{head}_1, \dots,
# \mathrm{head}_h)\, W^O = \sum_i \mathrm{head}_i W^O_i$ with $W^O_i$
# the $i$-th block of $D$ rows. `nn.Linear` stores the transpose,
# (out, in), so in code the blocks swap: head $i$ owns rows $iD, \dots,
# (i+1)D - 1$ of `w_q.weight` and the same columns of `w_o.weight`.
#
# *Rubric (2 points).* 1 point: $W^O$'s rows multiply the input
# features of the concatenation, of which head $i$'s are a block, so
# the output is a sum of one product per head ($\sum_i
# \mathrm{head}_i W^O_i$, or the same said in words). 1 point: because
# `nn.Linear` keeps the weight as (out, in), the transpose of the
# paper's matrix, head $i$ is a row block of `w_q.weight` and a column
# block of `w_o.weight`; the indices $iD$ to $(i+1)D - 1$ are not
# needed for the point.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 1
# message: Hint: view as (B, L, H, D) first
# def split_heads(x, H):
#     B, L, C = x.shape
#     return x.view(B, H, L, C // H)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def split_heads(x, H):
#     return MultiHeadAttention(x.size(-1), H).split_heads(x)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def split_heads(x, H):
#     B, L, C = x.shape
#     return torch.zeros(B, H, L, C // H, dtype=x.dtype)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def merge_heads(x):
#     return mha.merge_heads(x)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def merge_heads(x):
#     B, H, L, D = x.shape
#     return torch.zeros(B, L, H * D, dtype=x.dtype)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def multi_head_attention(mha, query, key, value, mask=None):
#     return mha(query, key, value, mask)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def multi_head_attention(mha, query, key, value, mask=None):
#     return query

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: delegate
# def mha_parameters(C, bias=True):
#     module = MultiHeadAttention(C, 1, bias=bias)
#     return sum(p.numel() for p in module.parameters())
#
#
# def mha_flops(B, Lq, Lk, C):
#     module = MultiHeadAttention(C, 1, dropout=0.0)
#     query, kv = torch.randn(B, Lq, C), torch.randn(B, Lk, C)
#     with FlopCounterMode(display=False) as counter:
#         module(query, kv, kv)
#     return counter.get_total_flops()

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def mha_parameters(C, bias=True):
#     return 0
#
#
# def mha_flops(B, Lq, Lk, C):
#     return 0

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def load_torch_mha(ours, theirs):
#     ours.load_state_dict(from_torch_mha(theirs).state_dict())
#     return ours

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def load_torch_mha(ours, theirs):
#     return ours

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def shuffle_heads(mha, perm):
#     return copy.deepcopy(mha)
