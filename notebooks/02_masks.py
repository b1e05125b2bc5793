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
# # 2. Masks
#
# Attention, as [chapter 1](01_attention) built it, lets every query look at
# every key. That is almost never what we want. Some keys are not really there:
# they are padding, added only so that sentences of different lengths fit in
# one rectangular tensor. Other keys are there but must stay hidden: a decoder
# that learns to predict word $t+1$ may not peek at word $t+1$. A **mask**
# says, for each query $i$ and key $j$, whether $i$ may attend to $j$.
#
# Write the mask as a boolean matrix $M$ with $M_{ij} = \text{True}$ when
# query $i$ may attend to key $j$. Masked attention replaces the scores of
# forbidden pairs by $-\infty$ before the softmax:
#
# $$
# \mathrm{Attention}(Q, K, V; M) =
#   \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + B\right) V,
# \qquad
# B_{ij} = \begin{cases} 0 & M_{ij} \\ -\infty & \text{otherwise.}
# \end{cases}
# $$
#
# Since $e^{-\infty} = 0$, a forbidden key gets weight exactly zero, and the
# allowed keys share the whole probability mass among themselves. This
# chapter builds the three masks a Transformer needs (padding, causal, and
# their combination), pins down which way round `True` points (PyTorch's own
# modules disagree with each other), and then looks closely at the
# arithmetic, because "$-\infty$" is where masking code most often breaks:
# NaN from a fully masked row, and overflow in half precision.
#
# Everything is taught from `transformer_lite/masks.py`, a module of about
# a hundred lines, and checked against PyTorch.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(2)

# %%
import inspect
import platform

import altair as alt
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

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
from transformer_lite.interop import (
    from_torch_decoder_layer,
    from_torch_encoder_layer,
    from_torch_mha,
)
from transformer_lite.masks import local_mask, to_torch_attn_mask
from transformer_lite.viz import heatmap, mask_chart

device = default_device()
SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
seed_everything(SEED)
print(f"python {platform.python_version()}, torch {torch.__version__}")
print(f"transformer_lite {transformer_lite.__version__}, device: {device}")
print(f"BOOK_SEED={SEED}")

# %% [markdown]
# ## Why masks: padding
#
# Sentences come in different lengths, tensors do not. To put three
# sentences into one batch we extend the shorter ones with a padding token
# until all have the length $S$ of the longest. We use a toy vocabulary
# whose first entry is the padding token, and give its id a name:
# `PAD_ID` is far easier to read than a bare `0` scattered through the code.

# %%
VOCAB = ["<pad>", "<s>", "</s>", "the", "cat", "sat", "on", "mat",
         "a", "dog", "ran", "home"]
PAD_ID = VOCAB.index("<pad>")
SENTENCES = ["the cat sat on the mat", "a dog ran home", "the dog sat"]


def encode(sentence: str) -> list[int]:
    return [VOCAB.index(word) for word in sentence.split()]


def pad_batch(sequences: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-pad token id lists to the longest one: (B, L)."""
    L = max(len(seq) for seq in sequences)
    rows = [seq + [pad_id] * (L - len(seq)) for seq in sequences]
    return torch.tensor(rows, device=device)


def words(ids: torch.Tensor) -> list[str]:
    return [VOCAB[i] for i in ids.tolist()]


src = pad_batch([encode(s) for s in SENTENCES], PAD_ID)  # (B, S)
B, S = src.shape
print(src)
for row in src:
    print(" ".join(f"{w:>5}" for w in words(row)))

# %% tags=["remove-cell"]
assert PAD_ID == 0 == transformer_lite.TransformerConfig(12, 12).pad_id
assert (B, S) == (3, 6)
assert (src == PAD_ID).sum(dim=1).tolist() == [0, 2, 3]

# %% [markdown]
# Padding must be invisible. "the dog sat" should mean the same thing
# whether it is encoded alone or in a batch with a six-word sentence.
# Without a mask it does not: the three `<pad>` keys are keys like any
# other, they receive attention weight, and their values leak into the
# outputs at the real positions. Let us measure the leak with one
# attention layer applied to embedded tokens: `MultiHeadAttention`, the
# subject of [chapter 3](03_multi_head_attention), in eval mode so that
# dropout is off.

# %%
C, H = 16, 2  # d_model and number of heads for this chapter's examples
embed = nn.Embedding(len(VOCAB), C).to(device).requires_grad_(False)
attn = MultiHeadAttention(C, H, dropout=0.0).to(device).eval()
attn.requires_grad_(False)

alone = torch.tensor([encode("the dog sat")], device=device)  # (1, 3)
x_alone = embed(alone)  # (1, 3, C)
x = embed(src)  # (B, S, C)

out_alone = attn(x_alone, x_alone, x_alone)  # (1, 3, C)
out_nomask = attn(x, x, x)  # (B, S, C)
out_masked = attn(x, x, x, padding_mask(src, PAD_ID))  # (B, S, C)

n = len(encode("the dog sat"))
leak = (out_nomask[2, :n] - out_alone[0]).abs().max().item()
no_leak = (out_masked[2, :n] - out_alone[0]).abs().max().item()
print(f"largest change from padding, no mask:   {leak:.3f}")
print(f"largest change from padding, with mask: {no_leak:.1e}")

# %% tags=["remove-cell"]
assert leak > 0.05
assert torch.allclose(out_masked[2, :n], out_alone[0], atol=1e-5)

# %% [markdown]
# With the padding mask the sentence in the batch gives the same outputs
# as the sentence alone, up to float rounding. That is the whole purpose of
# a padding mask: batching becomes an implementation detail that does not
# change the answer.
#
# ## Padding masks
#
# A padding mask marks which **keys** are real tokens:
#
# $$ M_{bij} = [\, x_{bj} \neq \texttt{PAD} \,], $$
#
# the same for every query $i$. The package computes it in one line:

# %%
print(inspect.getsource(padding_mask))

# %%
src_mask = padding_mask(src, PAD_ID)  # (B, 1, S)
print(src_mask.shape)
print(src_mask.int())

# %% tags=["remove-cell"]
assert src_mask.shape == (B, 1, S) and src_mask.dtype == torch.bool
assert src_mask[:, 0].tolist() == (src != PAD_ID).tolist()

# %% [markdown]
# Why the shape $(B, 1, S)$ rather than $(B, S)$? Because the scores it
# masks have shape $(B, L_q, S)$: one row per query, one column per key.
# Broadcasting lines up shapes from the right; the `1` in the middle
# stretches over the $L_q$ queries, so every query of sentence $b$ gets the
# same row of allowed keys. That is exactly right: whether a key is padding
# does not depend on who is asking. The mask stores $B \cdot S$ booleans
# instead of $B \cdot L_q \cdot S$. Inside `MultiHeadAttention` it gains one
# more axis, $(B, 1, 1, S)$, which broadcasts over the $H$ heads too.

# %%
L_q = S  # in the encoder, every position is a query
scores_shape = torch.Size((B, L_q, S))
print(torch.broadcast_shapes(src_mask.shape, scores_shape))
print(torch.broadcast_shapes(src_mask.unsqueeze(1).shape, (B, H, L_q, S)))
print(src_mask.expand(scores_shape)[2].int())  # sentence 2, all queries

# %% tags=["remove-cell"]
assert torch.broadcast_shapes(src_mask.shape, scores_shape) == scores_shape
_full = src_mask.expand(scores_shape)
assert all(torch.equal(_full[:, i], src_mask[:, 0]) for i in range(L_q))

# %% [markdown]
# One row per sentence is the natural picture of a padding mask. Hover over
# a cell to see its sentence, key position and value.

# %%
heatmap(
    src_mask[:, 0].float(),
    title="Padding mask of the batch (dark = real token)",
    x_title="key position",
    y_title="sentence",
    value_title="may attend",
    y_labels=[" ".join(words(row)[:3]) + " ..." for row in src],
    scheme="greys",
    size=200,
)

# %% [markdown]
# Note what the padding mask does *not* do: it leaves the padded
# **queries** alone. The outputs at padded positions are computed like any
# other and are meaningless; the loss (chapter 6) simply ignores them.
# Masking them as queries as well would give rows in which nothing may be
# attended to, and we will see below why such rows need care.
#
# ## The causal mask
#
# A decoder is trained to predict every next token of the target at once:
# given $y_0, \dots, y_i$ it predicts $y_{i+1}$, for all $i$ in one pass.
# If position $i$ could attend to position $i+1$ it would simply read the
# answer. The causal mask, the paper's masking of "subsequent
# positions" {cite:p}`vaswani2017attention`, lets query $i$ see keys
# $0, \dots, i$ and
# nothing later:
#
# $$ M_{ij} = [\, j \le i \,]. $$
#
# It is the lower triangle of a square of ones, diagonal included:

# %%
print(inspect.getsource(causal_mask))

# %%
T = 8
tril = causal_mask(T, device=device)  # (1, T, T)
print(tril.shape)
print(tril[0].int())

# %% tags=["remove-cell"]
assert tril.shape == (1, T, T) and tril.dtype == torch.bool
_i = torch.arange(T, device=device)
assert torch.equal(tril[0], _i[None, :] <= _i[:, None])  # M_ij = [j <= i]

# %% [markdown]
# The leading `1` broadcasts over the batch: every sentence shares the
# same causal structure. As a picture, each row is a query and the dark
# cells are the keys it may see; the staircase is the arrow of time.

# %%
mask_chart(tril, title="Causal mask, T = 8 (dark = may attend)")

# %% [markdown]
# PyTorch's fused `F.scaled_dot_product_attention` knows this mask by the
# flag `is_causal=True`. Passing our mask instead must give the same
# output, and it does (checked in a hidden cell, on random $Q, K, V$ of
# shape $(B, H, T, D)$).

# %% tags=["remove-cell"]
_q, _k, _v = torch.randn(3, 2, H, T, 4, device=device)  # 3 x (B, H, T, D)
_a = F.scaled_dot_product_attention(_q, _k, _v, attn_mask=tril)
_b = F.scaled_dot_product_attention(_q, _k, _v, is_causal=True)
assert torch.allclose(_a, _b, atol=1e-6)
assert torch.allclose(scaled_dot_product_attention(_q, _k, _v, tril)[0], _b,
                      atol=1e-5)

# %% [markdown]
# ## Both at once: the decoder's mask
#
# The decoder's self-attention needs both rules: no padding and no future.
# A key is allowed when both masks allow it, so the combination is a
# logical *and*, and broadcasting does the rest:
#
# $$ \underbrace{(B, 1, T)}_{\text{padding}} \;\wedge\;
#    \underbrace{(1, T, T)}_{\text{causal}} \;\to\; (B, T, T). $$

# %%
print(inspect.getsource(target_mask))

# %% [markdown]
# Our target sentences start with the start token `<s>` and are padded on
# the right.

# %%
tgt = pad_batch([[VOCAB.index("<s>")] + encode(s) for s in SENTENCES],
                PAD_ID)  # (B, T)
T = tgt.size(1)
tgt_mask = target_mask(tgt, PAD_ID)  # (B, T, T)
print(tgt.shape, "->", tgt_mask.shape)

# %% tags=["remove-cell"]
assert tgt_mask.shape == (B, T, T)
_expected = padding_mask(tgt, PAD_ID) & causal_mask(T, device=device)
assert torch.equal(tgt_mask, _expected)
for _b in range(B):  # entry by entry: j <= i and token j is real
    for _i in range(T):
        for _j in range(T):
            _want = _j <= _i and tgt[_b, _j].item() != PAD_ID
            assert tgt_mask[_b, _i, _j].item() == _want

# %% [markdown]
# Side by side, one chart per sentence: the staircase of the causal mask,
# cut off on the right where the padding begins. Each query row is labelled
# with its token; hover for details.

# %%
charts = [
    heatmap(
        tgt_mask[b].float(),
        title=f"sentence {b}",
        x_title="key",
        y_title="query",
        value_title="may attend",
        x_labels=words(tgt[b]),
        y_labels=words(tgt[b]),
        scheme="greys",
        size=170,
    )
    for b in range(B)
]
alt.hconcat(*charts).properties(
    title="Target masks: causal AND not padding (dark = may attend)"
)

# %% [markdown]
# Every attention in the encoder-decoder model gets one of two masks:
#
# | attention | queries | keys | mask | shape |
# |---|---|---|---|---|
# | encoder self | source | source | `padding_mask(src)` | $(B, 1, S)$ |
# | decoder self | target | target | `target_mask(tgt)` | $(B, T, T)$ |
# | cross | target | source | `padding_mask(src)` | $(B, 1, S)$ |
#
# Cross-attention reuses the *source* padding mask: its keys are the
# encoder outputs, one per source token, and the padded ones must stay
# invisible to every target query. The target's own padding plays no part
# there, and no causal mask is needed, since the whole source is known
# before decoding starts. The $(B, 1, S)$ mask broadcasts over $T$
# queries just as it broadcast over $S$ queries in the encoder:

# %%
cross_scores = torch.Size((B, T, S))  # target queries x source keys
print(torch.broadcast_shapes(src_mask.shape, cross_scores))

# %% tags=["remove-cell"]
assert torch.broadcast_shapes(src_mask.shape, cross_scores) == cross_scores
_m = transformer_lite.make_model(12, 12, n_layers=1, d_model=16, d_ff=32,
                                 n_heads=2).to(device).eval()
# the model builds exactly these masks when none are given
with torch.no_grad():
    _explicit = _m.decode(_m.encode(src, src_mask), src_mask, tgt, tgt_mask)
    _default = _m.decode(_m.encode(src), src_mask, tgt)
    _full_explicit = _m(src, tgt, src_mask, tgt_mask)
    _full_default = _m(src, tgt)
assert torch.allclose(_full_explicit, _full_default, atol=1e-6)
assert torch.allclose(_explicit, _default, atol=1e-6)

# %% [markdown]
# ## Which way is True? A convention, and PyTorch's two
#
# A boolean mask needs one more decision: does `True` mean *may attend* or
# *masked out*? transformer-lite says **True = may attend**, everywhere.
# PyTorch, unfortunately, says both:
#
# | API | boolean `True` means | float mask |
# |---|---|---|
# | transformer-lite | may attend | not accepted |
# | `F.scaled_dot_product_attention` | takes part in attention | added |
# | `nn.MultiheadAttention` | **not** allowed to attend | added |
# | `nn.Transformer` and its layers | as `nn.MultiheadAttention` | added |
#
# ("added" means: added to the scores before the softmax.) The function's
# mask argument is `attn_mask`; `nn.MultiheadAttention` has two,
# `attn_mask` of shape $(L_q, L_k)$ and `key_padding_mask` of shape
# $(B, L_k)$; `nn.Transformer` and its encoder and decoder layers hand
# their masks (`src_mask`, `tgt_mask`, `src_key_padding_mask`, ...) on to
# it.
#
# These statements come from PyTorch's documentation. Let us not take them
# on trust, and run them. First, the same mask in the same convention:
# our attention and the fused function agree.

# %%
q, k, v = torch.randn(3, B, H, T, 4, device=device)  # 3 x (B, H, T, D)
mask4 = tgt_mask.unsqueeze(1)  # (B, 1, T, T), shared by the heads
ours_out, _ = scaled_dot_product_attention(q, k, v, mask4)  # (B, H, T, D)
sdpa_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask4)
print(f"ours vs F.scaled_dot_product_attention: "
      f"{(ours_out - sdpa_out).abs().max().item():.1e}")

# %% tags=["remove-cell"]
assert torch.allclose(ours_out, sdpa_out, atol=1e-5)

# %% [markdown]
# Now `nn.MultiheadAttention`. We build one with PyTorch and copy its
# weights into ours with `from_torch_mha`, so that the two compute the same
# function, and hand both the causal mask exactly as we built it.

# %%
seed_everything(SEED + 1)
torch_mha = nn.MultiheadAttention(C, H, dropout=0.0, batch_first=True)
torch_mha = torch_mha.to(device).eval()
ours_mha = from_torch_mha(torch_mha).eval().requires_grad_(False)


def run_torch_mha(query, key, value, **masks):
    """nn.MultiheadAttention's output, detached (its general path)."""
    out, _ = torch_mha(query, key, value, **masks)
    return out.detach()


x = torch.randn(B, T, C, device=device)  # (B, T, C)
tril = causal_mask(T, device=device)[0]  # (T, T)
ours_out = ours_mha(x, x, x, tril)  # (B, T, C)
theirs_raw = run_torch_mha(x, x, x, attn_mask=tril)  # our mask, unconverted
print("first query, ours:  ", ours_out[0, 0, :4])
print("first query, theirs:", theirs_raw[0, 0, :4])
print("last query, theirs: ", theirs_raw[0, -1, :4])

# %% [markdown]
# Same weights, same mask, different answers, and a NaN. PyTorch read our
# mask backwards: to `nn.MultiheadAttention` a `True` on and below the
# diagonal means *forbidden*, so each query was allowed to see only the
# strict future, and the last query, which has no future, was allowed to
# see nothing at all (we will meet that NaN again below). A hidden check
# confirms this reading: PyTorch's output equals ours given the strict
# future mask `~tril`.
#
# The fix is one function, `to_torch_attn_mask`, the only place in the
# package where the flip happens. For padding, `nn.MultiheadAttention`
# takes a separate `key_padding_mask` of shape $(B, S)$, the middle axis of
# our $(B, 1, S)$ squeezed away, flipped by the same function.

# %% tags=["remove-cell"]
_future = ours_mha(x, x, x, ~tril)
assert torch.isnan(theirs_raw[:, -1]).all()
assert not torch.isnan(theirs_raw[:, :-1]).any()
assert torch.allclose(theirs_raw[:, :-1], _future[:, :-1], atol=1e-5)
assert not torch.allclose(theirs_raw[:, :-1], ours_out[:, :-1], atol=1e-3)

# %%
print(inspect.getsource(to_torch_attn_mask))

# %%
tgt_pad = padding_mask(tgt, PAD_ID)[:, 0]  # (B, T)
theirs = run_torch_mha(x, x, x, attn_mask=to_torch_attn_mask(tril),
                       key_padding_mask=to_torch_attn_mask(tgt_pad))
ours_out = ours_mha(x, x, x, target_mask(tgt, PAD_ID))  # (B, T, C)
print(f"decoder self-attention, ours vs nn.MultiheadAttention: "
      f"{(ours_out - theirs).abs().max().item():.1e}")

memory = torch.randn(B, S, C, device=device)  # encoder output (B, S, C)
theirs = run_torch_mha(x, memory, memory,
                       key_padding_mask=to_torch_attn_mask(src_mask[:, 0]))
ours_out = ours_mha(x, memory, memory, src_mask)  # (B, T, C)
print(f"cross-attention,        ours vs nn.MultiheadAttention: "
      f"{(ours_out - theirs).abs().max().item():.1e}")

# %% tags=["remove-cell"]
_self = run_torch_mha(x, x, x, attn_mask=to_torch_attn_mask(tril),
                      key_padding_mask=to_torch_attn_mask(tgt_pad))
assert torch.allclose(ours_mha(x, x, x, tgt_mask), _self, atol=1e-5)
assert torch.allclose(ours_out, theirs, atol=1e-5)
# a per-sentence (B*H, T, T) attn_mask works the same way
_m3 = to_torch_attn_mask(tgt_mask).repeat_interleave(H, dim=0)
assert torch.allclose(run_torch_mha(x, x, x, attn_mask=_m3), _self,
                      atol=1e-5)
# the flip is its own inverse
assert torch.equal(to_torch_attn_mask(to_torch_attn_mask(tgt_mask)),
                   tgt_mask)
# nn.TransformerEncoderLayer hands its key-padding mask to MHA unchanged
seed_everything(SEED + 2)
_enc = nn.TransformerEncoderLayer(C, H, 32, dropout=0.0, batch_first=True)
_enc = _enc.to(device).eval()
_ours_enc = from_torch_encoder_layer(_enc).eval()
_xs = torch.randn(B, S, C, device=device)
_real = src_mask[:, 0]
_t = _enc(_xs, src_key_padding_mask=to_torch_attn_mask(_real)).detach()
_o = _ours_enc(_xs, src_mask).detach()
assert torch.allclose(_o[_real], _t[_real], atol=1e-5)
# ... and so does nn.TransformerDecoderLayer with all three of its masks
_dec = nn.TransformerDecoderLayer(C, H, 32, dropout=0.0, batch_first=True)
_dec = _dec.to(device).eval()
_ours_dec = from_torch_decoder_layer(_dec).eval()
_t = _dec(x, _xs, tgt_mask=to_torch_attn_mask(tril),
          tgt_key_padding_mask=to_torch_attn_mask(tgt_pad),
          memory_key_padding_mask=to_torch_attn_mask(_real)).detach()
_o = _ours_dec(x, _xs, src_mask, tgt_mask).detach()
assert torch.allclose(_o, _t, atol=1e-5)
# nn.Transformer: True = masked out (the converted causal mask equals its
# own float mask and keeps the past from seeing the future; ours, as is,
# does not)
_tr = nn.Transformer(C, H, 1, 1, 32, dropout=0.0, batch_first=True)
_tr = _tr.to(device).eval()
_flt = nn.Transformer.generate_square_subsequent_mask(T, device=device)
_y_bool = _tr(_xs, x, tgt_mask=to_torch_attn_mask(tril)).detach()
_y_float = _tr(_xs, x, tgt_mask=_flt).detach()
assert torch.allclose(_y_bool, _y_float, atol=1e-6)
_x2 = x.clone()
_x2[:, 4:] = torch.randn_like(_x2[:, 4:])
_y2 = _tr(_xs, _x2, tgt_mask=to_torch_attn_mask(tril)).detach()
assert torch.allclose(_y2[:, :4], _y_bool[:, :4], atol=1e-6)
_y_raw = _tr(_xs, x, tgt_mask=tril).detach()
assert not torch.allclose(_y_raw[:, :4], _y_bool[:, :4], atol=1e-3)

# %% [markdown]
# After conversion the two agree to float rounding, for the decoder's
# self-attention and for cross-attention alike. (A hidden cell also checks
# a per-sentence mask of shape $(B \cdot H, T, T)$, the other form
# `attn_mask` accepts; PyTorch's encoder and decoder layers, which read
# their masks the same way once they are converted; and `nn.Transformer`
# itself, whose converted causal mask keeps the past from seeing the
# future.)
#
# **Float masks are added, not obeyed.** Both PyTorch functions also accept a
# float mask, and then they do not read it as yes or no at all: they add it to
# the scores. A float mask of $0$ and $-\infty$ is the $B$ of the equation at
# the top, and `nn.Transformer.generate_square_subsequent_mask` returns exactly
# that. Any other float values are an additive bias, which is sometimes what
# you want (position biases such as ALiBi {cite:p}`press2022train` work this
# way; [chapter 9](09_positions_that_generalise) builds them) and often a
# bug: `mask.float()` turns our booleans into $1$ and $0$ and *adds one* to
# the allowed scores, which masks nothing.

# %%
subsequent = nn.Transformer.generate_square_subsequent_mask(4)
print(subsequent)

# %%
q, k, v = torch.randn(3, 1, 1, T, 4, device=device)  # 3 x (1, 1, T, D)
d_k = q.size(-1)
bias = torch.randn(T, T, device=device)  # any float (T, T)
by_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
by_hand = ((q @ k.transpose(-2, -1) / d_k**0.5 + bias).softmax(-1)) @ v
print(f"float mask is added: {(by_sdpa - by_hand).abs().max().item():.1e}")

as_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=tril)
as_float01 = F.scaled_dot_product_attention(q, k, v,
                                            attn_mask=tril.float())
print(f"bool mask vs the same mask as 1.0/0.0: "
      f"{(as_bool - as_float01).abs().max().item():.2f}")

# %% tags=["remove-cell"]
_inf = torch.zeros(4, 4).masked_fill(~causal_mask(4)[0], float("-inf"))
assert torch.equal(subsequent, _inf)
assert torch.allclose(by_sdpa, by_hand, atol=1e-5)
_additive = torch.zeros(T, T, device=device).masked_fill(~tril,
                                                         float("-inf"))
assert torch.allclose(
    F.scaled_dot_product_attention(q, k, v, attn_mask=_additive), as_bool,
    atol=1e-6)
# 1.0/0.0 is a bias of +1 on allowed keys, nothing is masked:
_plus_one = ((q @ k.transpose(-2, -1) / d_k**0.5 + tril.float())
             .softmax(-1)) @ v
assert torch.allclose(as_float01, _plus_one, atol=1e-5)
assert (as_bool - as_float01).abs().max() > 0.1
# nn.MultiheadAttention: a 0/-inf float mask == the flipped boolean mask
assert torch.allclose(run_torch_mha(x, x, x, attn_mask=_additive),
                      run_torch_mha(x, x, x,
                                    attn_mask=to_torch_attn_mask(tril)),
                      atol=1e-6)

# %% [markdown]
# ## The numerics of masking
#
# The equation says $-\infty$. Code has three common choices for that
# number, and they behave differently exactly where it matters: in a row
# whose every key is masked, and in half precision.
#
# Fully masked rows are not exotic. Pad a batch on the *left*, as is
# common when generating text for several prompts at once, and combine it
# with the causal mask: the first query is a padding token that may look
# only at itself, which is padding. Its row allows nothing.

# %%
left = torch.tensor([[PAD_ID, PAD_ID] + encode("the cat sat on"),
                     encode("a dog ran home the mat")], device=device)
left_mask = target_mask(left, PAD_ID)  # (B, T, T)
print(words(left[0]))
print("rows with no allowed key:", (~left_mask.any(dim=-1)).int().tolist())

# %% tags=["remove-cell"]
assert (~left_mask.any(dim=-1)).int().tolist() == [[1, 1, 0, 0, 0, 0],
                                                  [0, 0, 0, 0, 0, 0]]

# %% [markdown]
# To see the arithmetic, take three query rows over four keys: the first
# row may see everything, the second only two keys, the third nothing.

# %%
scores = torch.tensor([[2.0, 1.0, 0.5, -1.0],
                       [2.0, 1.0, 0.5, -1.0],
                       [2.0, 1.0, 0.5, -1.0]], device=device)  # (3, 4)
mask = torch.tensor([[True, True, True, True],
                     [True, False, True, False],
                     [False, False, False, False]], device=device)

# %% [markdown]
# **(a) $-\infty$.** Exactly the equation. It works for the first two rows:
# masked keys get weight $0$. In the third row every entry is $-\infty$,
# the softmax computes $e^{-\infty} / \sum e^{-\infty} = 0/0$, and the row
# becomes NaN. Worse, NaN spreads: through the next matrix product and
# into anything summed from it, such as the loss.

# %%
w_inf = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
print(w_inf)

# %% tags=["remove-cell"]
assert torch.isfinite(w_inf[:2]).all()
assert torch.allclose(w_inf[:2].sum(-1), torch.ones(2, device=device))
assert (w_inf[:2][~mask[:2]] == 0).all()
assert torch.isnan(w_inf[2]).all()
assert torch.isnan((w_inf @ torch.randn(4, 2, device=device)).sum())

# %% [markdown]
# **(b) $-10^9$**, as the Annotated Transformer
# {cite:p}`rush2018annotated` does. In float32
# this is an ordinary number, far below any real score, so $e^{-10^9 - \max}$
# rounds to exactly zero and the first two rows come out as with $-\infty$. In
# the third row every entry is the same $-10^9$, and the softmax of equal
# numbers is *uniform*: no NaN, but a query that averages the very keys it was
# told to ignore. Finite, and quietly wrong.

# %%
w_1e9 = scores.masked_fill(~mask, -1e9).softmax(dim=-1)
print(w_1e9)

# %% tags=["remove-cell"]
assert torch.equal(w_1e9[:2], w_inf[:2])
assert torch.allclose(w_1e9[2], torch.full((4,), 0.25, device=device))

# %% [markdown]
# In float16 the number does not exist. The largest float16 magnitude is
# 65504, so $-10^9$ converted to float16 becomes $-\infty$, and
# `masked_fill` on a half tensor refuses it outright. (We ran this, on the
# device printed at the top; the error message is PyTorch's own.) bfloat16
# keeps float32's exponent range and stores $-10^9$, rounded.

# %%
print(torch.tensor(-1e9, dtype=torch.float16))
try:
    scores.half().masked_fill(~mask, -1e9)
    half_error = None
except RuntimeError as error:
    half_error = str(error)
print("float16 masked_fill(-1e9):", half_error)
print("bfloat16 masked_fill(-1e9):",
      scores.bfloat16().masked_fill(~mask, -1e9)[1])

# %% tags=["remove-cell"]
assert torch.tensor(-1e9, dtype=torch.float16).item() == float("-inf")
assert half_error is not None and "overflow" in half_error
_bf = scores.bfloat16().masked_fill(~mask, -1e9)
assert torch.isfinite(_bf).all() and _bf.min().item() < -9e8
# an additive float16 mask built from -1e9 holds -inf: NaN again
_additive16 = torch.where(mask, 0.0, -1e9).half()
assert torch.isinf(_additive16[~mask]).all()
assert torch.isnan((scores.half() + _additive16).softmax(-1)[2]).all()

# %% [markdown]
# Mixed-precision training {cite:p}`micikevicius2018mixed` computes scores in
# float16, so a model written with $-10^9$ crashes the moment it is
# switched to half precision. Had the $-10^9$ been an additive float mask
# instead, it would have become $-\infty$ without a word and brought back
# the NaN of (a).
#
# **(c) The dtype's own minimum.** `torch.finfo(dtype).min` is the most
# negative *finite* number of each dtype, so it fits by construction:

# %%
for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
    print(f"{str(dtype):15} finfo.min = {torch.finfo(dtype).min:.4g}")

# %% tags=["remove-cell"]
for _dtype in (torch.float32, torch.bfloat16, torch.float16):
    _min = torch.finfo(_dtype).min
    assert torch.isfinite(torch.tensor(_min, dtype=_dtype))
    _w = scores.to(_dtype).masked_fill(~mask, _min).softmax(-1)
    assert (_w[:2][~mask[:2]] == 0).all()  # masked keys: exactly 0
    assert torch.allclose(_w[2].float(),  # empty row: finite and uniform
                          torch.full((4,), 0.25, device=device))

# %% [markdown]
# Being finite, it never produces $0/0$: a fully masked row softmaxes to a
# uniform row, as $-10^9$ did. transformer-lite then adds the one step
# that makes the result right and not merely finite: after the softmax it
# sets the weights of all masked keys to zero. In a row with at least one
# allowed key this changes nothing (its masked keys already had weight
# exactly $0$); a fully masked row becomes all zeros, and so does its
# output. "Attends to nothing" then
# means what it says. Here is the package's
# `scaled_dot_product_attention` from the scores on; the two lines that
# matter are its two `masked_fill` calls, the fill with the dtype's
# minimum before the softmax and the zeros after it:

# %%
source = inspect.getsource(scaled_dot_product_attention)
print(source[source.index("    with full_precision("):])

# %% tags=["remove-cell"]
# The printed code fills twice: finfo.min before the softmax, 0 after it.
_tail = source[source.index("    with full_precision("):]
assert _tail.count(".masked_fill(") == 2, _tail
assert _tail.index("finfo(scores.dtype).min") < _tail.index(".softmax(")
assert _tail.index(".softmax(") < _tail.index("masked_fill(~mask, 0.0)")

# %% [markdown]
# The same left-padded batch, through the package function in three
# dtypes: no NaN anywhere, the masked weights exactly zero, the fully
# masked rows all zero, and the other rows summing to one.

# %%
q, k, v = torch.randn(3, 2, H, 6, 4, device=device)  # 3 x (B, H, T, D)
mask4 = left_mask.unsqueeze(1)  # (B, 1, T, T)
empty = ~mask4.any(dim=-1)  # (B, 1, T): rows with nothing to attend to
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    out, w = scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), mask4
    )  # (B, H, T, D), (B, H, T, T)
    print(f"{str(dtype)}: any NaN: {bool(out.isnan().any())}")
    print("  query 0 (pad, empty):", w[0, 0, 0].float().cpu().numpy().round(2))
    print("  query 3 ('cat'):     ", w[0, 0, 3].float().cpu().numpy().round(2))

# %% tags=["remove-cell"]
_ref, _ = scaled_dot_product_attention(q, k, v, mask4)
for _dtype, _tol in ((torch.float32, 1e-6), (torch.float16, 1e-2),
                     (torch.bfloat16, 5e-2)):
    _out, _w = scaled_dot_product_attention(
        q.to(_dtype), k.to(_dtype), v.to(_dtype), mask4)
    assert not _out.isnan().any() and not _w.isnan().any()
    assert (_w.masked_select(~mask4.expand_as(_w)) == 0).all()
    assert (_w[empty.expand(-1, H, -1)] == 0).all()
    assert (_out[empty.expand(-1, H, -1)] == 0).all()
    _sums = _w.float().sum(-1)[~empty.expand(-1, H, -1)]
    assert torch.allclose(_sums, torch.ones_like(_sums), atol=_tol)
    assert torch.allclose(_out.float(), _ref, atol=_tol * 4)
# rows with an allowed key: the same as the -inf equation
_s = q @ k.transpose(-2, -1) / 2.0
_w_inf = _s.masked_fill(~mask4, float("-inf")).softmax(-1)
_ok = ~empty.expand(-1, H, -1)
assert torch.allclose(scaled_dot_product_attention(q, k, v, mask4)[1][_ok],
                      _w_inf[_ok], atol=1e-6)
# the fused path of MultiHeadAttention follows the same zero rule
_xl = torch.randn(2, 6, C, device=device)
_plain = MultiHeadAttention(C, H, dropout=0.0).to(device).eval()
_fused = MultiHeadAttention(C, H, dropout=0.0, kernel="fused")
_fused = _fused.to(device).eval()
_fused.load_state_dict(_plain.state_dict())
with torch.no_grad():
    _a = _plain(_xl, _xl, _xl, left_mask)
    _b = _fused(_xl, _xl, _xl, left_mask)
assert torch.allclose(_a, _b, atol=1e-5) and not _b.isnan().any()
# The heads of an empty row are zero, so the module's output there is
# W^O applied to zero: W^O's bias, in both paths.
_empty = ~left_mask.any(dim=-1)  # (B, T)
assert _empty.any()
for _module, _y in ((_plain, _a), (_fused, _b)):
    _bias = _module.w_o.bias.expand(int(_empty.sum()), C)
    assert torch.equal(_y[_empty], _bias)

# %% [markdown]
# `MultiHeadAttention(kernel="fused")`, which calls PyTorch's fused kernel,
# applies the same rule to the attention's output, so in both paths the
# heads of an empty row are zero. The module's output for that row is
# then $W^O$ applied to zero, which is not zero but $W^O$'s bias (a
# hidden cell checks that the two paths agree on this batch and give
# exactly that bias in the empty rows). The
# design choice, then: **mask with `torch.finfo(dtype).min` inside the
# softmax, zero the masked weights after it.** It needs no special
# constant per dtype, it cannot overflow, and it gives an empty row a
# definite, harmless meaning.
#
# ## Do the masks do what they claim?
#
# Two properties define the masks, and both can be tested from the
# outside, without looking at a single weight.
#
# **Causality.** Changing the input at position $t$ must leave every
# output before $t$ unchanged. We change the input at position 5 of 10 and
# measure how much each output moves, once with the causal mask and once
# without.

# %%
L, t = 10, 5
x = torch.randn(1, L, C, device=device)  # (1, L, C)
x_changed = x.clone()
x_changed[:, t] += torch.randn(C, device=device)

tril = causal_mask(L, device=device)  # (1, L, L)
change_causal = (attn(x_changed, x_changed, x_changed, tril)
                 - attn(x, x, x, tril)).abs().amax(dim=-1)[0]  # (L,)
change_open = (attn(x_changed, x_changed, x_changed)
               - attn(x, x, x)).abs().amax(dim=-1)[0]  # (L,)

fig, axes = plt.subplots(1, 2, figsize=(6, 3.5), sharey=True)
for ax, change, name in ((axes[0], change_open, "no mask"),
                         (axes[1], change_causal, "causal mask")):
    ax.bar(range(L), change.cpu(), color="tab:blue")
    ax.set_xticks(range(L))
    ax.axvline(t, color="tab:red", linestyle="--", linewidth=1)
    ax.set_title(name)
    ax.set_xlabel("output position")
axes[0].set_ylabel("largest change")
fig.suptitle(f"Changing input position {t} (red line)")
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
assert torch.allclose(change_causal[:t], torch.zeros(t, device=device),
                      atol=1e-6)
assert (change_causal[t:] > 1e-3).all()
assert (change_open > 1e-3).all()  # without the mask, the test would fail

# %% [markdown]
# Without a mask, one changed input moves every output. With the causal
# mask the outputs before position 5 do not move at all; from position 5
# on, they may.
#
# **Padding invariance.** Changing the input at a *padded* position must
# leave every output at a real position unchanged. We fill the padded
# positions of our batch with random vectors and check all three uses of
# the masks from the table above: encoder self-attention, decoder
# self-attention, and cross-attention (where the padded positions are
# those of the source memory).

# %%
def scramble_padding(x, tokens):
    """x with random vectors at the padded positions of tokens."""
    pad = (tokens == PAD_ID).unsqueeze(-1)  # (B, L, 1)
    return torch.where(pad, torch.randn_like(x), x)


xs = embed(src)  # (B, S, C)
xt = embed(tgt)  # (B, T, C)
xs_2, xt_2 = scramble_padding(xs, src), scramble_padding(xt, tgt)
real_s, real_t = src != PAD_ID, tgt != PAD_ID  # (B, S), (B, T)

enc = (attn(xs, xs, xs, src_mask), attn(xs_2, xs_2, xs_2, src_mask))
dec = (attn(xt, xt, xt, tgt_mask), attn(xt_2, xt_2, xt_2, tgt_mask))
cross = (attn(xt, xs, xs, src_mask), attn(xt, xs_2, xs_2, src_mask))
for name, (before, after), real in (("encoder", enc, real_s),
                                    ("decoder", dec, real_t),
                                    ("cross", cross, real_t)):
    moved = (after - before)[real].abs().max().item()
    print(f"{name:8} largest change at real positions: {moved:.1e}")

# %% tags=["remove-cell"]
for _before, _after, _real in ((*enc, real_s), (*dec, real_t),
                               (*cross, real_t)):
    assert torch.allclose(_before[_real], _after[_real], atol=1e-6)
# teeth: without masks the real positions do move
_open = attn(xs_2, xs_2, xs_2) - attn(xs, xs, xs)
assert _open[real_s & (src_mask.sum(-1) < S)].abs().max() > 1e-3
_open = attn(xt, xs_2, xs_2) - attn(xt, xs, xs)
assert _open[real_t].abs().max() > 1e-3

# %% [markdown]
# Zero, or float rounding away from it, in all three. (Hidden cells also
# run both checks without the masks, and there the outputs do move: the
# checks can fail.)
#
# ## A glimpse ahead: sliding windows
#
# Attention scores every query against every key, which is why its cost
# grows with $L^2$, whatever the mask. The causal mask does not change
# that, and even the pairs it allows grow with $L^2$: position $i$ sees
# all $i + 1$ positions up to its own, $L(L+1)/2$ pairs in all. A
# **local** (sliding-window) mask keeps only the most recent $w$:
#
# $$ M_{ij} = [\, i - w < j \le i \,]. $$

# %%
print(inspect.getsource(local_mask))

# %%
window = local_mask(10, window=3, device=device)  # (1, L, L)
mask_chart(window, title="Local causal mask, L = 10, window w = 3")

# %% tags=["remove-cell"]
_i = torch.arange(10, device=device)
_want = (_i[None, :] <= _i[:, None]) & (_i[None, :] > _i[:, None] - 3)
assert torch.equal(window[0], _want)
assert window[0].sum(-1).tolist() == [min(i + 1, 3) for i in range(10)]
assert torch.equal(local_mask(10, 10), causal_mask(10))
assert torch.equal(local_mask(10, 1)[0], torch.eye(10, dtype=torch.bool))
# the causal mask allows L (L + 1) / 2 pairs, the local one at most L w
assert int(causal_mask(10).sum()) == 10 * 11 // 2
assert int(window.sum()) <= 10 * 3

# %% [markdown]
# Each row now has at most $w$ allowed keys, a band along the diagonal.
# As a mask it saves nothing by itself: `scaled_dot_product_attention`
# still computes all $L^2$ scores and then discards most of them. Turning
# the pattern into real savings takes kernels that skip masked blocks, a
# subject for chapter 8 (*Making it fast*).
#
# ## Summary
#
# - A mask is a boolean matrix over (query, key) pairs. transformer-lite
#   uses **True = may attend** everywhere, as
#   `F.scaled_dot_product_attention` does.
# - `padding_mask(tokens, PAD_ID)` has shape $(B, 1, S)$: padding is a
#   property of keys, and the `1` broadcasts over all queries (and, with
#   one more axis, over heads).
# - `causal_mask(L)` is the lower triangle, shape $(1, L, L)$, shared by
#   the batch; `target_mask` combines both with a logical *and* into
#   $(B, T, T)$. The encoder and cross-attention use the source padding
#   mask, the decoder's self-attention the target mask.
# - `nn.MultiheadAttention` and `nn.Transformer` read boolean masks the
#   other way round (True = forbidden). Convert with `to_torch_attn_mask`;
#   unconverted, the causal mask becomes a "future only" mask and its
#   last row NaN. Float masks, everywhere in PyTorch, are *added*:
#   `mask.float()` masks nothing.
# - $-\infty$ turns a fully masked row into NaN; $-10^9$ makes it a
#   uniform average in float32 and fails in float16. The package fills
#   with `torch.finfo(dtype).min` and zeroes masked weights after the
#   softmax: no overflow in any dtype, and an empty row gives zero
#   weights and a zero attention output (after $W^O$, its bias).
# - Test masks from the outside: change a later input, earlier outputs
#   must not move; change a padded input, real outputs must not move.
#
# ## Exercises
#
# 1. **Left padding.** Build a batch of three target sentences padded on
#    the *left*, with different amounts of padding. Before running
#    anything, predict which rows of `target_mask` allow no key at all;
#    then check with `~mask.any(dim=-1)`. Run the batch through `attn`
#    and confirm that the outputs in those rows all equal the bias of
#    its output projection, `attn.w_o.bias`: the attention itself gives
#    exactly zero there, and $W^O$ maps zero to its bias. Would the
#    same rows be empty with the padding on the right?
# 2. **A prefix-LM mask.** Some models read a prompt of $P$ tokens
#    bidirectionally and generate the rest causally. Write
#    `prefix_mask(size, prefix)` returning a $(1, L, L)$ boolean mask
#    (True = may attend) in which positions $< P$ see each other freely
#    and later positions are causal. Draw it with `mask_chart`, then adapt
#    the causality check: changing input $t \ge P$ must not move outputs
#    before $t$, while changing any input $t < P$ *does* move output 0.
# 3. **Why `masked_fill` and not addition?** Build the additive float mask
#    $B$ in float16 with `torch.finfo(torch.float16).min` in place of
#    $-\infty$, and add it to float16 scores that are themselves
#    negative, say $-100$. Print the sum, then the softmax of a fully
#    masked row. What went wrong, and why does filling (as the package
#    does) avoid it?

# %% tags=["remove-cell"]
# Exercise 1 as stated: left padding, the empty rows of target_mask, and
# attn's outputs there equal to W^O's bias (not zero); on the right, none.
_left3 = torch.tensor([[PAD_ID] + encode("the cat sat on the"),
                       [PAD_ID] * 2 + encode("a dog ran home"),
                       [PAD_ID] * 3 + encode("the dog sat")], device=device)
_mask3 = target_mask(_left3, PAD_ID)  # (B, T, T)
_empty3 = ~_mask3.any(dim=-1)  # (B, T)
assert _empty3.int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0],
                                  [1, 1, 1, 0, 0, 0]]  # fmt: skip
_x3 = embed(_left3)  # (B, T, C)
_heads3 = scaled_dot_product_attention(
    attn.split_heads(attn.w_q(_x3)), attn.split_heads(attn.w_k(_x3)),
    attn.split_heads(attn.w_v(_x3)), _mask3.unsqueeze(1))[0]  # (B, H, T, D)
assert (_heads3.transpose(1, 2)[_empty3] == 0).all()  # zero before W^O
_y3 = attn(_x3, _x3, _x3, _mask3)  # (B, T, C)
assert attn.w_o.bias.abs().min() > 0  # so "the bias" is not "zero"
assert torch.equal(_y3[_empty3], attn.w_o.bias.expand(6, C))
_right3 = pad_batch([encode(s) for s in ("the cat sat on the",
                                         "a dog ran home", "the dog sat")],
                    PAD_ID)  # (B, T)
assert target_mask(_right3, PAD_ID).any(dim=-1).all()

# %% [markdown]
# ## Graded exercises
#
# Nine exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then
# open them. The classroom edition (the teaching page) hands out the
# same exercises with the solutions removed, and nbgrader scores them.
# Every mask here follows the chapter's convention: a bool tensor in
# which True means *may attend*.

# %% tags=["exercise-setup"]
import math

import torch
from torch import nn

from transformer_lite import MultiHeadAttention
from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
    expect_tensor,
    watch,
)
from transformer_lite.interop import from_torch_mha

PAD_ID = 0
# (B, L) token ids: three sentences padded on the right, then the left
right = torch.tensor([[5, 3, 7, 2, 9, 4],
                      [8, 6, 2, 0, 0, 0],
                      [4, 9, 0, 0, 0, 0]])  # fmt: skip
left = torch.tensor([[5, 3, 7, 2, 9, 4],
                     [0, 0, 0, 8, 6, 2],
                     [0, 0, 0, 0, 4, 9]])  # fmt: skip
gen = torch.Generator().manual_seed(2)
torch.manual_seed(2)  # the initial weights of the two modules below
C, H = 16, 2
attn = MultiHeadAttention(C, H, dropout=0.0).double().eval()
torch_mha = nn.MultiheadAttention(C, H, dropout=0.0, batch_first=True)
torch_mha = torch_mha.double().eval()

# %% [markdown]
# ### Exercise 2.1: the padding mask (1 point)
#
# Write `make_padding_mask(tokens, pad_id)`: for token ids of shape
# $(B, S)$, a bool mask of shape $(B, 1, S)$ that is True where the
# key is a real token and False where it is `pad_id`. The middle axis
# of size 1 broadcasts over the queries.

# %% tags=["solution", "hide-input"]
def make_padding_mask(tokens, pad_id):
    ### BEGIN SOLUTION
    return (tokens != pad_id).unsqueeze(1)  # (B, 1, S)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import padding_mask

with exercise("2.1", twins=[padding_mask]):
    got = make_padding_mask(right, PAD_ID)
    expect_tensor("make_padding_mask(right, PAD_ID)", got, shape=(3, 1, 6),
                  dtype=torch.bool,
                  hint="compare the ids with pad_id (a bool tensor), then "
                  "add the query axis with unsqueeze(1)")  # fmt: skip
    expect_equal("make_padding_mask(right, PAD_ID)", got,
                 padding_mask(right, PAD_ID),
                 hint="True marks a real token, False the padding: use "
                 "tokens != pad_id")  # fmt: skip
    expect_equal("make_padding_mask(right, 9)", make_padding_mask(right, 9),
                 padding_mask(right, 9),
                 hint="use the pad_id argument, not a fixed 0")  # fmt: skip

# %% [markdown]
# ### Exercise 2.2: the causal mask (1 point)
#
# Write `make_causal_mask(L)`: the bool mask of shape $(1, L, L)$ with
# $M_{ij} = [\, j \le i \,]$, so that query $i$ may attend to keys
# $0, \dots, i$ and to nothing later. The leading 1 broadcasts over
# the batch.

# %% tags=["solution", "hide-input"]
def make_causal_mask(L):
    ### BEGIN SOLUTION
    ones = torch.ones(L, L, dtype=torch.bool)
    return torch.tril(ones).unsqueeze(0)  # (1, L, L)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import causal_mask

with exercise("2.2", twins=[causal_mask]):
    for L in (1, 5):
        expect_equal(f"make_causal_mask({L})", make_causal_mask(L),
                     causal_mask(L),
                     hint="query i may see keys 0..i: the lower triangle, "
                     "diagonal included (torch.tril), True = may "
                     "attend")  # fmt: skip

# %% [markdown]
# ### Exercise 2.3: the decoder's mask (1 point)
#
# Write `make_target_mask(tgt, pad_id)`: for target ids of shape
# $(B, T)$, the mask of shape $(B, T, T)$ that allows key $j$ to query
# $i$ when $j \le i$ *and* token $j$ is not padding. Build it from your
# two functions above and let broadcasting do the rest.

# %% tags=["solution", "hide-input"]
def make_target_mask(tgt, pad_id):
    ### BEGIN SOLUTION
    T = tgt.size(1)
    return make_padding_mask(tgt, pad_id) & make_causal_mask(T)  # (B, T, T)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import target_mask

with exercise("2.3", twins=[target_mask], after=["2.1", "2.2"]):
    for name, tgt in (("right", right), ("left", left)):
        expect_equal(f"make_target_mask({name}, PAD_ID)",
                     make_target_mask(tgt, PAD_ID), target_mask(tgt, PAD_ID),
                     hint="a key must pass both masks: combine them with & "
                     "(a logical and); (B, 1, T) & (1, T, T) broadcasts to "
                     "(B, T, T)")  # fmt: skip

# %% [markdown]
# ### Exercise 2.4: a masked softmax that never gives NaN (2 points)
#
# Write `masked_softmax(scores, mask)`: the softmax along the last axis
# of `scores` $(\dots, L_q, L_k)$ over the keys that `mask` allows
# (`mask` broadcasts to the shape of `scores`). The result has the
# shape and dtype of `scores`, and
#
# - a masked key gets weight exactly $0$;
# - a row in which no key is allowed gets all-zero weights, not NaN
#   and not a uniform row;
# - it works in float16 as well: fill the masked scores with the
#   dtype's most negative finite number, `torch.finfo(dtype).min`.
#
# The first check compares with the equation's $-\infty$ version, in
# which the NaN of an empty row is replaced by zeros. Both checks also
# watch your function run: it must never make a NaN, not even one it
# removes afterwards.

# %% tags=["solution", "hide-input"]
def masked_softmax(scores, mask):
    ### BEGIN SOLUTION
    lowest = torch.finfo(scores.dtype).min
    weights = scores.masked_fill(~mask, lowest).softmax(dim=-1)
    return weights.masked_fill(~mask, 0.0)  # (..., Lq, Lk)
    ### END SOLUTION


# %% tags=["check"]
scores = torch.randn(3, 6, 6, generator=gen, dtype=torch.float64)
mask = target_mask(left, PAD_ID)  # (B, T, T); some rows allow nothing
# the equation with -inf, and zeros for the rows that come out NaN
want = scores.masked_fill(~mask, -math.inf).softmax(-1).nan_to_num(0.0)
with exercise("2.4"):
    with watch() as seen:
        got = masked_softmax(scores, mask)
    expect_close("masked_softmax(scores, mask)", got, want,
                 hint="a query with no allowed key must get all-zero "
                 "weights: after the softmax, set the weights of the "
                 "masked keys to 0")  # fmt: skip
    expect(not seen.made_nan,
           "masked_softmax makes a NaN on the way (and hides it after)",
           hint="fill the masked scores with torch.finfo(scores.dtype)"
           ".min, not -inf: then no row is ever 0/0")  # fmt: skip

# %% tags=["check"]
scores16 = (8 * torch.randn(3, 6, 6, generator=gen)).half()
mask = target_mask(left, PAD_ID)  # (B, T, T); some rows allow nothing
hint16 = ("fill with torch.finfo(scores.dtype).min: -1e9 does not fit "
          "in float16, and -inf gives NaN in an empty row")  # fmt: skip
want16 = (scores16.double().masked_fill(~mask, -math.inf).softmax(-1)
          .nan_to_num(0.0))  # fmt: skip
with exercise("2.4"):
    try:
        with watch() as seen:
            got16 = masked_softmax(scores16, mask)
    except NotImplementedError:
        raise
    except RuntimeError as error:
        expect(False, f"masked_softmax raised in float16: {error}",
               hint=hint16)  # fmt: skip
    expect(not seen.made_nan,
           "masked_softmax makes a NaN on the way (and hides it after)",
           hint=hint16)  # fmt: skip
    expect_tensor("masked_softmax(scores16, mask)", got16, shape=(3, 6, 6),
                  dtype=torch.float16, hint=hint16)  # fmt: skip
    expect_close("masked_softmax(scores16, mask)", got16, want16, atol=2e-3,
                 rtol=0, hint=hint16)  # fmt: skip

# %% [markdown]
# ### Exercise 2.5: masked attention (1 point)
#
# Write `masked_attention(Q, K, V, mask)`: chapter 1's attention
# $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$ with the softmax replaced
# by your `masked_softmax`, so that each query averages only the
# values of the keys it may see. The inputs are $(\dots, L_q, d_k)$,
# $(\dots, L_k, d_k)$ and $(\dots, L_k, d_v)$, the output
# $(\dots, L_q, d_v)$. The mask may be $(B, 1, L_k)$, $(B, L_q, L_k)$
# or carry a head axis; it only has to broadcast to the scores.

# %% tags=["solution", "hide-input"]
def masked_attention(Q, K, V, mask):
    ### BEGIN SOLUTION
    d_k = Q.size(-1)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)
    return masked_softmax(scores, mask) @ V  # (..., Lq, Dv)
    ### END SOLUTION


# %% tags=["check"]
import torch.nn.functional as F

from transformer_lite import scaled_dot_product_attention

# decoder self-attention over the left-padded batch, two heads
Q, K, V = (torch.randn(3, H, 6, 4, generator=gen, dtype=torch.float64)
           for _ in range(3))  # fmt: skip
mask4 = target_mask(left, PAD_ID).unsqueeze(1)  # (B, 1, T, T)
# cross-attention: 2 target queries over the 6 padded source keys
Qx = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64)
src_mask = padding_mask(right, PAD_ID)  # (B, 1, S)
with exercise("2.5", after=["2.4"], twins=[
        scaled_dot_product_attention, F.scaled_dot_product_attention]):
    expect_close("masked_attention(Q, K, V, mask4)",
                 masked_attention(Q, K, V, mask4),
                 scaled_dot_product_attention(Q, K, V, mask4)[0],
                 hint="the scores are Q K^T / sqrt(d_k); mask them, "
                 "softmax, then multiply the weights by V")  # fmt: skip
    expect_close("masked_attention(Qx, K[:, 0], V[:, 0], src_mask)",
                 masked_attention(Qx, K[:, 0], V[:, 0], src_mask),
                 scaled_dot_product_attention(Qx, K[:, 0], V[:, 0],
                                              src_mask)[0],
                 hint="let the (B, 1, S) mask broadcast over the queries; "
                 "L_q need not equal L_k")  # fmt: skip

# %% [markdown]
# ### Exercise 2.6: PyTorch's convention (2 points)
#
# `nn.MultiheadAttention` reads a bool mask the other way round:
# True means *masked out*. It takes the decoder's two rules as two
# arguments, `attn_mask` of shape $(T, T)$ for the future and
# `key_padding_mask` of shape $(B, T)$ for the padding. Write
# `torch_masks(tgt, pad_id)` returning the pair
# `(attn_mask, key_padding_mask)` in PyTorch's convention for target
# ids of shape $(B, T)$. The second check runs `torch_mha` with your
# masks against the same weights in our module with `target_mask`.

# %% tags=["solution", "hide-input"]
def torch_masks(tgt, pad_id):
    ### BEGIN SOLUTION
    T = tgt.size(1)
    future = ~make_causal_mask(T)[0]  # (T, T), True = masked out
    padding = tgt == pad_id  # (B, T), True = masked out
    return future, padding
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.masks import to_torch_attn_mask

with exercise("2.6", after=["2.2"],
              twins=[to_torch_attn_mask, causal_mask, padding_mask]):
    attn_mask, key_padding_mask = torch_masks(right, PAD_ID)
    expect_equal("attn_mask", attn_mask,
                 to_torch_attn_mask(causal_mask(6)[0]),
                 hint="attn_mask is (T, T) and True where query i may NOT "
                 "see key j, that is j > i: the strict upper "
                 "triangle")  # fmt: skip
    expect_equal("key_padding_mask", key_padding_mask,
                 to_torch_attn_mask(padding_mask(right, PAD_ID)[:, 0]),
                 hint="key_padding_mask is (B, T), no query axis, and True "
                 "at the padding")  # fmt: skip

# %% tags=["check"]
x = torch.randn(3, 6, C, generator=gen, dtype=torch.float64)  # (B, T, C)
ours = from_torch_mha(torch_mha).eval()
with exercise("2.6", after=["2.2"],
              twins=[to_torch_attn_mask, causal_mask, padding_mask]):
    attn_mask, key_padding_mask = torch_masks(right, PAD_ID)
    theirs, _ = torch_mha(x, x, x, attn_mask=attn_mask,
                          key_padding_mask=key_padding_mask)  # fmt: skip
    expect_close("nn.MultiheadAttention with your masks", theirs.detach(),
                 ours(x, x, x, target_mask(right, PAD_ID)).detach(),
                 hint="PyTorch reads True as masked out: flip our masks "
                 "with ~, do not pass them as they are")  # fmt: skip

# %% [markdown]
# ### Exercise 2.7: a prefix-LM mask, tested from the outside (2 points)
#
# Some models read a prompt of $P$ tokens in both directions and
# generate the rest causally. Write `prefix_mask(L, P)`, a bool mask of
# shape $(1, L, L)$ in which query $i$ may attend to key $j$ when
# $j \le i$ or $j < P$: the first $P$ positions see each other freely,
# and every later position sees the whole prompt and its own past.
# With $P = 0$ or $P = 1$ it is the causal mask. The second check
# tests your mask from the outside, with `attn`: changing the input
# at a position $t \ge P$ must leave every output before $t$
# unchanged, while changing the last prompt input must move output 0.

# %% tags=["solution", "hide-input"]
def prefix_mask(L, P):
    ### BEGIN SOLUTION
    i = torch.arange(L).unsqueeze(1)  # (L, 1): queries
    j = torch.arange(L).unsqueeze(0)  # (1, L): keys
    return ((j <= i) | (j < P)).unsqueeze(0)  # (1, L, L)
    ### END SOLUTION


# %% tags=["check"]
want = torch.tensor([[[1, 1, 0, 0],
                      [1, 1, 0, 0],
                      [1, 1, 1, 0],
                      [1, 1, 1, 1]]], dtype=torch.bool)  # fmt: skip
with exercise("2.7"):
    expect_equal("prefix_mask(4, 2)", prefix_mask(4, 2), want,
                 hint="query i may see key j when j <= i OR j < P: the "
                 "prompt is a full block, the rest a lower "
                 "triangle")  # fmt: skip
    for P in (0, 1):
        expect_equal(f"prefix_mask(5, {P})", prefix_mask(5, P),
                     causal_mask(5),
                     hint="with no prompt, or a one-token prompt, the mask "
                     "is the causal mask")  # fmt: skip
    expect(bool(prefix_mask(5, 5).all()),
           "prefix_mask(5, 5) should allow every pair",
           hint="a prompt of the whole length is read in both "
           "directions")  # fmt: skip

# %% tags=["check"]
L, P = 8, 3
x = torch.randn(1, L, C, generator=gen, dtype=torch.float64)  # (1, L, C)
with exercise("2.7"):
    mask = prefix_mask(L, P)  # (1, L, L)
    before = attn(x, x, x, mask)
    for t in range(P, L):
        x_t = x.clone()
        x_t[:, t] += 1.0
        expect_close(f"attn(x_t, x_t, x_t, mask)[:, :{t}], input {t} "
                     "changed", attn(x_t, x_t, x_t, mask)[:, :t],
                     before[:, :t],
                     hint="a key after the prompt must stay hidden from "
                     "every earlier query: outside the prompt the mask is "
                     "causal")  # fmt: skip
    x_t = x.clone()
    x_t[:, P - 1] += 1.0
    moved = (attn(x_t, x_t, x_t, mask)[:, 0] - before[:, 0]).abs().max()
    expect(bool(moved > 1e-6),
           f"output 0 did not move when input {P - 1} changed",
           hint="inside the prompt every query sees every prompt key, the "
           "later ones too")  # fmt: skip

# %% [markdown]
# ### Exercise 2.8: predict, then run (1 point)
#
# Decide before you run the cell below it. A query whose keys are *all*
# masked has every score replaced by the same large negative number;
# here we use $-10^9$, as many codebases do, in float32. What does
# the softmax give that row? Set `prediction` to one of the strings
# `"zeros"` (every weight 0), `"uniform"` (every weight $1/L_k$) or
# `"nan"`; then run the experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "uniform"
### END SOLUTION

# %% [markdown]
# The experiment: one query, four keys, every one of them masked.

# %%
scores = torch.tensor([[0.3, -1.2, 2.0, 0.5]])  # (1, Lk)
nobody = torch.zeros(1, 4, dtype=torch.bool)  # (1, Lk): no key allowed
weights = scores.masked_fill(~nobody, -1e9).softmax(dim=-1)
print(weights)

# %% tags=["check", "hide-input"]
with exercise("2.8", prediction=True):
    expect(prediction in ("zeros", "uniform", "nan"),
           f"prediction is {prediction!r}: choose one of \"zeros\", "
           f"\"uniform\" or \"nan\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(prediction == "uniform",
           f"the row came out {weights.tolist()}, not {prediction!r}",
           hint="every score is the same number, -1e9, and a softmax "
           "of equal scores is uniform whatever their value: a finite "
           "fill hides the empty row instead of zeroing it")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 2.9: NaN or zeros? (2 points, written)
#
# PyTorch's own attention fills forbidden scores with $-\infty$, and a
# query with no allowed key comes out NaN; your `masked_softmax` gives
# it all-zero weights. In two to four sentences: why does the first
# give NaN, and which behaviour would you want in a decoder trained on
# padded batches, and why?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# With every score $-\infty$, the softmax divides $e^{-\infty} \cdot 0$
# by a sum of zeros: $0/0$, which is NaN. In training, a NaN in one
# padded query's output reaches the loss through the layers above it
# and its gradient turns every weight into NaN, even though the query
# is padding whose output nobody reads; all-zero weights keep that
# query's output finite and its gradient zero, so zeros are the safe
# choice (a uniform row, from a finite fill, would instead mix the
# padding's values into it).
#
# *Rubric (2 points).* 1 point: the NaN is $0/0$ (or "the
# normaliser is zero") for a row of $-\infty$. 1 point: prefers zeros
# (or a finite, ignored output) *because* a NaN spreads through the
# loss and the gradients to the whole model; naming that padded
# queries' outputs are discarded anyway is enough for the reason.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 4
# message: Hint: a query with no allowed key must get all-zero
# def masked_softmax(scores, mask):
#     scores = scores.masked_fill(~mask, float("-inf"))
#     return scores.softmax(dim=-1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def make_padding_mask(tokens, pad_id):
#     return padding_mask(tokens, pad_id)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def make_padding_mask(tokens, pad_id):
#     return torch.ones_like(tokens, dtype=torch.bool).unsqueeze(1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def make_causal_mask(L):
#     from transformer_lite.masks import causal_mask
#     return causal_mask(L)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def make_causal_mask(L):
#     return torch.ones(1, L, L, dtype=torch.bool)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def make_target_mask(tgt, pad_id):
#     return target_mask(tgt, pad_id)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def make_target_mask(tgt, pad_id):
#     T = tgt.size(1)
#     return make_padding_mask(tgt, pad_id).expand(-1, T, -1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def masked_softmax(scores, mask):  # the first check's own line, copied
#     scores = scores.masked_fill(~mask, -math.inf)
#     return scores.softmax(-1).nan_to_num(0.0)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def masked_attention(Q, K, V, mask):
#     return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def masked_attention(Q, K, V, mask):
#     return torch.zeros(*Q.shape[:-1], V.size(-1), dtype=V.dtype)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: delegate
# def torch_masks(tgt, pad_id):
#     T = tgt.size(1)
#     return (to_torch_attn_mask(causal_mask(T)[0]),
#             to_torch_attn_mask(padding_mask(tgt, pad_id)[:, 0]))

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def torch_masks(tgt, pad_id):
#     B, T = tgt.shape
#     return (torch.zeros(T, T, dtype=torch.bool),
#             torch.zeros(B, T, dtype=torch.bool))

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 7
# kind: trivial
# def prefix_mask(L, P):
#     return torch.ones(1, L, L, dtype=torch.bool)
