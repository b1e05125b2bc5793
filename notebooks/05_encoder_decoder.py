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
# # 5. The encoder/decoder stack
#
# Chapters 1 to 4 built the two ideas that make the Transformer new:
# attention, split into heads, and positions added to the embeddings.
# What remains is the plumbing that turns them into a translation model,
# and plumbing is where most of the details hide. This chapter assembles
# the whole model, part by part:
#
# - the position-wise feed-forward network, the second sublayer of every
#   layer;
# - residual connections and LayerNorm, and the two places LayerNorm can
#   sit (post-LN, as in the paper, and pre-LN, as in most code since);
# - the Annotated Transformer's own LayerNorm, and why ours is PyTorch's;
# - the encoder layer, the decoder layer and the stacks of $N = 6$;
# - the embeddings scaled by $\sqrt{d_{model}}$, the output projection and
#   tied embeddings;
# - the parameter count of the paper's base and big models, from formulas
#   and from the code, against the paper's Table 3;
# - proof that our layers compute exactly what `nn.TransformerEncoderLayer`
#   and `nn.TransformerDecoderLayer` compute;
# - one forward pass through an untrained model, every shape printed.
#
# It teaches `transformer_lite/layers.py` and `transformer_lite/model.py`,
# with `transformer_lite/interop.py` for the comparisons with PyTorch. The
# shape legend is the book's: B batch, S source length, T target length,
# L any length, C = `d_model`, H heads, D = `d_k`, V vocabulary.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(5)

# %%
import inspect
import math
import platform
import textwrap
import time
import warnings

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch
from torch import nn

import transformer_lite
from transformer_lite import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    Transformer,
    causal_mask,
    default_device,
    make_model,
    padding_mask,
    seed_everything,
    target_mask,
)
from transformer_lite.device import book_seed, no_tf32
from transformer_lite.interop import (
    from_torch_decoder_layer,
    from_torch_encoder_layer,
)
from transformer_lite.masks import to_torch_attn_mask

device = default_device()
SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
# Exactness checks run in float64; Apple's MPS has none, so they use the CPU.
exact = device if device.type != "mps" else torch.device("cpu")
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"transformer_lite {transformer_lite.__version__}")
print(f"device: {device}, device for float64 checks: {exact}")
print(f"BOOK_SEED={SEED}")
seed_everything(SEED + 5)


def show(*objects) -> None:
    """Print the source code of package classes, methods or functions."""
    for obj in objects:
        print(textwrap.dedent(inspect.getsource(obj)))


def rms(t: torch.Tensor) -> float:
    """Root mean square of all entries: the typical size of one entry."""
    return t.detach().float().pow(2).mean().sqrt().item()


def gap(u: torch.Tensor, v: torch.Tensor) -> str:
    """The largest absolute difference between two tensors, formatted."""
    return f"{(u - v).abs().max().item():.1e}"


# %% [markdown]
# ## The map
#
# Here is the whole model before we take it apart. The encoder (left)
# reads the source sentence and turns each of its $S$ tokens into a vector;
# together they are the *memory*, of shape (B, S, C). The decoder (right)
# reads the target sentence shifted right by one place (so that the
# prediction at position $t$ is made from the tokens before $t$) and, in
# every layer,
# looks up the memory with cross-attention. A final linear layer turns the
# decoder's vectors into one score per vocabulary word. Both stacks repeat
# their layer $N$ times; the paper uses $N = 6$. The small grey names are
# the attributes of our modules, so you can find each box in the code.

# %% tags=["remove-input"]
ATT, FFN_COLOR, NORM, EMB = "#f9d9b5", "#cfe8cf", "#f3f0a8", "#e4d7f0"


def draw_box(ax, x, y, text, code="", color="#dbe9f6", w=3.0, h=0.55):
    ax.add_patch(FancyBboxPatch(
        (x - w / 2, y - h / 2), w, h, fc=color, ec="#333333", lw=0.8,
        boxstyle="round,pad=0.02,rounding_size=0.08"))
    ax.text(x, y + (0.07 if code else 0), text, ha="center", va="center",
            fontsize=8)
    if code:
        ax.text(x, y - 0.15, code, ha="center", va="center", fontsize=6,
                family="monospace", color="#555555")


def draw_arrow(ax, start, end, color="#333333", lw=0.9):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>",
                                 mutation_scale=9, color=color, lw=lw,
                                 shrinkA=0, shrinkB=0))


def draw_residual(ax, x, y0, y1, side):
    """The skip path from below a sublayer into its add & norm box."""
    x_skip = x + side * 1.65
    ax.plot([x, x_skip, x_skip], [y0, y0, y1], color="#888888", lw=0.8)
    draw_arrow(ax, (x_skip, y1), (x + side * 1.5, y1), color="#888888")


def draw_stack(ax, x, labels, side):
    """A grey block holding one layer's boxes, bottom to top."""
    top = 3.15 + 0.95 * (len(labels) - 1) + 0.7  # the block's upper edge
    ax.add_patch(FancyBboxPatch(
        (x - 1.8, 2.55), 3.6, top - 2.55, fc="#f4f4f4",
        ec="#777777", lw=0.8, boxstyle="round,pad=0.02,rounding_size=0.15"))
    ys = [3.15 + 0.95 * i for i in range(len(labels))]
    for y, (text, code, color) in zip(ys, labels, strict=True):
        draw_box(ax, x, y, text, code, color)
    for y_low, y_high in zip(ys, ys[1:], strict=False):
        draw_arrow(ax, (x, y_low + 0.28), (x, y_high - 0.28))
    draw_arrow(ax, (x, 2.55), (x, ys[0] - 0.28))
    starts = [2.75] + [y + 0.45 for y in ys[1:-1:2]]
    for y_start, y_norm in zip(starts, ys[1::2], strict=True):
        draw_residual(ax, x, y_start, y_norm, side)
    return ys


fig, ax = plt.subplots(figsize=(6.5, 7.2))
ax.set_xlim(0, 10)
ax.set_ylim(-0.2, 12.4)
ax.axis("off")
X_ENC, X_DEC = 2.7, 7.3  # centres of the encoder and decoder columns
for x, side, tokens, name in (
    (X_ENC, -1, "source tokens  (B, S)", "src_embed"),
    (X_DEC, 1, "target tokens, shifted right  (B, T)", "tgt_embed"),
):
    ax.text(x, 0.0, tokens, ha="center", va="center", fontsize=8)
    draw_arrow(ax, (x, 0.18), (x, 0.62))
    draw_box(ax, x, 0.9, "embedding × √d_model", name, EMB)
    draw_arrow(ax, (x, 1.18), (x, 1.54))
    ax.add_patch(Circle((x, 1.7), 0.16, fc="white", ec="#333333", lw=0.8))
    ax.text(x, 1.7, "+", ha="center", va="center", fontsize=9)
    draw_arrow(ax, (x, 1.86), (x, 2.55))
    ax.text(x + side * 1.35, 1.7, "positional\nencoding", ha="center",
            va="center", fontsize=7)
    draw_arrow(ax, (x + side * 0.7, 1.7), (x + side * 0.17, 1.7))

draw_stack(ax, X_ENC, [
    ("multi-head self-attention", "self_attn", ATT),
    ("add & norm", "norm1", NORM),
    ("feed-forward", "feed_forward", FFN_COLOR),
    ("add & norm", "norm2", NORM),
], side=-1)
ax.text(X_ENC - 1.65, 6.6, "Encoder", ha="left", va="top", fontsize=8,
        weight="bold")
ax.text(X_ENC - 2.0, 4.6, "N ×", ha="right", va="center", fontsize=10)

y_dec = draw_stack(ax, X_DEC, [
    ("masked multi-head self-attention", "self_attn", ATT),
    ("add & norm", "norm1", NORM),
    ("multi-head cross-attention", "cross_attn", ATT),
    ("add & norm", "norm2", NORM),
    ("feed-forward", "feed_forward", FFN_COLOR),
    ("add & norm", "norm3", NORM),
], side=1)
ax.text(X_DEC + 1.65, 8.5, "Decoder", ha="right", va="top", fontsize=8,
        weight="bold")
ax.text(X_DEC + 2.0, 5.55, "× N", ha="left", va="center", fontsize=10)

# The memory: the encoder's output becomes cross-attention's keys, values.
ax.plot([X_ENC, X_ENC, 4.85, 4.85], [6.28, 7.45, 7.45, y_dec[2]],
        color="#c0392b", lw=1.2)
draw_arrow(ax, (4.85, y_dec[2]), (X_DEC - 1.5, y_dec[2]), color="#c0392b",
           lw=1.2)
ax.text(4.95, 7.6, "memory (B, S, C):\nkeys and values", ha="center",
        va="bottom", fontsize=7, color="#c0392b")

draw_arrow(ax, (X_DEC, 8.62), (X_DEC, 9.42))
draw_box(ax, X_DEC, 9.7, "linear to V logits", "generator", EMB)
draw_arrow(ax, (X_DEC, 9.98), (X_DEC, 10.5))
draw_box(ax, X_DEC, 10.75, "softmax", "", "#ffffff")
draw_arrow(ax, (X_DEC, 11.03), (X_DEC, 11.5))
ax.text(X_DEC, 11.7, "next-token probabilities  (B, T, V)", ha="center",
        va="center", fontsize=8)
ax.set_title("The Transformer (post-LN, as in the paper)", fontsize=11)
fig.tight_layout()
plt.show()

# %% [markdown]
# Every arrow inside the two grey blocks carries a tensor of the same
# shape, (B, S, C) in the encoder and (B, T, C) in the decoder. That is the
# design's central simplification: every sublayer maps C numbers per
# position to C numbers per position, so sublayers can be stacked and
# skipped around freely. Only the bottom (token ids to vectors) and the
# top (vectors to V scores) change the shape.
#
# ## The position-wise feed-forward network
#
# Attention mixes information *between* positions. The second sublayer of
# every layer does the opposite: it transforms each position on its own,
# with the same two-layer network at every position:
#
# $$\mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2,
# \qquad W_1 \in \mathbb{R}^{d_{model} \times d_{ff}},\;
# W_2 \in \mathbb{R}^{d_{ff} \times d_{model}} .$$
#
# In the base model $d_{model} = 512$ and the inner width is four times
# larger, $d_{ff} = 2048$. Our module writes the formula with the same
# names; `nn.Linear` stores $W_1$ transposed, as (d_ff, C). The
# nonlinearity is the paper's $\max(0, \cdot)$ unless the module is told
# otherwise: BERT and GPT-2 use GELU, $x\,\Phi(x)$, a ReLU with a smooth
# corner, and the `activation` argument is there for them. The dropout
# between the two layers is not in the paper; the Annotated Transformer
# and PyTorch's layers have it, BERT and GPT-2 do not, and
# `inner_dropout=False` leaves it out.

# %%
show(FeedForward)

# %%
d_model, d_ff = 512, 2048  # the base model (Table 3 of the paper)
ffn = FeedForward(d_model, d_ff, dropout=0.1).to(device).eval()
x = torch.randn(2, 10, d_model, device=device)  # (B, L, C)
with torch.no_grad():
    hidden = F.relu(ffn.w_1(x))  # (B, L, d_ff)
    y = ffn(x)  # (B, L, C)
n_ffn = sum(p.numel() for p in ffn.parameters())
print("x      ", tuple(x.shape))
print("hidden ", tuple(hidden.shape), "  the ReLU layer, 4x wider")
print("FFN(x) ", tuple(y.shape))
print(f"parameters: {n_ffn:,} = 2·C·d_ff + d_ff + C")

# %% tags=["remove-cell"]
assert hidden.shape == (2, 10, d_ff) and y.shape == x.shape
assert n_ffn == 2 * d_model * d_ff + d_ff + d_model == 2_099_712
torch.testing.assert_close(y, ffn.w_2(hidden))

# %% [markdown]
# "Position-wise" means the network never looks at a neighbour. One way to
# see it: shuffle the positions, and the output is shuffled the same way.
# That alone is not proof, though: [chapter 4](04_positional_encoding)
# showed that self-attention without positions passes the same test, and
# attention mixes positions by design. The stronger check is to feed one
# position *alone* and get exactly the row it had in the full batch:
# nothing else influenced it.

# %%
perm = torch.randperm(10, device=device)
mha = MultiHeadAttention(d_model, 8, dropout=0.0).to(device).eval()
with torch.no_grad():
    y_perm = ffn(x[:, perm])  # (B, L, C)
    y_alone = ffn(x[:, 3:4])  # (B, 1, C): position 3 with no neighbours
    a, a_perm = mha(x, x, x), mha(x[:, perm], x[:, perm], x[:, perm])
    a_alone = mha(x[:, 3:4], x[:, 3:4], x[:, 3:4])  # (B, 1, C)

print("permute, then apply vs apply, then permute:")
print("  FFN      ", gap(y_perm, y[:, perm]))
print("  attention", gap(a_perm, a[:, perm]))
print("position 3 alone vs position 3 among the others:")
print("  FFN      ", gap(y_alone, y[:, 3:4]))
print("  attention", gap(a_alone, a[:, 3:4]))

# %% tags=["remove-cell"]
torch.testing.assert_close(y_perm, y[:, perm])
torch.testing.assert_close(a_perm, a[:, perm])
torch.testing.assert_close(y_alone, y[:, 3:4])
assert (a_alone - a[:, 3:4]).abs().max() > 1e-2

# %% [markdown]
# The paper offers another way to say the same thing: the FFN is "two
# convolutions with kernel size 1". A 1-wide convolution over the sequence
# is a linear map applied at each position, so copying $W_1$ and $W_2$
# into two `nn.Conv1d` layers gives the same numbers (a convolution wants
# the channels before the length, hence the transposes).
#
# On a GPU, "the same numbers" needs one precaution. NVIDIA GPUs since
# Ampere compute float32 convolutions in TF32 by default: cuDNN rounds
# their inputs to 10 bits of fraction (float32 keeps 23), and the outputs
# move by a few times $10^{-4}$, far beyond float32's rounding. The
# package's `no_tf32()` computes both sides in full float32 for the
# comparison; on a CPU it changes nothing.

# %%
conv_1 = nn.Conv1d(d_model, d_ff, kernel_size=1).to(device)
conv_2 = nn.Conv1d(d_ff, d_model, kernel_size=1).to(device)
with torch.no_grad(), no_tf32():
    conv_1.weight.copy_(ffn.w_1.weight.unsqueeze(-1))  # (d_ff, C, 1)
    conv_1.bias.copy_(ffn.w_1.bias)
    conv_2.weight.copy_(ffn.w_2.weight.unsqueeze(-1))  # (C, d_ff, 1)
    conv_2.bias.copy_(ffn.w_2.bias)
    x_channels = x.transpose(1, 2)  # (B, C, L)
    y_conv = conv_2(F.relu(conv_1(x_channels))).transpose(1, 2)  # (B, L, C)
    y_ffn = ffn(x)  # (B, L, C), also in full float32
print("FFN vs two 1-wide convolutions:", gap(y_conv, y_ffn))

# %% tags=["remove-cell"]
torch.testing.assert_close(y_conv, y_ffn, atol=1e-5, rtol=1e-4)


# TF32, emulated on the CPU: inputs rounded to 10 bits of fraction, products
# summed exactly. The outputs move by a few 1e-4, beyond the tolerance.
def tf32(t: torch.Tensor) -> torch.Tensor:
    bits = t.detach().float().cpu().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32).double()


with torch.no_grad():
    _w_1, _w_2 = ffn.w_1.weight, ffn.w_2.weight
    _h = F.relu(tf32(x) @ tf32(_w_1).T + ffn.w_1.bias.cpu().double())
    _y_tf32 = tf32(_h) @ tf32(_w_2).T + ffn.w_2.bias.cpu().double()
_tf32_gap = (_y_tf32 - y_ffn.cpu().double()).abs().max().item()
assert 1e-4 < _tf32_gap < 1e-3, _tf32_gap
# Two thirds of an encoder layer's parameters and arithmetic are the FFN.
n_layer = sum(p.numel() for p in EncoderLayer(d_model, 8, d_ff).parameters())
assert abs(n_ffn / n_layer - 2 / 3) < 0.01
for L in (20, 40):
    ffn_madds = 2 * d_model * d_ff
    attention_madds = 4 * d_model**2 + 2 * L * d_model
    assert abs(ffn_madds / (ffn_madds + attention_madds) - 2 / 3) < 0.03

# %% [markdown]
# Two thirds of an encoder layer's parameters live in this innocent
# network (2.1 M of 3.15 M in the base model), and so does about two
# thirds of its arithmetic for sentences of a few dozen tokens: per
# position, the FFN costs $2 C d_{ff} = 8C^2$ multiply-adds, attention
# $4C^2$ for its projections plus $2LC$ for scores and weighted sum.
# Later work reads the FFN as a key-value memory
# {cite:p}`geva2021transformer`; for us it is simply where each position
# computes on what attention brought
# it.
#
# ## Residual connections and LayerNorm
#
# Each sublayer (attention or FFN) is wrapped in two more operations. A
# *residual connection* adds the sublayer's input to its output, so the
# sublayer only has to learn a correction to the identity, and gradients
# have a direct path through the whole stack {cite:p}`he2016deep`.
# *Layer normalisation* {cite:p}`ba2016layer` rescales each position's vector
# to
# mean 0 and variance 1, then applies a learned gain $\gamma$ and bias
# $\beta$:
#
# $$\mathrm{LayerNorm}(x) = \gamma \odot
#   \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta,
# \qquad \mu = \frac{1}{C}\sum_{i=1}^{C} x_i,\quad
# \sigma^2 = \frac{1}{C}\sum_{i=1}^{C} (x_i - \mu)^2 ,$$
#
# with $\epsilon = 10^{-5}$ in PyTorch. There are two ways to put the two
# together, and the literature uses both:
#
# | | post-LN | pre-LN |
# |---|---|---|
# | one sublayer, $f$ | $\mathrm{LN}(x + f(x))$ | $x + f(\mathrm{LN}(x))$ |
# | used by | the paper, BERT | GPT-2 and most since |
# | residual stream | normalised by every sublayer | never normalised |
# | after the stack | nothing to add | one more LayerNorm |
# | `norm_first` | `False` (our default) | `True` |
#
# Stated plainly: post-LN normalises the *sum*, so what flows from layer
# to layer is always a normalised vector; pre-LN normalises only the copy
# that goes *into* the sublayer, so the main path from the embeddings to
# the output is a plain sum of sublayer outputs, untouched by any
# normalisation. The Annotated Transformer's text quotes the paper's
# $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$, and its code computes
# `x + dropout(sublayer(norm(x)))` with a final norm after each stack: it
# is pre-LN, and a comment in that code says so, putting the norm first
# for simplicity. {cite:t}`xiong2020layer` showed that pre-LN can be trained
# without the learning-rate warm-up post-LN needs; chapter 6 compares the
# two in practice.
#
# The two wirings are one line each. Here they are as functions that take
# the sublayer and the norm as arguments:

# %%
def post_ln(x, sublayer, norm):
    return norm(x + sublayer(x))  # LayerNorm(x + Sublayer(x))


def pre_ln(x, sublayer, norm):
    return x + sublayer(norm(x))  # x + Sublayer(LayerNorm(x))


# %% [markdown]
# The package's `EncoderLayer` holds both, chosen by the flag `norm_first`
# (PyTorch's name for it). The dropouts are the paper's "residual
# dropout": dropout {cite:p}`srivastava2014dropout` applied to each
# sublayer's output before the sum.

# %%
show(EncoderLayer._attend, EncoderLayer._feed, EncoderLayer.forward)

# %% [markdown]
# An encoder layer is then just two wirings in a row: attention, then the
# FFN. Built from our two functions and the layer's own modules, it gives
# the package's output to the last bit, for both flags.

# %%
def scratch_encoder_layer(layer, x, mask, wiring):
    """An encoder layer from `wiring` and the modules of `layer`."""

    def self_attention(h):
        return layer.self_attn(h, h, h, mask)

    x = wiring(x, self_attention, layer.norm1)
    return wiring(x, layer.feed_forward, layer.norm2)


x = torch.randn(2, 7, 64, device=device)  # (B, S, C)
mask = torch.ones(2, 1, 7, dtype=torch.bool, device=device)  # (B, 1, S)
mask[1, :, 5:] = False  # the second sentence has two padding tokens
for norm_first, wiring in ((False, post_ln), (True, pre_ln)):
    layer = EncoderLayer(64, 4, 256, norm_first=norm_first).to(device)
    layer.eval()  # no dropout
    with torch.no_grad():
        diff = gap(scratch_encoder_layer(layer, x, mask, wiring),
                   layer(x, mask))
    print(f"norm_first={norm_first!s:5}  {wiring.__name__}: "
          f"max difference {diff}")

# %% tags=["remove-cell"]
for norm_first, wiring in ((False, post_ln), (True, pre_ln)):
    layer = EncoderLayer(64, 4, 256, norm_first=norm_first).to(device).eval()
    with torch.no_grad():
        mine = scratch_encoder_layer(layer, x, mask, wiring)
        theirs = scratch_encoder_layer(
            layer, x, mask, pre_ln if wiring is post_ln else post_ln)
        assert torch.equal(mine, layer(x, mask))
        assert (theirs - layer(x, mask)).abs().max() > 1e-2

# %% [markdown]
# ### Why pre-LN needs a final LayerNorm
#
# In a post-LN stack every layer ends with a LayerNorm, so the output of
# the last layer is normalised like every other. In a pre-LN stack nothing
# normalises the residual stream itself: each layer adds its sublayers'
# outputs to it, and its size drifts with depth. The decoder's output goes
# straight into the output projection, which would then see vectors of a
# depth-dependent size; so pre-LN stacks end with one more LayerNorm.
#
# We can watch the drift. The next cell feeds the same random input of
# RMS 1 through 12 layers of each kind (freshly initialised as
# `make_model` does, width 128) and measures the root mean square of the
# residual stream after each layer. With LayerNorm's initial
# $\gamma = 1, \beta = 0$, post-LN pins it to 1; pre-LN lets it grow.

# %%
n_deep = 12
x = torch.randn(8, 20, 128).to(device)  # (B, S, C), RMS about 1
depth_rms, output_rms = {}, {}
for norm_first in (False, True):
    seed_everything(SEED + 12)
    model = make_model(11, 11, n_layers=n_deep, d_model=128, d_ff=512,
                       n_heads=4, norm_first=norm_first)
    encoder = model.encoder.to(device).eval()
    h, sizes = x, [rms(x)]
    with torch.no_grad():
        for layer in encoder.layers:
            h = layer(h)
            sizes.append(rms(h))
        final = encoder(x)  # with the final norm, if the stack has one
    name = "pre-LN" if norm_first else "post-LN"
    depth_rms[name] = sizes
    output_rms[name] = rms(final)
    print(f"{name:7}: RMS after layer 12 = {sizes[-1]:.2f}, "
          f"stack output = {rms(final):.2f}, final norm: {encoder.norm}")

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, sizes in depth_rms.items():
    ax.plot(range(n_deep + 1), sizes, marker="o", ms=3, label=name)
ax.set_title("Size of the residual stream through an untrained encoder")
ax.set_xlabel("layers applied")
ax.set_ylabel("RMS of the residual stream")
ax.set_ylim(0, None)
ax.legend()
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
post, pre = depth_rms["post-LN"], depth_rms["pre-LN"]
assert all(abs(s - 1) < 1e-3 for s in post[1:])
assert pre[n_deep // 2] > 1.5 * pre[0] and pre[-1] > 1.2 * pre[n_deep // 2]
# With gamma = 1, beta = 0 a row of variance s^2 leaves LayerNorm with
# mean 0 and variance s^2 / (s^2 + eps): its RMS is within eps / (2 s^2)
# of 1, under 5e-6 for the grown stream (s^2 > 1); 1e-4 allows rounding.
assert abs(output_rms["pre-LN"] - 1) < 1e-4
assert Encoder(1, 8, 2, 8, norm_first=False).norm is None
assert isinstance(Encoder(1, 8, 2, 8, norm_first=True).norm, nn.LayerNorm)
assert isinstance(Decoder(1, 8, 2, 8, norm_first=True).norm, nn.LayerNorm)
assert Decoder(1, 8, 2, 8, norm_first=False).norm is None

# %% [markdown]
# The final LayerNorm brings the pre-LN stack's output back to RMS 1.
# `Encoder` and `Decoder` create it exactly when `norm_first=True`, and
# apply it after the loop. (The `checkpointing` branch saves memory in
# training; chapter 8 explains it.)

# %%
show(Encoder.forward)

# %% [markdown]
# ### The Annotated Transformer's LayerNorm
#
# The Annotated Transformer writes its own LayerNorm, and it is not quite
# the formula above. It divides by the *unbiased* standard deviation
# (`x.std()` divides by $n - 1$, not $n$) and adds $\epsilon = 10^{-6}$ to
# the standard deviation, outside the square root:
#
# $$\mathrm{LN}_{\mathrm{AT}}(x) = \gamma \odot
#   \frac{x - \mu}{s + \epsilon} + \beta, \qquad
#   s = \sqrt{\tfrac{1}{n-1}\textstyle\sum_i (x_i - \mu)^2}
#   = \sigma \sqrt{\tfrac{n}{n-1}} .$$
#
# Ignoring $\epsilon$, its output is PyTorch's times
# $\sqrt{(n-1)/n} \approx 1 - \frac{1}{2n}$: every output is about
# $\frac{1}{2n}$ too small, 0.1% for $n = 512$. Here is that formula in a
# few lines of our own (with $\gamma = 1$, $\beta = 0$, their initial
# values), measured against `nn.LayerNorm`:

# %%
def annotated_layer_norm(x, eps=1e-6):
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)  # unbiased: divides by n - 1
    return (x - mean) / (std + eps)


n = 512
layer_norm = nn.LayerNorm(n).to(device)  # eps = 1e-5 inside the root
x = torch.randn(64, 10, n, device=device)  # (B, L, C)
with torch.no_grad():
    ours_ln, theirs_ln = layer_norm(x), annotated_layer_norm(x)
relative = (theirs_ln - ours_ln).norm(dim=-1) / ours_ln.norm(dim=-1)
float32_eps = torch.finfo(torch.float32).eps
print(f"relative difference, mean over {relative.numel()} vectors: "
      f"{relative.mean().item():.3e}")
print(f"predicted 1 - sqrt((n-1)/n):          "
      f"{1 - math.sqrt((n - 1) / n):.3e}   (1/(2n) = {1 / (2 * n):.3e})")
print(f"float32 machine epsilon:               {float32_eps:.3e}")

# %% tags=["remove-cell"]
predicted = 1 - math.sqrt((n - 1) / n)
assert abs(relative.mean().item() - predicted) < 0.02 * predicted
assert relative.min() > 1000 * float32_eps  # far above float32 rounding
assert relative.max() < 2e-3  # yet small
torch.testing.assert_close(
    theirs_ln * math.sqrt(n / (n - 1)), ours_ln, atol=1e-4, rtol=1e-4
)

# %% [markdown]
# The difference is about $10^{-3}$: eight thousand times float32's
# machine epsilon, so it is real, not rounding; and small enough that a
# model would train the same either way, since the learned gain $\gamma$
# can absorb a constant factor (multiplying by $\sqrt{n/(n-1)}$ removes
# it, as the hidden check of this cell confirms). It is not the same
# *function*, though: load weights trained with one into the other, and
# the output of every one of the base model's 30 LayerNorms moves by
# 0.1%.
#
# Where $\epsilon$ sits (and its size) matters too, but only for vectors
# whose spread is comparable to $\sqrt{\epsilon}$. PyTorch's
# $\sqrt{\sigma^2 + 10^{-5}}$ never divides by less than
# $\sqrt{10^{-5}} \approx 0.003$; the Annotated Transformer's
# $s + 10^{-6}$ divides by almost exactly $s$. For an input
# whose entries vary by about $10^{-3}$ the two disagree completely:

# %%
x_flat = 1e-3 * torch.randn(4, n, device=device)  # spread about 0.001
with torch.no_grad():
    print(f"RMS of the output, nn.LayerNorm:        "
          f"{rms(layer_norm(x_flat)):.3f}")
    print(f"RMS of the output, Annotated LayerNorm: "
          f"{rms(annotated_layer_norm(x_flat)):.3f}")

# %% tags=["remove-cell"]
with torch.no_grad():
    assert rms(layer_norm(x_flat)) < 0.5
    assert abs(rms(annotated_layer_norm(x_flat)) - 1) < 0.01

# %% [markdown]
# transformer-lite uses `nn.LayerNorm`, for three reasons. It is Ba et
# al.'s definition (they normalise by the plain, biased standard
# deviation). It is what every PyTorch Transformer module uses, which is
# what lets us prove below that our layers equal PyTorch's to $10^{-15}$.
# And it runs as one fused kernel instead of a chain of five separate
# operations.
#
# ## The encoder layer
#
# Many tutorials build the encoder layer in one line with PyTorch's
# module, `nn.TransformerEncoderLayer(d_model=512, nhead=8,
# dim_feedforward=2048, dropout=0.1, batch_first=True)`. Ours is the same
# function with the parts in plain sight: one `MultiHeadAttention`
# ([chapter 3](03_multi_head_attention)), one `FeedForward`, two
# LayerNorms, two residual dropouts. Printing the module lists them:

# %%
print(EncoderLayer(d_model=512, n_heads=8, d_ff=2048, dropout=0.1))

# %% [markdown]
# Its input and output are both (B, S, C), and its mask is the source
# padding mask of [chapter 2](02_masks), (B, 1, S): every query may
# look at every real source token, none at padding.
#
# ## The decoder layer
#
# The decoder layer has three sublayers, each wrapped the same way:
#
# 1. **masked self-attention** over the target: position $t$ may attend to
#    positions $\le t$ that are not padding (the target mask of chapter 2,
#    (B, T, T));
# 2. **cross-attention**: queries from the decoder, keys and values from
#    the encoder's memory, with the source padding mask (B, 1, S);
# 3. the **feed-forward network**.
#
# $$x \leftarrow \mathrm{Wrap}(x, \mathrm{SelfAttn}), \quad
#   x \leftarrow \mathrm{Wrap}\big(x, h \mapsto
#     \mathrm{CrossAttn}(h, m, m)\big), \quad
#   x \leftarrow \mathrm{Wrap}(x, \mathrm{FFN}),$$
#
# where $m$ is the memory and Wrap is `post_ln` or `pre_ln`.

# %%
show(DecoderLayer.forward)

# %% [markdown]
# (The `cache` argument serves fast generation, one token at a time, in
# chapter 8; without it the layer computes all T positions at once, which
# is all we need here.)

# %%
PAD_ID = 0  # the padding token id in this chapter's toy sentences
src = torch.tensor([[3, 4, 5, 6, 7, 8],
                    [3, 4, 5, 6, PAD_ID, PAD_ID]], device=device)  # (B, S)
tgt = torch.tensor([[1, 2, 3, 4, 5],
                    [1, 2, 3, PAD_ID, PAD_ID]], device=device)  # (B, T)
src_mask = padding_mask(src, PAD_ID)  # (B, 1, S)
tgt_mask = target_mask(tgt, PAD_ID)  # (B, T, T)
C_small, H_small, d_ff_small = 32, 4, 64

decoder_layer = DecoderLayer(C_small, H_small, d_ff_small).to(device).eval()
memory = torch.randn(2, 6, C_small, device=device)  # (B, S, C)
x = torch.randn(2, 5, C_small, device=device)  # (B, T, C)
with torch.no_grad():
    out = decoder_layer(x, memory, src_mask, tgt_mask)  # (B, T, C)
print("x (target)", tuple(x.shape), "  memory", tuple(memory.shape))
print("src_mask  ", tuple(src_mask.shape), "  tgt_mask",
      tuple(tgt_mask.shape))
print("output    ", tuple(out.shape))

# %% [markdown]
# The two masks do what they promise. Change a *later* target position,
# or the memory at a *padded* source position, and no earlier or real
# output moves:

# %%
x_changed = x.clone()
x_changed[:, 3:] += 10.0  # change target positions 3 and 4
memory_changed = memory.clone()
memory_changed[1, 4:] += 10.0  # change the padded source positions
with torch.no_grad():
    out_future = decoder_layer(x_changed, memory, src_mask, tgt_mask)
    out_padding = decoder_layer(x, memory_changed, src_mask, tgt_mask)
print("positions 0-2 after changing positions 3-4:",
      gap(out_future[:, :3], out[:, :3]))
print("all outputs after changing padded memory:  ",
      gap(out_padding, out))

# %% tags=["remove-cell"]
torch.testing.assert_close(out_future[:, :3], out[:, :3])
assert (out_future[:, 3:] - out[:, 3:]).abs().max() > 1e-2
torch.testing.assert_close(out_padding, out)
for norm_first in (False, True):
    layer = DecoderLayer(C_small, H_small, d_ff_small, norm_first=norm_first)
    layer = layer.to(device).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            layer(x, memory_changed, src_mask, tgt_mask),
            layer(x, memory, src_mask, tgt_mask),
        )

# %% [markdown]
# ## The stacks
#
# `Encoder` and `Decoder` repeat their layer `n_layers` times ($N = 6$ in
# the paper), each layer with its own weights, and pass the same masks
# (and, in the decoder, the same memory) to every layer. Nothing else
# happens between layers: the output of one is the input of the next. The
# base model's stacks are built below on PyTorch's `meta` device, which
# records shapes but allocates no memory (more on that in the section on
# parameter counts).

# %%
with torch.device("meta"):
    encoder = Encoder(6, 512, 8, 2048)
    decoder = Decoder(6, 512, 8, 2048)
print(f"encoder: {len(encoder.layers)} x {type(encoder.layers[0]).__name__}"
      f", {sum(p.numel() for p in encoder.parameters()):,} parameters")
print(f"decoder: {len(decoder.layers)} x {type(decoder.layers[0]).__name__}"
      f", {sum(p.numel() for p in decoder.parameters()):,} parameters")

# %% tags=["remove-cell"]
assert len(encoder.layers) == len(decoder.layers) == 6
assert encoder.layers[0] is not encoder.layers[1]
assert encoder.layers[0].self_attn.w_q.weight.is_meta

# %% [markdown]
# ## Equal to PyTorch's layers
#
# PyTorch ships both layers as `nn.TransformerEncoderLayer` and
# `nn.TransformerDecoderLayer`. `from_torch_encoder_layer` and
# `from_torch_decoder_layer` build our layer of the same size and copy
# every weight (splitting PyTorch's packed $W^Q, W^K, W^V$ as in chapter
# 3). If our code is right, the two compute the same function.
#
# We check it in float64, where rounding errors are near $10^{-16}$, so
# anything above about $10^{-12}$ would be a real difference. Both layers
# are created in float32, the weights copied, then both converted with
# `.double()`, so they hold bit-identical weights. Dropout is 0 and both
# are in eval mode. The masks need translating: PyTorch says True =
# *masked out*, and takes the padding as a separate (B, L)
# `key_padding_mask`. `to_torch_attn_mask` ([chapter 2](02_masks)) flips
# the convention.

# %%
src_e, tgt_e = src.to(exact), tgt.to(exact)
src_mask_e = padding_mask(src_e, PAD_ID)  # (B, 1, S)
tgt_mask_e = target_mask(tgt_e, PAD_ID)  # (B, T, T)
torch_masks = dict(  # PyTorch's convention: True = masked out
    src_key_padding_mask=to_torch_attn_mask(src_mask_e[:, 0]),  # (B, S)
    causal=to_torch_attn_mask(
        causal_mask(tgt_e.size(1), device=exact)[0]),  # (T, T)
    tgt_key_padding_mask=to_torch_attn_mask(
        padding_mask(tgt_e, PAD_ID)[:, 0]),  # (B, T)
)


def torch_and_ours(torch_class, convert, norm_first):
    theirs = torch_class(C_small, H_small, d_ff_small, dropout=0.0,
                         batch_first=True, norm_first=norm_first)
    ours = convert(theirs)
    return theirs.double().to(exact).eval(), ours.double().to(exact).eval()


src_x = torch.randn(2, 6, C_small, dtype=torch.float64, device=exact)
tgt_x = torch.randn(2, 5, C_small, dtype=torch.float64, device=exact)
rows = []
for norm_first in (False, True):
    theirs, ours = torch_and_ours(
        nn.TransformerEncoderLayer, from_torch_encoder_layer, norm_first)
    y_theirs = theirs(
        src_x, src_key_padding_mask=torch_masks["src_key_padding_mask"])
    y_ours = ours(src_x, src_mask_e)
    rows.append(("encoder layer", norm_first, y_ours, y_theirs))

    theirs, ours = torch_and_ours(
        nn.TransformerDecoderLayer, from_torch_decoder_layer, norm_first)
    y_theirs = theirs(
        tgt_x, src_x, tgt_mask=torch_masks["causal"],
        tgt_key_padding_mask=torch_masks["tgt_key_padding_mask"],
        memory_key_padding_mask=torch_masks["src_key_padding_mask"])
    y_ours = ours(tgt_x, src_x, src_mask_e, tgt_mask_e)
    rows.append(("decoder layer", norm_first, y_ours, y_theirs))

pd.DataFrame(
    [(name, nf, f"{(a - b).abs().max().item():.1e}")
     for name, nf, a, b in rows],
    columns=["layer", "norm_first", "max |ours - PyTorch|"],
)

# %% tags=["remove-cell"]
assert len(rows) == 4
for _, _, y_ours, y_theirs in rows:
    torch.testing.assert_close(y_ours, y_theirs, rtol=0, atol=1e-12)

# %% [markdown]
# Agreement to about $10^{-15}$ for all four: the same function, not a
# close approximation.
#
# **The fast path.** `nn.TransformerEncoderLayer` has a second
# implementation, a single fused kernel it switches to when it is in eval
# mode and no gradient is needed (for example under `torch.no_grad()`),
# among other conditions. The layer above ran with gradients enabled, so
# it took the ordinary path. Fused code may treat padded positions
# differently, so we run the same layer on both paths and compare each
# position, padded ones included:

# %%
theirs, ours = torch_and_ours(
    nn.TransformerEncoderLayer, from_torch_encoder_layer, False)
kpm = torch_masks["src_key_padding_mask"]  # (B, S), True = padding
slow = theirs(src_x, src_key_padding_mask=kpm).detach()  # plain path
with torch.no_grad():
    fast = theirs(src_x, src_key_padding_mask=kpm)  # fused fast path
    y_ours = ours(src_x, src_mask_e)
per_position = (fast - slow).abs().amax(-1)  # (B, S)
print("fast path vs plain path, largest difference per position:")
print(per_position.cpu().numpy())
print(f"at the padded positions: {per_position[kpm].max().item():.1e}")

# %% tags=["remove-cell"]
# The fused kernel really runs without gradients, and only then.
fused_calls = []
fused_kernel = torch._transformer_encoder_layer_fwd


def counting_kernel(*args, **kwargs):
    fused_calls.append(torch.is_grad_enabled())
    return fused_kernel(*args, **kwargs)


torch._transformer_encoder_layer_fwd = counting_kernel
try:
    theirs(src_x, src_key_padding_mask=kpm)
    assert fused_calls == []
    with torch.no_grad():
        theirs(src_x, src_key_padding_mask=kpm)
    assert fused_calls == [False]
finally:
    torch._transformer_encoder_layer_fwd = fused_kernel

# %% [markdown]
# In this version of PyTorch (the versions are printed at the top), a
# single layer's fast path agrees with the plain path at every position,
# padding included, to rounding. The difference people run into is one
# level up: `nn.TransformerEncoder`, the stack, converts a padded batch to
# a *nested tensor* in eval mode without gradients
# (`enable_nested_tensor=True`, the default; post-LN layers only), drops
# the padded positions altogether and returns **zeros** there. Our
# encoder computes a vector at every position, padded or not:

# %%
with warnings.catch_warnings(), torch.no_grad():
    warnings.simplefilter("ignore")  # nested tensors are a "prototype"
    stack = nn.TransformerEncoder(theirs, num_layers=1).eval()
    y_stack = stack(src_x, src_key_padding_mask=kpm)
print("real positions, |ours - nn.TransformerEncoder|:  ",
      gap(y_stack[~kpm], y_ours[~kpm]))
print("padded positions, nn.TransformerEncoder output:  ",
      y_stack[kpm].abs().max().item())
print("padded positions, our output (largest entry):    ",
      f"{y_ours[kpm].abs().max().item():.2f}")

# %% tags=["remove-cell"]
assert per_position.max() < 1e-12
torch.testing.assert_close(y_stack[~kpm], y_ours[~kpm], rtol=0, atol=1e-12)
assert torch.all(y_stack[kpm] == 0)
assert y_ours[kpm].abs().max() > 0.1

# %% [markdown]
# Neither is wrong. A padded position is never a key (the mask hides it)
# and its output is never scored (the loss ignores padding, chapter 6), so
# whatever value sits there cannot reach anything that matters. But a
# comparison that includes padded positions will fail for reasons that
# have nothing to do with attention; compare real positions only.
#
# ## Embeddings, positions and the output projection
#
# The bottom of each stack turns token ids into vectors: an embedding
# table $E \in \mathbb{R}^{V \times C}$ looks up one row per token, the
# row is multiplied by $\sqrt{d_{model}}$, and the positional encoding of
# chapter 4 is added:
#
# $$x_t = \sqrt{d_{model}}\; E[\mathrm{token}_t] + PE_t .$$

# %%
show(Transformer.embed)

# %% [markdown]
# (`offset` lets generation add the positions of tokens that arrive one at
# a time, chapter 8; here it is 0.)

# %% [markdown]
# The paper gives no reason for the $\sqrt{d_{model}}$. One reading, which
# [chapter 4](04_positional_encoding) tells from the shared output matrix, is
# the relative size of the two terms. Every row of the sinusoidal table has RMS
# exactly $\sqrt{1/2} \approx 0.71$ (half its entries are $\sin^2$, half
# $\cos^2$, and $\sin^2 + \cos^2 = 1$). Embedding tables start with small
# entries: we initialise them as every other matrix, Glorot-uniform with bound
# $\sqrt{6/(V + C)}$, which gives entries of RMS $\sqrt{2/(V + C)}$, under 0.01
# for the paper's vocabulary. Added as they are, the token would be a faint
# whisper under the position. Let us measure it in the base model itself, built
# with the paper's shared vocabulary of about 37,000 subword tokens.

# %%
V_PAPER = 37_000  # shared source-target BPE vocabulary, EN-DE (the paper)
seed_everything(SEED + 37)
start = time.perf_counter()
base = make_model(V_PAPER, V_PAPER, tie_embeddings=True)  # on the CPU
real_seconds = time.perf_counter() - start
C = base.config.d_model
E = base.src_embed.weight  # (V, C)
pe = base.positional.table[:100]  # (L, C), the first 100 positions
sizes = {
    "embedding E[token]": rms(E),
    "√d_model · E[token]": rms(E * math.sqrt(C)),
    "positional encoding": rms(pe),
}
for name, value in sizes.items():
    print(f"RMS of {name:21}: {value:.4f}")
print(f"ratio position / token: {sizes['positional encoding'] / rms(E):.0f}"
      f" unscaled, {sizes['positional encoding'] / rms(E * C**0.5):.1f}"
      " scaled")

fig, ax = plt.subplots(figsize=(6, 3))
ax.barh(list(sizes), list(sizes.values()),
        color=["#b0b0b0", "#5b8fd6", "#e08a3c"])
ax.set_xscale("log")
ax.set_title("Token and position vectors in the base model, at init")
ax.set_xlabel("RMS of an entry (log scale)")
for i, value in enumerate(sizes.values()):
    ax.text(value * 1.1, i, f"{value:.3f}", va="center", fontsize=8)
ax.set_xlim(3e-3, 2)
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
assert abs(rms(E) - math.sqrt(2 / (V_PAPER + C))) < 0.01 * rms(E)
torch.testing.assert_close(
    pe.pow(2).mean(-1), torch.full((100,), 0.5), atol=1e-6, rtol=0)
assert sizes["positional encoding"] / sizes["embedding E[token]"] > 50
assert sizes["positional encoding"] / sizes["√d_model · E[token]"] < 5
# tensor2tensor's init: scaled tokens of RMS 1; PyTorch's default: 32x PE.
t2t = torch.randn(2000, C) * C**-0.5  # (V, C), std d_model^-1/2
assert abs(rms(t2t * math.sqrt(C)) - 1) < 0.01
default = nn.Embedding(2000, C).weight  # N(0, 1)
assert 30 < rms(default * math.sqrt(C)) / sizes["positional encoding"] < 34

# %% [markdown]
# Unscaled, the token's vector is about a hundred times smaller than the
# position's; scaled, about four. The authors' own code (tensor2tensor)
# initialises embeddings with normal entries of standard deviation
# $d_{model}^{-1/2}$, and there the factor $\sqrt{d_{model}}$ brings the
# token to RMS 1, level with the positions. Either way the multiplication
# keeps the token's identity from drowning under its position at the
# start of training. The scale has to match the initialisation, though:
# PyTorch's default for `nn.Embedding` is $\mathcal{N}(0, 1)$, and
# multiplied by $\sqrt{512}$ those tokens would be 32 times *larger* than
# the positions.
#
# At the top, the decoder's output (B, T, C) goes through one linear layer,
# the `generator`, to V scores per position, the *logits*; a softmax turns
# them into next-token probabilities (the loss in chapter 6 takes the
# logits directly). The paper then saves parameters: "we share the same
# weight matrix between the two embedding layers and the pre-softmax
# linear transformation". With one vocabulary for both languages,
# `tie_embeddings=True` makes the source embedding, the target embedding
# and the generator's weight one and the same tensor, (V, C). The sharing
# is natural: the embedding represents token $v$ by row $v$, and the
# generator scores token $v$ by the dot product of the decoder's vector
# with row $v$, so both ask the same matrix what token $v$ looks like in
# the model's space {cite:p}`press2017using`. The generator keeps its own
# bias, V numbers.

# %%
print("src_embed.weight is tgt_embed.weight:",
      base.src_embed.weight is base.tgt_embed.weight)
print("src_embed.weight is generator.weight:",
      base.src_embed.weight is base.generator.weight)
print("shared matrix:", tuple(base.generator.weight.shape),
      "  generator bias:", tuple(base.generator.bias.shape))

# %% tags=["remove-cell"]
assert base.src_embed.weight is base.tgt_embed.weight
assert base.src_embed.weight is base.generator.weight
assert base.generator.bias is not None
assert base.generator.weight.data_ptr() == base.tgt_embed.weight.data_ptr()
n_base_model = base.count_parameters()
del base, E  # 250 MB of float32 we no longer need

# %% [markdown]
# ## Counting parameters
#
# Every parameter of the model sits in one of a few kinds of block, and
# each kind has a simple count. With $C = d_{model}$:
#
# | block | parameters |
# |---|---|
# | attention: $W^Q, W^K, W^V, W^O$ and biases | $4(C^2 + C)$ |
# | feed-forward: $W_1, b_1, W_2, b_2$ | $2\,C\,d_{ff} + d_{ff} + C$ |
# | LayerNorm: $\gamma, \beta$ | $2C$ |
# | tied embeddings and output matrix | $V C$ |
# | output bias | $V$ |
#
# An encoder layer holds one attention, one FFN and two LayerNorms; a
# decoder layer two attentions, one FFN and three LayerNorms; each stack
# has $N$ of them. The positional table is fixed, not learned, and pre-LN
# adds two final LayerNorms. In code:

# %%
def transformer_parameters(V, N, C, d_ff, norm_first=False):
    """Parameters of make_model(V, V, tie_embeddings=True, ...)."""
    attention = 4 * (C * C + C)  # W^Q, W^K, W^V, W^O, with biases
    ffn = 2 * C * d_ff + d_ff + C  # W_1, b_1, W_2, b_2
    layer_norm = 2 * C  # gamma, beta
    encoder_layer = attention + ffn + 2 * layer_norm
    decoder_layer = 2 * attention + ffn + 3 * layer_norm
    final_norms = 2 * layer_norm if norm_first else 0
    embeddings = V * C  # one matrix: source, target and output
    output_bias = V
    return (N * (encoder_layer + decoder_layer) + final_norms
            + embeddings + output_bias)


# %% [markdown]
# Now the paper's two configurations (Table 3), each counted by the
# formula and by the code. The big model holds 214 million float32
# parameters, about 860 MB, and building it for real would spend seconds
# drawing random weights we never use. Built under
# `with torch.device("meta")`, every tensor records its shape and dtype
# and nothing else: no memory, no arithmetic, and `numel()` still
# answers. (One quirk: the first `nn.Embedding` created on the meta device
# imports part of PyTorch's compiler to initialise it, a one-off cost of a
# second or more, so we pay it before timing.)

# %%
PAPER = {  # Vaswani et al. (2017), Table 3; P_drop of the EN-DE models
    "base": dict(n_layers=6, d_model=512, d_ff=2048, n_heads=8,
                 dropout=0.1, paper_millions=65),
    "big": dict(n_layers=6, d_model=1024, d_ff=4096, n_heads=16,
                dropout=0.3, paper_millions=213),
}
with torch.device("meta"):  # warm-up: the one-off import
    make_model(8, 8, n_layers=1, d_model=8, d_ff=8, n_heads=2)
counts, meta_models, build_seconds = {}, {}, {}
for name, cfg in PAPER.items():
    fields = {k: v for k, v in cfg.items() if k != "paper_millions"}
    start = time.perf_counter()
    with torch.device("meta"):
        model = make_model(V_PAPER, V_PAPER, tie_embeddings=True, **fields)
    build_seconds[name] = time.perf_counter() - start
    meta_models[name] = model
    counts[name] = (
        transformer_parameters(V_PAPER, cfg["n_layers"], cfg["d_model"],
                               cfg["d_ff"]),
        model.count_parameters(),
    )

rows = []
for name, cfg in PAPER.items():
    formula, built = counts[name]
    paper = cfg["paper_millions"] * 1e6
    rows.append({
        "model": name, "N": cfg["n_layers"], "d_model": cfg["d_model"],
        "d_ff": cfg["d_ff"], "h": cfg["n_heads"], "P_drop": cfg["dropout"],
        "formula": f"{formula:,}", "make_model": f"{built:,}",
        "paper (Table 3)": f"{cfg['paper_millions']}M",
        "ours / paper": f"{built / paper:.3f}",
    })
pd.DataFrame(rows).set_index("model")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"base, real weights on the CPU: built in {real_seconds:.2f} s")
for name, seconds in build_seconds.items():
    print(f"{name}, meta device: built in {seconds:.2f} s")

# %% tags=["remove-cell"]
for name, cfg in PAPER.items():
    formula, built = counts[name]
    assert formula == built, (name, formula, built)
    assert abs(built / 1e6 / cfg["paper_millions"] - 1) < 0.05
    assert all(p.is_meta for p in meta_models[name].parameters())
assert counts["base"][1] == n_base_model  # the real base model, built above
assert build_seconds["big"] < real_seconds  # the bigger model, yet faster
assert len(meta_models["big"].encoder.layers) == 6
# The formula also holds for pre-LN (two final norms) and small models.
with torch.device("meta"):
    small = make_model(50, 50, tie_embeddings=True, n_layers=3, d_model=64,
                       d_ff=96, n_heads=4, norm_first=True)
    untied = make_model(V_PAPER, V_PAPER, **{
        k: v for k, v in PAPER["base"].items() if k != "paper_millions"})
assert small.count_parameters() == transformer_parameters(50, 3, 64, 96,
                                                          norm_first=True)
assert untied.count_parameters() - counts["base"][1] == 2 * V_PAPER * 512

# %% [markdown]
# The formula and the code agree exactly. Against the paper, the base
# model comes out at 63.1 M where Table 3 says 65 M (3% fewer), and the big
# model at 214.3 M where it says 213 M (0.6% more). The vocabulary is the
# only number we had to guess ("about 37000 tokens"), so we can ask what
# vocabulary each figure implies. Table 3 rounds to the million; every
# vocabulary that rounds to 65 M for the base model is larger than any
# that rounds to 213 M for the big one:

# %%
def vocabulary_range(cfg):
    """Vocabulary sizes V whose count rounds to the paper's figure."""
    args = (cfg["n_layers"], cfg["d_model"], cfg["d_ff"])
    fixed = transformer_parameters(0, *args)  # all that does not grow with V
    per_token = cfg["d_model"] + 1  # a row of E and one output bias
    low = (cfg["paper_millions"] - 0.5) * 1e6
    high = (cfg["paper_millions"] + 0.5) * 1e6
    return (math.ceil((low - fixed) / per_token),
            math.floor((high - fixed) / per_token))


ranges = {name: vocabulary_range(cfg) for name, cfg in PAPER.items()}
for name, (low, high) in ranges.items():
    print(f"{name:4}: V between {low:,} and {high:,}")

# %% tags=["remove-cell"]
assert ranges["base"][0] > ranges["big"][1]  # the two ranges are disjoint
assert ranges["big"][0] < V_PAPER < ranges["base"][0]

# %% [markdown]
# No single vocabulary reproduces both figures. The paper does not say
# how it counted: perhaps the two models used different vocabularies, or
# the figures include or leave out something ours do not. With the
# vocabulary it states, our counts are within 3% of both.
#
# Where do the base model's parameters go? The embedding matrix alone is
# almost a third of the model; the decoder, with its extra attention,
# outweighs the encoder by a third.

# %%
groups = {}
for param_name, p in meta_models["base"].named_parameters():
    module = param_name.split(".")[0]  # src_embed, encoder, decoder, ...
    groups[module] = groups.get(module, 0) + p.numel()
total = sum(groups.values())
pd.DataFrame(
    [(module, f"{n:,}", f"{n / total:.1%}") for module, n in groups.items()],
    columns=["module (base model)", "parameters", "share"],
).set_index("module (base model)")

# %% tags=["remove-cell"]
assert total == counts["base"][1]
assert set(groups) == {"src_embed", "encoder", "decoder", "generator"}
assert groups["generator"] == V_PAPER  # only the bias: the weight is tied
assert 0.28 < groups["src_embed"] / total < 0.33
assert 1.3 < groups["decoder"] / groups["encoder"] < 1.4

# %% [markdown]
# (`named_parameters` lists a shared tensor once, under the first name
# that holds it, `src_embed`; that is why `tgt_embed` is missing and the
# `generator` shows only its bias.)
#
# ## One forward pass, untrained
#
# Everything is in place. `Transformer.forward` encodes the source into
# the memory, decodes the target against it and projects to logits,
# building the masks from `pad_id` when none are given. `encode` embeds
# the source and runs the encoder; `decode` does the same for the target
# with the target mask, plus the memory and source mask for
# cross-attention.

# %%
show(Transformer.encode, Transformer.forward)

# %% [markdown]
# A model small enough to read: a vocabulary of 11 tokens, 2 layers per
# stack, $d_{model} = 32$, 4 heads. The toy sentences are the ones from
# the decoder section, with 0 as padding.

# %%
seed_everything(SEED + 11)
V = 11
model = make_model(V, V, n_layers=2, d_model=32, d_ff=64, n_heads=4,
                   pad_id=PAD_ID).to(device).eval()
with torch.no_grad():
    src_mask = padding_mask(src, PAD_ID)  # (B, 1, S)
    tgt_mask = target_mask(tgt, PAD_ID)  # (B, T, T)
    memory = model.encode(src, src_mask)  # (B, S, C)
    hidden = model.decode(memory, src_mask, tgt, tgt_mask)  # (B, T, C)
    logits = model.generator(hidden)  # (B, T, V)
    logits_forward = model(src, tgt)  # the same, masks built inside
for name, t in [("src", src), ("tgt", tgt), ("src_mask", src_mask),
                ("tgt_mask", tgt_mask), ("memory", memory),
                ("hidden", hidden), ("logits", logits)]:
    print(f"{name:9}{str(tuple(t.shape)):13}{t.dtype}")
print(f"parameters: {model.count_parameters():,}")

# %% tags=["remove-cell"]
B, S, T = 2, 6, 5
assert src.shape == (B, S) and tgt.shape == (B, T)
assert src_mask.shape == (B, 1, S) and tgt_mask.shape == (B, T, T)
assert memory.shape == (B, S, 32) and hidden.shape == (B, T, 32)
assert logits.shape == (B, T, V)
torch.testing.assert_close(logits_forward, logits)
assert model.count_parameters() == (
    transformer_parameters(V, 2, 32, 64) + 2 * V * 32)  # untied: 3 tables

# %% [markdown]
# The shapes are right; the numbers mean nothing yet. The weights are
# random, so the model's "translation" is a confident-looking guess. Ask
# it to copy a source, the task chapter 6 starts with, and compare its
# cross-entropy with picking uniformly among the 11 tokens
# ($\ln 11 \approx 2.40$):

# %%
copy_src = torch.tensor([[1, 3, 5, 7, 9, 2]], device=device)  # (1, S)
with torch.no_grad():
    copy_logits = model(copy_src, copy_src[:, :-1])  # (1, T, V), T = S - 1
loss = F.cross_entropy(copy_logits.reshape(-1, V),
                       copy_src[:, 1:].reshape(-1))
print("greedy guesses:", copy_logits.argmax(-1).tolist()[0])
print("wanted:        ", copy_src[0, 1:].tolist())
print(f"cross-entropy: {loss.item():.2f}  (uniform guess: "
      f"{math.log(V):.2f})")

# %% [markdown]
# In the run shown it does no better than the uniform guess. Five
# targets are a small sample, though, and with another seed
# (`BOOK_SEED`) the same sentence can come out a little better. Over 256
# random copy sentences the verdict no longer depends on the seed: the
# untrained model is a *worse* guesser than the uniform guess, because
# its logits are random, not flat (over twenty seeds, by 10% to 55%).

# %%
generator = torch.Generator().manual_seed(SEED + 13)
symbols = torch.randint(3, V, (256, 4), generator=generator)  # (N, 4)
sentences = torch.cat([torch.full((256, 1), 1), symbols,
                       torch.full((256, 1), 2)], 1).to(device)  # (N, S)
with torch.no_grad():
    many_logits = model(sentences, sentences[:, :-1])  # (N, T, V)
many_loss = F.cross_entropy(many_logits.reshape(-1, V),
                            sentences[:, 1:].reshape(-1))
print(f"cross-entropy over 256 sentences: {many_loss.item():.2f}  "
      f"(uniform guess: {math.log(V):.2f})")

# %% tags=["remove-cell"]
assert many_loss.item() > 1.05 * math.log(V)  # 1.10 or more in 20 seeds

# %% [markdown]
# [Chapter 6](06_training) trains models like this one, starting with
# exactly this copy task.
#
# ## Summary
#
# - The **feed-forward network** $\max(0, xW_1 + b_1)W_2 + b_2$, with
#   $d_{ff} = 4\,d_{model}$, acts on each position alone: a position fed
#   by itself gives the same output as in the batch (attention does not),
#   and it equals two 1-wide convolutions. It holds two thirds of each
#   encoder layer's parameters.
# - Every sublayer is wrapped in a **residual connection and a
#   LayerNorm**. Post-LN (the paper, `norm_first=False`) normalises the
#   sum, $\mathrm{LayerNorm}(x + f(x))$; pre-LN (`norm_first=True`, the
#   Annotated Transformer's code, by its own stated choice) normalises
#   only the sublayer's input, $x + f(\mathrm{LayerNorm}(x))$, lets the
#   residual stream grow with depth, and needs a final LayerNorm after
#   each stack.
# - The Annotated Transformer's LayerNorm (unbiased std, $\epsilon$ outside
#   the root) differs from `nn.LayerNorm` by about $1/(2n)$, 0.1% at
#   $n = 512$: real, but absorbable by $\gamma$. We use `nn.LayerNorm`.
# - Our `EncoderLayer` and `DecoderLayer` equal PyTorch's layers to
#   $10^{-15}$ in float64, post-LN and pre-LN, with masks. PyTorch's fused
#   fast path agrees too; `nn.TransformerEncoder`'s nested tensors return
#   zeros at padded positions, where we compute (unused) values.
# - Embeddings are multiplied by $\sqrt{d_{model}}$ so that tokens are not
#   drowned by positional encodings of RMS 0.71; `tie_embeddings=True`
#   makes the two embeddings and the output projection one tensor.
# - The base model has 63.1 M parameters and the big one 214.3 M, by
#   formula and by code (built on the `meta` device, free); the paper says
#   65 M and 213 M.
#
# ## Exercises
#
# 1. **The Annotated LayerNorm as a module.** Write an `nn.Module` with
#    parameters `a_2` (ones) and `b_2` (zeros) that computes
#    `a_2 * (x - mean) / (std + eps) + b_2`, and put it in place of
#    `norm1` and `norm2` of an `EncoderLayer(64, 4, 256)` in eval mode.
#    Compare the output with the unchanged layer for $d_{model}$ = 64,
#    256 and 1024. Does the relative difference follow $1/(2n)$? Then
#    set `a_2` to $\sqrt{n/(n-1)}$ and check that the difference nearly
#    vanishes.
# 2. **Count an untied, pre-LN model.** Extend `transformer_parameters` to
#    separate source and target vocabularies (`V_src`, `V_tgt`), untied
#    embeddings and `norm_first=True`. Check it against
#    `make_model(8000, 6000, norm_first=True)` built on the `meta` device.
#    What share of the paper's base model would embeddings take if it
#    used separate 37,000-token vocabularies without tying?
# 3. **Deeper residual streams.** Repeat the measurement of the residual
#    stream's RMS through a pre-LN encoder with 48 layers. If each layer
#    added an independent vector of RMS $r$ to the stream, its RMS after
#    $k$ layers would be about $\sqrt{1 + k r^2}$. Estimate $r$ from the
#    first layer and see how well the rule predicts the 48th. Then apply
#    the final LayerNorm and check its output's RMS.

# %% [markdown]
# ## Graded exercises
#
# Nine exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then
# open them. The classroom edition (the teaching page) hands out the
# same exercises with the solutions removed, and nbgrader scores them.
# Every layer here is in eval mode with dropout 0, and every value is
# float64, so the checks compare to round-off.

# %% tags=["exercise-setup"]
import math

import torch

from transformer_lite import padding_mask, target_mask
from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
)

torch.manual_seed(5)  # the layers' initial weights
gen = torch.Generator().manual_seed(5)  # the inputs
C, H, D_FF, V = 16, 4, 32, 11  # d_model, heads, d_ff, vocabulary
PAD = 0  # the padding id
src = torch.tensor([[3, 4, 5, 6, 7],
                    [3, 4, 5, PAD, PAD]])  # (B, S)
tgt = torch.tensor([[1, 5, 6, 2],
                    [1, 7, PAD, PAD]])  # (B, T)
src_mask = padding_mask(src, PAD)  # (B, 1, S)
tgt_mask = target_mask(tgt, PAD)  # (B, T, T)
x_src = torch.randn(2, 5, C, generator=gen, dtype=torch.float64)  # (B, S, C)
x_tgt = torch.randn(2, 4, C, generator=gen, dtype=torch.float64)  # (B, T, C)

# %% [markdown]
# ### Exercise 5.1: the feed-forward network (1 point)
#
# Write `feed_forward(x, W_1, b_1, W_2, b_2)`, the position-wise network
# $\max(0,\, x W_1 + b_1)\, W_2 + b_2$ for $x$ of shape $(B, L, C)$,
# with $W_1$ of shape $(C, d_{ff})$ and $W_2$ of shape $(d_{ff}, C)$ as
# in the formula. (`nn.Linear` stores the transposes: the check passes
# `w_1.weight.T`.)

# %% tags=["solution", "hide-input"]
def feed_forward(x, W_1, b_1, W_2, b_2):
    ### BEGIN SOLUTION
    hidden = torch.relu(x @ W_1 + b_1)  # (B, L, d_ff)
    return hidden @ W_2 + b_2  # (B, L, C)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import FeedForward

ffn = FeedForward(C, D_FF, dropout=0.0).double().eval()
with torch.no_grad(), exercise("5.1", twins=[FeedForward.forward]):
    expect_close("feed_forward(x, ...)",
                 feed_forward(x_src, ffn.w_1.weight.T, ffn.w_1.bias,
                              ffn.w_2.weight.T, ffn.w_2.bias),
                 ffn(x_src),
                 hint="the ReLU acts on the hidden layer x W_1 + b_1 "
                 "(bias included); the output layer x W_2 + b_2 has "
                 "no ReLU")  # fmt: skip

# %% [markdown]
# ### Exercise 5.2: LayerNorm (2 points)
#
# Write `layer_norm(x, gamma, beta, eps=1e-5)`, which normalises the
# last axis of $x$ as `nn.LayerNorm` does:
# $\gamma \odot (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$, where
# $\mu$ and $\sigma^2$ are the mean and the *biased* variance of the
# $C$ entries (divided by $C$). Do not call `F.layer_norm`.

# %% tags=["solution", "hide-input"]
def layer_norm(x, gamma, beta, eps=1e-5):
    ### BEGIN SOLUTION
    mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
    var = (x - mu).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), biased
    return gamma * (x - mu) / torch.sqrt(var + eps) + beta
    ### END SOLUTION


# %% tags=["check"]
import torch.nn.functional as F

gamma = 1 + 0.1 * torch.randn(C, generator=gen, dtype=torch.float64)
beta = 0.1 * torch.randn(C, generator=gen, dtype=torch.float64)
# F.layer_norm, and nn.LayerNorm that calls it, are refused
with exercise("5.2", twins=[F.layer_norm, torch.layer_norm,
                            torch.native_layer_norm]):
    expect_close("layer_norm(x, gamma, beta)",
                 layer_norm(x_src, gamma, beta),
                 F.layer_norm(x_src, (C,), gamma, beta, eps=1e-5),
                 hint="the variance divides by C, not C - 1: "
                 "x.var(-1, unbiased=False), or the mean of the squared "
                 "deviations")  # fmt: skip

# %% tags=["check"]
flat = 1 + 1e-3 * torch.randn(3, C, generator=gen, dtype=torch.float64)
ones = torch.ones(C, dtype=torch.float64)
zeros = torch.zeros(C, dtype=torch.float64)
with exercise("5.2", twins=[F.layer_norm, torch.layer_norm,
                            torch.native_layer_norm]):
    expect_close("layer_norm(flat, 1, 0)", layer_norm(flat, ones, zeros),
                 F.layer_norm(flat, (C,), eps=1e-5),
                 hint="epsilon is added to the variance, inside the "
                 "square root: sqrt(var + eps), not sqrt(var) + "
                 "eps")  # fmt: skip

# %% [markdown]
# ### Exercise 5.3: an encoder layer from its parts (2 points)
#
# Write `encoder_layer(layer, x, mask)`, the output of the
# `EncoderLayer` `layer` for $x$ of shape $(B, S, C)$ and a source mask
# $(B, 1, S)$, computed from its modules: `layer.self_attn(q, k, v,
# mask)`, `layer.feed_forward`, `layer.norm1` and `layer.norm2`. Wrap
# each of the two sublayers $f$ as `layer.norm_first` says: post-LN
# (False) $x \leftarrow \mathrm{LN}(x + f(x))$, pre-LN (True)
# $x \leftarrow x + f(\mathrm{LN}(x))$. Do not call `layer` itself or
# its methods. (Dropout is off: ignore `layer.dropout1` and
# `layer.dropout2`.)

# %% tags=["solution", "hide-input"]
def encoder_layer(layer, x, mask):
    ### BEGIN SOLUTION
    def attend(h):
        return layer.self_attn(h, h, h, mask)  # (B, S, C)

    for f, norm in ((attend, layer.norm1),
                    (layer.feed_forward, layer.norm2)):
        if layer.norm_first:
            x = x + f(norm(x))  # (B, S, C)
        else:
            x = norm(x + f(x))  # (B, S, C)
    return x
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import EncoderLayer

post = EncoderLayer(C, H, D_FF, dropout=0.0).double().eval()
with torch.no_grad(), exercise("5.3", twins=[
        EncoderLayer.forward, EncoderLayer._attend, EncoderLayer._feed]):
    expect_close("encoder_layer(post-LN layer, x, mask)",
                 encoder_layer(post, x_src, src_mask),
                 post(x_src, src_mask),
                 hint="post-LN normalises the sum: x = norm1(x + "
                 "self_attn(x, x, x, mask)), then x = norm2(x + "
                 "feed_forward(x))")  # fmt: skip

# %% tags=["check"]
pre = EncoderLayer(C, H, D_FF, dropout=0.0, norm_first=True)
pre = pre.double().eval()
with torch.no_grad(), exercise("5.3", twins=[
        EncoderLayer.forward, EncoderLayer._attend, EncoderLayer._feed]):
    expect_close("encoder_layer(pre-LN layer, x, mask)",
                 encoder_layer(pre, x_src, src_mask),
                 pre(x_src, src_mask),
                 hint="pre-LN normalises only the sublayer's input: "
                 "h = norm1(x), x = x + self_attn(h, h, h, mask); "
                 "nothing normalises the sum")  # fmt: skip

# %% [markdown]
# ### Exercise 5.4: a decoder layer from its parts (2 points)
#
# Write `decoder_layer(layer, x, memory, src_mask, tgt_mask)` for the
# `DecoderLayer` `layer`, in the same way: three sublayers, each wrapped
# as `layer.norm_first` says, with `layer.norm1`, `layer.norm2` and
# `layer.norm3` in turn:
#
# 1. masked self-attention, `layer.self_attn`, under `tgt_mask`
#    $(B, T, T)$;
# 2. cross-attention, `layer.cross_attn`: queries from the decoder,
#    keys and values from `memory` $(B, S, C)$, under `src_mask`
#    $(B, 1, S)$;
# 3. the feed-forward network, `layer.feed_forward`.

# %% tags=["solution", "hide-input"]
def decoder_layer(layer, x, memory, src_mask, tgt_mask):
    ### BEGIN SOLUTION
    def attend(h):
        return layer.self_attn(h, h, h, tgt_mask)  # (B, T, C)

    def cross(h):
        return layer.cross_attn(h, memory, memory, src_mask)  # (B, T, C)

    sublayers = ((attend, layer.norm1), (cross, layer.norm2),
                 (layer.feed_forward, layer.norm3))  # fmt: skip
    for f, norm in sublayers:
        if layer.norm_first:
            x = x + f(norm(x))  # (B, T, C)
        else:
            x = norm(x + f(x))  # (B, T, C)
    return x
    ### END SOLUTION


# %% tags=["check", "points-2"]
from transformer_lite import DecoderLayer

decoders = [DecoderLayer(C, H, D_FF, dropout=0.0, norm_first=norm_first)
            .double().eval() for norm_first in (False, True)]  # fmt: skip
with torch.no_grad(), exercise("5.4", twins=[
        DecoderLayer.forward, DecoderLayer._attend, DecoderLayer._cross,
        DecoderLayer._feed]):
    for dec in decoders:
        expect_close(f"decoder_layer(norm_first={dec.norm_first})",
                     decoder_layer(dec, x_tgt, x_src, src_mask, tgt_mask),
                     dec(x_tgt, x_src, src_mask, tgt_mask),
                     hint="cross-attention takes its queries from the "
                     "decoder and its keys and values from the memory, "
                     "cross_attn(h, memory, memory, src_mask); "
                     "self-attention uses tgt_mask")  # fmt: skip

# %% [markdown]
# ### Exercise 5.5: the embeddings (1 point)
#
# Write `embed(tokens, E, pe)`: token ids of shape $(B, L)$, an
# embedding table $E$ of shape $(V, C)$ and a positional table `pe` of
# shape $(\mathit{max\_len}, C)$ give
# $\sqrt{C}\; E[\mathrm{token}_t] + PE_t$ for $t = 0, \dots, L-1$,
# of shape $(B, L, C)$.

# %% tags=["solution", "hide-input"]
def embed(tokens, E, pe):
    ### BEGIN SOLUTION
    C = E.size(1)
    x = E[tokens] * math.sqrt(C)  # (B, L, C)
    return x + pe[: tokens.size(1)]  # (B, L, C)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import (
    SinusoidalPositionalEncoding,
    Transformer,
    make_model,
)

model = make_model(V, V, n_layers=1, d_model=C, d_ff=D_FF, n_heads=H,
                   dropout=0.0).double().eval()  # fmt: skip
with torch.no_grad(), exercise("5.5", twins=[
        Transformer.embed, SinusoidalPositionalEncoding.forward]):
    expect_close("embed(src, E, pe)",
                 embed(src, model.src_embed.weight, model.positional.table),
                 model.embed(src, model.src_embed),
                 hint="multiply the rows of E by sqrt(d_model), "
                 "C = E.size(1), then add the first L rows of "
                 "pe")  # fmt: skip

# %% [markdown]
# ### Exercise 5.6: counting parameters (2 points)
#
# Write `n_parameters(V_src, V_tgt, N, C, d_ff, tie=False,
# norm_first=False)`, the number of trainable parameters of
# `make_model(V_src, V_tgt, n_layers=N, d_model=C, d_ff=d_ff,
# tie_embeddings=tie, norm_first=norm_first)`, from the sizes alone.
# Untied, the model has a source and a target embedding table and an
# output layer with its own weight and bias; tied (then
# $V_{src} = V_{tgt}$), one $V \times C$ matrix serves all three and the
# output layer keeps its bias. The sinusoidal positions learn nothing.
# Do not build a model.

# %% tags=["solution", "hide-input"]
def n_parameters(V_src, V_tgt, N, C, d_ff, tie=False, norm_first=False):
    ### BEGIN SOLUTION
    attention = 4 * (C * C + C)  # W^Q, W^K, W^V, W^O and their biases
    ffn = 2 * C * d_ff + d_ff + C  # W_1, b_1, W_2, b_2
    norm = 2 * C  # gamma and beta
    encoder = N * (attention + ffn + 2 * norm)
    decoder = N * (2 * attention + ffn + 3 * norm)
    final_norms = 2 * norm if norm_first else 0
    if tie:
        tables = V_src * C + V_tgt  # one matrix, and the output bias
    else:
        tables = (V_src + V_tgt) * C + V_tgt * C + V_tgt
    return encoder + decoder + final_norms + tables
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import TransformerConfig

small = make_model(13, 17, n_layers=2, d_model=8, d_ff=12, n_heads=2)
want = small.count_parameters()
with exercise("5.6", twins=[make_model, Transformer.__init__,
                            TransformerConfig.n_parameters]):
    expect_equal("n_parameters(13, 17, 2, 8, 12)",
                 n_parameters(13, 17, 2, 8, 12), want,
                 hint="an encoder layer holds one attention (four C x C "
                 "matrices with biases), a feed-forward network and two "
                 "LayerNorms of 2C each; a decoder layer two attentions "
                 "and three LayerNorms")  # fmt: skip

# %% tags=["check"]
with exercise("5.6", twins=[make_model, Transformer.__init__,
                            TransformerConfig.n_parameters]):
    for args in ((37_000, 37_000, 6, 512, 2048, True, False),
                 (8000, 6000, 6, 512, 2048, False, True),
                 (50, 50, 3, 64, 96, True, True)):  # fmt: skip
        V_src, V_tgt, N, d_model, d_ff, tie, norm_first = args
        config = TransformerConfig(V_src, V_tgt, n_layers=N,
                                   d_model=d_model, d_ff=d_ff, n_heads=8,
                                   tie_embeddings=tie,
                                   norm_first=norm_first)  # fmt: skip
        expect_equal(f"n_parameters{args}", n_parameters(*args),
                     config.n_parameters(),
                     hint="tied, one V x C matrix serves both embeddings "
                     "and the output weight, which keeps its own bias of "
                     "V; pre-LN adds a final LayerNorm to each "
                     "stack")  # fmt: skip

# %% [markdown]
# ### Exercise 5.7: predict, then run (1 point)
#
# Decide before you run the cell below it. The feed-forward network
# holds two thirds of each encoder layer's parameters. What fraction of
# the *whole* base model, `make_model(37_000, 37_000,
# tie_embeddings=True)` ($N = 6$, $C = 512$, $d_{ff} = 2048$, one
# shared vocabulary), sits in its twelve feed-forward networks, six in
# the encoder and six in the decoder? Set `prediction` to a number
# between 0 and 1; within 0.05 of the count earns the point.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = 0.4
### END SOLUTION

# %% [markdown]
# The experiment: the base model, built on the `meta` device (shapes
# only, no memory), its parameters counted by where they sit.

# %%
from transformer_lite import make_model

with torch.device("meta"):
    base = make_model(37_000, 37_000, tie_embeddings=True)
shares = {"feed-forward": 0, "attention": 0, "LayerNorm": 0,
          "embedding": 0}  # the shared matrix and the output bias
for param_name, p in base.named_parameters():  # a shared tensor once
    part = ("feed-forward" if ".feed_forward." in param_name else
            "attention" if "attn." in param_name else
            "LayerNorm" if ".norm" in param_name else
            "embedding")  # fmt: skip
    shares[part] += p.numel()
n_base = sum(shares.values())
for part, n in shares.items():
    print(f"{part:12} {n:>11,}  {n / n_base:6.1%}")
ff_share = shares["feed-forward"] / n_base

# %% tags=["check", "hide-input"]
with exercise("5.7", prediction=True):
    expect(isinstance(prediction, (int, float))
           and not isinstance(prediction, bool)
           and 0 <= prediction <= 1,
           f"prediction is {prediction!r}: give a number between 0 and "
           f"1")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(abs(prediction - ff_share) <= 0.05,
           f"the feed-forward networks hold {ff_share:.3f} of the base "
           f"model, not {prediction!r}",
           hint="the FFN is 8C^2 of an encoder layer's 12C^2 (two "
           "thirds), but only 8C^2 of a decoder layer's 16C^2 (half: "
           "two attentions), and the shared 37,000 x 512 embedding "
           "alone holds 19 M of the 63 M: 25.2 M in the FFNs, about "
           "0.40")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 5.8: predict, then run (1 point)
#
# Decide before you run the cell below it. A pre-LN stack lets the
# residual stream grow, slowly, because each sublayer reads a
# normalised copy of it. Now take the LayerNorms away altogether: a
# 12-layer untrained encoder (the weights of `torch.manual_seed(5)`,
# $C = 16$) whose sublayers are wrapped as $x \leftarrow x + f(x)$,
# with nothing normalised. Its input has RMS about 1. By about what
# factor is the RMS of the residual stream multiplied after the 12
# layers? Set `prediction` to one of the strings `"1"`, `"3"`, `"12"`
# or `"100+"` (a hundred or more).

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "100+"
### END SOLUTION

# %% [markdown]
# The experiment: two pre-LN encoders with the same weights, one of
# them with its LayerNorms replaced by `nn.Identity()`, and the RMS of
# the residual stream after every layer of each.

# %%
from torch import nn

stacks = {}
for name in ("pre-LN", "no LayerNorm"):
    torch.manual_seed(5)  # the same weights for both
    stacks[name] = make_model(V, V, n_layers=12, d_model=C, d_ff=D_FF,
                              n_heads=H, dropout=0.0,
                              norm_first=True).encoder  # fmt: skip
    stacks[name] = stacks[name].double().eval()
for layer in stacks["no LayerNorm"].layers:
    layer.norm1, layer.norm2 = nn.Identity(), nn.Identity()
stream = torch.randn(2, 10, C, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(58))
growth = {}
for name, stack in stacks.items():
    h, sizes = stream, [stream.pow(2).mean().sqrt().item()]
    with torch.no_grad():
        for layer in stack.layers:
            h = layer(h)  # (B, L, C)
            sizes.append(h.pow(2).mean().sqrt().item())
    growth[name] = sizes[-1] / sizes[0]
    print(f"{name:12}: RMS " + " ".join(f"{s:.3g}" for s in sizes[::3])
          + f" (layers 0, 3, ..., 12); x{growth[name]:.1f}")

# %% tags=["check", "hide-input"]
with exercise("5.8", prediction=True):
    expect(prediction in ("1", "3", "12", "100+"),
           f"prediction is {prediction!r}: choose one of the strings "
           f"\"1\", \"3\", \"12\" or \"100+\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    factor = growth["no LayerNorm"]
    truth = ("100+" if factor >= 50 else "12" if factor >= 6 else
             "3" if factor >= 1.7 else "1")  # fmt: skip
    expect(prediction == truth,
           f"the RMS was multiplied by {factor:.0f}, so the answer is "
           f"{truth!r}, not {prediction!r}",
           hint="without a LayerNorm each sublayer's output is about "
           "proportional to its input (linear maps, a ReLU, attention's "
           "average of values), so every layer multiplies the stream by "
           "a factor, here about 1.5, and twelve factors compound to "
           "more than a hundred. Pre-LN's sublayers read a normalised "
           "copy, so each adds about the same amount and the stream "
           "grows like sqrt(1 + k r^2); post-LN pins it to 1")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 5.9: one matrix, two scales (2 points, written)
#
# With `tie_embeddings=True` one matrix $E$ is both the embedding
# table and the weight of the output layer, whose logits are
# $h \cdot E[v] + b_v$ for the decoder's output $h$. The package starts
# $E$ with small entries (RMS below 0.01 at the paper's sizes) and
# multiplies the rows it looks up by $\sqrt{d_{model}}$. In two to four
# sentences: why does the output layer want $E$'s entries small, and
# why then must the embedding multiply its rows by $\sqrt{d_{model}}$
# rather than start $E$ with entries of size 1?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# The decoder's output $h$ has entries of size about 1 (it comes out of
# a LayerNorm), so a logit $h \cdot E[v]$ sums $C$ products and has
# size about $\sqrt{C}$ times the RMS of $E$'s entries: entries of size
# $1/\sqrt{C}$ or less give logits of size 1 or less and a soft first
# softmax, while entries of size 1 would give logits of about
# $\sqrt{512} \approx 23$ and a saturated, overconfident softmax at the
# start of training. At the input, the same small rows would be a
# whisper beside the positional encoding (RMS 0.71) added to them, so
# the token's identity would drown under its position; multiplying by
# $\sqrt{C} \approx 23$ brings the tokens up near the positions' scale
# (level with them for entries of size $1/\sqrt{C}$, the paper's own
# start) without touching the shared matrix the output layer reads.
#
# *Rubric (2 points).* 1 point: the output side, a logit is a sum of
# $C$ products, so its size grows with $\sqrt{C}$ times the entries of
# $E$; small entries keep the initial logits moderate (entries of 1
# would make them about $\sqrt{C}$ and the softmax peaked). 1 point:
# the input side, small token vectors would be swamped by the position
# vectors (RMS about 0.7), and the factor $\sqrt{d_{model}}$ fixes that
# at the input only, since one matrix cannot have two scales.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 2
# message: Hint: the variance divides by C, not C - 1
# def layer_norm(x, gamma, beta, eps=1e-5):
#     mu = x.mean(dim=-1, keepdim=True)
#     var = x.var(dim=-1, keepdim=True)
#     return gamma * (x - mu) / torch.sqrt(var + eps) + beta

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def feed_forward(x, W_1, b_1, W_2, b_2):
#     return ffn(x)  # the check's own module

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def feed_forward(x, W_1, b_1, W_2, b_2):
#     return x

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def layer_norm(x, gamma, beta, eps=1e-5):
#     return F.layer_norm(x, x.shape[-1:], gamma, beta, eps)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def layer_norm(x, gamma, beta, eps=1e-5):
#     return x

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def encoder_layer(layer, x, mask):
#     return layer(x, mask)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def encoder_layer(layer, x, mask):
#     return x

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: delegate
# def decoder_layer(layer, x, memory, src_mask, tgt_mask):
#     return layer(x, memory, src_mask, tgt_mask)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def decoder_layer(layer, x, memory, src_mask, tgt_mask):
#     return x

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def embed(tokens, E, pe):
#     return model.embed(tokens, torch.nn.Embedding.from_pretrained(E))

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def embed(tokens, E, pe):
#     return E[tokens]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: delegate
# def n_parameters(V_src, V_tgt, N, C, d_ff, tie=False, norm_first=False):
#     config = TransformerConfig(V_src, V_tgt, n_layers=N, d_model=C,
#                                d_ff=d_ff, n_heads=1, tie_embeddings=tie,
#                                norm_first=norm_first)
#     return config.n_parameters()

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def n_parameters(V_src, V_tgt, N, C, d_ff, tie=False, norm_first=False):
#     return 0
