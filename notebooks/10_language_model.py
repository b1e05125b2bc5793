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
# # 10. A decoder-only language model
#
# Chapters 5 to 7 built the Transformer as the paper did: an encoder
# reads the source, a decoder writes the target while looking at it.
# Remove the source, and with it the encoder and the cross-attention,
# and what is left is a stack of masked self-attention and feed-forward
# layers that reads a text and, at every position, scores the token that
# comes next. Trained on plain text, that stack is a **language model**:
# it assigns a probability to any text,
#
# $$
# p(x_1, \dots, x_n) = \prod_{t=1}^{n} p(x_t \mid x_1, \dots, x_{t-1}),
# $$
#
# and it can write new text by drawing one token after another from
# those conditional distributions. GPT {cite:p}`radford2018improving` and
# its successors are this model, made large.
#
# This chapter teaches the package's `transformer_lite/lm/` tier:
#
# - the model (`lm/model.py`): [chapter 5](05_encoder_decoder)'s encoder
#   layer under the causal mask, with the `is_causal` fast path of
#   [chapter 8](08_making_it_fast);
# - a corpus that ships with Python, and training to a stated held-out
#   **perplexity** (`lm/perplexity.py`, `tasks/text_corpus.py`);
# - **sampling** (`lm/generate.py`): temperature, top-$k$ and top-$p$,
#   side by side, with and without the KV cache;
# - what the trained model attends to;
# - **Transformer-XL's segment memory** (`lm/memory.py`), which lets a
#   model trained on short segments look back past their start, measured
#   against the same model without it.
#
# The shape legend is the book's: B batch, L any length, T a segment's
# length, C = `d_model`, H heads, D = `d_k`, V vocabulary; M is the
# length of a segment memory.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(10)

# %%
import inspect
import math
import platform
import re
import textwrap
import time
from collections import Counter
from unittest import mock

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

import transformer_lite
from transformer_lite import default_device, seed_everything
from transformer_lite.device import book_seed, evaluating
from transformer_lite.layers import EncoderLayer
from transformer_lite.lm import (
    LanguageModel,
    SegmentMemory,
    generate,
    make_lm,
    next_token_loss,
    perplexity,
    segments,
    token_losses,
    top_k_filter,
    top_p_filter,
)
from transformer_lite.masks import causal_mask
from transformer_lite.tasks.text_corpus import (
    SPECIAL,
    corpus_splits,
    pydoc_topics,
    repeated_segments,
    segment_batches,
    shared_spans,
    streams,
)
from transformer_lite.tasks.tokenizer import SubwordTokenizer
from transformer_lite.training import Examples, TrainOptions, fit
from transformer_lite.viz import attention_explorer, kept_weights, mask_chart

device = default_device()
SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
seed_everything(SEED)
print(f"python {platform.python_version()}, torch {torch.__version__}")
print(f"transformer_lite {transformer_lite.__version__}, device: {device}")
print(f"BOOK_SEED={SEED}")


def show(*objects) -> None:
    """Print the source code of package classes, methods or functions."""
    for obj in objects:
        print(textwrap.dedent(inspect.getsource(obj)))


# %% [markdown]
# As in [chapter 6](06_training), the models here are small enough that
# a CPU runs them fastest on one thread; this notebook's session uses
# one.

# %%
threads_available = torch.get_num_threads()
if device.type == "cpu":
    torch.set_num_threads(1)
print(f"threads: {torch.get_num_threads()} of {threads_available}")

# %% [markdown]
# ## The model: the encoder layer under a causal mask
#
# Chapter 5's `EncoderLayer` is self-attention followed by a feed-forward
# network, each with its residual connection and LayerNorm. Give its
# self-attention the causal mask of [chapter 2](02_masks) and position
# $t$ can read positions $0, \dots, t$ only: exactly what predicting
# token $t + 1$ allows. That is the whole block of a decoder-only
# model; the package builds its language model from `EncoderLayer`
# itself, not from a copy. Around the blocks sit what chapter 5's model
# had: token embeddings multiplied by $\sqrt{d_{model}}$, positions, a
# final LayerNorm (the blocks are pre-LN, as in GPT-2
# {cite:p}`radford2019language`), and an output layer that turns each
# position's vector into $V$ scores. With `tie_embeddings=True` the
# output layer's weight *is* the embedding matrix
# {cite:p}`press2017using`, as in GPT-2; this chapter's model keeps the
# two apart (exercise 4 ties them).

# %%
show(LanguageModel.forward)

# %% [markdown]
# `is_causal=True` is how each block asks for the causal mask. It does
# not build one: on the fused path (the model's default), PyTorch's
# `F.scaled_dot_product_attention` is *told* that the mask is causal and
# is given no mask tensor, which on a CUDA GPU keeps FlashAttention
# eligible (chapter 8: the flash kernel takes no mask). We make a small
# model and watch the calls it makes to the kernel:

# %%
V_DEMO = 40
demo = make_lm(V_DEMO, n_layers=2, d_model=32, d_ff=64, n_heads=4,
               dropout=0.0).eval()
x = torch.randint(4, V_DEMO, (2, 7))  # (B, L)
calls = []
kernel = F.scaled_dot_product_attention


def spy(*args, **kwargs):
    calls.append({"is_causal": kwargs.get("is_causal"),
                  "attn_mask": kwargs.get("attn_mask")})
    return kernel(*args, **kwargs)


with mock.patch.object(F, "scaled_dot_product_attention", spy):
    logits = demo(x)  # (B, L, V)
print(f"logits {tuple(logits.shape)}; kernel calls: {calls}")

# %% tags=["remove-cell"]
assert calls == [{"is_causal": True, "attn_mask": None}] * 2
assert all(type(layer) is EncoderLayer for layer in demo.layers)

# %% [markdown]
# Two blocks, two calls, each with `is_causal=True` and no mask. The
# hand-written kernel (`kernel="plain"`) computes the same numbers with an
# explicit causal mask, and no future token changes a logit of the past:

# %%
plain = make_lm(V_DEMO, n_layers=2, d_model=32, d_ff=64, n_heads=4,
                dropout=0.0, kernel="plain").eval()
plain.load_state_dict(demo.state_dict())
y = x.clone()
y[:, 4:] = torch.randint(4, V_DEMO, (2, 3))  # another future
with torch.no_grad():
    gap_paths = (plain(x) - demo(x)).abs().max().item()
    gap_past = (demo(y)[:, :4] - demo(x)[:, :4]).abs().max().item()
print(f"fused vs hand-written: {gap_paths:.1e}; "
      f"past logits after a new future: {gap_past:.1e}")

# %% tags=["remove-cell"]
assert gap_paths < 1e-5 and gap_past < 1e-5

# %% [markdown]
# Positions: the model takes every scheme of
# [chapter 9](09_positions_that_generalise) (`position=`), and this
# chapter uses RoPE, which rotates queries and keys inside attention
# instead of adding a vector to the embeddings. Why that
# matters here will be clear in the last section.
#
# ## The corpus: Python's own documentation
#
# A language model needs text, and this book downloads nothing. Every
# Python installation carries the text that `help("if")` prints, and
# the other `help` topics, in the module `pydoc_data.topics`: chapters
# of the language reference on statements, expressions and data types,
# generated from the Python documentation (Copyright Python Software
# Foundation, released under the PSF License). It is English prose with
# Python code between it, and its exact text depends on the Python
# version.

# %%
topics = pydoc_topics()
n_chars = sum(len(text) for text in topics.values())
print(f"{len(topics)} topics, {n_chars:,} characters; for example:")
print(textwrap.indent(topics["if"][:400], "    "))

# %% [markdown]
# A held-out text must be text the model has not read. The help topics
# repeat each other: the section on compound statements is printed under
# `if`, `while` and `for` alike, and a sentence of boilerplate under
# many topics. Holding out the last tenth of every topic as it stands
# would leave about 30% of the held-out characters, in stretches of 60
# or more, word for word in the training text, and the held-out
# perplexity would partly measure memory. So `corpus_splits` first cuts
# the topics into paragraphs and keeps each paragraph once, where it
# first occurs; then it holds out the last tenth of every topic's
# paragraphs, and drops a held-out paragraph that still shares a
# stretch of 60 characters with the training text (which dropping a
# held-out paragraph leaves as it was). Of the held-out sentences (each
# the text up to a ".", "!" or "?"), none of three words or more then
# occurs anywhere in the training text. The text is cut into tokens by
# [chapter 7](07_translation)'s byte-pair encoding, trained on the
# training text with 512 tokens: common words become one token, rare
# ones a few pieces, and decoding gives back the text exactly.

# %%
train_text, held_text = corpus_splits(held_out=0.1)
tokenizer = SubwordTokenizer.train([train_text], vocab_size=512)
V = tokenizer.vocab_size


def encode(text: str) -> torch.Tensor:
    """Token ids of text, without BOS and EOS: a plain stream."""
    return torch.tensor(tokenizer.encode(text)[1:-1])  # (N,)


train_ids, held_ids = encode(train_text), encode(held_text)
chars_per_token = len(held_text) / len(held_ids)
sentence = "A class definition is an executable statement."
print(f"V = {V}; {len(train_ids):,} training and {len(held_ids):,} "
      f"held-out tokens, {chars_per_token:.2f} characters per token")
print(tokenizer.pieces(sentence))
print(f"held-out stretches of 60 characters found in the training text: "
      f"{shared_spans(held_text, train_text, 60)}")
held_sentences = [s for s in re.split(r"(?<=[.!?])\s+", held_text)
                  if s.strip()]
in_training = [s for s in held_sentences if s.strip() in train_text]
print(f"held-out sentences (ended by . ! or ?): {len(held_sentences)}; "
      f"found in the training text: {len(in_training)}, at most "
      f"{max((len(s.split()) for s in in_training), default=0)} word(s) "
      "long")

# %% tags=["remove-cell"]
assert all(len(s.split()) <= 2 for s in in_training), in_training
assert tokenizer.decode([1, *encode(held_text[:2000]).tolist()]) == (
    held_text[:2000])
assert shared_spans(held_text, train_text, 60) == 0
_kept = len(train_text) + len(held_text)
assert 0.75 < _kept / n_chars < 0.9  # the repeats dropped
assert 0.07 < len(held_text) / _kept < 0.1

# %% [markdown]
# Training reads the text as B parallel **streams**: the token sequence
# cut into B rows of equal length, each read from its start in
# consecutive **segments** of T tokens. Segment $j$ of a row reads tokens
# $jT, \dots, jT + T - 1$ and is trained to predict tokens
# $jT + 1, \dots, jT + T$: every position of a segment is a training
# example, and a batch is the next segment of every row. A model without
# memory gains nothing from that order; the Transformer-XL model of the
# last section needs it, and both are trained on the same batches.

# %%
T = 16  # segment length, in tokens
B = 64  # parallel streams of the training text
train_streams = streams(train_ids, B)  # (B, N / B)
held_streams = streams(held_ids, 16)  # (16, N_held / 16)
print(f"training streams {tuple(train_streams.shape)}, "
      f"held-out streams {tuple(held_streams.shape)}")
first_inputs, first_targets = next(segments(train_streams, T))
print("inputs: ", repr(tokenizer.decode([1, *first_inputs[0].tolist()])))
print("targets:", repr(tokenizer.decode([1, *first_targets[0].tolist()])))

# %% [markdown]
# ## Loss and perplexity
#
# The training loss is the cross-entropy of the next token, averaged
# over the positions (padding, where there is any, left out). Its
# exponential on held-out text is the **perplexity**,
#
# $$
# \mathrm{PPL} = \exp\Big(-\frac{1}{N}\sum_{t=1}^{N}
# \log p(x_t \mid x_{<t})\Big),
# $$
#
# the number of equally likely tokens the model is, on average,
# hesitating between: $V$ for a uniform guess, 1 for a model that is
# always sure and right. `perplexity` reads the held-out streams in
# segments of T, as the model was trained; a model that knows nothing
# yet is near $V$ or worse:

# %%
show(next_token_loss)

# %%
CONFIG = dict(n_layers=2, d_model=128, d_ff=512, n_heads=4, dropout=0.0,
              position="rope", tie_embeddings=False)
seed_everything(SEED + 1)
model = make_lm(V, **CONFIG)
untrained_ppl = perplexity(model, held_streams, segment_len=T)
print(f"{model.count_parameters():,} parameters; untrained held-out "
      f"perplexity {untrained_ppl:.0f} (V = {V})")

# %% tags=["remove-cell"]
assert 0.5 * V < untrained_ppl < 3 * V, untrained_ppl

# %% [markdown]
# ## Training
#
# The recipe: AdamW {cite:p}`loshchilov2019decoupled`, which is Adam
# {cite:p}`kingma2015adam` with its weight decay decoupled from the
# gradient step, at a peak learning rate of
# $5 \times 10^{-3}$, reached after a linear warm-up of 40 steps and then
# decayed along a half cosine to zero at the last step; gradients
# clipped to norm 1; 400 steps of B = 64 segments of T = 16 tokens, about
# 410,000 tokens, between two and three passes over the training text
# (the count printed below depends on the Python version, whose help
# text differs). There is no dropout: so few passes over the data leave
# little to overfit.
#
# The loop is [chapter 6](06_training)'s `fit`, the one that trained the
# translator; what a language model adds is its batches and its
# objective. `segment_batches` gives `Examples`: the inputs of a segment
# and its targets, the same tokens one place on. The objective is the
# summed `next_token_loss` of the model's predictions (the step divides
# by the number of targets). It takes an optional segment `memory`, used
# in the last section, which it clears where the streams start again;
# without one it is the plain language-model objective. Every
# EVAL_EVERY steps a callback measures the held-out perplexity.

# %%
STEPS, PEAK_LR, WARMUP = 400, 5e-3, 40
EVAL_EVERY = 50
QUIET = TrainOptions(progress=False)  # clip_norm=1.0, no progress bar
passes = STEPS * B * T / len(train_ids)
print(f"{STEPS * B * T:,} training tokens: {passes:.2f} passes over the "
      "training text")

# %% tags=["remove-cell"]
assert 2 < passes < 3, passes  # as the text says


# %%
def next_tokens(memory: SegmentMemory | None = None):
    """The objective: the summed next-token loss of a batch of segments,
    each read after the memory of the segments before it."""
    def objective(model, batch: Examples) -> torch.Tensor:
        if memory is not None and batch.starts_stream:
            memory.reset()  # the streams start again
        logits = model(*batch.inputs, memory=memory)  # (B, T, V)
        return next_token_loss(logits, batch.targets, reduction="sum")
    return objective


def train(model, *, mem_len: int = 0, evaluate: bool = False) -> dict:
    """Train on the segments of the training streams; returns the loss
    of every step and, with ``evaluate``, the held-out perplexity every
    EVAL_EVERY steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR,
                                  weight_decay=0.01)
    schedule = LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP)
                        * 0.5 * (1 + math.cos(math.pi * s / STEPS)))
    memory = model.new_memory(mem_len) if mem_len else None
    log = {"eval_step": [], "eval_ppl": [], "eval_s": 0.0}

    def held_out(step: int, loss: float) -> None:
        if evaluate and step % EVAL_EVERY == 0:
            tic = time.perf_counter()
            log["eval_step"].append(step)
            log["eval_ppl"].append(perplexity(
                model, held_streams, segment_len=T, mem_len=mem_len))
            log["eval_s"] += time.perf_counter() - tic

    record = fit(model, segment_batches(train_streams, T, STEPS),
                 next_tokens(memory), optimizer, scheduler=schedule,
                 epochs=1, options=QUIET, on_step=held_out)
    return {"loss": record.step_loss, **log}


start = time.perf_counter()
history = train(model, evaluate=True)
train_seconds = time.perf_counter() - start - history["eval_s"]
final_ppl = history["eval_ppl"][-1]
nats_per_char = math.log(final_ppl) / chars_per_token

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{STEPS} steps in {train_seconds:.0f} s (and "
      f"{history['eval_s']:.0f} s of held-out evaluation)")

# %%
for step, ppl in zip(history["eval_step"], history["eval_ppl"],
                     strict=True):
    print(f"step {step:3d}: held-out perplexity {ppl:6.1f}")
print(f"held-out perplexity {final_ppl:.1f} per token "
      f"({nats_per_char:.2f} nats, {nats_per_char / math.log(2):.2f} bits "
      "per character)")

# %% tags=["remove-cell"]
# 19.3 to 19.7 over the sweep (notebooks/sweeps/10.json)
assert final_ppl < 21, final_ppl
_bits = nats_per_char / math.log(2)
assert 2.0 < _bits < 2.25, _bits  # "about 2.1 bits per character"
assert final_ppl < untrained_ppl / 20
_at_150 = history["eval_ppl"][history["eval_step"].index(150)]
assert math.log(untrained_ppl / _at_150) > 3 * math.log(_at_150 / final_ppl)

# %% [markdown]
# The held-out perplexity falls from the hundreds to about 20 per token
# (19.3 to 19.7 over the book's sweep of seeds and CPU kernels; the
# numbers printed above are this run's), about 2.1 bits per character of
# documentation: the model now hesitates, on average, between some twenty
# continuations out of 512. That is text it has not read: before the
# split removed the repeated paragraphs, the same model scored about 18
# on a held-out text that was partly a copy of its training text, and we
# would have believed it better than it is. Most of the gain, measured on
# the log scale of the chart below, comes in the first 150 steps; the
# rest is slow work on the remaining surprise.

# %%
fig, ax = plt.subplots(figsize=(7, 3.6))
train_ppl = torch.tensor(history["loss"]).exp()
window = 20
smooth = train_ppl.unfold(0, window, 1).mean(-1)  # a running mean
ax.plot(range(window, STEPS + 1), smooth, label="training (running mean)",
        color="tab:blue")
ax.plot(history["eval_step"], history["eval_ppl"], "o-", color="tab:red",
        label="held-out")
ax.set_yscale("log")
ax.set_xlabel("optimizer step")
ax.set_ylabel("perplexity per token (log scale)")
ax.set_title("Perplexity during training")
ax.legend()
ax.grid(alpha=0.3)
plt.show()

# %% [markdown]
# ## Sampling
#
# The model gives, for the last position of a prompt, a score $z_i$ per
# token. `generate` turns scores into a choice in four steps:
#
# 1. **temperature** $\tau$: the distribution becomes
#    $\mathrm{softmax}(z / \tau)$. Below 1 it is sharper (the likely get
#    likelier), above 1 flatter; $\tau = 0$ means **greedy**, always the
#    most likely token;
# 2. **top-$k$** {cite:p}`fan2018hierarchical` keeps the $k$ most likely
#    tokens;
# 3. **top-$p$** or *nucleus* sampling {cite:p}`holtzman2020curious` keeps
#    the smallest set of most likely tokens whose probabilities add up to
#    at least $p$: few tokens where the model is sure, many where it is
#    not;
# 4. softmax over what is kept, so that the kept probabilities sum to 1
#    again, and one draw.
#
# Ties need a rule, or the kept set would depend on the order of equal
# scores: both filters keep every token that is exactly as likely as
# the last one kept (so top-$k$ may keep more than $k$). In code, a token
# survives top-$p$ when the tokens *strictly* more likely than it hold
# less than $p$ of the probability, which is the same set. Its sums are
# taken in float64 whatever the logits' dtype: on a vocabulary of 50,000
# tokens, float32 running sums fell short of $p$ by up to
# $3 \cdot 10^{-6}$ in every row we tried, and the kept set with them.
# And $p = 1$ returns the logits untouched, where a running sum that
# rounds to 1 early dropped 2,600 to 3,500 of the least likely tokens:

# %%
show(top_k_filter, top_p_filter)

# %% [markdown]
# On the trained model's next-token distribution after a prompt, the two
# filters keep these tokens (▁ marks the start of a word):

# %%
prompt_text = "The value of"
prompt = encode(prompt_text).unsqueeze(0)  # (1, L)
with evaluating(model):
    next_logits = model(prompt)[0, -1]  # (V,)
probs = next_logits.softmax(-1)
order = probs.argsort(descending=True)
kept_k = torch.isfinite(top_k_filter(next_logits, 5))
kept_p = torch.isfinite(top_p_filter(next_logits, 0.5))
table = pd.DataFrame({
    "token": [tokenizer.tokenizer.id_to_token(int(i)) for i in order[:12]],
    "probability": probs[order[:12]].tolist(),
    "top-k, k=5": kept_k[order[:12]].tolist(),
    "top-p, p=0.5": kept_p[order[:12]].tolist(),
}).round(3)
print(f"prompt {prompt_text!r}; top-p keeps {int(kept_p.sum())} tokens "
      f"holding {float(probs[kept_p].sum()):.2f} of the probability")
table

# %% tags=["remove-cell"]
assert int(kept_k.sum()) >= 5
assert float(probs[kept_p].sum()) >= 0.5
_without_least = probs[kept_p].sum() - probs[kept_p].min()
assert float(_without_least) < 0.5  # the smallest such set (no ties here)

# %% [markdown]
# Now whole samples, all from the same prompt, each with its own seeded
# generator so that the page is the same at every build:

# %%
SAMPLE_TOKENS = 60
settings = {
    "greedy (τ = 0)": dict(temperature=0.0),
    "τ = 0.7": dict(temperature=0.7),
    "τ = 1.0": dict(temperature=1.0),
    "τ = 1.5": dict(temperature=1.5),
    "top-k, k = 10": dict(top_k=10),
    "top-p, p = 0.9": dict(top_p=0.9),
}
samples = {}
for i, (name, options) in enumerate(settings.items()):
    g = torch.Generator().manual_seed(SEED + 10 + i)
    out = generate(model, prompt, SAMPLE_TOKENS, generator=g, **options)
    samples[name] = out[0]
    text = tokenizer.decode([1, *out[0].tolist()])
    print(f"--- {name}\n{text}\n")


def repeats_itself(tokens: torch.Tensor, n: int = 4) -> bool:
    """Whether some n tokens in a row occur twice in ``tokens``."""
    grams = [tuple(tokens[i:i + n].tolist())
             for i in range(len(tokens) - n + 1)]
    return len(set(grams)) < len(grams)


print("greedy sample repeats 4 tokens in a row:",
      repeats_itself(samples["greedy (τ = 0)"]))

# %% tags=["remove-cell"]
assert repeats_itself(samples["greedy (τ = 0)"])

# %% [markdown]
# Greedy decoding falls into a loop quickly: once a phrase is the most
# likely continuation of itself, nothing breaks the cycle. Low
# temperature keeps the text close to the documentation's most common
# turns of phrase; at $\tau = 1$ the model writes what it believes the
# corpus looks like, words, quotes and code included, with no sense; at
# $\tau = 1.5$ unlikely pieces creep in and words fall apart. Top-$k$
# and top-$p$ cut off the long tail of unlikely tokens while keeping
# the variety of $\tau = 1$.
#
# One measurable trace of this: under the model itself, a sample drawn
# at a higher temperature is less likely. The mean log-probability per
# token, over eight samples per temperature:

# %%
def mean_log_prob(tokens: torch.Tensor) -> float:
    """Mean log p(token | prefix) of the generated part, under the model
    at temperature 1."""
    with evaluating(model):
        logp = model(tokens[:, :-1]).log_softmax(-1)  # (B, L - 1, V)
    picked = logp.gather(-1, tokens[:, 1:, None])[..., 0]  # (B, L - 1)
    return picked[:, prompt.size(1) - 1:].mean().item()


temperatures = (0.5, 1.0, 1.5)
g = torch.Generator().manual_seed(SEED + 20)
likelihood = {
    tau: mean_log_prob(generate(model, prompt.repeat(8, 1), SAMPLE_TOKENS,
                                temperature=tau, generator=g))
    for tau in temperatures
}
for tau, value in likelihood.items():
    print(f"τ = {tau}: mean log-probability {value:.2f} nats per token")

# %% tags=["remove-cell"]
assert likelihood[0.5] > likelihood[1.0] > likelihood[1.5]

# %% [markdown]
# The rest of that description can be counted as well. For 32 samples
# of each setting, two shares of their words (the text between spaces):
# *distinct pairs*, the share of adjacent word pairs that occur only
# once among all 32 samples, high when the text does not repeat itself
# and low when it loops; and *unseen words*, the share of words that
# never occur in the training text, high when words fall apart.

# %%
training_words = set(train_text.split())


def word_shares(options: dict, seed: int) -> tuple[float, float]:
    """Distinct word pairs and unseen words of 32 samples."""
    g = torch.Generator().manual_seed(seed)
    out = generate(model, prompt.repeat(32, 1), SAMPLE_TOKENS, generator=g,
                   **options)  # (32, L + SAMPLE_TOKENS)
    texts = [tokenizer.decode([1, *row[prompt.size(1):].tolist()])
             for row in out]
    words = [text.split() for text in texts]
    pairs = [tuple(w[i:i + 2]) for w in words for i in range(len(w) - 1)]
    counts = Counter(pairs)
    distinct = sum(counts[pair] == 1 for pair in pairs) / len(pairs)
    unseen = (sum(word not in training_words for w in words for word in w)
              / sum(map(len, words)))
    return distinct, unseen


shares = pd.DataFrame(
    [word_shares(options, SEED + 50 + i)
     for i, options in enumerate(settings.values())],
    index=list(settings), columns=["distinct pairs", "unseen words"])
shares.round(3)

# %% tags=["remove-cell"]
_distinct, _unseen = shares["distinct pairs"], shares["unseen words"]
assert _distinct["greedy (τ = 0)"] < 0.5 * _distinct["τ = 1.0"]
assert _unseen["τ = 1.5"] > _unseen["τ = 1.0"]
assert _unseen["top-k, k = 10"] < _unseen["τ = 1.5"]
assert _unseen["top-p, p = 0.9"] < _unseen["τ = 1.5"]
assert _distinct["top-k, k = 10"] > 0.8 * _distinct["τ = 1.0"]
assert _distinct["top-p, p = 0.9"] > 0.8 * _distinct["τ = 1.0"]

# %% [markdown]
# Over the book's sweep the greedy samples repeated every word pair (no
# pair occurred once), while at $\tau = 1$ 92% to 96% of the pairs
# occurred once. Unseen words rose from 33%-42% at $\tau = 1$ to 44%-50%
# at $\tau = 1.5$ (many "words" here are code and punctuation, so the
# share is high at every setting). Top-$k$ and top-$p$ kept 82% to 94%
# distinct pairs, close to $\tau = 1$'s variety, with fewer unseen words
# than $\tau = 1.5$ (27% to 40%). The checks assert each of these
# orderings, which held in every run.


# %% [markdown]
# The filters are not just a promise of the docstring. Every token of
# the top-$k$ sample above was among the 10 most likely at its step,
# and every greedy token the most likely, which we check by running the
# model over the samples once more:

# %%
def rank_of_choices(tokens: torch.Tensor) -> torch.Tensor:
    """For each generated token: how many tokens the model scored
    strictly higher at that step."""
    with evaluating(model):
        logits = model(tokens[None, :-1])[0]  # (L - 1, V)
    chosen = logits.gather(-1, tokens[1:, None])  # (L - 1, 1)
    higher = (logits > chosen).sum(-1)  # (L - 1,)
    return higher[prompt.size(1) - 1:]


ranks = rank_of_choices(samples["top-k, k = 10"])
print(f"worst rank of a top-k choice: {int(ranks.max())} (0 = the most "
      f"likely); at τ = 1.5: {int(rank_of_choices(samples['τ = 1.5']).max())}")

# %% tags=["remove-cell"]
assert int(ranks.max()) < 10
assert (rank_of_choices(samples["greedy (τ = 0)"]) == 0).all()

# %% [markdown]
# ### The KV cache, again
#
# Each step of `generate` needs the scores of one new position. Without
# a cache it runs the model over the whole prefix again: for $L$ tokens,
# $1 + 2 + \dots + L$ positions through the embeddings, projections and
# feed-forward networks, $O(L^2)$, and attention over every prefix,
# $O(L^3)$. With `use_cache=True` (the default), the keys and values of
# the earlier positions are kept (chapter 8's `KVCache`) and a step
# feeds the model one token: $O(L)$ positions, as chapter 8 counted,
# and attention of one query over the $t$ cached keys, $O(t\,C)$ a
# step, $O(L^2)$ in all. A cached step's single query may
# attend to every cached key, so it needs no mask at all; the prompt,
# fed at once into the empty cache, uses `is_causal=True` like training.
# Same tokens, less work:

# %%
def positions_read(run) -> tuple[torch.Tensor, int]:
    """What ``run()`` returns, and how many token positions the model
    embedded (a measure of its work) while doing it."""
    count = [0]

    def tally(module, args, output) -> None:
        count[0] += args[0].numel()

    hook = model.embed.register_forward_hook(tally)
    try:
        return run(), count[0]
    finally:
        hook.remove()


g1, g2 = (torch.Generator().manual_seed(SEED + 30) for _ in range(2))
batch_prompt = prompt.repeat(4, 1)  # (B, L)
start = time.perf_counter()
recomputed, recomputed_work = positions_read(lambda: generate(
    model, batch_prompt, 120, generator=g1, use_cache=False))
recompute_s = time.perf_counter() - start
start = time.perf_counter()
cached, cached_work = positions_read(lambda: generate(
    model, batch_prompt, 120, generator=g2, use_cache=True))
cached_s = time.perf_counter() - start
same_tokens = torch.equal(recomputed, cached)
print(f"same tokens: {same_tokens}; positions the model read: "
      f"{recomputed_work:,} recomputing, {cached_work:,} with the cache")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"4 x 120 tokens: recomputed {recompute_s:.2f} s, cached "
      f"{cached_s:.2f} s ({recompute_s / cached_s:.1f} times faster)")

# %% tags=["remove-cell"]
assert same_tokens
_L = prompt.size(1)
assert cached_work == 4 * (_L + 119)  # the prompt, then one a step
assert recomputed_work == 4 * sum(range(_L, _L + 120))

# %% [markdown]
# `make bench` measures the same comparison for 256 new tokens at the
# benchmark's sizes (its "Language model: generation" table).
#
# ## What the model attends to
#
# The attention explorer of chapter 7 takes the weights of any model
# whose attention modules keep them (`kept_weights`). A decoder-only
# model has one kind of attention, masked self-attention, so the menu
# offers only that. Each row is a position, labelled by the token it
# *predicts*; its cells are the weights on the tokens it could read.

# %%
g = torch.Generator().manual_seed(SEED + 40)
sample = generate(model, prompt, 23, temperature=0.7, generator=g)
shown = sample[:, :-1]  # (1, L): the model reads these ...
pieces = [tokenizer.tokenizer.id_to_token(int(i)) for i in sample[0]]
blocks = {"decoder": [b.self_attn for b in model.layers]}
weights = kept_weights(model, blocks, shown)
explorer = attention_explorer(
    weights, [pieces[:-1]], [pieces[:-1]], ["sample"],
    predicted=[pieces[1:]],  # ... and predict these
    title="Attention of the language model (choose below the chart)",
)
print(repr(tokenizer.decode([1, *sample[0].tolist()])))
explorer

# %% tags=["remove-cell"]
assert len(explorer.data) < 5000
assert set(explorer.data["attention"]) == {"decoder self-attention"}
_rows = explorer.data.groupby(["layer", "head", "q"])["weight"].sum()
assert _rows.between(0.99, 1.01).all()

# %% [markdown]
# One sample is an anecdote. Averaged over the held-out streams (16 rows
# of 64 tokens), the weight that each head gives the query's own token
# and the token just before it:

# %%
held_weights = kept_weights(model, blocks, held_streams[:, :64])["decoder"]
rows = []
for layer, w in enumerate(held_weights):  # w: (16, H, 64, 64)
    own = w.diagonal(dim1=-2, dim2=-1).mean(dim=(0, 2))  # (H,)
    before = w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))
    for head in range(w.size(1)):
        rows.append({"layer": layer, "head": head,
                     "own token": float(own[head]),
                     "token before": float(before[head])})
near = pd.DataFrame(rows).round(2)
uniform = (1 / torch.arange(1, 65)).mean().item()  # a flat row's share
print(f"a head that spread its weight evenly would give each "
      f"{uniform:.2f} on average")
near

# %% tags=["remove-cell"]
_second = near[near["layer"] == 1]
assert (_second["token before"] > 2 * uniform).all()
assert _second["token before"].mean() > 0.2

# %% [markdown]
# Every head of the second layer gives the token just before the one it
# reads at least twice, and on average several times, the weight an even
# spread would: this small model leans on the nearest context, the
# material of spelling and short phrases. The explorer shows the rest of
# each row spread more thinly over the earlier words.
#
# ## Transformer-XL: a memory across segments
#
# The model was trained on segments of T = 16 tokens, and its context
# starts again at every segment: the first token of a segment is
# predicted from one token, the last from sixteen. Longer segments cost
# more (attention grows with $T^2$), and however long they are, the
# positions near the start of each are starved.
#
# Transformer-XL {cite:p}`dai2019transformer` keeps, for each block, the
# hidden states that entered it during the previous segment, and lets
# the next segment attend to them as extra keys and values:
#
# $$
# \tilde h^{n-1} = [\,\mathrm{SG}(m^{n-1})\,;\, h^{n-1}\,], \qquad
# q = h^{n-1} W^Q,\quad k = \tilde h^{n-1} W^K,\quad
# v = \tilde h^{n-1} W^V .
# $$
#
# $\mathrm{SG}$ stops the gradient: the memory is a constant of the
# backward pass, so a step still costs one segment's backward pass,
# while the forward pass reaches $M$ positions further back in each of
# the $N$ blocks ($N \times M$ in all, since block 2's memory was itself
# computed with block 1's). The queries are the segment's last $T$
# positions and the keys are $M + T$: the causal mask becomes a
# rectangle whose diagonal ends in the bottom-right corner. (PyTorch's
# own `is_causal` puts it in the top-left corner, right only for a
# square; the package spells this mask out.)

# %%
mask_chart(causal_mask(8)[:, 4:],
           title="A segment of 4 with a memory of 4 (True = may attend)")

# %% [markdown]
# The memory's tokens were seen at other offsets than the segment's. With
# absolute positions counted from each segment's start, the last token
# of the segment above had position 3 when it was read, and from the
# new segment's point of view it sits at $-1$: one position, two
# numbers. Relative positions avoid the question: RoPE turns a query and
# a key by their positions, and their score depends on the positions
# only through the difference, which stays right when the memory's keys
# are placed before the segment's. The package therefore refuses a
# memory with absolute positions:

# %%
show(SegmentMemory.update)
try:
    make_lm(V_DEMO, position="sinusoidal")(x, memory=SegmentMemory(4, 2))
except ValueError as error:
    print("ValueError:", textwrap.shorten(str(error), 110))

# %% [markdown]
# This is where our model parts from the paper's. Transformer-XL brings
# its own relative encoding: it writes the score of query $i$ and key
# $j$ as four terms, in which a sinusoidal vector $R_{i-j}$ of the
# offset, projected by a matrix of its own, stands for the key's
# position, two learned vectors $u$ and $v$ take the place of the
# query's position in the terms that would hold it, and a "relative
# shift" of the score matrix computes the terms of every offset in one
# matrix product. The package implements none of that: it keeps the segment
# recurrence, the memory and its stopped gradient, and takes RoPE from
# [chapter 9](09_positions_that_generalise) for the relative positions,
# which gives the property the memory needs by other means.
#
# Where segments and one pass must agree, they do: reading a text in
# segments with a memory that holds everything before them gives the
# trained model's logits of one pass over the whole text.

# %%
text = held_streams[:2, : 3 * T]  # (2, 3T)
with evaluating(model):
    one_pass = model(text)  # (2, 3T, V)
    memory = model.new_memory(2 * T)
    pieces_xl = [model(text[:, j:j + T], memory=memory)
                 for j in range(0, 3 * T, T)]
gap_xl = (torch.cat(pieces_xl, dim=1) - one_pass).abs().max().item()
print(f"3 segments with a memory of 2T against one pass: {gap_xl:.1e}")

# %% tags=["remove-cell"]
assert gap_xl < 1e-4

# %% [markdown]
# ### With and without memory, same budget
#
# The experiment: the same model (configuration, initial weights), the
# same 400 steps on the same segments of T = 16 tokens, once as above
# and once carrying a memory of M = 16 positions from each segment to
# the next. Only the memory differs. Both are then scored on the
# held-out streams, the memory model with and without its memory.

# %%
seed_everything(SEED + 1)  # the plain model's initial weights
xl_model = make_lm(V, **CONFIG)
M = T
start = time.perf_counter()
xl_history = train(xl_model, mem_len=M)
xl_seconds = time.perf_counter() - start
xl_ppl = perplexity(xl_model, held_streams, segment_len=T, mem_len=M)
xl_alone_ppl = perplexity(xl_model, held_streams, segment_len=T)
comparison = pd.DataFrame({
    "model": ["plain", "with memory", "with memory, read without it"],
    "held-out perplexity": [final_ppl, xl_ppl, xl_alone_ppl],
}).round(2)
comparison

# %%
# NBVAL_IGNORE_OUTPUT
print(f"training: plain {train_seconds:.0f} s, with memory "
      f"{xl_seconds:.0f} s")

# %% tags=["remove-cell"]
assert xl_ppl < 0.95 * final_ppl, (xl_ppl, final_ppl)
assert xl_alone_ppl > 1.1 * xl_ppl, (xl_alone_ppl, xl_ppl)
assert xl_alone_ppl > final_ppl, (xl_alone_ppl, final_ppl)

# %% [markdown]
# The memory model reads the held-out text with a lower perplexity than
# the plain one (17.6 to 18.1 against 19.3 to 19.7 over the book's
# sweep, `notebooks/sweeps/10.json`). It also
# depends on its memory: read segment by segment without it, it does
# worse than the model that never had one. Where does
# the gain come from? Each held-out token was predicted at some place
# $t = 0, \dots, T - 1$ of its segment, seeing $t + 1$ tokens of the
# segment and, for the memory model, $M$ more. Grouping the held-out
# losses by that place (first segments of each stream left out, as they
# have no memory):

# %%
def ppl_by_place(model, mem_len: int) -> torch.Tensor:
    """Held-out perplexity at each place of a segment (segments after
    the first of each stream)."""
    losses, _ = token_losses(model, held_streams, segment_len=T,
                             mem_len=mem_len)  # (16, N - 1)
    n = losses.size(1) // T * T
    by_place = losses[:, :n].view(losses.size(0), -1, T)  # (16, S, T)
    return by_place[:, 1:].mean(dim=(0, 1)).exp()  # (T,)


plain_by_place = ppl_by_place(model, 0)
xl_by_place = ppl_by_place(xl_model, M)
fig, ax = plt.subplots(figsize=(7, 3.6))
places = torch.arange(1, T + 1)
ax.plot(places, plain_by_place, "o-", label="plain: sees t + 1 tokens")
ax.plot(places + M, xl_by_place, "s-",
        label=f"with memory: sees M + t + 1 (M = {M})")
ax.set_xlabel("tokens the prediction can attend to")
ax.set_ylabel("held-out perplexity")
ax.set_title("Perplexity against the context in view")
ax.legend()
ax.grid(alpha=0.3)
plt.show()
first_places = slice(0, 4)
print(f"first 4 places: plain {plain_by_place[first_places].mean():.1f}, "
      f"with memory {xl_by_place[first_places].mean():.1f}; last 4: "
      f"plain {plain_by_place[-4:].mean():.1f}, with memory "
      f"{xl_by_place[-4:].mean():.1f}")

# %% tags=["remove-cell"]
_plain_first = plain_by_place[first_places].mean()
_xl_first = xl_by_place[first_places].mean()
_plain_last = plain_by_place[-4:].mean()
assert _xl_first < 0.8 * _plain_first, (_xl_first, _plain_first)
assert plain_by_place[0] > 1.5 * _plain_last
assert _xl_first < 1.15 * _plain_last, (_xl_first, _plain_last)
# At most 4.7% apart over the sweep.
assert abs(math.log(xl_by_place[-4:].mean() / _plain_last)) < math.log(1.08)

# %% [markdown]
# The plain model's perplexity is worst at the first place of a segment,
# where it sees one token, and falls as the context grows. The memory
# model starts every segment with sixteen tokens in view, and its curve
# stays near the level the plain model reaches only at the end of its
# segments. Most of its gain is at those first places; at the last
# ones the two are within a few percent (at most 5% apart over the
# sweep), which says how little a model
# of this size makes of context beyond a dozen tokens.
#
# ### A task that needs the memory
#
# Perplexity mixes many effects. A synthetic check isolates one: every
# stream is a random block of 16 symbols repeated again and again,
# segment after segment. After the first segment, the next token is
# always the one exactly T places back, which lies in the *previous*
# segment. A model that sees only its segment can do no better than
# guess (1 in 16), except at the segment's last place, whose answer is
# the segment's own first token; with a memory of T, the answer is in
# view at every place.

# %%
SYMBOLS, SEGMENTS, SYN_STEPS = 16, 4, 400


def train_repeat(mem_len: int) -> float:
    """Train a one-block model on repeated segments; return its accuracy
    on fresh streams, segments after the first."""
    seed_everything(SEED + 5)
    lm = make_lm(len(SPECIAL) + SYMBOLS, n_layers=1, d_model=64, d_ff=256,
                 n_heads=2, dropout=0.0, position="rope")
    optimizer = torch.optim.AdamW(lm.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(SEED + 6)

    def fresh_streams():  # SYN_STEPS batches: SEGMENTS per new stream
        for _ in range(SYN_STEPS // SEGMENTS):
            stream = repeated_segments(32, SEGMENTS, T, SYMBOLS, g)  # (B, L)
            for j, (inputs, targets) in enumerate(segments(stream, T)):
                yield Examples(inputs, targets, starts_stream=j == 0)

    memory = lm.new_memory(mem_len) if mem_len else None
    fit(lm, fresh_streams(), next_tokens(memory), optimizer, epochs=1,
        options=TrainOptions(clip_norm=None, progress=False))
    test = repeated_segments(256, SEGMENTS, T, SYMBOLS, SEED + 7)
    memory = lm.new_memory(mem_len) if mem_len else None
    right = []
    with evaluating(lm):
        for inputs, targets in segments(test, T):
            right.append(lm(inputs, memory=memory).argmax(-1) == targets)
    return torch.stack(right[1:]).float().mean().item()


repeat_plain, repeat_xl = train_repeat(0), train_repeat(T)
ceiling = (1 + (T - 1) / SYMBOLS) / T  # the last place, plus guesses
print(f"accuracy after the first segment: plain {repeat_plain:.3f} "
      f"(chance {1 / SYMBOLS:.3f}, at most {ceiling:.3f} without "
      f"memory), with memory {repeat_xl:.3f}")

# %% tags=["remove-cell"]
assert repeat_plain < 1 / SYMBOLS + 0.03, repeat_plain
assert repeat_xl > 0.95, repeat_xl

# %% [markdown]
# The memory model copies the previous segment almost perfectly; the
# plain one stays at chance. The one-block memory model has to learn to
# attend to the key exactly T places back, and RoPE lets a head score
# keys by their offset from the query, which is what it needs.
#
# ## Summary
#
# - A **decoder-only language model** is chapter 5's encoder layer
#   under the causal mask, stacked, between embeddings and an output
#   layer, trained to predict each next token. The package builds it
#   from `EncoderLayer` itself; its causal calls reach PyTorch's kernel
#   as `is_causal=True` with no mask, which keeps FlashAttention
#   eligible on a GPU.
# - Python's `pydoc_data` documentation, 512 BPE tokens, 400 steps of
#   64 x 16 tokens: a held-out **perplexity** of about 20 per token
#   (19.3 to 19.7 over the seeds and kernels we swept), about 2.1 bits
#   per character, on a held-out text that shares no stretch of 60
#   characters with the training text.
# - **Sampling**: temperature sharpens or flattens the distribution;
#   top-$k$ and top-$p$ cut its tail, ties kept together. Greedy text
#   loops; higher temperatures give less likely text, measurably. The
#   KV cache gives the same tokens for less work.
# - **Transformer-XL's memory** lets each segment attend to the previous
#   one's hidden states, without a gradient through them; positions must
#   be relative (RoPE here, not the paper's own relative encoding).
#   With the same segments and steps, it lowered the held-out
#   perplexity, mostly at the first places of each segment, and only it
#   solved a task whose answers lie in the previous segment.
#
# ## Exercises
#
# 1. **Longer segments, same tokens.** Train the plain model with
#    T = 32 and B = 32 (the same tokens per step). How much of the
#    memory model's gain does it recover, and what does each step cost?
# 2. **Other positions.** Train the memory model with `position="alibi"`,
#    `"t5"` and `"none"` (no positions at all). Which solve the repeated
#    segments? Can ALiBi, whose bias only decays with distance, single
#    out the key exactly T back? Can T5, whose far offsets share
#    buckets?
# 3. **The memory's length.** Evaluate the memory model with M = 4, 8,
#    32 and 64 (it was trained with 16). Does perplexity keep falling
#    past the length it was trained with?
# 4. **Tied or not.** Train with `tie_embeddings=True`, the output
#    layer sharing the embedding matrix. Compare the parameter count, the
#    untrained perplexity and the final one. Why does a tied model,
#    untrained, predict that its input token comes again?

# %% [markdown]
# ## Graded exercises
#
# Eleven exercises, each with a check that runs when you run its
# cell, save the last, which a teacher marks by hand. In the book the
# reference solutions are folded: try first, then open them. The
# classroom edition (the teaching page) hands out the same exercises
# with the solutions removed, and nbgrader scores them.

# %% tags=["exercise-setup"]
import math

import torch

from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
)
from transformer_lite.lm import make_lm, perplexity
from transformer_lite.lm import token_losses as losses_per_token
from transformer_lite.tokens import PAD_ID

gen = torch.Generator().manual_seed(10)
V = 12  # a small vocabulary
# (B, V): next-token scores of four rows, in float64
scores = 2 * torch.randn(4, V, generator=gen, dtype=torch.float64)
stream = torch.randint(3, V, (2, 9), generator=gen)  # (B, L) token ids

# %% [markdown]
# ### Exercise 10.1: inputs and targets (1 point)
#
# A causal language model reads tokens $x_0, \dots, x_{L-2}$ and is
# scored, at every position $t$, on the next token $x_{t+1}$. Write
# `shift_targets(tokens)`: from token ids of shape $(B, L)$, the pair
# `(inputs, targets)`, both of shape $(B, L - 1)$.

# %% tags=["solution", "hide-input"]
def shift_targets(tokens):
    ### BEGIN SOLUTION
    return tokens[:, :-1], tokens[:, 1:]  # (B, L - 1) each
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.lm import segments

want_inputs, want_targets = next(segments(stream, stream.size(1)))
with exercise("10.1", twins=[segments]):
    inputs, targets = shift_targets(stream)
    expect_equal("inputs", inputs, want_inputs,
                 hint="the inputs are every token but the "
                 "last")  # fmt: skip
    expect_equal("targets", targets, want_targets,
                 hint="the target at position t is token t + 1: drop "
                 "the first token, not the last")  # fmt: skip

# %% [markdown]
# ### Exercise 10.2: temperature (2 points)
#
# Write `tempered_probs(logits, tau)`, the distribution
# $\mathrm{softmax}(z / \tau)$ along the last axis for $\tau > 0$. For
# $\tau = 0$ (greedy) it is one-hot: all the probability on the most
# likely token, the lowest id among equal maxima (`argmax` picks it).

# %% tags=["solution", "hide-input"]
def tempered_probs(logits, tau):
    ### BEGIN SOLUTION
    if tau == 0:
        best = logits.argmax(dim=-1, keepdim=True)  # (..., 1)
        return torch.zeros_like(logits).scatter(-1, best, 1.0)
    return torch.softmax(logits / tau, dim=-1)  # (..., V)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.lm.generate import tempered

taus = (0.5, 1.0, 3.0)
want = {tau: tempered(scores, tau).softmax(dim=-1) for tau in taus}
with exercise("10.2", twins=[tempered]):
    for tau in taus:
        expect_close(f"tempered_probs(scores, {tau})",
                     tempered_probs(scores, tau), want[tau],
                     hint="divide the scores by tau, then take the "
                     "softmax along the last axis")  # fmt: skip

# %% tags=["check"]
tied = torch.tensor([[1.0, 3.0, 3.0, 0.0]], dtype=torch.float64)
# greedy is the limit tau -> 0 of the package's tempered softmax (the
# rows of scores hold no ties)
greedy = tempered(scores, 1e-12).softmax(dim=-1)  # (B, V), one-hot
with exercise("10.2", twins=[tempered]):
    expect_close("tempered_probs(tied, 0)", tempered_probs(tied, 0),
                 torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64),
                 hint="tau = 0 is greedy: probability 1 on the first "
                 "largest score (argmax), 0 elsewhere; never divide by "
                 "tau = 0")  # fmt: skip
    expect_close("tempered_probs(scores, 0)", tempered_probs(scores, 0),
                 greedy, hint="one one-hot row per row of scores")

# %% [markdown]
# ### Exercise 10.3: top-$k$, ties kept (2 points)
#
# Write `keep_top_k(logits, k)`: the logits, with $-\infty$ for every
# token strictly less likely than the $k$-th most likely of its row.
# Every token tied with the $k$-th stays, so more than $k$ may stay; a
# $k$ larger than V keeps every token.

# %% tags=["solution", "hide-input"]
def keep_top_k(logits, k):
    ### BEGIN SOLUTION
    k = min(k, logits.size(-1))
    ranked = logits.sort(dim=-1, descending=True).values  # (..., V)
    kth = ranked[..., k - 1 : k]  # (..., 1)
    return logits.masked_fill(logits < kth, -math.inf)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.lm import top_k_filter

want = {k: top_k_filter(scores, k) for k in (1, 3, 5)}
with exercise("10.3", twins=[top_k_filter]):
    for k in (1, 3, 5):
        expect_close(f"keep_top_k(scores, {k})", keep_top_k(scores, k),
                     want[k],
                     hint="keep the k largest logits of each row (along "
                     "the last axis) as they are, and set the others to "
                     "-inf, not to 0")  # fmt: skip

# %% tags=["check"]
tied = torch.tensor([[0.5, 2.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
want = top_k_filter(tied, 2)
with exercise("10.3", twins=[top_k_filter]):
    expect_close("keep_top_k(tied, 2)", keep_top_k(tied, 2), want,
                 hint="compare every logit with the k-th largest value "
                 "instead of keeping exactly k tokens: a tie with the "
                 "k-th stays")  # fmt: skip
    expect_close(f"keep_top_k(scores, {V + 3})",
                 keep_top_k(scores, V + 3), scores,
                 hint="a k larger than V keeps every token")

# %% [markdown]
# ### Exercise 10.4: top-$p$, the nucleus (2 points)
#
# Write `keep_top_p(logits, p)` for $0 < p \le 1$: the logits, with
# $-\infty$ outside the nucleus, the smallest set of most likely tokens
# whose probabilities add up to at least $p$. In other words, a token
# stays when the tokens strictly more likely than it hold less than $p$
# of the probability: the token whose probability carries the sum past
# $p$ stays, the most likely token always stays, and ties stay together.

# %% tags=["solution", "hide-input"]
def keep_top_p(logits, p):
    ### BEGIN SOLUTION
    ranked = logits.sort(dim=-1, descending=True).values  # (..., V)
    probs = ranked.softmax(dim=-1)  # (..., V), most likely first
    before = probs.cumsum(dim=-1) - probs  # the mass above each token
    # the least likely logit kept; ties with it stay too
    last = ranked.masked_fill(before >= p, math.inf).amin(-1, keepdim=True)
    return logits.masked_fill(logits < last, -math.inf)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.lm import top_p_filter

nuclei = (0.3, 0.6, 0.9, 1.0)
want = {p: top_p_filter(scores, p) for p in nuclei}
with exercise("10.4", twins=[top_p_filter]):
    for p in nuclei:
        expect_close(f"keep_top_p(scores, {p})", keep_top_p(scores, p),
                     want[p],
                     hint="keep the token that crosses p: a token stays "
                     "when the mass of the tokens before it, its own "
                     "left out, is below p")  # fmt: skip

# %% tags=["check"]
alone = top_p_filter(scores, 1e-9)  # the most likely token of each row
tied = torch.tensor([[2.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
want = top_p_filter(tied, 0.3)
with exercise("10.4", twins=[top_p_filter]):
    expect_close("keep_top_p(scores, 1e-9)", keep_top_p(scores, 1e-9),
                 alone,
                 hint="the most likely token always stays, even for a "
                 "tiny p")  # fmt: skip
    expect_close("keep_top_p(tied, 0.3)", keep_top_p(tied, 0.3), want,
                 hint="a token exactly as likely as a kept one stays "
                 "too: compare values, not places in the sorted "
                 "order")  # fmt: skip

# %% [markdown]
# ### Exercise 10.5: the distribution a sampler draws from (1 point)
#
# Write `sampling_probs(logits, tau, top_k=None, top_p=None)`: the
# temperature first (exercise 10.2; $\tau = 0$ is greedy and ignores
# the filters), then top-$k$ if given, then top-$p$ if given, on the
# tempered logits, and last a softmax over the tokens kept, so that
# their probabilities add up to 1 again. Build it from your functions
# above.

# %% tags=["solution", "hide-input"]
def sampling_probs(logits, tau, top_k=None, top_p=None):
    ### BEGIN SOLUTION
    if tau == 0:
        return tempered_probs(logits, 0)
    logits = logits / tau
    if top_k is not None:
        logits = keep_top_k(logits, top_k)
    if top_p is not None:
        logits = keep_top_p(logits, top_p)
    return logits.softmax(dim=-1)  # (..., V), zero outside the kept
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.lm import top_k_filter, top_p_filter
from transformer_lite.lm.generate import tempered

both = top_p_filter(top_k_filter(tempered(scores, 0.7), 6), 0.8)
nucleus = top_p_filter(tempered(scores, 2.0), 0.5)
greedy = tempered(scores, 1e-12).softmax(dim=-1)  # the limit tau -> 0
with exercise("10.5", twins=[top_k_filter, top_p_filter, tempered],
              after=["10.2", "10.3", "10.4"]):  # fmt: skip
    expect_close("sampling_probs(scores, 0.7, 6, 0.8)",
                 sampling_probs(scores, 0.7, top_k=6, top_p=0.8),
                 both.softmax(dim=-1),
                 hint="divide by tau before the filters (the nucleus is "
                 "taken from the tempered distribution), apply top-k "
                 "before top-p, and end with a softmax")  # fmt: skip
    expect_close("sampling_probs(scores, 2.0, top_p=0.5)",
                 sampling_probs(scores, 2.0, top_p=0.5),
                 nucleus.softmax(dim=-1),
                 hint="top_k=None means no top-k filter")  # fmt: skip
    expect_close("sampling_probs(scores, 0, top_k=3, top_p=0.5)",
                 sampling_probs(scores, 0, top_k=3, top_p=0.5), greedy,
                 hint="tau = 0 is greedy: the one-hot rows of "
                 "tempered_probs(logits, 0), whatever the filters; never "
                 "divide by tau = 0")  # fmt: skip

# %% [markdown]
# ### Exercise 10.6: perplexity from token losses (2 points)
#
# The package's `token_losses(model, stream, segment_len=T)`, imported
# as `losses_per_token`, returns the loss of every predicted token, in
# nats, and a bool mask `counted` of the tokens that count (a padding
# target does not; its loss is 0). Write
# `perplexity_from_losses(losses, counted)`: the perplexity
# $\exp\big(\frac{1}{N}\sum \mathrm{loss}\big)$ over the N counted
# tokens, as a Python float.

# %% tags=["solution", "hide-input"]
def perplexity_from_losses(losses, counted):
    ### BEGIN SOLUTION
    mean = losses[counted].sum() / counted.sum()  # nats per token
    return math.exp(float(mean))
    ### END SOLUTION


# %% tags=["check"]
torch.manual_seed(10)
lm = make_lm(V, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0)
padded = stream.clone()
padded[1, 5:] = PAD_ID  # the second row is shorter
losses, counted = losses_per_token(lm, padded, segment_len=4)
want = torch.tensor(perplexity(lm, padded, segment_len=4))
with exercise("10.6"):
    expect_close("perplexity_from_losses(losses, counted)",
                 torch.tensor(float(perplexity_from_losses(losses,
                                                           counted))),
                 want,
                 hint="average over the counted tokens only: a padding "
                 "target is in neither the sum nor N")  # fmt: skip

# %% tags=["check"]
# a uniform guess over V tokens, every counted loss log V; the last row
# ends early, its padding targets at loss 0, as token_losses gives them
flat = torch.full((3, 5), math.log(V), dtype=torch.float64)
real = torch.ones(3, 5, dtype=torch.bool)
real[2, 2:] = False
flat[~real] = 0.0
with exercise("10.6"):
    expect_close("perplexity of a uniform guess",
                 torch.tensor(float(perplexity_from_losses(flat, real))),
                 torch.tensor(float(V)),
                 hint="the losses are in nats: take exp of the mean over "
                 "the counted tokens, not 2 to its power, and count no "
                 "padding in N")  # fmt: skip

# %% [markdown]
# ### Exercise 10.7: the mask of a segment with a memory (1 point)
#
# With a memory of M positions, a segment's T queries are the last T
# of $M + T$ keys: query $i$ sits at position $M + i$ and may attend to
# keys $0, \dots, M + i$. Write `memory_mask(T, M)`, the $(T, M + T)$
# bool mask (True = may attend), whose diagonal ends in the
# bottom-right corner. $M = 0$ must give the ordinary causal mask.

# %% tags=["solution", "hide-input"]
def memory_mask(T, M):
    ### BEGIN SOLUTION
    keys = torch.arange(M + T)  # (M + T,)
    queries = torch.arange(M, M + T)  # (T,) their positions
    return keys[None] <= queries[:, None]  # (T, M + T)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import causal_mask
from transformer_lite.attention import attend
from transformer_lite.masks import local_mask

# The package's causal attention places T queries at the last T of
# M + T keys; the keys each query may see are those it gives weight.
sizes = ((4, 4), (3, 5), (4, 0))
want = {}
for T, M in sizes:
    queries, keys = torch.zeros(1, T, 1), torch.zeros(1, M + T, 1)
    _, weights = attend(queries, keys, keys, is_causal=True,
                        need_weights=True)  # (1, T, M + T)
    want[T, M] = weights[0] > 0  # (T, M + T)
with exercise("10.7", twins=[causal_mask, local_mask, attend]):
    for T, M in sizes:
        expect_equal(f"memory_mask({T}, {M})", memory_mask(T, M),
                     want[T, M],
                     hint="query i sits at position M + i: it sees the "
                     "whole memory and its segment up to itself "
                     "(torch.tril alone puts the diagonal in the "
                     "top-left corner)")  # fmt: skip

# %% [markdown]
# ### Exercise 10.8: attention over a segment memory (2 points)
#
# One head of Transformer-XL's attention. The segment's hidden states
# $h$, of shape $(B, T, C)$, give the queries, $q = h W^Q$; the memory
# $m$, $(B, M, C)$, followed by $h$ gives the keys and values,
# $k = [\mathrm{SG}(m); h]\, W^K$ and $v = [\mathrm{SG}(m); h]\, W^V$,
# where $W^Q, W^K, W^V$ are matrices of shape $(C, D)$. Write
# `attend_with_memory(h, memory, w_q, w_k, w_v)`, returning
# $\mathrm{softmax}(q k^\top / \sqrt{D})\, v$ under `memory_mask`, of
# shape $(B, T, D)$. SG stops the gradient: no gradient may reach the
# memory.

# %% tags=["solution", "hide-input"]
def attend_with_memory(h, memory, w_q, w_k, w_v):
    ### BEGIN SOLUTION
    T, M = h.size(1), memory.size(1)
    both = torch.cat([memory.detach(), h], dim=1)  # (B, M + T, C)
    q = h @ w_q  # (B, T, D)
    k, v = both @ w_k, both @ w_v  # (B, M + T, D)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, T, M + T)
    s = s.masked_fill(~memory_mask(T, M), -math.inf)
    return s.softmax(dim=-1) @ v  # (B, T, D)
    ### END SOLUTION


# %% tags=["check"]
import torch.nn.functional as F

from transformer_lite import causal_mask, scaled_dot_product_attention
from transformer_lite.attention import attend, fused_attention
from transformer_lite.chunked import chunked_attention

C, D = 8, 4
w_q, w_k, w_v = (torch.randn(C, D, generator=gen, dtype=torch.float64)
                 for _ in range(3))  # fmt: skip
before = torch.randn(2, 3, C, generator=gen, dtype=torch.float64)
now = torch.randn(2, 4, C, generator=gen, dtype=torch.float64)
text = torch.cat([before, now], dim=1)  # (B, M + T, C): one pass
want = scaled_dot_product_attention(text @ w_q, text @ w_k, text @ w_v,
                                    causal_mask(7))[0][:, 3:]  # fmt: skip
want_alone = scaled_dot_product_attention(
    now @ w_q, now @ w_k, now @ w_v, causal_mask(4))[0]  # fmt: skip
with exercise("10.8", after=["10.7"], twins=[
        scaled_dot_product_attention, attend, fused_attention,
        chunked_attention, F.scaled_dot_product_attention]):
    expect_close("attend_with_memory(now, before, ...)",
                 attend_with_memory(now, before, w_q, w_k, w_v), want,
                 hint="with the previous segment as memory, the result "
                 "is the last T rows of causal attention over both: keys "
                 "and values are [memory; h], queries h "
                 "alone")  # fmt: skip
    expect_close("attend_with_memory(now, empty memory, ...)",
                 attend_with_memory(now, now[:, :0], w_q, w_k, w_v),
                 want_alone,
                 hint="an empty memory (M = 0) is plain causal "
                 "attention")  # fmt: skip

# %% tags=["check"]
memory = before.clone().requires_grad_()
h = now.clone().requires_grad_()
other = torch.randn(2, 3, C, generator=gen, dtype=torch.float64)
with exercise("10.8", after=["10.7"], twins=[
        scaled_dot_product_attention, attend, fused_attention,
        chunked_attention, F.scaled_dot_product_attention]):
    out = attend_with_memory(h, memory, w_q, w_k, w_v)
    out.sum().backward()
    expect(memory.grad is None,
           "a gradient reached the memory, which should be a constant",
           hint="stop the gradient: use memory.detach()")  # fmt: skip
    expect(h.grad is not None and bool(h.grad.abs().sum() > 0),
           "no gradient reached h",
           hint="detach the memory only, not the segment")  # fmt: skip
    moved = attend_with_memory(now, other, w_q, w_k, w_v)
    expect(not torch.allclose(moved, out.detach()),
           "the output did not change when the memory did",
           hint="stop the gradient, not the values: the keys and values "
           "are [memory; h]")  # fmt: skip

# %% [markdown]
# ### Exercise 10.9: predict, then run: generating without a cache (1 point)
#
# Decide before you run the cell below it. Without a cache,
# `generate(..., use_cache=False)` runs the model over the whole
# sequence again at every step. Count its work, as the section on the
# KV cache did, by the token positions the model embeds. From a prompt
# of one token, generating 24 new tokens instead of 12 multiplies that
# work by about how much? Set `prediction` to `2`, `4` or `8`; then run
# the experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = 4
### END SOLUTION

# %% [markdown]
# The experiment: a small untrained model, a hook that counts the
# positions it embeds, and both ways of generating.

# %%
from transformer_lite.lm import generate

torch.manual_seed(10)
small_lm = make_lm(V, n_layers=1, d_model=16, d_ff=32, n_heads=2,
                   dropout=0.0)  # fmt: skip
embedded = [0]  # token positions the model embedded


def tally(module, args, output):
    embedded[0] += args[0].numel()


work = {}  # (new tokens, use_cache) -> positions embedded
hook = small_lm.embed.register_forward_hook(tally)
for use_cache in (False, True):
    for n in (12, 24):
        embedded[0] = 0
        generate(small_lm, torch.tensor([[3]]), n, use_cache=use_cache,
                 generator=torch.Generator().manual_seed(10))  # fmt: skip
        work[n, use_cache] = embedded[0]
hook.remove()
growth = {c: work[24, c] / work[12, c] for c in (False, True)}
print(f"without the cache: {work[12, False]} then {work[24, False]} "
      f"positions ({growth[False]:.2f} times)")
print(f"with the cache:    {work[12, True]} then {work[24, True]} "
      f"positions ({growth[True]:.2f} times)")

# %% tags=["check", "hide-input"]
with exercise("10.9", prediction=True):
    expect(prediction in (2, 4, 8),
           f"prediction is {prediction!r}: choose 2, 4 or 8")
    ### BEGIN HIDDEN TESTS
    nearest = min((2, 4, 8), key=lambda c: abs(math.log(growth[False] / c)))
    expect(prediction == nearest,
           f"the work grew {growth[False]:.2f} times, about {nearest}, "
           f"not {prediction}",
           hint="step t reads all t tokens again, so n tokens cost "
           "1 + 2 + ... + n = n(n + 1)/2 positions: twice the tokens, "
           "about four times the work. With the cache a step reads "
           "only its new token (the causal mask means a new token never "
           "changes the keys and values of earlier positions, so they "
           "can be kept): twice the tokens, twice the work")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 10.10: predict, then run: the size of a nucleus (1 point)
#
# Decide before you run the cell below it. A distribution over
# $V = 1000$ tokens falls off like Zipf's law, $p_i \propto 1/i$: the
# most likely token holds 13% of the probability, the tenth 1.3%. How
# many tokens does top-$p$ with $p = 0.9$ keep: about 10, about 50 or
# about 500? Set `prediction` to `10`, `50` or `500`; then run the
# experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = 500
### END SOLUTION

# %% [markdown]
# The experiment: the package's top-$p$ filter on the log-probabilities.

# %%
from transformer_lite.lm import top_p_filter

zipf = 1 / torch.arange(1, 1001, dtype=torch.float64)  # (V,)
zipf_probs = zipf / zipf.sum()
nucleus_size = int((top_p_filter(zipf_probs.log(), 0.9) > -math.inf)
                   .sum())  # fmt: skip
print(f"the most likely token: {zipf_probs[0]:.3f}; top-p = 0.9 keeps "
      f"{nucleus_size} tokens, which hold "
      f"{zipf_probs[:nucleus_size].sum():.3f}")

# %% tags=["check", "hide-input"]
with exercise("10.10", prediction=True):
    expect(prediction in (10, 50, 500),
           f"prediction is {prediction!r}: choose 10, 50 or 500")
    ### BEGIN HIDDEN TESTS
    nearest = min((10, 50, 500),
                  key=lambda c: abs(math.log(nucleus_size / c)))
    expect(prediction == nearest,
           f"top-p = 0.9 kept {nucleus_size} tokens, about {nearest}, "
           f"not {prediction}",
           hint="the ten most likely tokens hold only 39% of a Zipf "
           "distribution: its long tail of unlikely tokens holds most "
           "of the probability, and a nucleus of 0.9 must take in much "
           "of it, here nearly half of the vocabulary. Top-p keeps few "
           "tokens only where the model is sure; top-k = 10 would keep "
           "ten whatever the shape")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 10.11: a memory and its positions (2 points, written)
#
# Transformer-XL's memory holds the hidden states of the previous
# segment, and the package refuses a memory with absolute positions.
# Suppose a model numbered the positions of each segment from 0, as an
# absolute table would, and attended to its memory anyway. In two to
# four sentences: what would go wrong, and why does RoPE not have the
# problem?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# The memory's tokens were read at positions $0, \dots, T - 1$ of their
# own segment, and the new segment's tokens get the same numbers, so a
# token of the memory and one of the segment $T$ places apart carry
# the same position, and the last memory token, just before the
# segment, looks as if it came after most of it: the order the model
# learnt to read is lost. Numbering on from segment to segment instead
# would push the positions past any seen in training, the failure of
# chapter 9. With RoPE a score depends on the positions only through
# the offset $j - i$; the memory's keys are turned by positions placed
# just before the segment's, so each offset is the true distance and
# never larger than the $M + T$ keys of a step, offsets that training
# met.
#
# *Rubric (2 points).* 1 point: with positions counted from each
# segment's start, a memory token and a segment token get the same (or
# a wrongly ordered) position, so the model cannot tell where the
# memory sits; or, counting on across segments, positions grow past the
# trained range. 1 point: RoPE's (any relative scheme's) score depends
# only on $j - i$, which is right once the memory's keys are placed
# before the segment, and stays within the offsets of training.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 4
# message: Hint: keep the token that crosses p
# def keep_top_p(logits, p):
#     probs = logits.softmax(dim=-1)
#     ranked, order = probs.sort(dim=-1, descending=True)
#     drop = ranked.cumsum(dim=-1) > p
#     drop = drop.scatter(-1, order, drop)
#     return logits.masked_fill(drop, -math.inf)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def shift_targets(tokens):
#     from transformer_lite.lm import segments
#     return next(segments(tokens, tokens.size(1)))

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def shift_targets(tokens):
#     return tokens[:, :-1], tokens[:, :-1]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def tempered_probs(logits, tau):
#     from transformer_lite.lm.generate import tempered
#     return tempered(logits, tau or 1e-12).softmax(dim=-1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def tempered_probs(logits, tau):
#     return torch.softmax(logits, dim=-1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def keep_top_k(logits, k):
#     from transformer_lite.lm import top_k_filter
#     return top_k_filter(logits, k)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def keep_top_k(logits, k):
#     return logits.clone()

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: delegate
# def keep_top_p(logits, p):
#     from transformer_lite.lm import top_p_filter
#     return top_p_filter(logits, p)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def keep_top_p(logits, p):
#     return logits.clone()

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def sampling_probs(logits, tau, top_k=None, top_p=None):
#     from transformer_lite.lm import top_k_filter, top_p_filter
#     if tau == 0:
#         return tempered_probs(logits, 0)
#     logits = logits / tau
#     if top_k is not None:
#         logits = top_k_filter(logits, top_k)
#     if top_p is not None:
#         logits = top_p_filter(logits, top_p)
#     return logits.softmax(dim=-1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def sampling_probs(logits, tau, top_k=None, top_p=None):
#     return tempered_probs(logits, tau)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def perplexity_from_losses(losses, counted):
#     return math.exp(float(losses.mean()))

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 7
# kind: delegate
# def memory_mask(T, M):
#     from transformer_lite import causal_mask
#     return causal_mask(M + T)[0, M:]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 7
# kind: trivial
# def memory_mask(T, M):
#     return torch.ones(T, M + T, dtype=torch.bool).tril()

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 8
# kind: delegate
# def attend_with_memory(h, memory, w_q, w_k, w_v):
#     from transformer_lite import scaled_dot_product_attention
#     T, M = h.size(1), memory.size(1)
#     both = torch.cat([memory.detach(), h], dim=1)
#     return scaled_dot_product_attention(h @ w_q, both @ w_k, both @ w_v,
#                                         memory_mask(T, M))[0]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 8
# kind: trivial
# def attend_with_memory(h, memory, w_q, w_k, w_v):
#     q, k, v = h @ w_q, h @ w_k, h @ w_v
#     s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
#     s = s.masked_fill(~memory_mask(h.size(1), 0), -math.inf)
#     return s.softmax(dim=-1) @ v
