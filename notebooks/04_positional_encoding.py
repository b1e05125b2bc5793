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
# # 4. Positional encodings
#
# "Dog bites man" and "man bites dog" hold the same three words; only their
# order tells the reader who is in trouble. A recurrent network reads words
# one after another, so order is built into the way it computes. A
# convolution slides a window whose taps know left from right. Attention
# has neither: as we will prove in the first section, it treats its input
# as a *set*. The Transformer therefore has to be told where each token
# sits, and it is told by adding a vector that depends only on the
# position to each token's embedding.
#
# This chapter teaches `transformer_lite/positional.py`:
#
# - why self-attention on its own cannot see order, proved and checked;
# - the paper's sinusoidal table, its formula and its pictures;
# - the property that motivated it: moving $k$ positions ahead is a fixed
#   rotation of the encoding, whatever the starting position;
# - the module `SinusoidalPositionalEncoding` as the model uses it;
# - learned position embeddings, the alternative the paper also tried, and
#   a look ahead at relative schemes.
#
# The shape legend is the book's: B batch, L any length, C = `d_model`,
# H heads, D = `d_k`, V vocabulary.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(4)

# %%
import inspect
import math
import platform
import textwrap

import altair as alt
import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch import nn

import transformer_lite
from transformer_lite import (
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    Transformer,
    default_device,
    seed_everything,
    sinusoidal_table,
)
from transformer_lite.device import book_seed
from transformer_lite.layers import Encoder
from transformer_lite.positional import LearnedPositionalEmbedding

device = default_device()
SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
# Exactness checks run in float64; Apple's MPS has no float64.
dtype = torch.float32 if device.type == "mps" else torch.float64
tol = 1e-5 if dtype == torch.float32 else 1e-12
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"transformer_lite {transformer_lite.__version__}")
print(f"device: {device}, dtype for exactness checks: {dtype}")
print(f"BOOK_SEED={SEED}")
seed_everything(SEED + 4)

# %% [markdown]
# ## Attention alone ignores order
#
# Take one self-attention head with no mask. The input is a matrix
# $X \in \mathbb{R}^{L \times C}$, one row per token, and the output is
#
# $$\mathrm{A}(X) = \mathrm{softmax}\!\left(
#   \frac{X W^Q (X W^K)^\top}{\sqrt{d_k}}\right) X W^V .$$
#
# Now shuffle the tokens: replace $X$ by $PX$, where $P$ is an $L \times L$
# permutation matrix. The score matrix $S = X W^Q (X W^K)^\top/\sqrt{d_k}$
# becomes $P S P^\top$: its rows and its columns are shuffled the same way.
# Softmax works on each row separately, and the sum in its denominator does
# not care about the order of the entries, so
# $\mathrm{softmax}(P S P^\top) = P\,\mathrm{softmax}(S)\,P^\top$. The
# values are $P X W^V$, and since $P^\top P = I$,
#
# $$\mathrm{A}(PX) = P\,\mathrm{softmax}(S)\,P^\top P\,X W^V
#   = P\,\mathrm{A}(X).$$
#
# Shuffle the input, and the output is shuffled the same way, with every
# row unchanged. Mathematicians call this *permutation equivariance*.
# Multi-head attention has it too: each head does, and concatenating the
# heads row by row keeps it. The output projection $W^O$, the
# feed-forward network, residual connections and LayerNorm act on each
# row on its own, which keeps it as well, and a chain of
# permutation-equivariant steps is permutation-equivariant. So the
# whole encoder of [chapter 5](05_encoder_decoder) inherits it: without
# positions, each token's output depends on the token itself and on the
# *bag* of the others, never on where they stand.
#
# Let us see it on the two sentences, with the package's
# `MultiHeadAttention` of [chapter 3](03_multi_head_attention) (no dropout,
# float64).

# %%
d_model, h = 16, 4
vocab = {"dog": 0, "bites": 1, "man": 2}
embedding = nn.Embedding(len(vocab), d_model).to(device, dtype)
mha = MultiHeadAttention(d_model, h, dropout=0.0).to(device, dtype)


def encode_words(words: list[str]) -> torch.Tensor:
    """Self-attention over the embedded words, no positions."""
    ids = torch.tensor([[vocab[w] for w in words]], device=device)  # (1, L)
    x = embedding(ids)  # (1, L, C)
    return mha(x, x, x)  # (1, L, C)


with torch.no_grad():
    out_a = encode_words(["dog", "bites", "man"])  # (1, 3, C)
    out_b = encode_words(["man", "bites", "dog"])  # (1, 3, C)
print("output for 'dog', sentence a:", out_a[0, 0, :4].cpu().numpy().round(4))
print("output for 'dog', sentence b:", out_b[0, 2, :4].cpu().numpy().round(4))

# %% [markdown]
# The vector computed for "dog" is the same whether the dog bites or is
# bitten. The same holds for any input and any shuffle: here a random
# sequence of 10 vectors and a random permutation `perm`.

# %%
B, L = 2, 10
x = torch.randn(B, L, d_model, device=device, dtype=dtype)  # (B, L, C)
perm = torch.randperm(L, device=device)
with torch.no_grad():
    out = mha(x, x, x)  # (B, L, C)
    out_shuffled_input = mha(x[:, perm], x[:, perm], x[:, perm])
equivariance_error = (out_shuffled_input - out[:, perm]).abs().max().item()
print("permutation:", perm.tolist())
print(f"max |A(PX) - P A(X)| = {equivariance_error:.1e}")

# %% tags=["remove-cell"]
# The two sentences give "dog" the same output, and so do "man" and "bites".
assert torch.allclose(out_a[0, 0], out_b[0, 2], rtol=0, atol=tol)
assert torch.allclose(out_a[0, 1], out_b[0, 1], rtol=0, atol=tol)
assert torch.allclose(out_a[0, 2], out_b[0, 0], rtol=0, atol=tol)
# Permutation equivariance, tight tolerance; the permutation is not trivial.
assert not torch.equal(perm.cpu(), torch.arange(L))
assert equivariance_error < tol
assert not torch.allclose(out_shuffled_input, out, atol=1e-3)
# ... and so is a whole encoder stack without positions (chapter 5),
# built aside so that the chapter's random numbers stay as they were.
with torch.random.fork_rng(devices=[]), torch.no_grad():
    _encoder = Encoder(2, d_model, h, 32, dropout=0.0).to(device, dtype)
    _encoder.eval()
    _y = _encoder(x)  # (B, L, C)
    _error = (_encoder(x[:, perm]) - _y[:, perm]).abs().max().item()
assert _error < tol, _error

# %% [markdown]
# Now add a position-dependent vector $PE(pos)$ to each row *before*
# attention, the way the Transformer does. Shuffling the tokens no longer
# shuffles the added vectors with them: token $j$ that moved to place $pos$
# is now seen as $x_j + PE(pos)$. The symmetry is broken, and each output
# depends on where its token stands. (We use the table of the next section;
# any position-dependent vectors would do.)

# %%
pe = sinusoidal_table(L, d_model, dtype=dtype).to(device)  # (L, C)
with torch.no_grad():
    x_pos = x + pe  # (B, L, C)
    out_pos = mha(x_pos, x_pos, x_pos)  # (B, L, C)
    x_shuffled_pos = x[:, perm] + pe  # (B, L, C)
    out_pos_shuffled = mha(x_shuffled_pos, x_shuffled_pos, x_shuffled_pos)
broken_error = (out_pos_shuffled - out_pos[:, perm]).abs().max().item()
print(f"with positions: max |A(PX + PE) - P A(X + PE)| = {broken_error:.3f}")

# %% tags=["remove-cell"]
assert broken_error > 1e-2
assert not torch.allclose(out_pos_shuffled, out_pos[:, perm], atol=1e-3)

# %% [markdown]
# One caveat: the decoder's causal mask ([chapter 2](02_masks)) is not
# symmetric under shuffling, since token $t$ sees exactly $t + 1$ tokens.
# Decoder-only language models trained without any positional encoding do
# pick up some sense of position from that alone
# {cite:p}`haviv2022transformer`. The encoder has no such crutch, and the paper
# gives both stacks explicit
# positions.
#
# ## The sinusoidal table
#
# The paper's encoding is a table with one row per position and one column
# per model dimension. Column pairs $(2i, 2i + 1)$ hold a sine and a cosine
# of the same frequency:
#
# $$PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_{\text{model}}}}
#   \right), \qquad
#   PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_{\text{model}}}}
#   \right),$$
#
# for $i = 0, 1, \dots, d_{\text{model}}/2 - 1$. Write the angular
# frequency of pair $i$ as
# $\omega_i = 10000^{-2i/d_{\text{model}}}$; then pair $i$ is the point
# $(\sin \omega_i\, pos,\ \cos \omega_i\, pos)$ going round the unit circle
# as $pos$ grows, with wavelength $\lambda_i = 2\pi / \omega_i$ positions.
# Each step of $i$ multiplies the wavelength by the same factor
# $10000^{2/d_{\text{model}}}$, so the wavelengths form a geometric
# progression from $2\pi$ (pair 0, about 6.3 positions) up to
# $2\pi \cdot 10000^{1 - 2/d_{\text{model}}}$, just short of
# $2\pi \cdot 10000$.

# %%
d_model = 128
two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (C/2,)
omega = 1.0 / 10000 ** (two_i / d_model)  # (C/2,)
wavelength = 2 * math.pi / omega  # (C/2,)
ratio = wavelength[1:] / wavelength[:-1]  # (C/2 - 1,)
print(f"d_model = {d_model}: {len(omega)} frequencies")
print(f"shortest wavelength {wavelength[0]:.3f} (2*pi = {2 * math.pi:.3f})")
print(f"longest wavelength  {wavelength[-1]:.1f} "
      f"(10000 * 2*pi = {10000 * 2 * math.pi:.1f})")
print(f"ratio between neighbours: {ratio.min():.6f} to {ratio.max():.6f}"
      f" = 10000^(2/d_model) = {10000 ** (2 / d_model):.6f}")

# %% tags=["remove-cell"]
assert math.isclose(wavelength[0].item(), 2 * math.pi, rel_tol=1e-12)
assert wavelength[-1] < 10000 * 2 * math.pi
assert math.isclose(wavelength[-1].item(),
                    2 * math.pi * 10000 ** (1 - 2 / d_model), rel_tol=1e-12)
assert torch.allclose(ratio, torch.full_like(ratio, 10000 ** (2 / d_model)),
                      rtol=1e-12, atol=0)
assert (wavelength[1:] > wavelength[:-1]).all()

# %% [markdown]
# `sinusoidal_table` builds the whole table at once: a column of positions
# divided by a row of $10000^{2i/d_{\text{model}}}$ gives every angle
# $\omega_i\, pos$ by broadcasting; sines go to the even columns, cosines
# to the odd ones. It computes in float64 and casts at the end, so even a
# float16 table is as accurate as float16 allows.

# %%
print(inspect.getsource(sinusoidal_table))

# %%
max_len = 256
table = sinusoidal_table(max_len, d_model, dtype=torch.float64)  # (L, C)
print("table:", tuple(table.shape), table.dtype)
print("row 0 (position 0), first 6 entries:", table[0, :6].tolist())

# %% [markdown]
# Position 0 is $(0, 1, 0, 1, \dots)$: every sine starts at 0 and every
# cosine at 1. As a check that the vectorised code says what the formula
# says, we evaluate the formula again, one number at a time, with Python's
# own `math.sin` and `math.cos`, at a handful of positions and pair indices.

# %%
def pe_formula(pos: int, dim: int, d_model: int) -> float:
    """PE(pos, dim) from the paper's formula, scalar by scalar."""
    i = dim // 2
    angle = pos / 10000 ** (2 * i / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


samples = [(0, 0), (1, 0), (7, 3), (42, 10), (100, 40), (255, 63)]
for pos, i in samples:
    print(f"pos {pos:3d}, i {i:2d}: table {table[pos, 2 * i]: .6f} "
          f"{table[pos, 2 * i + 1]: .6f}   formula "
          f"{pe_formula(pos, 2 * i, d_model): .6f} "
          f"{pe_formula(pos, 2 * i + 1, d_model): .6f}")

# %% tags=["remove-cell"]
for pos, i in samples:
    for dim in (2 * i, 2 * i + 1):
        assert abs(table[pos, dim].item()
                   - pe_formula(pos, dim, d_model)) < 1e-12, (pos, dim)
# Every entry, against the scalar formula.
formula_table = torch.tensor(
    [[pe_formula(p, j, d_model) for j in range(d_model)]
     for p in range(max_len)], dtype=torch.float64)
assert (table - formula_table).abs().max() < 1e-12
assert torch.equal(table[0, 0::2], torch.zeros(d_model // 2))
assert torch.equal(table[0, 1::2], torch.ones(d_model // 2))
# float32 table: the float64 table rounded once.
assert torch.equal(sinusoidal_table(max_len, d_model),
                   table.to(torch.float32))

# %% [markdown]
# Each (sine, cosine) pair has length one, since
# $\sin^2 + \cos^2 = 1$. Every row therefore has the same length,
# $\lVert PE(pos) \rVert = \sqrt{d_{\text{model}}/2}$, and its entries
# have a root mean square of exactly $1/\sqrt{2}$: positions differ in
# direction, never in size.

# %%
row_norms = table.norm(dim=1)  # (L,)
print(f"row norms: min {row_norms.min():.6f}, max {row_norms.max():.6f}, "
      f"sqrt(d_model / 2) = {math.sqrt(d_model / 2):.6f}")

# %% tags=["remove-cell"]
assert torch.allclose(row_norms, torch.full_like(row_norms,
                      math.sqrt(d_model / 2)), rtol=0, atol=1e-12)
assert math.isclose(table.pow(2).mean().sqrt().item(), math.sqrt(0.5),
                    rel_tol=1e-12)

# %% [markdown]
# Plotted against position, each column is a wave. The fast pairs
# distinguish neighbours; the slow ones change so little over a sentence
# that they act like a coarse "roughly where" signal. Together they work
# like the hands of a clock, or the digits of a counter: no two positions
# in the table share the same code. Each odd column (not drawn) is the same
# wave as its even neighbour, a quarter wavelength ahead.

# %% tags=["remove-input"]
fig, ax = plt.subplots(figsize=(7, 3.5))
positions = torch.arange(100)
for dim in (0, 16, 32, 64):
    lam = wavelength[dim // 2].item()
    ax.plot(positions, table[:100, dim], marker=".", markersize=3,
            linewidth=1, label=f"dim {dim}\n($\\lambda$ = {lam:.1f})")
ax.set_title(f"Sinusoidal encoding, four columns (d_model = {d_model})")
ax.set_xlabel("position pos")
ax.set_ylabel("PE(pos, dim)")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The whole table as a picture: one row per position, one column per
# dimension. On the left, the fast columns flicker from row to row; to the
# right the wavelengths grow. Just past the middle the columns still
# swing: over the 256 positions, dimension 64 (a sine) rises from 0 to 1
# and falls back to 0.56, and dimension 65 (its cosine) runs from 1 down to
# $-0.83$. Only in the last quarter, dimensions 96 to 127, is every
# column nearly flat: every sine there stays between 0 and 0.26, every
# cosine between 0.96 and 1. (The cosines settle a little sooner, since
# a cosine changes slowly near its peak; the sines, rising from 0, are
# the last to flatten.)

# %% tags=["remove-input"]
fig, ax = plt.subplots(figsize=(6, 4.2))
image = ax.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1,
                  interpolation="nearest")
ax.set_title(f"Sinusoidal table, {max_len} positions x {d_model} "
             "dimensions")
ax.set_xlabel("dimension (even: sin, odd: cos)")
ax.set_ylabel("position pos")
fig.colorbar(image, ax=ax, label="PE(pos, dim)")
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
# Over 256 positions at d_model = 128: dims 64-65 still swing by 1.0 and
# 1.83; in the last quarter no column swings by more than 0.26.
assert (max_len, d_model) == (256, 128)
swing = table.amax(dim=0) - table.amin(dim=0)  # (C,)
assert abs(swing[64] - 1.0) < 1e-3 and abs(swing[65] - 1.83) < 5e-3
assert abs(table[:, 65].min() + 0.83) < 5e-3
assert abs(table[:, 64].max() - 1) < 1e-3 and abs(table[-1, 64] - 0.56) < 5e-3
last_quarter = table[:, 3 * d_model // 4 :]  # (L, C/4): dims 96-127
pair_swing = swing.view(-1, 2).amax(dim=1)  # (C/2,): the sin/cos pairs
assert pair_swing[d_model * 3 // 8 :].max() < 0.26  # pairs 48-63
assert pair_swing[: d_model * 3 // 8].min() > 0.26  # none before them
assert last_quarter[:, 0::2].min() >= 0 and last_quarter[:, 0::2].max() < 0.26
assert last_quarter[:, 1::2].min() > 0.96
# the cosines get below 0.26 first, the sines only at dim 96
_first_flat = [int((swing[start::2] < 0.26).nonzero()[0]) * 2 + start
               for start in (0, 1)]  # fmt: skip
assert _first_flat[1] < _first_flat[0] == 96, _first_flat

# %% [markdown]
# Distinct codes are easy to check: the vector most similar (largest dot
# product) to each row of a 2000-position table is that row itself.

# %%
long_table = sinusoidal_table(2000, d_model, dtype=torch.float64)  # (L, C)
nearest = (long_table @ long_table.T).argmax(dim=1)  # (L,)
print("every position is its own nearest neighbour:",
      torch.equal(nearest, torch.arange(2000)))

# %% tags=["remove-cell"]
assert torch.equal(nearest, torch.arange(2000))
assert (torch.cdist(long_table, long_table)
        + 10 * torch.eye(2000, dtype=torch.float64)).min() > 1e-3

# %% [markdown]
# ## Relative positions are rotations
#
# Why sines and cosines, rather than any other set of distinct vectors?
# The authors hoped the model could learn to attend *by relative position*
# ("the word two to the left"), because for any fixed offset $k$,
# $PE(pos + k)$ is a linear function of $PE(pos)$. The proof is two lines
# of school trigonometry. With $a = \omega_i\, pos$ and $b = \omega_i k$,
# the angle-addition formulas read
#
# $$\begin{aligned}
# \sin(a + b) &= \ \ \,\sin a \cos b + \cos a \sin b, \\
# \cos(a + b) &= -\sin a \sin b + \cos a \cos b,
# \end{aligned}$$
#
# that is, for the pair $i$,
#
# $$\begin{pmatrix} PE_{(pos+k,\,2i)} \\ PE_{(pos+k,\,2i+1)} \end{pmatrix}
# = \underbrace{\begin{pmatrix} \cos \omega_i k & \sin \omega_i k \\
#   -\sin \omega_i k & \cos \omega_i k \end{pmatrix}}_{R(\omega_i k)}
# \begin{pmatrix} PE_{(pos,\,2i)} \\ PE_{(pos,\,2i+1)} \end{pmatrix}.$$
#
# The matrix $R(\omega_i k)$ is a rotation by the angle $\omega_i k$, and
# it contains $k$ but not $pos$. Stacking one such $2 \times 2$ block per
# frequency gives a block-diagonal $d_{\text{model}} \times
# d_{\text{model}}$ matrix
#
# $$M_k = \mathrm{diag}\big(R(\omega_0 k),\, R(\omega_1 k),\, \dots,\,
#   R(\omega_{d_{\text{model}}/2 - 1}\, k)\big), \qquad
#   PE(pos + k) = M_k\, PE(pos) \ \text{ for every } pos.$$
#
# In code, with `omega` as above:

# %%
def offset_rotation(k: int, d_model: int, base: float = 10000.0):
    """M_k, the (C, C) matrix with PE(pos + k) = M_k PE(pos)."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (C/2,)
    omega = 1.0 / base ** (two_i / d_model)  # (C/2,)
    blocks = []
    for angle in (omega * k).tolist():
        c, s = math.cos(angle), math.sin(angle)
        blocks.append(torch.tensor([[c, s], [-s, c]], dtype=torch.float64))
    return torch.block_diag(*blocks)  # (C, C)


print("M_3 for d_model = 4:")
print(offset_rotation(3, 4).numpy().round(4))

# %% [markdown]
# Here is $M_3$ for $d_{\text{model}} = 16$. Hover over the cells: the
# first block turns by 3 radians, almost half a turn, while the last
# turns by about a thousandth of a radian and is nearly the identity.

# %% tags=["remove-input"]
M_show = offset_rotation(3, 16)  # (C, C)
frame = pd.DataFrame(
    [{"row": r, "column": c, "entry": float(M_show[r, c])}
     for r in range(16) for c in range(16)]
)
alt.Chart(frame, title="M_k for k = 3, d_model = 16").mark_rect().encode(
    x=alt.X("column:O", title="input dimension"),
    y=alt.Y("row:O", title="output dimension"),
    color=alt.Color("entry:Q", title="entry",
                    scale=alt.Scale(scheme="redblue", domain=[-1, 1])),
    tooltip=["row:O", "column:O", alt.Tooltip("entry:Q", format=".4f")],
).properties(width=260, height=260)

# %% tags=["remove-cell"]
first_angle = math.atan2(M_show[0, 1].item(), M_show[0, 0].item())
last_angle = math.atan2(M_show[14, 15].item(), M_show[14, 14].item())
assert math.isclose(first_angle, 3.0, rel_tol=1e-12)
assert 5e-4 < last_angle < 2e-3
assert torch.equal(M_show, torch.block_diag(
    *(M_show[j:j + 2, j:j + 2] for j in range(0, 16, 2))))

# %% [markdown]
# Our table stores positions as rows, so the map reads
# $PE(pos + k)^\top = PE(pos)^\top M_k^\top$: one matrix product moves
# *every* row of the table $k$ places down. We check it for all 256
# positions at once, for several offsets, first on the float64 table and
# then on the float32 table the model actually uses.

# %%
table32 = sinusoidal_table(max_len, d_model)  # (L, C) float32
print(" k   max error (float64)   max error (float32 table)")
for k in (1, 2, 5, 37, 100, 200):
    M_k = offset_rotation(k, d_model)  # (C, C)
    err64 = (table[:-k] @ M_k.T - table[k:]).abs().max().item()
    err32 = (table32[:-k].double() @ M_k.T - table32[k:]).abs().max().item()
    print(f"{k:3d}   {err64:.1e}               {err32:.1e}")

# %% tags=["remove-cell"]
for k in (1, 2, 5, 37, 100, 200, 255):
    M_k = offset_rotation(k, d_model)
    assert (table[:-k] @ M_k.T - table[k:]).abs().max() < 1e-12, k
    assert (table32[:-k].double() @ M_k.T - table32[k:]).abs().max() < 1e-5
# The map does depend on k: M_1 does not move rows by 2.
M_1 = offset_rotation(1, d_model)
assert (table[:-2] @ M_1.T - table[2:]).abs().max() > 0.1

# %% [markdown]
# Being rotations, the $M_k$ behave like offsets: they are orthogonal
# ($M_k M_k^\top = I$, so no information is lost), stepping back is the
# transpose ($M_{-k} = M_k^\top$), and two steps compose into one
# ($M_j M_k = M_{j+k}$).

# %%
M_5, M_7, M_12 = (offset_rotation(k, d_model) for k in (5, 7, 12))
eye = torch.eye(d_model, dtype=torch.float64)
print("M_5 M_5^T = I:    ", torch.allclose(M_5 @ M_5.T, eye, atol=1e-12))
print("M_-5 = M_5^T:     ",
      torch.allclose(offset_rotation(-5, d_model), M_5.T, atol=1e-12))
print("M_5 M_7 = M_12:   ", torch.allclose(M_5 @ M_7, M_12, atol=1e-12))

# %% tags=["remove-cell"]
assert torch.allclose(M_5 @ M_5.T, eye, rtol=0, atol=1e-12)
assert torch.allclose(offset_rotation(-5, d_model), M_5.T, rtol=0,
                      atol=1e-12)
assert torch.allclose(M_5 @ M_7, M_12, rtol=0, atol=1e-12)
assert torch.allclose(offset_rotation(0, d_model), eye, rtol=0, atol=0)
assert not torch.allclose(M_5 @ M_7, offset_rotation(13, d_model),
                          atol=1e-3)

# %% [markdown]
# What this buys, and what it does not. Attention compares the token at
# position $m$ with the token at position $n$ through the score
# $(x_m W^Q)(x_n W^K)^\top$. Because "$k$ places further" is one fixed
# matrix for every starting point, a single pair of projections
# $W^Q, W^K$ can make a head prefer, say, the token one to the left,
# wherever the query stands: the same weights serve position 3 and
# position 300. That is what the authors hoped training would find. The
# property makes such weights possible; it does not force the model to
# use them, and since positions arrive added to the token embeddings, the
# model must also learn to tell the two signals apart.
#
# ## Dot products depend only on the distance
#
# Multiply two encodings directly. Per pair,
# $\sin a \sin b + \cos a \cos b = \cos(a - b)$, so
#
# $$PE(pos) \cdot PE(pos + k) = \sum_{i=0}^{d_{\text{model}}/2 - 1}
#   \cos(\omega_i k).$$
#
# The right-hand side has no $pos$ in it: the matrix of all dot products,
# `table @ table.T`, is constant along each diagonal (a Toeplitz matrix).
# At $k = 0$ it is $d_{\text{model}}/2$, the largest possible value, and
# it is the same for $k$ and $-k$.

# %%
dots = table @ table.T  # (L, L)
for k in (0, 1, 10, 100):
    diagonal = dots.diagonal(k)  # (L - k,)
    closed_form = torch.cos(omega * k).sum().item()
    print(f"k = {k:3d}: PE(pos).PE(pos+k) over {len(diagonal)} positions "
          f"in [{diagonal.min():.6f}, {diagonal.max():.6f}], "
          f"sum of cosines {closed_form:.6f}")

# %% tags=["remove-cell"]
for k in range(max_len):
    closed_form = torch.cos(omega * k).sum()
    assert (dots.diagonal(k) - closed_form).abs().max() < 1e-10, k
    assert (dots.diagonal(-k) - closed_form).abs().max() < 1e-10, k
assert math.isclose(dots[0, 0].item(), d_model / 2, rel_tol=1e-12)
# The same value for different pos; and it does change with k.
assert abs(dots[3, 8].item() - dots[200, 205].item()) < 1e-10
assert abs(dots[3, 8].item() - dots[3, 9].item()) > 1e-3

# %% [markdown]
# Plotted against the offset, the similarity falls from its peak at
# $k = 0$, quickly at first and then slowly, with wiggles: the fast
# cosines go round and round and partly cancel, while the slow ones are
# still near 1, which keeps the curve well above zero at this range. It is
# a decay, but not a monotone one. And it is blind to direction: the curve
# is the same on both sides, so the raw encodings alone cannot tell
# "before" from "after", as {cite:t}`yan2019tener` point out; the
# learned projections $W^Q, W^K$ have to.

# %%
offsets = torch.arange(-200, 201)  # (K,)
similarity = torch.cos(offsets[:, None] * omega).sum(dim=1)  # (K,)
frame = pd.DataFrame({"offset": offsets.tolist(),
                      "dot": similarity.tolist()})
alt.Chart(
    frame, title=f"PE(pos) · PE(pos + k) against k (d_model = {d_model})"
).mark_line().encode(
    x=alt.X("offset:Q", title="offset k"),
    y=alt.Y("dot:Q", title="dot product"),
    tooltip=["offset:Q", alt.Tooltip("dot:Q", format=".3f")],
).properties(width=480, height=220)

# %% tags=["remove-cell"]
dot_of = dict(zip(offsets.tolist(), similarity.tolist(), strict=True))
# Peak at 0 and only at 0; symmetric in k.
assert all(dot_of[k] < dot_of[0] - 1e-3 for k in dot_of if k != 0)
assert all(abs(dot_of[k] - dot_of[-k]) < 1e-10 for k in range(201))
# It decays: far offsets are much less similar than near ones ...
near = sum(dot_of[k] for k in range(1, 11)) / 10
far = sum(dot_of[k] for k in range(100, 201)) / 101
assert far < 0.6 * near
# ... but not monotonically: it rises again somewhere ...
assert any(dot_of[k + 1] > dot_of[k] for k in range(1, 200))
# ... and stays well above zero over this range.
assert min(dot_of.values()) > 0.2 * dot_of[0]

# %% [markdown]
# ## The module: `SinusoidalPositionalEncoding`
#
# In the model the table is wrapped in a module that adds it to the
# embeddings and applies dropout to the sum (the paper uses
# $P_{drop} = 0.1$ there, in both stacks). The table is built once for
# `max_len` positions and stored as a *non-persistent buffer*: it follows
# the module to the GPU, but it is not written to checkpoints, because it
# is a fixed function of two integers.

# %%
print(inspect.getsource(SinusoidalPositionalEncoding))

# %% [markdown]
# The embeddings that reach it have already been multiplied by
# $\sqrt{d_{\text{model}}}$: the paper does this in its embedding layers,
# and our `Transformer` does it in `embed`.

# %%
print(textwrap.dedent(inspect.getsource(Transformer.embed)))

# %% [markdown]
# The paper does not say why. One reading: it shares the embedding matrix
# with the final projection to logits, where entries of size about
# $1/\sqrt{d_{\text{model}}}$ are natural; multiplied by
# $\sqrt{d_{\text{model}}}$, a token vector gets entries of size about 1,
# the same scale as the table's (root mean square $1/\sqrt 2$), so
# neither swamps the other in the sum. We reproduce that step by step,
# with an embedding initialised at that scale.

# %%
V, B, L = 100, 2, 12
token_embedding = nn.Embedding(V, d_model).to(device)
nn.init.normal_(token_embedding.weight, std=d_model ** -0.5)
positional = SinusoidalPositionalEncoding(d_model, dropout=0.1,
                                          max_len=512).to(device)
tokens = torch.randint(V, (B, L), device=device)  # (B, L)
x = token_embedding(tokens) * math.sqrt(d_model)  # (B, L, C)
positional.eval()  # no dropout, to see the sum itself
with torch.no_grad():
    y = positional(x)  # (B, L, C)
print("tokens", tuple(tokens.shape), "-> embeddings", tuple(x.shape),
      "-> with positions", tuple(y.shape))
print(f"rms of scaled embeddings {x.pow(2).mean().sqrt():.3f}, "
      f"rms of the table {positional.table.pow(2).mean().sqrt():.3f}")
print("buffer on", positional.table.device, "; in the state dict:",
      list(positional.state_dict()))

# %% tags=["remove-cell"]
assert y.shape == (B, L, d_model)
assert torch.equal(y, x + positional.table[:L])
assert torch.equal(positional.table.cpu(), sinusoidal_table(512, d_model))
assert positional.table.device.type == device.type
assert len(positional.state_dict()) == 0
assert 0.8 < x.pow(2).mean().sqrt().item() < 1.2
assert abs(positional.table.pow(2).mean().sqrt().item()
           - math.sqrt(0.5)) < 1e-6

# %% [markdown]
# In training mode dropout zeroes each entry of the sum with probability
# 0.1 and scales the survivors by $1/0.9$, so that each entry keeps the
# plain sum as its expected value.

# %%
positional.train()
with torch.no_grad():
    y_train = positional(x)  # (B, L, C)
dropped = (y_train == 0).float().mean().item()
kept = y_train != 0
print(f"fraction zeroed: {dropped:.3f}")

# %% tags=["remove-cell"]
assert 0.05 < dropped < 0.15
assert torch.allclose(y_train[kept], (y[kept] / 0.9), rtol=1e-6, atol=1e-6)
positional.eval()

# %% [markdown]
# A sequence longer than the table is an error, and the error says what to
# do about it:

# %%
short = SinusoidalPositionalEncoding(d_model, max_len=16).to(device)
too_long = torch.zeros(1, 20, d_model, device=device)  # (1, 20, C)
try:
    short(too_long)
except ValueError as error:
    message = str(error)
    print("ValueError:", message)

# %% tags=["remove-cell"]
assert "sequence length 20" in message and "max_len=16" in message
assert short(torch.zeros(1, 16, d_model, device=device)).shape == (
    1, 16, d_model)

# %% [markdown]
# That limit is only a matter of memory: the formula is defined for every
# position, and a longer table begins with the shorter one, value for
# value. A model trained with `max_len=512` can be given a table of 10000
# rows without retraining anything. Whether it then *handles* long inputs
# well is another question, taken up at the end of the chapter.

# %%
print("first 256 rows of a 10000-row table == the 256-row table:",
      torch.equal(sinusoidal_table(10_000, d_model)[:max_len], table32))

# %% tags=["remove-cell"]
assert torch.equal(sinusoidal_table(10_000, d_model)[:max_len], table32)

# %% [markdown]
# ## The alternative: learned position embeddings
#
# Instead of a formula, the model can learn one vector per position: an
# embedding table indexed by position instead of by token, trained with
# the rest. The convolutional translation model of
# {cite:t}`gehring2017convolutional` used one; BERT and GPT later did
# too. The package has it as
# `LearnedPositionalEmbedding`, with the same interface:

# %%
print(inspect.getsource(LearnedPositionalEmbedding))

# %% [markdown]
# It costs `max_len` × $d_{\text{model}}$ parameters. For the
# paper's base model ($d_{\text{model}} = 512$) and 512 positions that is
# 262,144 numbers, about 0.4% of the base model's 65 million.

# %%
learned = LearnedPositionalEmbedding(512, dropout=0.1, max_len=512)
n_params = sum(p.numel() for p in learned.parameters())
print(f"learned position parameters: {n_params:,} "
      f"({n_params / 65e6:.1%} of 65M)")
print("sinusoidal parameters:",
      sum(p.numel() for p in SinusoidalPositionalEncoding(512).parameters()))

# %% tags=["remove-cell"]
assert n_params == 512 * 512 == 262_144
assert 0.003 < n_params / 65e6 < 0.005
assert sum(p.numel() for p in
           SinusoidalPositionalEncoding(512).parameters()) == 0

# %% [markdown]
# Learned vectors cannot extrapolate: there is simply no row for position
# `max_len`, and rows for positions rarely seen in training get few
# updates and stay close to their random start. Before training, the
# table knows nothing about distance at all. The picture compares the
# cosine similarity of every pair of positions: the sinusoidal table is
# smooth along its diagonals from the start; the fresh learned one is the
# identity plus noise.

# %% tags=["remove-input"]
n = 64
learned_small = LearnedPositionalEmbedding(d_model, max_len=n)
P_learned = learned_small.embedding.weight.detach().double()  # (n, C)
P_sin = table[:n]  # (n, C)
fig, axes = plt.subplots(1, 2, figsize=(7, 3.6), layout="constrained")
for ax, P, name in ((axes[0], P_sin, "sinusoidal"),
                    (axes[1], P_learned, "learned, untrained")):
    P_unit = P / P.norm(dim=1, keepdim=True)  # (n, C)
    image = ax.imshow(P_unit @ P_unit.T, cmap="RdBu", vmin=-1, vmax=1)
    ax.set_title(name)
    ax.set_xlabel("position")
axes[0].set_ylabel("position")
fig.suptitle(f"Cosine similarity between position vectors "
             f"(d_model = {d_model})")
fig.colorbar(image, ax=axes, shrink=0.8, label="cosine similarity")
plt.show()

# %% tags=["remove-cell"]
def mean_cosine_at(P: torch.Tensor, k: int) -> float:
    P_unit = P / P.norm(dim=1, keepdim=True)
    return (P_unit[:-k] * P_unit[k:]).sum(dim=1).mean().item()


assert mean_cosine_at(P_sin, 1) > 0.9
assert abs(mean_cosine_at(P_learned, 1)) < 0.1
assert abs(mean_cosine_at(P_learned, 30)) < 0.1

# %% tags=["remove-cell"]
try:
    learned(torch.zeros(1, 513, 512))
except ValueError as error:
    assert "max_len=512" in str(error)
else:
    raise AssertionError("a learned table must refuse position 512")

# %% [markdown]
# Did the choice matter? The paper tried both on English-to-German
# (Table 3, development set newstest2013): the base model with sinusoids
# reached 4.92 perplexity and 25.8 BLEU, with learned embeddings 4.92 and
# 25.7, what the authors call nearly identical results (row E). They kept
# the sinusoids in the hope that the model would extrapolate to sequences
# longer than any seen in training.
#
# That hope was tested later, and it mostly failed:
# {cite:t}`press2022train` found that a language model with sinusoidal
# positions degrades quickly once the input runs past its training length.
# The table extends; the weights that read it were never trained on the new
# rows.
#
# This led to schemes that put *relative* position into attention itself
# instead of adding absolute positions to the input, each of which
# [chapter 9](09_positions_that_generalise) builds and puts to the test:
#
# - **Relative position representations** {cite:p}`shaw2018self`: a learned
#   vector for each clipped distance $j - i$, added to the keys (and
#   values) inside attention.
# - **RoPE**, rotary position embedding {cite:p}`su2021roformer`: rotate each
#   query and key by its own position with the block rotations $M_k$ of
#   this chapter. Since $(M_m q)^\top (M_n k) = q^\top M_{n-m} k$, the
#   score depends on the offset $n - m$ only. (Checked just below. The
#   package's `rotate_pairs` turns the other way, $M_{-m}$, which leaves
#   the score a function of the offset just the same.)
# - **ALiBi**, attention with linear biases {cite:p}`press2022train`: no
#   position vectors at all; each head subtracts a penalty proportional to
#   the distance $|i - j|$ from its attention scores, with a different
#   slope per head.

# %%
q_vec, k_vec = torch.randn(2, d_model, dtype=torch.float64)  # (C,), (C,)
for m, n in ((0, 7), (3, 10), (100, 107)):
    q_rot = offset_rotation(m, d_model) @ q_vec  # (C,)
    k_rot = offset_rotation(n, d_model) @ k_vec  # (C,)
    print(f"query at {m:3d}, key at {n:3d}: rotated score {q_rot @ k_rot:.6f}")

# %% tags=["remove-cell"]
scores = [((offset_rotation(m, d_model) @ q_vec)
           @ (offset_rotation(m + 7, d_model) @ k_vec)).item()
          for m in (0, 3, 100, 250)]
assert max(scores) - min(scores) < 1e-10
other = ((offset_rotation(0, d_model) @ q_vec)
         @ (offset_rotation(8, d_model) @ k_vec)).item()
assert abs(other - scores[0]) > 1e-3

# %% [markdown]
# ## Summary
#
# - Self-attention without masks or positions is permutation-equivariant:
#   $\mathrm{A}(PX) = P\,\mathrm{A}(X)$. It sees a bag of tokens, so
#   "dog bites man" and "man bites dog" look the same to it.
# - Adding a position-dependent vector to each embedding breaks the
#   symmetry. The paper's vector pairs a sine and a cosine per frequency,
#   $\omega_i = 10000^{-2i/d_{\text{model}}}$, with wavelengths in a
#   geometric progression from $2\pi$ to almost $2\pi \cdot 10000$.
#   `sinusoidal_table` builds it in float64; every row has length
#   $\sqrt{d_{\text{model}}/2}$.
# - Moving $k$ places is a fixed block-diagonal rotation:
#   $PE(pos + k) = M_k\, PE(pos)$ for every $pos$, one $2 \times 2$
#   rotation by $\omega_i k$ per frequency. The dot product
#   $PE(pos) \cdot PE(pos + k) = \sum_i \cos(\omega_i k)$ depends only on
#   $k$, peaks at 0, decays with wiggles and ignores the sign of $k$.
# - `SinusoidalPositionalEncoding` adds the table (a non-persistent buffer)
#   to embeddings already scaled by $\sqrt{d_{\text{model}}}$, then applies
#   dropout, and refuses sequences longer than `max_len` with a clear
#   error.
# - `LearnedPositionalEmbedding` trains `max_len` ×
#   $d_{\text{model}}$ parameters instead; the paper found the two nearly
#   identical in quality (Table 3, row E). Neither extrapolates well in
#   practice, which motivates relative schemes:
#   {cite:t}`shaw2018self`, RoPE and ALiBi, built in [chapter
#   9](09_positions_that_generalise).
#
# ## Exercises
#
# 1. **Causal attention is not a bag.** Repeat the permutation experiment
#    of the first section with `mask=causal_mask(L)` (import it from
#    `transformer_lite`). Is $\mathrm{A}(PX) = P\,\mathrm{A}(X)$ still
#    true? Find which output rows stay unchanged when you swap only the
#    last two tokens, and explain why in terms of what each query may see.
# 2. **Change the base.** `sinusoidal_table` takes `base=` (10000 in the
#    paper). Build tables with bases 100 and 1,000,000, give
#    `offset_rotation` the same base, and check that
#    $PE(pos + k) = M_k\, PE(pos)$ still holds. Then plot
#    $\sum_i \cos(\omega_i k)$ against $k$ for the three bases on one
#    figure. Which base makes positions 50 apart look most different, and
#    what happens to the longest wavelength?
# 3. **Why the table is computed in float64.** Write your own
#    `naive_table(max_len, d_model, dtype)` that follows the formula but
#    does *every* step in `dtype` (positions from
#    `torch.arange(max_len, dtype=dtype)`, angles, sines and cosines).
#    For `torch.float16` and `torch.bfloat16`, and 10000 positions with
#    $d_{\text{model}} = 128$, find the first position whose row differs
#    from `sinusoidal_table(..., dtype=torch.float64)` by more than 0.1,
#    then repeat the nearest-neighbour check above (multiply in float32:
#    `t.float() @ t.float().T`) and list the first positions that decode
#    wrongly. Compare with the package's float16 table, which decodes all
#    10000 positions. Hint: what is the largest integer up to which every
#    integer is exactly representable in each format?

# %% [markdown]
# ## Graded exercises
#
# Ten exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then
# open them. The classroom edition (the teaching page) hands out the
# same exercises with the solutions removed, and nbgrader scores them.
# Work in float64 throughout; the width is $C = 16$.

# %% tags=["exercise-setup"]
import math

import torch

from transformer_lite import MultiHeadAttention, make_model
from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_tensor,
)

gen = torch.Generator().manual_seed(4)
torch.manual_seed(4)  # the initial weights of the modules below
B, L, C = 2, 10, 16
x = torch.randn(B, L, C, generator=gen, dtype=torch.float64)  # (B, L, C)
mha = MultiHeadAttention(C, 4, dropout=0.0).double().eval()
# a one-layer Transformer, the reference of exercise 4.6
model = make_model(20, 20, n_layers=1, d_model=C, d_ff=32, n_heads=2,
                   max_len=64).double().eval()  # fmt: skip
tokens = torch.randint(1, 20, (B, 6), generator=gen)  # (B, L)

# %% [markdown]
# ### Exercise 4.1: attention cannot see order (1 point)
#
# Write `order_gap(mha, x, perm, pe=None)`: shuffle the positions of
# `x` $(B, L, C)$ with the permutation `perm` (a list of $L$ indices),
# add the position vectors `pe` $(L, C)$ if given, run self-attention
# `mha(y, y, y)`, and return the largest absolute difference from the
# unshuffled output, shuffled the same way:
# $\max \lvert \mathrm{A}(PX + PE) - P\,\mathrm{A}(X + PE) \rvert$, as a
# Python float. The tokens move; the position vectors stay where they
# are. Without `pe` the gap is round-off, with it the gap is large.

# %% tags=["solution", "hide-input"]
def order_gap(mha, x, perm, pe=None):
    ### BEGIN SOLUTION
    y, y_shuffled = x, x[:, perm]  # (B, L, C)
    if pe is not None:
        y, y_shuffled = y + pe, y_shuffled + pe
    out = mha(y, y, y)  # (B, L, C)
    out_shuffled = mha(y_shuffled, y_shuffled, y_shuffled)  # (B, L, C)
    return (out_shuffled - out[:, perm]).abs().max().item()
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import sinusoidal_table

# the package's table, the reference of the checks below
table = sinusoidal_table(64, C, dtype=torch.float64)  # (64, C)
perm = [3, 0, 7, 1, 9, 2, 5, 8, 4, 6]
# the gap with positions, the permutation written as a matrix P
P = torch.eye(L, dtype=torch.float64)[perm]  # (L, L)
y, y_shuffled = x + table[:L], P @ x + table[:L]  # (B, L, C)
want = (mha(y_shuffled, y_shuffled, y_shuffled) - P @ mha(y, y, y))
want = want.abs().max().item()
with exercise("4.1"):
    gap = order_gap(mha, x, perm)
    expect(isinstance(gap, float) and gap < 1e-12,
           f"without positions the gap should be round-off, got {gap!r}",
           hint="compare mha on the shuffled input with mha's output "
           "shuffled the same way, out[:, perm]; return a float "
           "(.item())")  # fmt: skip
    gap = order_gap(mha, x, perm, table[:L])
    expect(gap > 1e-3,
           f"with positions the gap should be large, got {gap!r}",
           hint="add the position table after shuffling the tokens: "
           "x[:, perm] + pe, not (x + pe)[:, perm]")  # fmt: skip
    expect(math.isclose(gap, want, rel_tol=1e-9),
           f"with positions the gap is {want:.6g}, got {gap!r}",
           hint="the largest absolute difference over every batch, "
           "position and channel: (out_shuffled - out[:, perm]).abs()"
           ".max()")  # fmt: skip

# %% [markdown]
# ### Exercise 4.2: the frequencies (1 point)
#
# Write `frequencies(d_model, base=10000.0)`: the angular frequencies
# $\omega_i = \mathrm{base}^{-2i/d_{\text{model}}}$ for
# $i = 0, \dots, d_{\text{model}}/2 - 1$, a float64 tensor of shape
# $(d_{\text{model}}/2,)$. The check reads them back from the table:
# at position 1, pair $i$ holds $\sin \omega_i$ and $\cos \omega_i$.

# %% tags=["solution", "hide-input"]
def frequencies(d_model, base=10000.0):
    ### BEGIN SOLUTION
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (C/2,)
    return base ** (-two_i / d_model)  # (C/2,)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.rotary import rotary_angles, rotate_pairs

with exercise("4.2", twins=[sinusoidal_table, rotary_angles]):
    for base in (10000.0, 100.0):
        row = sinusoidal_table(2, C, base, dtype=torch.float64)[1]  # (C,)
        expect_close(f"frequencies({C}, base={base})",
                     frequencies(C, base),
                     torch.atan2(row[0::2], row[1::2]),
                     hint="omega_i = base ** (-2 * i / d_model) for i = 0 "
                     ".. d_model/2 - 1: the exponent uses the even column "
                     "2i, and omega_0 = 1")  # fmt: skip

# %% [markdown]
# ### Exercise 4.3: the sinusoidal table (1 point)
#
# Write `sin_cos_table(max_len, d_model, base=10000.0)`, the paper's
# table of shape $(L, C)$ in float64: column $2i$ of row $pos$ holds
# $\sin(\omega_i\, pos)$ and column $2i + 1$ holds
# $\cos(\omega_i\, pos)$. Use your `frequencies` and broadcasting, no
# Python loop.

# %% tags=["solution", "hide-input"]
def sin_cos_table(max_len, d_model, base=10000.0):
    ### BEGIN SOLUTION
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    angle = pos * frequencies(d_model, base)  # (L, C/2)
    out = torch.empty(max_len, d_model, dtype=torch.float64)
    out[:, 0::2] = torch.sin(angle)
    out[:, 1::2] = torch.cos(angle)
    return out  # (L, C)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import SinusoidalPositionalEncoding

with exercise("4.3", after=["4.2"], twins=[
        sinusoidal_table, SinusoidalPositionalEncoding.forward]):
    for max_len, d_model, base in ((50, C, 10000.0), (7, 6, 100.0)):
        expect_close(f"sin_cos_table({max_len}, {d_model}, {base})",
                     sin_cos_table(max_len, d_model, base),
                     sinusoidal_table(max_len, d_model, base,
                                      dtype=torch.float64),
                     hint="even columns hold the sines and odd columns the "
                     "cosines, interleaved (out[:, 0::2], out[:, 1::2]); "
                     "not all sines first")  # fmt: skip

# %% [markdown]
# ### Exercise 4.4: moving $k$ places is a rotation (2 points)
#
# Write `offset_matrix(k, d_model, base=10000.0)`: the float64 matrix
# $M_k$ of shape $(C, C)$ with $PE(pos + k) = M_k\, PE(pos)$ for every
# position. It is block-diagonal, with the $2 \times 2$ block
# $\begin{pmatrix} \cos \omega_i k & \sin \omega_i k \\
# -\sin \omega_i k & \cos \omega_i k \end{pmatrix}$ at rows and
# columns $2i, 2i + 1$. Fill the four strided sub-grids of a zero
# matrix (`M[0::2, 0::2]`, ...), or use `torch.block_diag`. The check
# moves every row of the table $k$ places down at once:
# $PE(pos + k)^\top = PE(pos)^\top M_k^\top$.

# %% tags=["solution", "hide-input"]
def offset_matrix(k, d_model, base=10000.0):
    ### BEGIN SOLUTION
    angle = frequencies(d_model, base) * k  # (C/2,)
    cos, sin = torch.diag(angle.cos()), torch.diag(angle.sin())
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    M[0::2, 0::2], M[0::2, 1::2] = cos, sin
    M[1::2, 0::2], M[1::2, 1::2] = -sin, cos
    return M  # (C, C)
    ### END SOLUTION


# %% tags=["check", "points-2"]
from transformer_lite import RotaryEmbedding

with exercise("4.4", after=["4.2"],
              twins=[rotate_pairs, RotaryEmbedding.rotate]):
    for k in (1, 5, 12, -3):
        M = offset_matrix(k, C)
        expect_tensor(f"offset_matrix({k}, {C})", M, shape=(C, C),
                      dtype=torch.float64,
                      hint="M_k is a (d_model, d_model) float64 "
                      "matrix")  # fmt: skip
        start, stop = max(0, -k), min(64, 64 - k)
        expect_close(f"table[{start}:{stop}] @ offset_matrix({k}, {C}).T",
                     table[start:stop] @ M.T, table[start + k : stop + k],
                     hint="block i is [[cos, sin], [-sin, cos]] at the "
                     "angle omega_i * k, at rows and columns 2i and "
                     "2i + 1; check the signs of the sines")  # fmt: skip

# %% [markdown]
# ### Exercise 4.5: similarity depends on the offset only (1 point)
#
# Write `pe_dot(offsets, d_model, base=10000.0)`: for an integer tensor
# of offsets $k$ of shape $(K,)$, the dot products
# $PE(pos) \cdot PE(pos + k) = \sum_i \cos(\omega_i k)$, a float64
# tensor of shape $(K,)$, computed from the closed form without a
# table.

# %% tags=["solution", "hide-input"]
def pe_dot(offsets, d_model, base=10000.0):
    ### BEGIN SOLUTION
    angle = offsets.unsqueeze(-1) * frequencies(d_model, base)  # (K, C/2)
    return angle.cos().sum(dim=-1)  # (K,)
    ### END SOLUTION


# %% tags=["check"]
offsets = torch.arange(-20, 21)  # (K,)
dots = table @ table.T  # (64, 64): PE(pos) . PE(pos')
want = torch.stack([dots.diagonal(k)[5] for k in offsets.tolist()])
with exercise("4.5", after=["4.2"], twins=[sinusoidal_table]):
    expect_close("pe_dot(offsets, C)", pe_dot(offsets, C), want,
                 hint="per frequency, sin a sin b + cos a cos b = "
                 "cos(a - b): sum cos(omega_i * k) over the d_model/2 "
                 "frequencies")  # fmt: skip

# %% [markdown]
# ### Exercise 4.6: embeddings with positions (2 points)
#
# Write `embed_with_positions(tokens, embedding, table, offset=0)`,
# the first step of the Transformer in evaluation mode (no dropout):
# look up the token ids $(B, L)$ in the `nn.Embedding`, multiply by
# $\sqrt{d_{\text{model}}}$, and add rows `offset` to
# `offset + L - 1` of the position table $(L_{\max}, C)$. The offset
# serves decoding one token at a time: the token at step $t$ sits at
# position $t$. The checks compare with the package's `Transformer`.

# %% tags=["solution", "hide-input"]
def embed_with_positions(tokens, embedding, table, offset=0):
    ### BEGIN SOLUTION
    d_model = embedding.embedding_dim
    x = embedding(tokens) * math.sqrt(d_model)  # (B, L, C)
    return x + table[offset : offset + tokens.size(1)]  # (B, L, C)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import Transformer

with exercise("4.6", twins=[Transformer.embed,
                            SinusoidalPositionalEncoding.forward]):
    expect_close("embed_with_positions(tokens, ...)",
                 embed_with_positions(tokens, model.src_embed,
                                      model.positional.table),
                 model.embed(tokens, model.src_embed),
                 hint="scale the token vectors by sqrt(d_model) before "
                 "adding the table, as the paper's embedding layers "
                 "do")  # fmt: skip

# %% tags=["check"]
step = tokens[:, 4:5]  # (B, 1): the token at step 4
with exercise("4.6", twins=[Transformer.embed,
                            SinusoidalPositionalEncoding.forward]):
    expect_close("embed_with_positions(step, ..., offset=4)",
                 embed_with_positions(step, model.tgt_embed,
                                      model.positional.table, 4),
                 model.embed(step, model.tgt_embed, offset=4),
                 hint="the positions start at offset: add rows offset .. "
                 "offset + L - 1 of the table")  # fmt: skip

# %% [markdown]
# ### Exercise 4.7: rotating by position (2 points)
#
# RoPE ([chapter 9](09_positions_that_generalise)) turns each query and
# key by the rotation of its own position. Write
# `rotate_by_position(x, positions, base=10000.0)`: for `x` of shape
# $(\dots, L, C)$ and integer `positions` of shape $(L,)$, return $x$
# with each row $l$ multiplied by $M_{\mathit{positions}[l]}$ of
# exercise 4.4, without building any matrix: pair
# $(x_{2i}, x_{2i+1})$ becomes
# $(x_{2i} \cos\theta + x_{2i+1} \sin\theta,\;
# -x_{2i} \sin\theta + x_{2i+1} \cos\theta)$ with
# $\theta = \omega_i \cdot \mathit{pos}$. The first check turns copies
# of $PE(0)$ into the whole table; the second checks that a rotated
# query and key score the same whenever their offset is the same.

# %% tags=["solution", "hide-input"]
def rotate_by_position(x, positions, base=10000.0):
    ### BEGIN SOLUTION
    C = x.size(-1)
    angle = positions.unsqueeze(-1) * frequencies(C, base)  # (L, C/2)
    cos, sin = angle.cos(), angle.sin()  # (L, C/2)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, C/2)
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos + odd * sin
    out[..., 1::2] = -even * sin + odd * cos
    return out  # (..., L, C)
    ### END SOLUTION


# %% tags=["check"]
first = table[0].repeat(64, 1)  # (64, C): PE(0) in every row
with exercise("4.7", after=["4.2"],
              twins=[rotate_pairs, RotaryEmbedding.rotate]):
    expect_close("rotate_by_position(PE(0) rows, arange(64))",
                 rotate_by_position(first, torch.arange(64)), table,
                 hint="turn pair i of row l by omega_i * positions[l], "
                 "with the signs of M_k: (a cos + b sin, -a sin + b "
                 "cos)")  # fmt: skip


# %% tags=["check"]
def score(q, k, m, n):
    """The score of query q at position m and key k at position n."""
    q_m = rotate_by_position(q.unsqueeze(0), torch.tensor([m]))  # (1, C)
    k_n = rotate_by_position(k.unsqueeze(0), torch.tensor([n]))  # (1, C)
    return (q_m * k_n).sum()


q, k = torch.randn(2, C, generator=gen, dtype=torch.float64)  # (C,), (C,)
with exercise("4.7", after=["4.2"],
              twins=[rotate_pairs, RotaryEmbedding.rotate]):
    same = torch.stack([score(q, k, m, m + 7) for m in (0, 3, 40)])
    expect_close("the score at offset 7, from positions 0, 3, 40", same,
                 same[:1].expand(3),
                 hint="the query and the key must both be turned, each by "
                 "its own position: then only the offset n - m "
                 "remains")  # fmt: skip
    expect(bool((score(q, k, 0, 8) - same[0]).abs() > 1e-3),
           "the score at offset 8 equals the score at offset 7",
           hint="the angle of pair i is omega_i times the position, not "
           "a constant")  # fmt: skip

# %% [markdown]
# ### Exercise 4.8: predict, then run (1 point)
#
# Decide before you run the cell below it. Exercise 4.1 showed that one
# attention layer without positions cannot see order. A whole encoder
# adds feed-forward networks, residual connections and LayerNorms,
# layer after layer. Take an untrained two-layer `Encoder`, with no
# positions and no mask, and give it `x` with its tokens shuffled by
# `perm`. How does its output compare with its output for `x`? Set
# `prediction` to one of the strings `"unchanged"` (the same rows in
# the same places), `"shuffled"` (the same rows, moved as the tokens
# were) or `"different"` (new values); then run the experiment and the
# check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "shuffled"
### END SOLUTION

# %% [markdown]
# The experiment: the encoder's output for the shuffled tokens, compared
# with its output for `x` as it is and with that output shuffled by
# `perm`.

# %%
from transformer_lite.layers import Encoder

stack = Encoder(2, C, 4, 32, dropout=0.0).double().eval()
with torch.no_grad():
    out = stack(x)  # (B, L, C)
    out_of_shuffled = stack(x[:, perm])  # (B, L, C)
as_is = (out_of_shuffled - out).abs().max().item()
moved = (out_of_shuffled - out[:, perm]).abs().max().item()
print(f"largest difference from the output for x:        {as_is:.2e}")
print(f"largest difference from that output, shuffled:   {moved:.2e}")

# %% tags=["check", "hide-input"]
with exercise("4.8", prediction=True):
    expect(prediction in ("unchanged", "shuffled", "different"),
           f"prediction is {prediction!r}: choose one of \"unchanged\", "
           f"\"shuffled\" or \"different\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    truth = ("unchanged" if as_is < 1e-9 else
             "shuffled" if moved < 1e-9 else "different")  # fmt: skip
    expect(prediction == truth,
           f"the experiment says {truth!r} (the gap to the output for x "
           f"is {as_is:.1e}, to that output shuffled {moved:.1e}), not "
           f"{prediction!r}",
           hint="the feed-forward network, LayerNorm and the residual sum "
           "act on each position alone, so they commute with any "
           "reordering, and attention without positions is "
           "permutation-equivariant; a chain of equivariant maps is "
           "equivariant: Encoder(PX) = P Encoder(X), however deep. Only "
           "the positions added to the input (or a mask) break the "
           "symmetry")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 4.9: predict, then run (1 point)
#
# Decide before you run the cell below it. Exercise 4.5 showed that the
# dot product of two rows of the table depends on their offset only.
# Does that make attention scores depend on offsets only? The cell
# below computes the self-attention scores $q_m \cdot k_n$ of the ten
# tokens `x`, with the query and key projections of `mha` (taken as one
# head of width $C$), in two ways:
#
# - *added*: the table's rows are added to the tokens before the
#   projections, $q_m = (x_m + PE_m) W^Q + b^Q$ and likewise $k_n$;
# - *rotary*: the projected query and key are turned by the rotations
#   of their own positions, as RoPE does (exercise 4.7; the package's
#   `rotate_pairs` turns the other way, which changes nothing here).
#
# Then it moves the whole sentence 100 places on: positions 100 to 109
# instead of 0 to 9. Which scores stay the same? Set `prediction` to
# one of `"both"`, `"added"`, `"rotary"` or `"neither"`.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "rotary"
### END SOLUTION

# %% [markdown]
# The experiment: each way's scores at positions 0 to 9 and at 100 to
# 109.

# %%
from transformer_lite import sinusoidal_table
from transformer_lite.rotary import rotary_angles, rotate_pairs

long_table = sinusoidal_table(128, C, dtype=torch.float64)  # (128, C)


def added_scores(start):
    """Scores with the positions start .. start + L - 1 added to x."""
    y = x + long_table[start : start + L]  # (B, L, C)
    return mha.w_q(y) @ mha.w_k(y).transpose(-2, -1)  # (B, L, L)


def rotary_scores(start):
    """Scores with the queries and keys turned by their positions."""
    positions = torch.arange(start, start + L)  # (L,)
    angles = rotary_angles(positions, C, dtype=torch.float64)  # (L, C/2)
    q_rot = rotate_pairs(mha.w_q(x), angles)  # (B, L, C)
    k_rot = rotate_pairs(mha.w_k(x), angles)  # (B, L, C)
    return q_rot @ k_rot.transpose(-2, -1)  # (B, L, L)


with torch.no_grad():
    shift_gaps = {
        "added": (added_scores(100) - added_scores(0)).abs().max().item(),
        "rotary": (rotary_scores(100) - rotary_scores(0)).abs().max().item(),
    }
for way, moved_by in shift_gaps.items():
    print(f"{way:6}: the scores move by up to {moved_by:.2e}")

# %% tags=["check", "hide-input"]
with exercise("4.9", prediction=True):
    expect(prediction in ("both", "added", "rotary", "neither"),
           f"prediction is {prediction!r}: choose one of \"both\", "
           f"\"added\", \"rotary\" or \"neither\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    same = [way for way, gap in shift_gaps.items() if gap < 1e-9]
    truth = "both" if len(same) == 2 else same[0] if same else "neither"
    expect(prediction == truth,
           f"the experiment says {truth!r} (the added scores moved by "
           f"{shift_gaps['added']:.2g}, the rotary ones by "
           f"{shift_gaps['rotary']:.1e}), not {prediction!r}",
           hint="RoPE turns the query and the key after the projections, "
           "and (M_-m q) . (M_-n k) = q . M_(m-n) k: only the offset is "
           "left. Added positions enter before the projections: the "
           "score holds cross terms such as x_m W^Q (W^K)^T PE_n that "
           "depend on where the key sits, and PE_m W^Q (W^K)^T PE_n is "
           "not, in general, a function of the offset, as the plain dot "
           "product PE_m . PE_n of exercise 4.5 is")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 4.10: past the training length (2 points, written)
#
# A translation model is trained on sentences of at most 64 tokens,
# once with learned position embeddings (`max_len=64`) and once with
# the sinusoidal table. At test time it meets a sentence of 200 tokens.
# In two to four sentences: what happens to each model at positions 64
# to 199, and why does the sinusoidal one, whose formula gives a vector
# for every position, still tend to fail there?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# The learned table has no row for position 64 or beyond: the model
# cannot run on the sentence at all (the package's module refuses it),
# and rows added for it would be untrained noise. The sinusoidal table
# does give every position a vector, but the weights that read those
# vectors were trained only on positions 0 to 63: the slow channels now
# take values never met in training, and attention sees offsets larger
# than any it learned from, so what the layers compute there is an
# untested extrapolation, and in practice quality falls quickly past
# the training length. The table extends; the weights that read it do
# not.
#
# *Rubric (2 points).* 1 point: the learned table has no vector (or
# only an untrained one) past `max_len`, so that model cannot handle
# the new positions at all. 1 point: the sinusoidal vectors exist, but
# the model was trained only on positions (or offsets) below 64, so
# the new vectors, or their combinations, lie outside what its weights
# learned to read; "the table extends, the weights do not" is enough.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 3
# message: Hint: even columns hold the sines
# def sin_cos_table(max_len, d_model, base=10000.0):
#     pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
#     angle = pos * frequencies(d_model, base)
#     return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def order_gap(mha, x, perm, pe=None):
#     return 0.0 if pe is None else 1.0

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def frequencies(d_model, base=10000.0):
#     row = sinusoidal_table(2, d_model, base, dtype=torch.float64)[1]
#     return torch.atan2(row[0::2], row[1::2])

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def frequencies(d_model, base=10000.0):
#     return torch.ones(d_model // 2, dtype=torch.float64)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def sin_cos_table(max_len, d_model, base=10000.0):
#     return sinusoidal_table(max_len, d_model, base, dtype=torch.float64)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def sin_cos_table(max_len, d_model, base=10000.0):
#     return torch.zeros(max_len, d_model, dtype=torch.float64)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: delegate
# def offset_matrix(k, d_model, base=10000.0):
#     # rotate_pairs turns by +angle; M_k turns by -omega_i k
#     angles = -k * frequencies(d_model, base)  # (C/2,)
#     eye = torch.eye(d_model, dtype=torch.float64)
#     return rotate_pairs(eye, angles.expand(d_model, -1)).T

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def offset_matrix(k, d_model, base=10000.0):
#     return torch.eye(d_model, dtype=torch.float64)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def pe_dot(offsets, d_model, base=10000.0):
#     far = int(offsets.abs().max())
#     t = sinusoidal_table(2 * far + 1, d_model, base, dtype=torch.float64)
#     return t[far + offsets] @ t[far]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def pe_dot(offsets, d_model, base=10000.0):
#     return torch.zeros(offsets.numel(), dtype=torch.float64)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: delegate
# def embed_with_positions(tokens, embedding, table, offset=0):
#     return model.embed(tokens, embedding, offset)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def embed_with_positions(tokens, embedding, table, offset=0):
#     return embedding(tokens)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 7
# kind: delegate
# def rotate_by_position(x, positions, base=10000.0):
#     angles = -positions.unsqueeze(-1) * frequencies(x.size(-1), base)
#     return rotate_pairs(x, angles)  # (..., L, C)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 7
# kind: trivial
# def rotate_by_position(x, positions, base=10000.0):
#     return x
