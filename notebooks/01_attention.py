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
# # 1. Attention
#
# Everything in the Transformer is arranged around one operation:
# scaled dot-product attention. It lets every position of a sequence
# look at every other position and pull in whatever information it
# finds relevant, in one step, with no recurrence. This chapter takes
# the formula apart, computes it by hand on numbers small enough to
# check on paper, shows why the paper divides by $\sqrt{d_k}$, and
# measures what it costs as sequences grow.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(1)

# %%
import functools
import inspect
import math
import platform
import statistics
import time

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F

import transformer_lite
from transformer_lite import (
    default_device,
    scaled_dot_product_attention,
    seed_everything,
)
from transformer_lite.device import book_seed
from transformer_lite.viz import attention_chart

SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
seed_everything(SEED)
device = default_device()
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"transformer_lite {transformer_lite.__version__}")
print(f"device: {device}, BOOK_SEED={SEED}")

# %% [markdown]
# ## The formula
#
# Attention is older than the Transformer: the translator of
# {cite:t}`bahdanau2015neural` learned to weigh every source word as it
# wrote each word of the target. The paper kept the attention and
# dropped the recurrence around it. {cite:t}`vaswani2017attention`
# define attention for a matrix of queries $Q$,
# keys $K$ and values $V$ as
#
# $$
# \mathrm{Attention}(Q, K, V)
#   = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V .
# $$
#
# The names come from retrieval. A Python `dict` is a hard lookup: a
# query either equals a key exactly and gets that key's value, or gets
# nothing. Attention is a *soft* lookup. A query is compared with every
# key, the dot product $q \cdot k$ serving as the similarity score; the
# softmax turns the scores of one query into weights that are positive
# and sum to one; and the answer is the weighted average of all the
# values. A query that matches one key much better than the others gets
# (almost) that key's value, as a dictionary would; a query halfway
# between two keys gets a blend of their values. Because every step is
# differentiable, a model can *learn* what to ask for and what to
# offer.
#
# The shapes, for $L_q$ queries and $L_k$ key/value pairs:
#
# | matrix | shape | meaning |
# |---|---|---|
# | $Q$ | $(L_q, d_k)$ | one row per position asking a question |
# | $K$ | $(L_k, d_k)$ | one row per position that can be found |
# | $V$ | $(L_k, d_v)$ | what each of those positions hands over |
# | $QK^\top$ | $(L_q, L_k)$ | score of every query against every key |
# | output | $(L_q, d_v)$ | one blended value per query |
#
# Queries and keys must share their width $d_k$ (they are compared by a
# dot product); values may have another width $d_v$, although the
# paper uses $d_k = d_v = 64$. In a real model there are also batch and
# head axes in front, $(B, H, L, D)$, and attention simply treats them
# as a stack of independent problems. Here is the formula line by line,
# with the symbols as names:

# %%
L_q, L_k, d_k, d_v = 3, 4, 8, 5
Q = torch.randn(L_q, d_k)  # (Lq, D)
K = torch.randn(L_k, d_k)  # (Lk, D)
V = torch.randn(L_k, d_v)  # (Lk, Dv)

scores = Q @ K.T / math.sqrt(d_k)  # (Lq, Lk)
weights = scores.softmax(dim=-1)  # (Lq, Lk), each row sums to 1
output = weights @ V  # (Lq, Dv)
print("scores ", tuple(scores.shape))
print("weights", tuple(weights.shape), "row sums", weights.sum(-1))
print("output ", tuple(output.shape))

# %% tags=["remove-cell"]
# Rows are probability distributions; the three lines are the package's
# function (same output, same weights).
assert torch.all(weights > 0)
assert torch.allclose(weights.sum(-1), torch.ones(L_q))
ref_out, ref_w = scaled_dot_product_attention(Q, K, V)
assert torch.allclose(output, ref_out, atol=1e-6)
assert torch.allclose(weights, ref_w, atol=1e-7)
assert output.shape == (L_q, d_v) and weights.shape == (L_q, L_k)

# %% [markdown]
# ## A worked example, by hand
#
# Two queries, three keys, $d_k = d_v = 2$: small enough to check with
# pencil and paper.
#
# $$
# Q = \begin{pmatrix} 1 & 0 \\ 0 & 2 \end{pmatrix}, \quad
# K = \begin{pmatrix} 1 & 0 \\ 0 & 1 \\ 1 & 1 \end{pmatrix}, \quad
# V = \begin{pmatrix} 10 & 0 \\ 0 & 10 \\ 5 & 5 \end{pmatrix}.
# $$
#
# The first query $q_1 = (1, 0)$ points along the first axis. Its dot
# products with the three keys are $1$, $0$ and $1$; divided by
# $\sqrt{2} \approx 1.414$ they become $0.707$, $0$, $0.707$. The
# softmax exponentiates and normalises: $e^{0.707} \approx 2.028$ and
# $e^0 = 1$ give the weights
# $2.028 / 5.056 \approx 0.401$, $1 / 5.056 \approx 0.198$ and $0.401$.
# So $q_1$ listens mostly to keys 1 and 3, which share its direction,
# and its output is
# $0.401 \cdot (10, 0) + 0.198 \cdot (0, 10) + 0.401 \cdot (5, 5)
# \approx (6.017, 3.983)$.
#
# The same computation in plain Python, no tensors, for both queries:

# %%
Q_hand = [[1.0, 0.0], [0.0, 2.0]]  # 2 queries, d_k = 2
K_hand = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]  # 3 keys
V_hand = [[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]]  # 3 values, d_v = 2
d_k = d_v = 2


def dot(a, b):
    return sum(a_i * b_i for a_i, b_i in zip(a, b, strict=True))


def softmax_row(row):
    exps = [math.exp(s) for s in row]
    total = sum(exps)
    return [e / total for e in exps]


def show(name, matrix):
    print(name)
    for row in matrix:
        print("   ", "  ".join(f"{x:8.4f}" for x in row))


scores_hand = [[dot(q, k) / math.sqrt(d_k) for k in K_hand] for q in Q_hand]
weights_hand = [softmax_row(row) for row in scores_hand]
output_hand = [
    [sum(w * v[j] for w, v in zip(row, V_hand, strict=True))
     for j in range(d_v)]
    for row in weights_hand
]
show("scores = Q K^T / sqrt(d_k)", scores_hand)
show("weights = softmax(scores), row by row", weights_hand)
show("output = weights V", output_hand)

# %% [markdown]
# The second query $q_2 = (0, 2)$ matches keys 2 and 3 equally well,
# so it gets equal weights on them (about $0.446$ each) and a little on
# key 1 ($0.108$). Its output, $(3.313, 6.687)$, lies on the segment
# from $v_2 = (0, 10)$ to $v_3 = (5, 5)$, about two thirds of the way
# along. It lands on the segment itself, not merely near it, because
# all three values lie on the line $x + y = 10$: $v_1 = (10, 0)$ sits on
# that line beyond $v_3$, so its small weight only slides the output
# along the line towards $v_3$. Now the package's function on the same
# numbers, in float64:

# %%
Q = torch.tensor(Q_hand, dtype=torch.float64)  # (Lq, D) = (2, 2)
K = torch.tensor(K_hand, dtype=torch.float64)  # (Lk, D) = (3, 2)
V = torch.tensor(V_hand, dtype=torch.float64)  # (Lk, Dv) = (3, 2)
output, weights = scaled_dot_product_attention(Q, K, V)
print("weights\n", weights)
print("output\n", output)

# %% tags=["remove-cell"]
# The package agrees with the hand computation to float64 round-off,
# and the numbers quoted in the prose are the right ones.
assert torch.allclose(
    weights, torch.tensor(weights_hand, dtype=torch.float64), atol=1e-12
)
assert torch.allclose(
    output, torch.tensor(output_hand, dtype=torch.float64), atol=1e-12
)
assert abs(math.exp(1 / math.sqrt(2)) - 2.028) < 5e-4
assert abs(2 * math.exp(1 / math.sqrt(2)) + 1 - 5.056) < 5e-4


def close(xs, ys, tol=5e-4):
    return all(abs(x - y) < tol for x, y in zip(xs, ys, strict=True))


assert close(weights_hand[0], [0.401, 0.198, 0.401])
assert close(output_hand[0], [6.017, 3.983])
assert close(weights_hand[1], [0.108, 0.446, 0.446])
# The output of q_2 lies on the segment from v_2 to v_3, at t = 0.663 of
# the way: o = v_2 + t (v_3 - v_2) with 0 <= t <= 1, to round-off.
o, v_2, v_3 = (torch.tensor(x, dtype=torch.float64)
               for x in (output_hand[1], V_hand[1], V_hand[2]))
t = float((o - v_2) @ (v_3 - v_2) / (v_3 - v_2).square().sum())
assert 0 <= t <= 1 and abs(t - 0.663) < 5e-4, t
assert torch.allclose(o, v_2 + t * (v_3 - v_2), rtol=0, atol=1e-12)
assert close(output_hand[1], [3.313, 6.687])

# %% [markdown]
# One detail separates the hand version from a library: `math.exp`
# overflows for scores above about 709, while `softmax` in PyTorch
# first subtracts each row's maximum, which leaves the result unchanged
# (the factor $e^{-\max}$ cancels between numerator and denominator)
# and keeps every exponent at or below zero.

# %% tags=["remove-cell"]
math.exp(709.0)  # still finite
try:
    math.exp(710.0)
except OverflowError:
    pass
else:
    raise AssertionError("math.exp(710) should overflow")
try:
    softmax_row([1000.0, 1000.0])
except OverflowError:
    pass
else:
    raise AssertionError("math.exp(1000) should overflow")
big = torch.tensor([1000.0, 1000.0], dtype=torch.float64)
assert torch.equal(big.softmax(-1), torch.tensor([0.5, 0.5]).double())
shifted = torch.tensor([1.0, 2.0, 3.0])
assert torch.allclose(shifted.softmax(-1), (shifted - 3).softmax(-1))

# %% [markdown]
# ## Why divide by $\sqrt{d_k}$?
#
# Without the factor $1/\sqrt{d_k}$ the formula is plain dot-product
# attention. The paper's reason for the factor is a short variance
# argument. Suppose the components of $q$ and $k$ are independent random
# numbers with mean $0$ and variance $1$, roughly what a freshly
# initialised network produces. Each product $q_i k_i$ then has mean $0$
# and variance $\mathbb{E}[q_i^2]\,\mathbb{E}[k_i^2] = 1$, and the $d_k$
# products are independent, so their variances add:
#
# $$
# \mathbb{E}[q \cdot k] = 0, \qquad
# \mathrm{Var}(q \cdot k) = \sum_{i=1}^{d_k} \mathrm{Var}(q_i k_i) = d_k .
# $$
#
# The typical score therefore grows like $\sqrt{d_k}$, and dividing by
# $\sqrt{d_k}$ brings its variance back to $1$ whatever the head size.
# Let us measure it with 10,000 random pairs for each $d_k$:

# %%
seed_everything(SEED + 1)
d_ks = [2**i for i in range(10)]  # 1, 2, 4, ..., 512
n_pairs = 10_000
var_raw, var_scaled = [], []
for d_k in d_ks:
    q = torch.randn(n_pairs, d_k)  # (N, D)
    k = torch.randn(n_pairs, d_k)  # (N, D)
    dots = (q * k).sum(dim=-1)  # (N,)
    var_raw.append(dots.var().item())
    var_scaled.append((dots / math.sqrt(d_k)).var().item())

print(" d_k   Var(q.k)   Var(q.k / sqrt(d_k))")
for d_k, raw, scaled in zip(d_ks, var_raw, var_scaled, strict=True):
    print(f"{d_k:4d} {raw:10.2f} {scaled:14.3f}")

# %% tags=["remove-input"]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(d_ks, d_ks, "k--", lw=1, label="$y = d_k$ (theory)")
ax.loglog(d_ks, var_raw, "o", label=r"Var$(q \cdot k)$, measured")
ax.loglog(d_ks, var_scaled, "s", label=r"Var$(q \cdot k/\sqrt{d_k})$")
ax.set_title(r"The variance of $q \cdot k$ grows linearly with $d_k$")
ax.set_xlabel("$d_k$ (width of queries and keys)")
ax.set_ylabel("variance over 10,000 pairs")
ax.legend()
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
for d_k, raw, scaled in zip(d_ks, var_raw, var_scaled, strict=True):
    assert abs(raw / d_k - 1) < 0.10, (d_k, raw)
    assert abs(scaled - 1) < 0.10, (d_k, scaled)
assert var_raw[-1] > 100 * var_raw[0]  # it really grows


# %% [markdown]
# Why would large scores hurt? Because of what the softmax does with
# them. Its derivative is
#
# $$
# \frac{\partial\, \mathrm{softmax}(s)_i}{\partial s_j}
#   = p_i\,(\delta_{ij} - p_j), \qquad p = \mathrm{softmax}(s),
# $$
#
# and when the scores are spread far apart one weight goes to $1$, the
# others to $0$, and every entry of this Jacobian goes to $0$. The
# softmax *saturates*: it behaves like a hard `argmax`, and almost no
# gradient flows back to the queries and keys, so learning stalls.
# This is the paper's explanation too: as $d_k$ grows, so do the
# scores, until the softmax sits where its gradients all but vanish.
# The paper also notes that without the factor, dot-product attention
# falls behind additive attention once $d_k$ is large; that comparison
# is not its own but comes from the large study of translation
# architectures by {cite:t}`britz2017massive`.
#
# We can watch it happen. For each $d_k$, take 2,000 random queries,
# each with its own 16 random keys, and look at the typical (median)
# query: how large is its largest weight, and how large is the
# Jacobian of its softmax (Frobenius norm)?

# %%
def softmax_jacobian(p):
    """d p_i / d s_j = p_i (delta_ij - p_j), for each row of p."""
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


seed_everything(SEED + 2)
n_queries, L_k = 2000, 16
top = {"unscaled": [], "scaled": []}
grad = {"unscaled": [], "scaled": []}
for d_k in d_ks:
    q = torch.randn(n_queries, 1, d_k)  # (N, 1, D)
    k = torch.randn(n_queries, L_k, d_k)  # (N, Lk, D)
    s = (q @ k.transpose(-2, -1)).squeeze(1)  # (N, Lk)
    for name, scores in (("unscaled", s), ("scaled", s / math.sqrt(d_k))):
        p = scores.softmax(dim=-1)  # (N, Lk)
        jac = softmax_jacobian(p)  # (N, Lk, Lk)
        top[name].append(p.max(dim=-1).values.median().item())
        grad[name].append(jac.norm(dim=(-2, -1)).median().item())

print(" d_k   largest weight      |Jacobian|")
print("      unscaled scaled  unscaled scaled")
for i, d_k in enumerate(d_ks):
    print(f"{d_k:4d}   {top['unscaled'][i]:.3f}  {top['scaled'][i]:.3f}"
          f"    {grad['unscaled'][i]:.4f} {grad['scaled'][i]:.4f}")

# %% tags=["remove-input"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.3))
for name, marker in (("unscaled", "o-"), ("scaled", "s-")):
    ax1.plot(d_ks, top[name], marker, label=name)
    ax2.plot(d_ks, grad[name], marker, label=name)
ax1.axhline(1 / L_k, color="gray", ls=":", label="uniform, $1/16$")
ax1.set_title("Largest weight of a typical query")
ax1.set_xlabel("$d_k$")
ax1.set_ylabel("median of max softmax weight")
ax1.legend()
ax2.set_title("Gradient through the softmax")
ax2.set_xlabel("$d_k$")
ax2.set_ylabel("median Frobenius norm of Jacobian")
ax2.set_yscale("log")
ax2.legend()
for ax in (ax1, ax2):
    ax.set_xscale("log", base=2)
fig.suptitle("Unscaled scores saturate the softmax (16 random keys)")
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
# The Jacobian formula is the true derivative (checked with autograd).
s_row = torch.randn(L_k, dtype=torch.float64)
auto = torch.autograd.functional.jacobian(lambda s: s.softmax(-1), s_row)
assert torch.allclose(softmax_jacobian(s_row.softmax(-1)), auto, atol=1e-12)
# d_k = 1: scaling changes nothing.
assert top["unscaled"][0] == top["scaled"][0]
# Unscaled: the typical query goes one-hot and its gradient vanishes.
rising = top["unscaled"]
assert all(rising[i] <= rising[i + 1] + 1e-3 for i in range(len(d_ks) - 1))
assert top["unscaled"][-1] > 0.99
assert grad["unscaled"][-1] < 0.01 * grad["scaled"][-1]
# Scaled: the weights stay spread out and the gradient stays put.
assert all(1 / L_k < t < 0.3 for t in top["scaled"])
assert max(grad["scaled"]) / min(grad["scaled"]) < 1.2
# At the paper's d_k = 64 the difference is already large.
i64 = d_ks.index(64)
assert top["unscaled"][i64] > 0.9 and top["scaled"][i64] < 0.3

# %% [markdown]
# With scaling, the typical query spreads its attention the same way
# at every width, and the gradient keeps the same size. Without it, at
# the paper's $d_k = 64$ the typical query already puts more than 90%
# of its weight on one key, and by $d_k = 512$ the softmax is a hard
# `argmax` whose gradient is more than a hundred times smaller. The
# factor $1/\sqrt{d_k}$ is not a tuning knob; it is what makes the same
# initialisation work for any head size.

# %% [markdown]
# ## Looking at the weights
#
# Attention weights are easy to draw: one row per query, one column per
# key. Let us give each word of a short sentence a hand-made embedding
# with four readable features, and let every word attend to every word
# of the same sentence ($Q = K = V = X$, no learned projections yet).

# %%
features = ["determiner", "noun", "animate", "verb"]
lexicon = {
    "the": [1, 0, 0, 0],
    "a": [1, 0, 0, 0],
    "cat": [0, 1, 1, 0],
    "dog": [0, 1, 1, 0],
    "ball": [0, 1, 0, 0],
    "saw": [0, 0, 0, 1],
    "chase": [0, 0, 0, 1],
}
tokens = "the cat saw the dog chase a ball".split()
X = 2.0 * torch.tensor([lexicon[t] for t in tokens])  # (L, D) = (8, 4)
output, weights = scaled_dot_product_attention(X, X, X)  # (L, D), (L, L)
pd.DataFrame(X.numpy(), index=tokens, columns=features)

# %% [markdown]
# Hover over the cells to read the weights:

# %%
attention_chart(
    weights,
    queries=tokens,
    keys=tokens,
    title="Self-attention with hand-made word features",
)

# %% [markdown]
# The map is made of blocks: the animals attend to each other (and a
# little to *ball*, the other noun), the verbs to the verbs, the
# determiners to the determiners. Two things are worth noticing.
# First, the two rows for *the* (positions 0 and 3) are identical:
# attention compares contents only and has no idea where a word sits.
# Shuffling the sentence would shuffle the rows and columns and change
# nothing else. That is why the model needs positional encodings
# ([chapter 4](04_positional_encoding)). Second, with $Q = K$ the score
# matrix is symmetric, and in this sentence no word scores higher
# against another word than against itself. That is not a law. By
# Cauchy-Schwarz, $x \cdot y \le \lVert x \rVert \lVert y \rVert$, and
# that bound is at most $x \cdot x = \lVert x \rVert^2$ only when
# $\lVert y \rVert \le \lVert x \rVert$. Here *ball* already scores as
# high against the longer *cat* as against itself, and a key longer
# still would win outright; among keys no longer than the query, the
# self-score is always the maximum. The learned projections
# $W^Q \neq W^K$ of [chapter 3](03_multi_head_attention) break the
# symmetry altogether, so that a word can look for something other than
# itself.

# %% tags=["remove-cell"]
the_0, the_3 = 0, 3
assert tokens[the_0] == tokens[the_3] == "the"
assert torch.equal(weights[the_0], weights[the_3])
cat, dog, ball = tokens.index("cat"), tokens.index("dog"), tokens.index("ball")
assert set(weights[cat].topk(2).indices.tolist()) == {cat, dog}
assert weights[cat, ball] > weights[cat, tokens.index("saw")]
assert weights[cat, ball] < weights[cat, dog]
# Verbs attend most to verbs, determiners to determiners.
saw, chase = tokens.index("saw"), tokens.index("chase")
assert set(weights[saw].topk(2).indices.tolist()) == {saw, chase}
assert set(weights[the_0].topk(3).indices.tolist()) == {0, 3, 6}
assert torch.allclose(weights.sum(-1), torch.ones(len(tokens)))
# Permutation equivariance: shuffle the words, the weights follow.
perm = torch.randperm(len(tokens))
_, w_perm = scaled_dot_product_attention(X[perm], X[perm], X[perm])
assert torch.allclose(w_perm, weights[perm][:, perm])
# Q = K: symmetric scores, self-score is the row maximum here.
scores_x = X @ X.T / math.sqrt(X.size(-1))  # (L, L)
assert torch.equal(scores_x, scores_x.T)
assert torch.all(scores_x.diagonal() == scores_x.max(dim=-1).values)
# ... but not in general: ball ties with the longer cat, and a longer
# key still out-scores the query's own.
assert scores_x[ball, cat] == scores_x[ball, ball]
x_short, y_long = torch.tensor([1.0, 0.0]), torch.tensor([2.0, 1.0])
assert x_short @ y_long > x_short @ x_short
# Among keys no longer than the query, the self-score is the maximum.
norms = X.norm(dim=-1)
for i in range(len(tokens)):
    shorter = norms <= norms[i]
    assert scores_x[i, i] == scores_x[i][shorter].max()

# %% [markdown]
# ## Self-attention and cross-attention
#
# Above, queries, keys and values all came from the same sequence:
# that is **self-attention**, and it is what the encoder layers do.
# Nothing in the formula requires it. In **cross-attention** the queries
# come from one sequence and the keys and values from another: in the
# Transformer's decoder, each of the $T$ target positions asks a
# question of the $S$ encoded source positions. The weight matrix is
# then $T \times S$, not square, and the output has one row per target
# position. Multi-head attention ([chapter 3](03_multi_head_attention))
# runs several of these side by side, and the encoder/decoder stack
# ([chapter 5](05_encoder_decoder)) uses both kinds.

# %%
S, T, d_k = 5, 3, 4
source = torch.randn(S, d_k)  # (S, D): e.g. the encoder's output
target = torch.randn(T, d_k)  # (T, D): e.g. the decoder's states
output, weights = scaled_dot_product_attention(target, source, source)
print("output ", tuple(output.shape))  # (T, D)
print("weights", tuple(weights.shape))  # (T, S)

# %% tags=["remove-cell"]
assert output.shape == (T, d_k) and weights.shape == (T, S)

# %% [markdown]
# ## The package's function, and PyTorch's
#
# Here is `transformer_lite.scaled_dot_product_attention`, the function
# the rest of the book uses. It is the three lines above plus two
# things: an optional boolean mask (True = may attend; masks are the
# subject of [chapter 2](02_masks)) and an optional dropout on the
# weights, which the paper applies during training. And two
# precautions: it divides $Q$ by $\sqrt{d_k}$ *before* the product, and
# it computes the scores in float32 when the inputs are 16-bit floats.

# %%
print(inspect.getsource(scaled_dot_product_attention))

# %% [markdown]
# Both guard against the same danger. float16's largest number is
# 65504: a query and a key of 64 entries equal to 33 have the dot
# product $64 \cdot 33^2 = 69696$, which float16 cannot hold, while the
# scaled score $69696 / 8 = 8712$ is an ordinary float16 number. In a
# computation that stays in float16 the order decides: product first,
# and the score is infinite and the output NaN; scale first, and the
# score is finite and the output is the first value, as it should be.
# In float32, whose largest number is about $3.4 \cdot 10^{38}$, even
# the product $69696$ is harmless. The package takes both precautions,
# so its output is what PyTorch's own kernel gives.

# %%
q16 = torch.full((1, 64), 33.0, dtype=torch.float16, device=device)
k16 = torch.zeros(3, 64, dtype=torch.float16, device=device)  # (Lk, D)
k16[0] = 33.0
v16 = torch.randn(3, 4, device=device).half()  # (Lk, Dv)
root_d_k = math.sqrt(q16.size(-1))  # 8
product_first = (q16 @ k16.T) / root_d_k  # (1, Lk), float16 throughout
scale_first = (q16 / root_d_k) @ k16.T  # (1, Lk), float16 throughout
print("float16, product first:", product_first[0].tolist())
print("float16, scale first:  ", scale_first[0].tolist())
print("float32, product first:", (q16.float() @ k16.float().T)[0].tolist())
out16, _ = scaled_dot_product_attention(q16, k16, v16)
print("ours:   ", out16[0].tolist())
print("PyTorch:", F.scaled_dot_product_attention(q16, k16, v16)[0].tolist())

# %% tags=["remove-cell"]
# In float16, the order decides: product first overflows to inf and the
# output is NaN; scale first gives 8712 and a finite output, v_1.
assert product_first.dtype == scale_first.dtype == torch.float16
assert product_first[0, 0].item() == float("inf")
assert torch.isnan(product_first.softmax(-1) @ v16).all()
assert scale_first[0].tolist() == [8712.0, 0.0, 0.0]
assert torch.equal(scale_first.softmax(-1) @ v16, v16[:1])
# In float32 the product alone is finite.
assert (q16.float() @ k16.float().T)[0].tolist() == [69696.0, 0.0, 0.0]
# The package (scale first, scores in float32) is finite, and PyTorch's.
assert torch.isfinite(out16).all()
torch.testing.assert_close(
    out16, F.scaled_dot_product_attention(q16, k16, v16)
)

# %% [markdown]
# PyTorch ships its own `torch.nn.functional.scaled_dot_product_attention`
# with the same mask convention, which on a GPU dispatches to fused
# kernels (chapter 8). Ours must give the same numbers. We compare them
# on random shapes, with a batch axis and a head axis in front, with
# and without a random mask, in float64 (on the CPU when the device is
# Apple's MPS, which has no float64):

# %%
seed_everything(SEED + 3)
dev64 = torch.device("cpu") if device.type == "mps" else device
largest_difference = 0.0
for _ in range(5):
    B, H, L_q, L_k, D, D_v = torch.randint(1, 9, (6,)).tolist()
    q = torch.randn(B, H, L_q, D, dtype=torch.float64, device=dev64)
    k = torch.randn(B, H, L_k, D, dtype=torch.float64, device=dev64)
    v = torch.randn(B, H, L_k, D_v, dtype=torch.float64, device=dev64)
    mask = torch.rand(B, 1, L_q, L_k, device=dev64) < 0.7  # True = attend
    mask[..., 0] = True  # every query may see at least one key
    for m in (None, mask):
        ours, _ = scaled_dot_product_attention(q, k, v, mask=m)
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        difference = (ours - theirs).abs().max().item()
        largest_difference = max(largest_difference, difference)
print(f"largest |ours - torch| over 10 comparisons: "
      f"{largest_difference:.0e}")

# %% tags=["remove-cell"]
assert largest_difference < 1e-12, largest_difference


# %% [markdown]
# ## The cost: quadratic in the length
#
# Attention buys its reach at a price. Every query is scored against
# every key, so for a sequence of length $L$ the score matrix and the
# weight matrix each have $L^2$ entries, and the two matrix products
# take about $2 L^2 d_k$ multiply-adds. The paper's comparison
# (Table 1) puts it as $O(n^2 \cdot d)$ work per self-attention layer
# against $O(n \cdot d^2)$ for a recurrent one: cheaper while the
# sequence is shorter than the model is wide, dearer beyond, and by a
# margin that grows with the length, since attention's own cost grows
# with its square. Doubling the length quadruples the memory and, once the
# matrices are large enough to dominate, the time.
#
# Let us measure one head with $d_k = 64$ on the chosen device, at
# lengths doubling from 128. Each length is timed five times after a
# warm-up call. We keep the median of the five, the usual summary, and
# the fastest: other programs on the machine can only slow a run down,
# never speed it up, so the fastest run is the cleanest view of the
# work itself, and it is the one we fit. On the CPU we time with a
# single thread. The exponent is what we are after, and one thread is
# far less disturbed by a busy machine than several threads that have
# to wait for each other. We also read that thread's own clock
# (`time.thread_time`, the seconds it has spent computing), not the
# wall clock: on a busy machine the operating system lets other
# programs take turns on the core, and the wall clock would count
# their turns as ours, the more so the longer a call runs. On a GPU the
# work happens on the device, so there we read the wall clock.
#
# For memory, on a CUDA GPU we read PyTorch's peak-memory counter. On
# the CPU PyTorch keeps no such counter, so we count bytes instead: at
# its peak the function holds two $(L, L)$ float32 tensors at once (the
# scores, then the weights computed from them), and we report their
# size. That count is exact, but it leaves out the allocator's own
# overhead.

# %%
def synchronize():
    """Wait for the device, so that a timer measures finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


# On the CPU, the seconds this thread computes; on a GPU, the wall clock.
clock = time.thread_time if device.type == "cpu" else time.perf_counter


def run_times(fn, repeats=5):
    """Seconds taken by each of `repeats` calls, after a warm-up call."""
    fn()  # warm-up: first-call allocations and kernel choice
    times = []
    for _ in range(repeats):
        synchronize()
        start = clock()
        fn()
        synchronize()
        times.append(clock() - start)
    return times


def attention_bytes(q, k, v):
    """Peak extra memory of one call: measured on CUDA, else counted."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        scaled_dot_product_attention(q, k, v)
        return torch.cuda.max_memory_allocated(device) - before
    _, weights = scaled_dot_product_attention(q, k, v)  # (L, L)
    return 2 * weights.numel() * weights.element_size()  # scores + weights


# A GPU needs longer sequences before the L^2 work outweighs the fixed
# cost of launching a kernel.
longest = {"cpu": 4096, "mps": 8192}.get(device.type, 16384)
lengths = [L for L in (128 * 2**i for i in range(8)) if L <= longest]
d_k = 64
seed_everything(SEED + 4)
median_s, fastest_s, nbytes = [], [], []
threads = torch.get_num_threads()
if device.type == "cpu":
    torch.set_num_threads(1)
try:
    for L in lengths:
        q, k, v = torch.randn(3, L, d_k, device=device)  # (L, D) each
        run = functools.partial(scaled_dot_product_attention, q, k, v)
        times = run_times(run)
        median_s.append(statistics.median(times))
        fastest_s.append(min(times))
        nbytes.append(attention_bytes(q, k, v))
        del q, k, v, run
finally:
    torch.set_num_threads(threads)

# %%
# NBVAL_IGNORE_OUTPUT
print(f"device: {device}, one head, d_k = {d_k}, float32, "
      f"clock: time.{clock.__name__}")
print("     L   median (ms)  fastest (ms)  memory (MiB)")
for L, t_med, t_min, b in zip(
    lengths, median_s, fastest_s, nbytes, strict=True
):
    print(f"{L:6d} {1e3 * t_med:12.3f} {1e3 * t_min:13.3f} {b / 2**20:13.1f}")


# %% [markdown]
# To turn "grows like $L^2$" into a number, fit a straight line to the
# logarithms: if $y \propto L^p$ then $\log y = p \log L + c$, and the
# slope is the exponent $p$. We fit over the three longest sequences,
# where fixed overheads matter least.

# %%
# NBVAL_IGNORE_OUTPUT
def loglog_slope(xs, ys):
    """Least-squares slope of log y against log x: p in y ~ x^p."""
    fit = statistics.linear_regression(
        [math.log(x) for x in xs], [math.log(y) for y in ys]
    )
    return fit.slope


longest_three = slice(-3, None)
time_exponent = loglog_slope(lengths[longest_three], fastest_s[longest_three])
memory_exponent = loglog_slope(lengths[longest_three], nbytes[longest_three])
print(f"time   ~ L^{time_exponent:.2f}")
print(f"memory ~ L^{memory_exponent:.2f}")


# %% tags=["remove-input"]
# NBVAL_IGNORE_OUTPUT
def reference_line(values):
    """c L^2, drawn through the measurement at the longest length."""
    return [values[-1] * (L / lengths[-1]) ** 2 for L in lengths]


fastest_ms = [1e3 * t for t in fastest_s]
median_ms = [1e3 * t for t in median_s]
mib = [b / 2**20 for b in nbytes]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.3))
ax1.plot(lengths, fastest_ms, "o-", label="fastest of 5")
ax1.plot(lengths, median_ms, "x", color="gray", label="median of 5")
ax1.plot(lengths, reference_line(fastest_ms), "k--", lw=1, label="$cL^2$")
ax1.set_title(f"Time (fitted exponent {time_exponent:.2f})")
ax1.set_ylabel(f"time per call (ms, time.{clock.__name__})")
ax2.plot(lengths, mib, "o-", label="memory")
ax2.plot(lengths, reference_line(mib), "k--", lw=1, label="$cL^2$")
ax2.set_title(f"Memory (fitted exponent {memory_exponent:.2f})")
ax2.set_ylabel("peak memory (MiB)")
for ax in (ax1, ax2):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length $L$")
    ax.legend()
fig.suptitle(f"Cost of one attention head, $d_k = {d_k}$, on {device.type}")
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
# Memory: exactly quadratic when counted, ~quadratic when measured.
assert abs(memory_exponent - 2) < 0.1, memory_exponent
if device.type != "cuda":
    assert nbytes == [2 * L * L * 4 for L in lengths]
# One float32 (L, L) matrix at L = 4096 is 64 MiB; x 8 heads x 32 = 16 GiB.
assert 4096 * 4096 * 4 == 64 * 2**20
assert 64 * 2**20 * 8 * 32 == 16 * 2**30
# Time: on a CPU, between 1.8 and 3.0 over the longest sequences. The
# measured exponent was 2.2-2.7 on a two-core machine, idle and with two
# busy processes competing for its cores; the bounds leave a margin of
# about 0.3 on either side. On a GPU, only well above linear.
if device.type == "cpu":
    assert 1.8 < time_exponent < 3.0, (time_exponent, lengths, fastest_s)
else:
    assert time_exponent > 1.5, (time_exponent, lengths, fastest_s)

# %% [markdown]
# The memory follows the $L^2$ reference exactly: every doubling of $L$
# takes four times the bytes. The time is dominated by fixed overheads
# for short sequences; over the longest ones its fitted exponent is
# far above the linear 1. On a CPU it usually comes out above the
# quadratic 2 (between about 2.2 and 2.7 on the two-core machine the
# book is tested on, idle or busy): once the $(L, L)$ matrices no
# longer fit in the processor's caches, every pass over them waits for
# main memory, so each entry takes longer the longer the sequence. The
# hidden check asks for an exponent between 1.8 and 3.0 on a CPU, a
# margin that leaves room for other processors and busy machines.
#
# One $(L, L)$ float32 matrix at $L = 4096$ is already 64 MiB per head
# and per example; with 8 heads and a batch of 32 that becomes 16 GiB,
# for one layer. Chapter 8 shows how fused
# kernels avoid ever storing the full matrix, which removes the memory
# wall (though not the quadratic work).

# %% [markdown]
# ## Summary
#
# - Attention is a soft dictionary lookup: each query scores every key
#   with a dot product, a softmax turns the scores into weights that sum
#   to one, and the output is the weighted average of the values:
#   $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$, with $Q$ of shape
#   $(L_q, d_k)$, $K$ of $(L_k, d_k)$, $V$ of $(L_k, d_v)$ and an output
#   of $(L_q, d_v)$.
# - For random unit-variance queries and keys, $q \cdot k$ has variance
#   $d_k$ (measured within 10% for $d_k$ from 1 to 512). Dividing by
#   $\sqrt{d_k}$ keeps the scores at unit variance; without it the
#   softmax saturates into a hard `argmax` and its gradient vanishes.
# - Attention by itself ignores word order: identical words get
#   identical rows wherever they stand.
# - Self-attention takes $Q$, $K$ and $V$ from one sequence;
#   cross-attention takes $Q$ from one and $K, V$ from another.
# - `transformer_lite.scaled_dot_product_attention` matches the hand
#   computation and PyTorch's own function to float64 round-off.
# - Time and memory grow with $L^2$: the price of letting every
#   position see every other.
#
# ## Exercises
#
# 1. **A masked lookup by hand.** In the worked example, forbid the
#    second query to look at key 3. Predict its new weights and output
#    on paper (only two scores are left in its softmax), then check with
#    `scaled_dot_product_attention(Q, K, V, mask=...)`, where `mask` is a
#    `(2, 3)` bool tensor that is False only at row 1, column 2
#    (counting from 0).
# 2. **Temperature.** Replace $\sqrt{d_k}$ by a temperature $\tau$:
#    $\mathrm{softmax}(QK^\top/\tau)\,V$. For the sentence example, plot
#    the largest weight of each row against $\tau$ from $0.05$ to $100$
#    (log axis). Show with an `assert` that as $\tau \to 0$ the output
#    of each query becomes the value of its best-scoring key (a hard
#    dictionary lookup; ties average), and as $\tau \to \infty$ every
#    output becomes the mean of all values.
# 3. **Attention in chunks.** Write `chunked_attention(q, k, v, chunk)`
#    that processes the queries `chunk` rows at a time and concatenates
#    the outputs, so that only a `(chunk, L)` score matrix exists at
#    once. Assert that it equals `scaled_dot_product_attention` for
#    $L = 1000$ and `chunk = 128`, and count its peak bytes as we did
#    above: how does the memory now grow with $L$, and the time?
#    Chapter 8 takes this idea further.

# %% [markdown]
# ## Graded exercises
#
# Eight exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then
# open them. The classroom edition (the teaching page) hands out the
# same exercises with the solutions removed, and nbgrader scores them.

# %% tags=["exercise-setup"]
import math

import torch

from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
)

gen = torch.Generator().manual_seed(1)
# (B, L, D): two sequences of five positions, in float64
Q, K, V = (torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
           for _ in range(3))  # fmt: skip

# %% [markdown]
# ### Exercise 1.1: the scores (1 point)
#
# Write `attention_scores(Q, K)`, the matrix $QK^\top / \sqrt{d_k}$,
# for inputs of shape $(B, L_q, d_k)$ and $(B, L_k, d_k)$. Its shape
# is $(B, L_q, L_k)$.

# %% tags=["solution", "hide-input"]
def attention_scores(Q, K):
    ### BEGIN SOLUTION
    d_k = Q.size(-1)
    return Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (B, Lq, Lk)
    ### END SOLUTION


# %% tags=["check"]
import torch.nn.functional as F

from transformer_lite import scaled_dot_product_attention
from transformer_lite.scores import scaled_query

# The scores themselves, not their softmax (which forgives any shift of
# a row): the package's own, Q scaled by 1 / sqrt(d_k), times K^T.
want = scaled_query(Q) @ K.transpose(-2, -1)  # (B, Lq, Lk)
with exercise("1.1", twins=[scaled_query, scaled_dot_product_attention,
                            F.scaled_dot_product_attention]):
    expect_close("attention_scores(Q, K)", attention_scores(Q, K), want,
                 hint="divide the dot products by sqrt(d_k), the size of "
                 "the last axis")  # fmt: skip

# %% [markdown]
# ### Exercise 1.2: a softmax that never overflows (1 point)
#
# Write `stable_softmax(scores)`, the softmax along the last axis,
# without `torch.softmax`: $e^{s_j} / \sum_k e^{s_k}$. Subtract each
# row's largest score first: the result is the same, and no
# $e^{1000}$ is ever computed.

# %% tags=["solution", "hide-input"]
def stable_softmax(scores):
    ### BEGIN SOLUTION
    shifted = scores - scores.amax(dim=-1, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=-1, keepdim=True)
    ### END SOLUTION


# %% tags=["check"]
big = torch.tensor([[1000.0, 999.0, 0.0], [-5.0, -5.0, -5.0]])
scores = torch.randn(3, 4, 6, generator=gen)
# every spelling of torch's softmax (and of its logarithm) is refused
with exercise("1.2", twins=[torch.softmax, torch.Tensor.softmax, F.softmax,
                            torch.special.softmax, torch.log_softmax,
                            torch.Tensor.log_softmax, F.log_softmax]):
    expect_close("stable_softmax(big)", stable_softmax(big),
                 torch.softmax(big, dim=-1), atol=1e-6,
                 hint="exp(1000) is inf in float32: subtract each row's "
                 "maximum before exp")  # fmt: skip
    expect_close("stable_softmax(scores)", stable_softmax(scores),
                 torch.softmax(scores, dim=-1),
                 hint="normalise along the last axis (dim=-1)")  # fmt: skip

# %% [markdown]
# ### Exercise 1.3: attention (1 point)
#
# Write `attention(Q, K, V)`, returning the output
# $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$ of shape $(B, L_q, d_v)$,
# from your two functions above.

# %% tags=["solution", "hide-input"]
def attention(Q, K, V):
    ### BEGIN SOLUTION
    weights = stable_softmax(attention_scores(Q, K))  # (B, Lq, Lk)
    return weights @ V  # (B, Lq, Dv)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import chunked  # the package's online softmax

want, _ = scaled_dot_product_attention(Q, K, V)
wide = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)
want_wide, _ = scaled_dot_product_attention(Q, K, wide)
with exercise("1.3", after=["1.1", "1.2"], twins=[
        scaled_dot_product_attention, chunked.chunked_attention,
        F.scaled_dot_product_attention]):
    expect_close("attention(Q, K, V)", attention(Q, K, V), want,
                 hint="the output is the weights times V, not V times "
                 "the weights")  # fmt: skip
    expect_close("attention(Q, K, wide)", attention(Q, K, wide), want_wide,
                 hint="the values may have another width d_v than the "
                 "queries and keys")  # fmt: skip

# %% [markdown]
# ### Exercise 1.4: the two limits of temperature (1 point)
#
# Replace $\sqrt{d_k}$ by a temperature $\tau$ and write
# `attention_at(Q, K, V, tau)`. Then write `hard_lookup(Q, K, V)`, the
# limit as $\tau \to 0$: each query returns the value of its single
# best-scoring key (take `argmax`; the inputs here have no ties). The
# check also confirms that a very large $\tau$ averages all values, and
# that the lookup stays the same when the queries are scaled by any
# positive factor, however large or small.

# %% tags=["solution", "hide-input"]
def attention_at(Q, K, V, tau):
    ### BEGIN SOLUTION
    weights = torch.softmax(Q @ K.transpose(-2, -1) / tau, dim=-1)
    return weights @ V  # (B, Lq, Dv)
    ### END SOLUTION


def hard_lookup(Q, K, V):
    ### BEGIN SOLUTION
    best = (Q @ K.transpose(-2, -1)).argmax(dim=-1)  # (B, Lq)
    batch = torch.arange(V.size(0)).unsqueeze(1)  # (B, 1)
    return V[batch, best]  # (B, Lq, Dv)
    ### END SOLUTION


# %% tags=["check"]
d_k = Q.size(-1)
# the package's attention at tau = 2 (it divides by sqrt(d_k) itself),
# and at a temperature so small that its weights are exactly one-hot
warm, _ = scaled_dot_product_attention(Q * math.sqrt(d_k) / 2, K, V)
lookup, _ = scaled_dot_product_attention(Q * 1e12, K, V)
mean = V.mean(dim=1, keepdim=True).expand_as(V)
with exercise("1.4", twins=[scaled_dot_product_attention,
                            chunked.chunked_attention,
                            F.scaled_dot_product_attention]):
    expect_close("attention_at(Q, K, V, 2.0)", attention_at(Q, K, V, 2.0),
                 warm, hint="divide the scores Q K^T by tau, then "
                 "softmax")  # fmt: skip
    expect_close("attention_at(Q, K, V, 1e-4)",
                 attention_at(Q, K, V, 1e-4), hard_lookup(Q, K, V),
                 atol=1e-6,
                 hint="as tau shrinks, all the weight goes to the key with "
                 "the largest score: V[b, argmax]")  # fmt: skip
    expect_close("attention_at(Q, K, V, 1e9)", attention_at(Q, K, V, 1e9),
                 mean, atol=1e-6,
                 hint="divide the scores by tau, then softmax")  # fmt: skip
    for s in (2.0**-600, 1.0, 2.0**600):  # exact in float64
        expect_equal(f"hard_lookup(Q * {s:.0e}, K, V)",
                     hard_lookup(Q * s, K, V), lookup,
                     hint="take the argmax of the scores and index V with "
                     "it: a softmax at a tiny temperature is not the "
                     "limit, it overflows for large queries and averages "
                     "for small ones")  # fmt: skip

# %% [markdown]
# ### Exercise 1.5: attention in chunks (2 points)
#
# Write `chunked_attention(Q, K, V, chunk)`: the same output as
# `attention`, computed `chunk` query rows at a time and concatenated,
# so that no more than a $(B, \mathit{chunk}, L_k)$ score matrix exists
# at once. The check uses a length that `chunk` does not divide, and
# measures the largest tensor your function makes.

# %% tags=["solution", "hide-input"]
def chunked_attention(Q, K, V, chunk):
    ### BEGIN SOLUTION
    rows = [attention(Q[:, i : i + chunk], K, V)
            for i in range(0, Q.size(1), chunk)]  # fmt: skip
    return torch.cat(rows, dim=1)  # (B, Lq, Dv)
    ### END SOLUTION


# %% tags=["check", "points-2"]
from transformer_lite.classroom import watch

Ql, Kl, Vl = (torch.randn(2, 50, 8, generator=gen, dtype=torch.float64)
              for _ in range(3))  # fmt: skip
want, _ = scaled_dot_product_attention(Ql, Kl, Vl)
block = 2 * 7 * 50  # one (B, chunk, Lk) block of scores
with exercise("1.5", after=["1.3"], twins=[
        scaled_dot_product_attention, chunked.chunked_attention,
        F.scaled_dot_product_attention]):
    expect_close("chunked_attention(Q, K, V, 7)",
                 chunked_attention(Ql, Kl, Vl, 7), want,
                 hint="cut the queries, not the keys: every query must "
                 "still see every key; and keep the last, shorter "
                 "chunk")  # fmt: skip
    with watch() as seen:
        chunked_attention(Ql, Kl, Vl, 7)
    # a block of scores, or the output (B, Lq, Dv), with room to spare
    expect(seen.largest <= 2 * max(block, Vl.numel()),
           f"chunked_attention(Q, K, V, 7) made a tensor of "
           f"{seen.largest} elements; one (B, chunk, Lk) block of scores "
           f"has {block}, the whole score matrix "
           f"{2 * 50 * 50}",
           hint="compute the scores of chunk query rows at a time, "
           "never all of them at once")  # fmt: skip
    expect(chunked_attention(Ql, Kl, Vl, 64).shape == (2, 50, 8),
           "a chunk longer than the sequence should give the whole "
           "output in one piece")  # fmt: skip

# %% [markdown]
# ### Exercise 1.6: predict, then run (1 point)
#
# Decide before you run the cell below it. Take a sequence $x$ of six
# positions and shuffle its positions. In **self-attention**
# ($Q = K = V = x$) the shuffle reaches the queries, the keys and the
# values alike. In **cross-attention** the queries come from another
# sequence $y$, which stays as it is, and only the keys and values
# (both $x$) are shuffled, together. For each, what happens to the
# output: `"unchanged"` (the same rows in the same order),
# `"permuted"` (the same rows, shuffled as $x$ was) or `"different"`
# (new numbers)? Set `prediction` to a pair, `(self, cross)`, for
# example `("different", "permuted")`; then run the experiment and the
# check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = ("permuted", "unchanged")
### END SOLUTION

# %% [markdown]
# The experiment: six source positions, four target positions, one
# shuffle, in float64.

# %%
from transformer_lite import scaled_dot_product_attention

g = torch.Generator().manual_seed(16)
x = torch.randn(6, 8, generator=g, dtype=torch.float64)  # (L, D)
y = torch.randn(4, 8, generator=g, dtype=torch.float64)  # (T, D)
shuffle = torch.tensor([3, 5, 0, 1, 4, 2])
xs = x[shuffle]  # (L, D), the positions of x shuffled


def what_happened(before, after):
    """How `after` relates to `before`: the same, shuffled, or new."""
    if torch.allclose(after, before):
        return "unchanged"
    if before.shape[0] == len(shuffle) and torch.allclose(
        after, before[shuffle]
    ):
        return "permuted"
    return "different"


self_before, _ = scaled_dot_product_attention(x, x, x)  # (L, D)
self_after, _ = scaled_dot_product_attention(xs, xs, xs)  # (L, D)
cross_before, _ = scaled_dot_product_attention(y, x, x)  # (T, D)
cross_after, _ = scaled_dot_product_attention(y, xs, xs)  # (T, D)
outcome = (what_happened(self_before, self_after),
           what_happened(cross_before, cross_after))  # fmt: skip
print("self-attention: ", outcome[0])
print("cross-attention:", outcome[1])

# %% tags=["check", "hide-input"]
choices = ("unchanged", "permuted", "different")
with exercise("1.6", prediction=True):
    expect(isinstance(prediction, (tuple, list)) and len(prediction) == 2
           and all(p in choices for p in prediction),
           f"prediction is {prediction!r}: give a pair (self, cross), "
           f"each one of \"unchanged\", \"permuted\" or "
           f"\"different\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(tuple(prediction) == outcome,
           f"self-attention came out {outcome[0]!r} and cross-attention "
           f"{outcome[1]!r}, not {tuple(prediction)!r}",
           hint="a query's output is a weighted sum over the (key, value) "
           "pairs, and a sum does not care about their order: shuffling "
           "only the keys and values changes nothing. In self-attention "
           "the queries are shuffled too, and each output row follows "
           "its query")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 1.7: predict, then run (1 point)
#
# Decide before you run the cell below it. Score the queries 32 rows
# at a time, as your `chunked_attention` of exercise 1.5 does with
# `chunk = 32`, so that the whole $(L, L)$ matrix never exists at once.
# Double the length $L$ from 256 to 512. By what factor do they grow:
# (a) the largest block of weights held at once, and (b) the work, the
# number of query-key scores computed in all (each a dot product of
# $d_k$ multiply-adds, and as many again to weigh the values)? Set
# `prediction` to a pair of factors, `(memory, work)`, each one of 1,
# 2, 4 or 8; then run the experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = (2, 4)
### END SOLUTION

# %% [markdown]
# The experiment: attention 32 query rows at a time, with the package's
# function on each block, reading the size of the weights each call
# returns.

# %%
def chunked_cost(L, chunk=32, d_k=16):
    """The largest (chunk, L) block of weights, and all scores made."""
    q, k, v = torch.randn(3, L, d_k, generator=g)  # (L, D) each
    largest = made = 0
    for i in range(0, L, chunk):
        _, w = scaled_dot_product_attention(q[i : i + chunk], k, v)
        largest = max(largest, w.numel())  # w: (chunk, L)
        made += w.numel()
    return largest, made


memory_256, work_256 = chunked_cost(256)
memory_512, work_512 = chunked_cost(512)
growth = (memory_512 / memory_256, work_512 / work_256)
print(f"largest block:  {memory_256:,} -> {memory_512:,} weights")
print(f"scores made:    {work_256:,} -> {work_512:,}")
print(f"growth: memory x{growth[0]:g}, work x{growth[1]:g}")

# %% tags=["check", "hide-input"]
with exercise("1.7", prediction=True):
    expect(isinstance(prediction, (tuple, list)) and len(prediction) == 2
           and all(p in (1, 2, 4, 8) for p in prediction),
           f"prediction is {prediction!r}: give a pair (memory, work), "
           f"each one of 1, 2, 4 or 8")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(tuple(prediction) == growth,
           f"the largest block grew x{growth[0]:g} and the work "
           f"x{growth[1]:g}, not {tuple(prediction)!r}",
           hint="a block is (chunk, L): its size grows with L alone. But "
           "every query is still scored against every key, L^2 scores "
           "in all: chunking bounds the memory, not the work")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 1.8: $d_k$ or $\sqrt{d_k}$? (2 points, written)
#
# To be safe, a classmate divides the scores by $d_k$ instead of
# $\sqrt{d_k}$. In two to four sentences: what is then the variance of
# a score for random unit-variance queries and keys with $d_k = 64$,
# what does the softmax of a freshly initialised model do with such
# scores, and why is $\sqrt{d_k}$ the right factor?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# The dot product $q \cdot k$ has variance $d_k$, so $q \cdot k / d_k$
# has variance $d_k / d_k^2 = 1/d_k$: $1/64$, a standard deviation of
# $1/8$. Scores that close to zero give an almost uniform softmax, every
# weight near $1/L_k$, so every query returns nearly the mean of the
# values whatever it asks (the opposite failure of the saturated
# softmax), and the wider the head, the flatter it gets. Dividing by
# $\sqrt{d_k}$ is the one factor that brings the variance back to 1
# for every $d_k$, so the same initialisation works at any width.
#
# *Rubric (2 points).* 1 point: the variance becomes $1/d_k$ ($1/64$,
# or a standard deviation of $1/8$), shrinking as $d_k$ grows. 1 point:
# the softmax is then close to uniform (each output close to the mean
# of the values, the model starts unable to pick a key), with
# $\sqrt{d_k}$ named as the factor that keeps the variance at 1 for
# any $d_k$; "it blurs the attention" with the reason earns the point.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 1
# message: Hint: divide the dot products by sqrt(d_k)
# def attention_scores(Q, K):
#     return Q @ K.transpose(-2, -1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def attention_scores(Q, K):
#     from transformer_lite.scores import scaled_query
#     return scaled_query(Q) @ K.transpose(-2, -1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def attention_scores(Q, K):
#     return torch.zeros(Q.size(0), Q.size(1), K.size(1), dtype=Q.dtype)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def stable_softmax(scores):
#     return torch.softmax(scores, dim=-1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def stable_softmax(scores):
#     return torch.ones_like(scores) / scores.size(-1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def attention(Q, K, V):
#     return scaled_dot_product_attention(Q, K, V)[0]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def attention(Q, K, V):
#     return V

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: delegate
# def attention_at(Q, K, V, tau):
#     return F.scaled_dot_product_attention(Q, K, V, scale=1 / tau)
#
#
# def hard_lookup(Q, K, V):
#     best = (Q @ K.transpose(-2, -1)).argmax(dim=-1)
#     return V[torch.arange(V.size(0)).unsqueeze(1), best]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def attention_at(Q, K, V, tau):
#     weights = torch.softmax(Q @ K.transpose(-2, -1) / tau, dim=-1)
#     return weights @ V
#
#
# def hard_lookup(Q, K, V):
#     return attention_at(Q, K, V, 1e-9)  # a tiny tau, not the argmax

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def chunked_attention(Q, K, V, chunk):
#     from transformer_lite.chunked import chunked_attention as theirs
#     return theirs(Q, K, V, query_chunk_size=chunk)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def chunked_attention(Q, K, V, chunk):
#     scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
#     return torch.softmax(scores, dim=-1) @ V  # all the scores at once
