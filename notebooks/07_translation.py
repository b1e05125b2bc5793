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
# # 7. A real task offline: translating number words
#
# The copy task of [chapter 6](06_training) proved that our Transformer
# can learn; it did not ask it to *translate*. Translation means reading
# a sentence in one language and writing it in another, where the words
# do not map one to one and do not come in the same order. The Annotated
# Transformer shows this on Multi30k, German image captions translated
# to English, which needs a download and an hour on a GPU. This chapter
# needs neither: its corpus is generated on the spot, and it trains on
# two CPU cores in a minute and a half. The task is small, but it is
# real.
#
# We translate **numbers written out in words** from German to English:
#
# $$\text{vierhunderteinundzwanzig} \;\longrightarrow\;
# \text{four hundred and twenty-one}$$
#
# German writes a number below a million as *one* word, and it says the
# units before the tens: *einundzwanzig* is "one-and-twenty". So the model
# must cut a long compound into its parts, and it must swap the order of
# the parts it found. French, our second source language, counts in
# twenties from 60 to 99: 60 to 79 are built on *soixante* (sixty), so 70
# is *soixante-dix*, "sixty-ten", and 80 to 99 on *quatre-vingt* (four
# twenties), so *quatre-vingt-dix-sept* is "four-twenty-ten-seven", that
# is $4 \cdot 20 + 10 + 7 = 97$. English is the target, as in
# the Annotated Transformer, and it has the virtue that its numbers are
# several words long, which the BLEU score needs.
#
# On the way we meet the rest of a real translation system:
#
# - a corpus split **by number**, so that the test set holds only numbers
#   the model has never seen;
# - **subword tokens** learnt by byte-pair encoding;
# - **batches of similar lengths**, training with label smoothing and the
#   Noam schedule, a checkpoint saved and loaded, and the **average of the
#   last checkpoints**;
# - **beam search** with a length penalty, against greedy decoding;
# - **BLEU**, **chrF** and exact match, and a table of the errors left;
# - **evaluation by slice**: named families of held-out numbers (every
#   number below 1000, round numbers, numbers with many zeros, ...)
#   scored one by one, because one aggregate score hid the numbers a
#   person types first;
# - an **interactive explorer** of every attention map of the trained
#   model;
# - training on **several processes** with `torchrun`, and a **command
#   line** to use the model outside the notebook.
#
# It teaches the tasks tier of the package, `transformer_lite/tasks/`:
# `numbers.py` (the corpus), `slices.py` (evaluation by slice),
# `tokenizer.py`, `trainer.py`, `metrics.py`, `translator.py` and
# `translate.py` (the command line), with `training/distributed.py` and
# beam search in `decoding.py`. The shape legend is the book's:
# B batch, S source length, T target length, L any length,
# C = `d_model`, H heads, D = `d_k`, V vocabulary.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(7)

# %%
import collections
import inspect
import platform
import tempfile
import textwrap
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import sacrebleu
import torch
from IPython.display import display

import transformer_lite
from transformer_lite import decoding, default_device, seed_everything
from transformer_lite.decoding import (
    beam_search,
    gnmt_length_penalty,
    greedy_decode,
)
from transformer_lite.device import book_seed
from transformer_lite.tasks.corpus import bucket_batches, pad_sequences
from transformer_lite.tasks.metrics import bleu, chrf, errors, scores
from transformer_lite.tasks.numbers import (
    NumberDomain,
    balance_digits,
    number_pairs,
    number_splits,
    number_words,
    read_number,
)
from transformer_lite.tasks.slices import (
    HELD_OUT,
    number_slices,
    score_slices,
    slice_table,
)
from transformer_lite.tasks.trainer import (
    TranslateConfig,
    train,
    train_tokenizers,
    training_numbers,
)
from transformer_lite.tasks.translator import Translator
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_lite.training import LabelSmoothingLoss
from transformer_lite.training.checkpoint import average_checkpoints
from transformer_lite.training.distributed import shard
from transformer_lite.viz import attention_explorer, collect_attention

device = default_device()
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"transformer_lite {transformer_lite.__version__}")
SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
print(f"device: {device}, BOOK_SEED={SEED}")
seed_everything(SEED + 7)


def show(*objects) -> None:
    """Print the source code of package classes or functions."""
    for obj in objects:
        print(textwrap.dedent(inspect.getsource(obj)))


# %% [markdown]
# ## Numbers in three languages
#
# `number_words` writes a number out with the `num2words` package, which
# knows the spelling rules of each language. Here are a few numbers in
# German, French and English:

# %%
examples = [7, 17, 21, 70, 80, 97, 312, 1100, 21405, 421097]
table = pd.DataFrame(
    {lang: [number_words(n, lang) for n in examples]
     for lang in ("de", "fr", "en")},
    index=pd.Index(examples, name="number"),
)
table

# %% tags=["remove-cell"]
assert number_words(21, "de") == "einundzwanzig"
assert number_words(97, "fr") == "quatre-vingt-dix-sept"
assert number_words(421, "de") == "vierhunderteinundzwanzig"
assert number_words(421, "en") == "four hundred and twenty-one"
assert " " not in number_words(421097, "de")  # one word
assert number_words(70, "fr") == "soixante-dix"  # sixty-ten
assert number_words(77, "fr") == "soixante-dix-sept"  # 60 + 17
assert number_words(80, "fr") == "quatre-vingts"  # four twenties
assert number_words(61, "fr").startswith("soixante")
# Eight numbers below 1000 tie for the longest German word, 727, 737,
# ..., 797 (29 letters), and a number below a million is (thousands) +
# "tausend" + (rest): the 64 made of two of them, 65 letters, are the
# longest.
de_letters = {n: len(number_words(n, "de")) for n in range(1000)}
most = max(de_letters.values())
longest = [n for n in range(1000) if de_letters[n] == most]
assert longest == list(range(727, 800, 10)) and most == 29
de727 = number_words(727, "de")
assert number_words(727727, "de") == de727 + "tausend" + de727
for thousands in longest:
    for rest in longest:
        words = number_words(1000 * thousands + rest, "de")
        assert words == (number_words(thousands, "de") + "tausend"
                         + number_words(rest, "de"))
        assert len(words) == 65

# %% [markdown]
# Three things make this a translation problem rather than a lookup:
#
# 1. **Segmentation.** The German source is one word, up to 65 letters
#    long. Below 1000, eight numbers tie for the longest word, 727, 737,
#    ..., 797, with 29 letters each; below a million, the 64 numbers
#    made of two of them, such as 727 727, tie at 65. The parts of a
#    word (*vier*, *hundert*, *ein*, *und*, *zwanzig*, *tausend*) are
#    not separated by anything.
# 2. **Reordering.** In *siebenundneunzig* the *sieben* (seven) comes
#    first, but in "ninety-seven" the "seven" comes last. Every pair of
#    tens and units is flipped, up to twice in one number.
# 3. **Non-compositional pieces.** French *soixante-dix* (70) is "sixty-
#    ten" and *quatre-vingts* (80) is "four-twenties"; English adds an
#    "and" after "hundred" and a comma after "thousand" only in some
#    contexts ("one thousand, one hundred" but "one thousand and one").
#
# ## A corpus split by number
#
# A model that has seen "vierhunderteinundzwanzig" during training and is
# tested on it again proves only that it can remember. We therefore split
# **by number**: every number goes to exactly one of training,
# validation and test. The test numbers are new to the model, though
# their parts are not; getting them right means composing known parts in
# a new way.
#
# `number_splits` draws the numbers. Drawn uniformly below a million,
# nine in ten would have six digits, and a model trained on them would
# stumble over "einundzwanzig" alone. So each draw first picks a number
# of digits, from one to six with equal chances, and then a number of
# that length; a number drawn twice is drawn again. The configuration of
# the whole chapter lives in one dataclass, `TranslateConfig`, shared
# with the command line:

# %%
config = TranslateConfig(seed=SEED)
print(textwrap.fill(repr(config), 79))
splits = number_splits(config.n_train, config.n_valid, config.n_test,
                       config.max_digits, config.seed)
pairs = {name: number_pairs(numbers, config.pair)
         for name, numbers in splits.items()}
for name, numbers in splits.items():
    digits = collections.Counter(len(str(n)) for n in numbers)
    print(f"{name:5s} {len(numbers):6d} numbers; by digits: "
          + ", ".join(f"{d}: {digits[d]}" for d in sorted(digits)))
print("for example:", " -> ".join(pairs["train"][0]))

# %% tags=["remove-cell"]
sets = {name: set(numbers) for name, numbers in splits.items()}
assert not sets["train"] & sets["test"]
assert not sets["train"] & sets["valid"] and not sets["valid"] & sets["test"]
assert len(sets["test"]) == config.n_test == 1000
assert all(0 <= n < 10**6 for n in sets["train"])
assert number_splits(config.n_train, config.n_valid, config.n_test,
                     config.max_digits, config.seed) == splits
assert any(n < 100 for n in splits["test"])
assert sum(n < 1000 for n in splits["train"]) > 0.04 * config.n_train

# %% [markdown]
# There are only ten one-digit numbers, ninety two-digit ones and nine
# hundred three-digit ones, so the short lengths run out and the long
# ones fill the rest. A few two-digit numbers landed in the test set: the
# model never sees the German word for them on its own, only inside
# longer numbers.
#
# That leaves the short numbers rare: under 5% of the training split.
# A first version of this chapter trained on the split as drawn. Its
# model translated 99% of the test numbers exactly, and yet it turned
# *fünf* into "five hundred and five" and *dreihundertzwölf* into "three
# hundred and twelve thousand and twelve", both numbers it had been
# trained on. It had learnt that numbers are long. The test set did not
# show it, because it holds few short numbers. So for training we repeat
# the numbers of the rare digit counts, as a real corpus would, where
# "five" is far more common than "six hundred thousand and five":
# `balance_digits` repeats them until each count of digits has about
# 3000 examples, 15% of the `n_train` numbers drawn for training
# (`digits_share`), and leaves the common counts alone. (Of all the
# examples trained on, which the repeats and the two groups added below
# make about 36 000, 3000 is about 8%.) Validation and test keep their
# numbers as drawn.

# %%
show(balance_digits)
at_least = round(config.digits_share * config.n_train)  # 3000
train_numbers = balance_digits(splits["train"], at_least)
train_pairs = number_pairs(train_numbers, config.pair)
before = collections.Counter(len(str(n)) for n in splits["train"])
after = collections.Counter(len(str(n)) for n in train_numbers)
print(pd.DataFrame({"distinct numbers": before, "training examples": after})
      .sort_index().rename_axis("digits").T.to_string())

# %% tags=["remove-cell"]
# Every number of a digit count appears equally often; a rare count is
# repeated to within half a copy of at_least, a common one left alone.
copies = collections.Counter(train_numbers)
for d, distinct in before.items():
    assert len({copies[n] for n in splits["train"] if len(str(n)) == d}) == 1
    if distinct < at_least:
        assert abs(after[d] - at_least) <= distinct / 2, d
    else:
        assert after[d] == distinct, d
assert before[1] < at_least and after[1] > 0.99 * at_least  # ones: rare
assert sum(n < 1000 for n in splits["train"]) < 0.05 * config.n_train
assert set(train_numbers) == set(splits["train"])
assert all(after[d] == before[d] for d in (4, 5, 6))

# %% [markdown]
# Short numbers are not the only ones a uniform draw leaves rare. A
# person trying the model types *zehntausend* (10 000) or
# *dreihunderttausend* (300 000) before anything like 318 462, and in a
# split of numbers drawn digit by digit such round numbers, and numbers
# such as 300 020 whose words leave whole parts unsaid, are a sliver.
# So are numbers that say the same words twice, such as 999 104 or
# 505 008: *neuf cent quatre-vingt-dix-neuf mille cent quatre* says
# *neuf*, *cent* and *quatre* twice each, and a model that finds its
# place in the source by what the words say, rather than where they
# stand, writes one where the other belongs.
# The last step of the recipe adds two groups of such numbers, each
# four to six digits long with a first digit from one to nine:
# `sparse_share` (25%) of `n_train` drawn by `sparse_numbers`, where
# each later digit is zero with probability 2/3, and `repeat_share`
# (15%) drawn by `repeated_numbers`, where each later digit copies one
# already drawn with probability 1/2. Why, and
# how we know it works, is the subject of the section on evaluation by
# slice below; the numbers it adds come from outside the validation
# and test splits and outside every family of numbers that section
# tests on. `training_numbers`
# does all of it, for this chapter and for the command line:

# %%
show(training_numbers)
train_numbers = training_numbers(splits, config)
train_pairs = number_pairs(train_numbers, config.pair)
balanced = len(balance_digits(splits["train"], at_least))
n_sparse = round(config.sparse_share * config.n_train)
sparse = train_numbers[balanced:balanced + n_sparse]
repeated = train_numbers[balanced + n_sparse:]
print(f"{len(train_numbers)} training examples, of which {len(sparse)} "
      "with many zeros, such as", ", ".join(map(str, sparse[:5])),
      f"\nand {len(repeated)} with repeated digits, such as",
      ", ".join(map(str, repeated[:5])))

# %% tags=["remove-cell"]
assert len(sparse) == n_sparse == 5000
assert at_least == 3000 and config.digits_share == 0.15
assert 0.08 < at_least / len(train_numbers) < 0.085  # 0.0822-0.0825, 0-11
assert 35_000 < len(train_numbers) < 37_000
fr_999104 = number_words(999104, "fr")
assert fr_999104 == "neuf cent quatre-vingt-dix-neuf mille cent quatre"
assert [fr_999104.count(w) for w in ("neuf", "cent", "quatre")] == [2, 2, 2]
assert len(repeated) == round(config.repeat_share * config.n_train) == 3000
tails = "".join(str(n)[1:] for n in sparse)  # the first digit is 1..9
# 2/3 of the digits drawn are zeros, fewer of those kept: the held-out
# round numbers, all zeros after the first digit, are drawn again
assert 0.55 < tails.count("0") / len(tails) < 0.73 and min(sparse) >= 1000
echo = sum(str(n)[1] == str(n)[0] for n in repeated) / len(repeated)
assert 0.5 < echo < 0.6 and min(repeated) >= 1000  # 1/2 + 1/20
added = set(sparse) | set(repeated)
assert not added & (set(splits["valid"]) | set(splits["test"]))

# %% [markdown]
# ## Subword tokens
#
# A word-level vocabulary would be useless here: each German number is
# its own word, and a test number would always be unknown. A
# character-level vocabulary works, but makes sequences long, and the
# cost of attention grows with the square of the length. **Byte-pair
# encoding** (BPE, {cite:t}`sennrich2016neural`) sits between the two. It
# starts from single characters and repeats one step: count every pair
# of adjacent symbols in the training text and merge the most frequent
# pair into a new symbol. It stops when the vocabulary has the size we
# asked for. Frequent words end up as single tokens, rare words as a few
# pieces, and any word made of known characters can still be spelt.
#
# `SubwordTokenizer.train` runs BPE with the `tokenizers` package, offline
# and in well under a second. Words are first split at spaces and
# punctuation; a `▁` marks a piece that starts a word, so that decoding
# puts the spaces back exactly. Four special tokens come first: `<pad>`,
# `<bos>`, `<eos>` and `<unk>`, at ids 0 to 3. Each language gets its own
# tokenizer, trained on the training split only:

# %%
src_tok, tgt_tok = train_tokenizers(pairs["train"], config)
print(f"source (German) vocabulary: {src_tok.vocab_size}, "
      f"target (English) vocabulary: {tgt_tok.vocab_size}")
for n in (21, 97, 312, 421, 97312):
    print(f"{n:>6}  {number_words(n, 'de'):36s} "
          f"{' '.join(src_tok.pieces(number_words(n, 'de')))}")
print()
print(" ".join(tgt_tok.pieces(number_words(421, "en"))))
print(tgt_tok.encode(number_words(421, "en")))

# %% tags=["remove-cell"]
# The pieces depend on the split, so on BOOK_SEED; these hold for 0-9.
assert src_tok.pieces("einundzwanzig") == ["▁ein", "undzwanzig"]
_pieces = src_tok.pieces("vierhunderteinundzwanzig")
assert len(_pieces) == 3 and _pieces[-1] == "undzwanzig"
assert _pieces[0].startswith("▁vier")
assert src_tok.pieces("siebenundneunzig") == ["▁sieben", "undneunzig"]
assert len(src_tok.pieces("zwölf")) >= 2  # not a token of its own
# zwölf: below 1000 in the numbers that end in 12; below a million, the
# words read (thousands) + "tausend" + (rest) (checked on the corpus), so
# also in the 9,900 that do not end in 12 but whose thousands do.
twelve = {n for n in range(1000) if "zwölf" in number_words(n, "de")}
assert twelve == set(range(12, 1000, 100))
corpus = set(train_numbers) | set(splits["valid"]) | set(splits["test"])
assert all(number_words(n, "de") == number_words(n // 1000, "de")
           + "tausend" + (number_words(n % 1000, "de") if n % 1000 else "")
           for n in corpus if n >= 2000)  # 1000-1999: "eintausend..."
assert all(("zwölf" in number_words(n, "de"))
           == (n // 1000 in twelve or n % 1000 in twelve) for n in corpus)
thousands_12 = sum(n % 100 != 12 and n // 1000 in twelve
                   for n in range(10**6))
assert thousands_12 == 9900
has_12 = sum("zwölf" in source for source, _ in pairs["train"])
assert has_12 / len(pairs["train"]) < 0.02  # 1.7% to 1.8%, seeds 0-11
assert tgt_tok.pieces("four hundred and twenty-one") == [
    "▁four", "▁hundred", "▁and", "▁twenty", "-", "one"]
for source, target in pairs["test"]:
    assert src_tok.decode(src_tok.encode(source)) == source
    assert tgt_tok.decode(tgt_tok.encode(target)) == target

# %% [markdown]
# BPE found the building blocks of the German compounds without being
# told about them: the hundreds (*vierhundert*), the units (*ein*,
# *sieben*), and the tens together with the "and" that joins them to the
# units (*undzwanzig*, *undneunzig*), sometimes with *tausend* attached.
# Its pieces follow frequency, not grammar: *zwölf* (twelve) is rare in
# this corpus, so it gets no token of its own and is spelt in bits. Only
# the numbers that end in 12 have it, and those whose thousands end in
# 12 (9,900 numbers below a million that do not end in 12 themselves,
# from 12 000, *zwölftausend*, to 912 999): under 2% of the training
# split. The exact pieces depend on the training split, so on the seed:
# for one of the seeds 0 to 9 (`BOOK_SEED=6`) BPE cuts *vier* +
# *hundertein* + *undzwanzig* instead. The English side needs no such
# help: with a vocabulary of about a hundred, every English number word
# is a single token, and the hyphen and comma are tokens of their own.
# Every source and target of the test set survives the round trip
# `decode(encode(x))` unchanged (checked).
#
# Each encoded sentence starts with BOS and ends with EOS. The sequences
# are short, and the English side is the longer one:

# %%
src_ids = [src_tok.encode(s) for s, _ in pairs["train"]]
tgt_ids = [tgt_tok.encode(t) for _, t in pairs["train"]]
for name, ids in (("source", src_ids), ("target", tgt_ids)):
    lengths = [len(x) for x in ids]
    print(f"{name}: {sum(lengths) / len(lengths):.1f} tokens on average, "
          f"{max(lengths)} at most")

# %% tags=["remove-cell"]
# At most 10 or 11 source and 16 target tokens for BOOK_SEED 0-9.
assert max(map(len, src_ids)) <= 12 and max(map(len, tgt_ids)) <= 17
assert sum(map(len, tgt_ids)) > 1.5 * sum(map(len, src_ids))

# %% [markdown]
# ## Batches of similar lengths
#
# A batch is a rectangle: every sequence is padded to the longest one in
# it. Random batches mix "eins" with 600 000-something and pay for the
# padding in every matrix product. `bucket_batches` sorts the examples by
# length (ties broken at random), cuts the sorted list into batches, and
# shuffles the order of the batches, so that each batch holds similar
# lengths while training still sees them in a random order:

# %%
def padding_share(batches) -> float:
    """The fraction of the token slots of src and tgt that are padding."""
    pads = sum(int((b.src == PAD_ID).sum() + (b.tgt == PAD_ID).sum())
               for b in batches)
    slots = sum(b.src.numel() + b.tgt.numel() for b in batches)
    return pads / slots


bucketed = bucket_batches(src_ids, tgt_ids, config.batch_size, SEED)
order = torch.randperm(len(src_ids), generator=torch.Generator()
                       .manual_seed(SEED)).tolist()
shuffled = [
    (pad_sequences([src_ids[i] for i in order[k:k + config.batch_size]]),
     pad_sequences([tgt_ids[i] for i in order[k:k + config.batch_size]]))
    for k in range(0, len(order), config.batch_size)
]
random_share = (sum(int((s == PAD_ID).sum() + (t == PAD_ID).sum())
                    for s, t in shuffled)
                / sum(s.numel() + t.numel() for s, t in shuffled))
print(f"{len(bucketed)} batches of {config.batch_size}")
print(f"padding, random batches:   {random_share:.0%}")
print(f"padding, bucketed batches: {padding_share(bucketed):.0%}")
print(bucketed[0])

# %% tags=["remove-cell"]
assert padding_share(bucketed) < random_share / 3
assert sum(b.src.size(0) for b in bucketed) == config.n_train

# %% [markdown]
# Bucketing removes most of the padding, and with it a good part of the
# work of every training step.
#
# ## Training
#
# The recipe is that of [chapter 6](06_training), at a small size:
#
# - a Transformer with $N = 2$ layers per stack, $d_{model} = 128$, $H = 4$
#   heads and $d_{ff} = 256$: under a million parameters, against the 65
#   million of the paper's base model;
# - pre-LN, which chapter 6 found more forgiving at a high learning
#   rate;
# - Adam with $\beta_2 = 0.98$ and the Noam schedule
#   $lr = factor \cdot d_{model}^{-0.5} \min(step^{-0.5},\;
#   step \cdot warmup^{-1.5})$;
# - label smoothing with $\varepsilon = 0.1$;
# - dropout 0.1, gradients clipped to norm 1;
# - `steps` optimizer steps on fresh bucketed batches each epoch; the
#   last `keep_last` multiples of `save_every` steps are saved as
#   checkpoints.
#
# `train` in `transformer_lite/tasks/trainer.py` runs it; the command line
# calls the same function, so the book and the tool cannot drift apart.
# It is data, a model and chapter 6's loop: `fit` over an endless stream
# of bucketed batches, stopped after `steps` steps, with a callback that
# validates and saves every `save_every` steps; its inner step is
# chapter 6's `train_step`, whose data-parallel case we read below in
# the section on several processes. Checkpoints go to a temporary
# directory. While it works, a progress bar counts the steps and shows
# the loss (it is left out of the book's web pages, which would show
# each of its updates).

# %% tags=["remove-output"]
workdir = tempfile.TemporaryDirectory()
seed_everything(config.seed)
result = train(train_pairs, config, Path(workdir.name) / "checkpoints",
               valid_pairs=pairs["valid"], tokenizers=(src_tok, tgt_tok),
               device=device)
translator = result.translator
model = translator.model

# %%
print(f"{sum(p.numel() for p in model.parameters()):,} parameters, "
      f"{len(result.step_loss)} steps, "
      f"{len(result.checkpoints)} checkpoints kept")

# %%
# NBVAL_IGNORE_OUTPUT
threads = torch.get_num_threads()
print(f"training took {result.seconds:.0f} s of wall-clock time and "
      f"{result.cpu_seconds:.0f} s of CPU time "
      f"({threads} thread{'s' if threads > 1 else ''})")

# %% [markdown]
# The training loss cannot reach zero: label smoothing asks for
# probability $1 - \varepsilon + \varepsilon / V$ on the right token and
# spreads the rest, and the smallest loss it allows is the entropy
# $H(q)$ of that smoothed target. We draw it as the floor.

# %%
floor = LabelSmoothingLoss(tgt_tok.vocab_size, PAD_ID,
                           config.smoothing).entropy
steps = range(1, len(result.step_loss) + 1)
window = 25
running = [sum(result.step_loss[max(0, i - window):i])
           / len(result.step_loss[max(0, i - window):i]) for i in steps]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(steps, result.step_loss, color="tab:blue", alpha=0.25, lw=0.8,
        label="training, each step")
ax.plot(steps, running, color="tab:blue", label=f"training, mean of "
        f"{window}")
ax.plot(*zip(*result.valid_loss, strict=True), "o-", color="tab:orange",
        label="validation")
ax.axhline(floor, color="grey", ls=":", label="floor $H(q)$")
ax.set(title="German to English number words: loss",
       xlabel="optimizer step", ylabel="label-smoothed loss",
       ylim=(floor - 0.2, 2.5))
ax.legend()
plt.show()

# %% tags=["remove-cell"]
valid_final = result.valid_loss[-1][1]
assert result.valid_loss[0][1] > valid_final  # it learnt
assert valid_final - floor < 0.15  # close to the floor
assert min(result.step_loss) > floor - 0.05
assert len(result.step_loss) == config.steps
assert sum(p.numel() for p in model.parameters()) < 10**6

# %% [markdown]
# The validation loss, on numbers the model has never seen, follows the
# training loss down to a little above the floor: the model generalises
# rather than memorises.
#
# ## Averaging the last checkpoints
#
# {cite:t}`vaswani2017attention` did not keep the weights of the last step: for
# the base model they averaged the last five checkpoints, written ten
# minutes apart. Near the end of training the weights wander around a
# minimum with the noise of each batch; their mean lies closer to it than
# most of the points it averages. `train` saved the weights every 50
# steps over the last 200; `average_checkpoints` loads the files, checks
# that they share one configuration, and averages every weight:

# %%
show(average_checkpoints)

# %% [markdown]
# We score both models on the 1000 test numbers, decoding greedily
# (beam search comes below):

# %%
print("averaging:", [p.name for p in result.checkpoints])
averaged_model, extra = average_checkpoints(result.checkpoints,
                                            map_location=device)
averaged = Translator.from_model(averaged_model, extra)
test_sources = [s for s, _ in pairs["test"]]
test_targets = [t for _, t in pairs["test"]]
start = time.perf_counter()
averaged_outputs = averaged.translate(test_sources, beam_size=1)
translate_seconds = time.perf_counter() - start
averaging = pd.DataFrame({
    "last step": scores(translator.translate(test_sources, beam_size=1),
                        test_targets),
    "average of the last five": scores(averaged_outputs, test_targets),
}).T
print(averaging.round(2).to_string())

# %% tags=["remove-cell"]
assert len(result.checkpoints) == config.keep_last == 5
saved_steps = [int(p.stem.split("-")[1]) for p in result.checkpoints]
assert saved_steps == list(range(config.steps - 200, config.steps + 1, 50))
assert averaging.loc["average of the last five", "exact match"] >= 95
assert (averaging.loc["average of the last five", "exact match"]
        >= averaging.loc["last step", "exact match"] - 0.5)

# %% [markdown]
# Averaging costs a few files on disk and a second, and gives one
# ordinary model. How much it buys depends on where the last step
# happened to land. Over the book's sweep (15 runs: `BOOK_SEED` 0, 1 and
# 2, the seed of the chapter, which also changes the split, each under
# AVX-512 and AVX2 kernels at one and two threads and under plain SSE
# kernels at one), the last step scored 96.3% to 99.9% exact and the
# average 99.8% to 100%, in no run below the last step
# (`notebooks/sweeps/07.json`). So where the last step landed worst, at
# 96.3%, the average of the same run scored at least 3.5 points more.
# The average was never worse, and sometimes much better, so it is the
# one we keep: the rest of the chapter, and the command line, use it.

# %%
translator = averaged
model = translator.model

# %% [markdown]
# ## Saving and loading
#
# `Translator.save` writes one file with the configuration, the weights
# and both tokenizers (as JSON strings). It holds only tensors, numbers
# and strings, so it loads with `torch.load(..., weights_only=True)`,
# which refuses to unpickle code:

# %%
path = Path(workdir.name) / "de-en.pt"
translator.save(path, pair=config.pair)
raw = torch.load(path, weights_only=True)
print("stored:", sorted(raw), "| extra:", sorted(raw["extra"]))
loaded = Translator.load(path, map_location=device)
probe = [source for source, _ in pairs["test"][:8]]
print(loaded.translate(probe[:3]))

# %% tags=["remove-cell"]
assert loaded.translate(probe) == translator.translate(probe)
loaded_state, state = loaded.model.state_dict(), model.state_dict()
assert all(torch.equal(loaded_state[k], state[k]) for k in state)
assert loaded.src_tokenizer.to_json() == src_tok.to_json()

# %% [markdown]
# ## Knowing what it does not know
#
# A trained model answers every input. It has only English number words
# to answer with, so it answers a greeting, a number beyond its range
# and a number with a noun after it with English number words too:

# %%
outside = ["Guten Morgen", "eine Million", "dreiundzwanzig Äpfel"]
for text, answer in zip(outside, translator.translate(outside),
                        strict=True):
    print(f"{text!r:24} -> {answer!r}")

# %% [markdown]
# A model cannot tell these from its real inputs, but the task can. Number
# words name one number each, so both sides can be *read*:
# `read_number(text, lang)` finds the number whose words are exactly
# `text` (it proposes candidates from a lexicon of the words of 0-999 and
# of the multiples of a thousand, and keeps the one that `number_words`
# writes out as `text` again), or says there is none. A translator that
# knows its domain, a `NumberDomain` of the language pair and the number
# of digits it was trained on, makes two checks:
#
# 1. **the input** must be the German words of a number below
#    $10^6$; anything else is refused before the model runs;
# 2. **the answer** must *round-trip*: read as an English number and
#    written out in German, it must give the input again.
#
# The second check needs no reference translation, and on the inputs of
# the domain it flags exactly the wrong answers: an English number word
# that reads as the input's number is the right answer, and any other
# reads as another number, or as none.

# %%
domain = NumberDomain(config.pair, config.max_digits)
checked = Translator(model, src_tok, tgt_tok, domain=domain)
for text in outside:
    print(f"{text!r:24} {checked.problem(text)}")
start = time.perf_counter()
flagged = [checked.doubt(source, answer) is not None
           for source, answer in zip(test_sources, averaged_outputs,
                                     strict=True)]
check_seconds = time.perf_counter() - start
wrong = [answer != target
         for answer, target in zip(averaged_outputs, test_targets,
                                   strict=True)]
print(f"round trip: {sum(flagged)} of {len(flagged)} test answers "
      f"flagged, {sum(wrong)} wrong")
print(f"per answer: the check {1000 * check_seconds / len(flagged):.2f} ms, "
      f"the greedy translation "
      f"{1000 * translate_seconds / len(flagged):.2f} ms")
print(checked.doubt("einundzwanzig", "seventy-one thousand and seventy-seven"))

# %% tags=["remove-cell"]
assert all(checked.problem(text) is not None for text in outside)
assert all(translator.translate(outside))  # an answer for each, none empty
assert all(read_number(s, "de") is not None for s in test_sources)
assert flagged == wrong  # exactly the wrong answers, whatever the model
assert read_number(number_words(421097, "de"), "de") == 421097

# %% [markdown]
# The check is cheap: the lexicon is about 2,000 calls to `num2words` per
# language, made once, and each check then tries a few prefixes of the text and
# writes out one or two numbers, a fraction of a millisecond (the cell above
# prints it beside the time of a greedy translation in a batch of 500). The
# command line's translator keeps its domain in its file and makes both checks:
# an input outside the domain, or an answer that does not round-trip, gets one
# line on stderr and an empty line on stdout, and the exit status is 1;
# `--unchecked` prints the model's answer anyway. Most tasks have no such check
# (no program can read an English sentence back into German), and there the
# confident wrong answer is a problem that only calibration or a second model
# can address.

# %% [markdown]
# ## Beam search
#
# Greedy decoding (chapter 6) takes the most probable token at every step.
# That is not the same as the most probable *sentence*: a token with
# probability 0.5 may lead only to poor continuations, while one with
# 0.4 leads to a sure one. Beam search keeps the $k$ best partial
# outputs ("hypotheses") instead of one. At each step it extends every
# hypothesis by every token, scores the $k \cdot V$ candidates, and keeps
# the best $k$; a hypothesis that emits EOS is finished and stays in the
# running unchanged. $k = 1$ is greedy decoding.
#
# The score of an output $Y$ for a source $X$ is its log-probability,
# which can only fall as $Y$ grows, so a plain beam search prefers short
# outputs. GNMT {cite:p}`wu2016google` divides by a length penalty:
#
# $$\mathrm{score}(Y) = \frac{\log P(Y \mid X)}{lp(Y)}, \qquad
# lp(Y) = \left(\frac{5 + |Y|}{6}\right)^{\alpha},$$
#
# with $\alpha = 0.6$ by default; $\alpha = 0$ is no penalty, and
# $lp = 1$ for a one-token output.

# %%
show(gnmt_length_penalty)
print(gnmt_length_penalty(torch.tensor([1.0, 5.0, 10.0, 15.0]), 0.6))

# %% [markdown]
# Our `beam_search` decodes all B sources at once, as $B \cdot k$ rows
# of one batch. It uses the key/value cache that chapter 8 explains: each
# step feeds only the newest token and appends its keys and values. When
# the kept hypotheses come from other rows, `select(rows)` reorders the
# self-attention caches to match; the cross-attention keys and values,
# computed once from the encoder's memory, are the same for the $k$ rows
# of a source and stay where they are. Here is the loop:

# %%
show(decoding._beam_search)

# %% [markdown]
# Its tests (`tests/test_beam.py`) check that $k = 1$ returns exactly what
# `greedy_decode` returns, that a batch returns what each source
# returns alone, and, on a hand-built model whose next-token
# probabilities are fixed, that beam search finds the more probable
# output that greedy decoding misses. Here is the same check on our
# trained model, on a few test numbers:

# %%
few = src_tok.encode_batch(test_sources[:50]).to(device)  # (B, S)
greedy_ys = greedy_decode(model, few, max_len=30, bos_id=BOS_ID, eos_id=EOS_ID)
beam1_ys = beam_search(
    model,
    few,
    max_len=30,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    beam_size=1,
)
print("k = 1 equals greedy:", torch.equal(greedy_ys, beam1_ys))

# %% tags=["remove-cell"]
assert torch.equal(greedy_ys, beam1_ys)

# %% [markdown]
# Now the whole test set, 1000 numbers the model has never seen, with
# greedy decoding and with a beam of 4:

# %%
test_src = src_tok.encode_batch(test_sources).to(device)  # (B, S)
max_len = 2 * test_src.size(1) + 10  # a common limit: 2 S + 10 tokens


def decode_test(k: int) -> dict:
    """Decode the test set with beam size k; score and time it."""
    start = time.perf_counter()
    ys, score = beam_search(
        model,
        test_src,
        max_len=max_len,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        beam_size=k,
        return_scores=True,
    )
    seconds = time.perf_counter() - start
    outputs = tgt_tok.decode_batch(ys)
    return {"ys": ys, "outputs": outputs, "score": score,
            "seconds": seconds, **scores(outputs, test_targets)}


runs = {k: decode_test(k) for k in (1, 4)}
columns = ["exact match", "BLEU", "chrF"]
comparison = pd.DataFrame(
    {("greedy" if k == 1 else f"beam, k = {k}"):
     {**{c: run[c] for c in columns},
      "mean score": float(run["score"].mean()),
      "seconds": run["seconds"]}
     for k, run in runs.items()}
).T
changed = sum(g != b for g, b in zip(runs[1]["outputs"], runs[4]["outputs"],
                                     strict=True))

# %%
# NBVAL_IGNORE_OUTPUT
print(comparison.round(3).to_string())
print(f"outputs where the beam differs from greedy: {changed}")

# %% tags=["remove-cell"]
greedy_run, beam_run = runs[1], runs[4]
assert greedy_run["exact match"] >= 95 and greedy_run["BLEU"] >= 90
assert beam_run["exact match"] >= 95 and beam_run["BLEU"] >= 90
assert (beam_run["score"] >= greedy_run["score"] - 1e-5).all()
assert changed <= 10  # the beam rarely changes the output

# %% [markdown]
# (Times vary with the machine; the other columns do not.) Both clear the
# bar we set ourselves, at least 95% exact match and a BLEU of at least
# 90 on held-out numbers, by a wide margin. And here beam search buys
# little. In this run, for every test number, the beam's output scores
# at least as high as the greedy one under the beam's own measure,
# $\log P / lp$ (checked). That is a fact of this model, not a promise
# of the algorithm: beam search may drop the greedy prefix when $k$
# other prefixes rank above it, and with a length penalty the ranking
# of prefixes differs from that of finished outputs, so in general it
# can return an output that scores *below* the greedy one. It also
# hardly ever finds a *different* output (the count is under the
# table), so the scores barely move, while the search decodes $k = 4$
# hypotheses for every source. The model is too
# sure of itself for a wider search to matter. Here is how sure: the
# probability it gives to each token of its greedy outputs (the
# geometric mean over an output's tokens, averaged over outputs), for
# the right outputs and for the wrong ones:

# %%
ys = runs[1]["ys"]  # the greedy outputs, (B, L)
with torch.no_grad():
    log_p = model(test_src, ys[:, :-1]).log_softmax(-1)  # (B, L-1, V)
chosen = log_p.gather(-1, ys[:, 1:, None]).squeeze(-1)  # (B, L-1)
real = ys[:, 1:] != PAD_ID  # (B, L-1)
per_token = ((chosen * real).sum(1) / real.sum(1)).exp()  # (B,)
right = torch.tensor([o == t for o, t in zip(runs[1]["outputs"],
                                             test_targets, strict=True)],
                     device=per_token.device)  # (B,)
cap = 1 - config.smoothing + config.smoothing / tgt_tok.vocab_size
wrong = (f"{per_token[~right].mean():.3f} ({int((~right).sum())} outputs)"
         if (~right).any() else "none in this run")  # fmt: skip
print(f"right outputs: {per_token[right].mean():.3f} per token; "
      f"wrong outputs: {wrong}; label smoothing's target: {cap:.3f}")

# %% tags=["remove-cell"]
assert abs(per_token[right].mean() / cap - 1) < 0.1
if (~right).any():  # some seeds get every test number right
    assert per_token[~right].mean() > 0.8 * cap

# %% [markdown]
# Label smoothing trains the model to give the right token probability
# $1 - \varepsilon + \varepsilon / V$, and on the numbers it gets right
# it gives about that at every step (a little more, as dropout, on during
# training, is off when decoding). On the numbers it gets wrong, when
# a run has any (a few at most; some seeds have none), it is hardly
# less sure: it is *confidently* wrong, and no search through less
# probable tokens can repair that. Beam search pays where a model
# hesitates between outputs, as in real translation, where a sentence has
# many good renderings; the third exercise explores the length penalty's
# part in it.
#
# ## Scores: exact match, BLEU and chrF
#
# **Exact match** is the strictest measure: the share of outputs equal to
# the reference, letter for letter. Real translation rarely has one right
# answer, so machine translation is scored with softer measures.
# **BLEU** {cite:p}`papineni2002bleu` measures, for $n = 1$ to $4$, a
# *clipped* (or modified) precision $p_n$ over the whole test set: each
# distinct $n$-gram (run of $n$ words) of an output counts as many times
# as it occurs there, but never more often than it occurs in the
# reference, and $p_n$ is the sum of those clipped counts over the
# number of the outputs' $n$-grams. Clipping matters on this corpus: an
# output that says "hundred" or "and" twice where the reference says it
# once gets credit for one, so repeating the commonest words cannot buy
# precision. BLEU combines the four:
#
# $$\mathrm{BLEU} = BP \cdot \exp\Big(\frac{1}{4} \sum_{n=1}^{4}
# \log p_n\Big), \qquad BP = \min\big(1,\; e^{\,1 - r/c}\big),$$
#
# where $c$ and $r$ are the total lengths of the outputs and the
# references: the brevity penalty $BP$ stops a system from scoring well by
# saying little. **chrF** {cite:p}`popovic2015chrf` is an F-score over
# character
# $n$-grams, which gives partial credit for a nearly right word. We use
# `sacrebleu` {cite:p}`post2018call`, the reference implementation, so our
# numbers
# mean what published ones mean. One wrong word shows how they differ:

# %%
reference = "four hundred and twenty-one thousand, three hundred and five"
wrong = "four hundred and twenty-one thousand, three hundred and four"
print(f"BLEU {bleu([wrong], [reference]):.1f}, "
      f"chrF {chrf([wrong], [reference]):.1f}, "
      f"exact match {scores([wrong], [reference])['exact match']:.0f}")

# %% tags=["remove-cell"]
assert 50 < bleu([wrong], [reference]) < chrf([wrong], [reference]) < 100
assert abs(bleu([reference], [reference]) - 100) < 1e-9

# %% [markdown]
# One wrong word costs this sentence more BLEU than chrF, and all of its
# exact match. In BLEU the last $n$-gram of every length contains the
# wrong word, so all four precisions drop; chrF counts character
# $n$-grams, of which the sentence has so many that one short wrong word
# spoils few. For a number, exact match is what counts: "three hundred
# and four" is not nearly right.
#
# Clipping shows on an output that stutters. Against "one hundred and
# five", the output "one hundred and hundred and five" has six words,
# all of which occur in the reference; unclipped, its unigram precision
# would be 6/6. `sacrebleu` reports the clipped counts:

# %%
stutter = sacrebleu.corpus_bleu(["one hundred and hundred and five"],
                                [["one hundred and five"]])
print("clipped n-gram counts:", stutter.counts,
      "of", stutter.totals, "n-grams")

# %% tags=["remove-cell"]
assert stutter.counts[:2] == [4, 3] and stutter.totals[:2] == [6, 5]

# %% [markdown]
# "hundred" and "and" are credited once each, as often as the reference
# has them: $p_1 = 4/6$, and of the five bigrams only three count
# ("hundred and" is in the output twice and in the reference once).
#
# ## The errors that remain
#
# First, where they fall: exact match of the greedy outputs by count of
# digits, for the test set, and for all thousand numbers below 1000. Most
# of those the model trained on; they check that repeating the short
# numbers did its job.

# %%
def exact_by_digits(numbers: list[int], outputs: list[str]) -> pd.Series:
    """Exact match (%) of the outputs for each count of digits."""
    right = pd.Series([out == number_words(n, "en")
                       for n, out in zip(numbers, outputs, strict=True)])
    digits = pd.Series([len(str(n)) for n in numbers], name="digits")
    return 100 * right.groupby(digits).mean()


below_1000 = list(range(1000))
small_outputs = translator.translate(
    [number_words(n, "de") for n in below_1000], beam_size=1)
by_digits = pd.DataFrame({
    "test numbers": pd.Series([len(str(n)) for n in splits["test"]])
    .value_counts(),
    "test, exact (%)": exact_by_digits(splits["test"], runs[1]["outputs"]),
    "0 to 999, exact (%)": exact_by_digits(below_1000, small_outputs),
}).rename_axis("digits")
print(by_digits.round(1).to_string(na_rep="-"))
print(translator.translate(["fünf", "zwölf", "dreihundertzwölf"]))

# %% tags=["remove-cell"]
assert (by_digits["test, exact (%)"].dropna() >= 95).all()
assert exact_by_digits(below_1000, small_outputs).min() >= 99
assert sum(n < 1000 for n in splits["train"]) > 500  # most were trained on
assert translator.translate(["fünf", "zwölf", "dreihundertzwölf"]) == [
    "five", "twelve", "three hundred and twelve"]

# %% [markdown]
# Short numbers are no longer a weak spot. Here are the test numbers
# that beam search still gets wrong:

# %%
wrong_rows = errors(test_sources, runs[4]["outputs"], test_targets)
number_of = dict(zip(test_sources, splits["test"], strict=True))
error_table = pd.DataFrame(
    [{"number": number_of[row["source"]], **row} for row in wrong_rows],
    columns=["number", "source", "output", "reference"],
)
print(f"{len(error_table)} errors in {len(test_sources)} (the German "
      "sources are in error_table.source):")
with pd.option_context("display.max_colwidth", None):
    display(error_table[["number", "output", "reference"]])

# %% tags=["remove-cell"]
assert len(error_table) == round(10 * (100 - runs[4]["exact match"]))
assert len(error_table) <= 50

# %% [markdown]
# ## Evaluation by slice
#
# The scores so far answer one question: how often is a number drawn
# like the test numbers translated exactly? Over 99% of the time. A
# person trying the model asks another: does it know the numbers *I*
# type? Those are short, round or full of zeros: *zehntausend*,
# *einhunderttausend*, *zweitausendfünf*. An aggregate score weights each
# kind of number by its share of the test set, and round numbers are a
# sliver of it:

# %%
def has_zeros(n: int, count: int = 3) -> bool:
    return str(n).count("0") >= count


round_numbers = {k * 10**n for k in range(1, 10) for n in range(6)}
in_test = sum(n in round_numbers for n in splits["test"])
zero_heavy = sum(map(has_zeros, splits["test"]))
print(f"of {len(splits['test'])} test numbers, {in_test} are round "
      f"(k x 10^n) and {zero_heavy} have three or more zeros")

# %% tags=["remove-cell"]
assert in_test <= 5 and zero_heavy <= 20  # 2 and 2 to 8 for seeds 0-2

# %% [markdown]
# So a model may fail on every round number and lose a percent of its
# score. That is what happened to the first version of this chapter,
# whose recipe added no numbers of its own (`sparse_share=0`,
# `repeat_share=0`): 99% exact on
# the test set, and yet *zehntausend* came out as "ten" and
# *einhunderttausend* as "one hundred". The cure for an aggregate that
# hides a failure is to score **slices**: named families of numbers,
# each scored on its own. `number_slices` builds them:
#
# - **complete** families, small enough to list: every number 0-999,
#   and every round number $k \cdot 10^n$ ($k = 1..9$);
# - **sampled** families, `slice_size` (200) numbers each: numbers with
#   three or more zeros; numbers made of 11-19 and the x1 forms (21,
#   31, ..., 91) in every group of three digits (the irregular German
#   *elf*, *zwölf*, *einund-*); the largest thousand numbers; random
#   numbers of four, five and six digits;
# - and the test set itself, **random held-out**, for the aggregate.
#
# A family must measure translation, not memory, so it holds only
# numbers *outside* the training split: the validation and test
# numbers and the numbers the split never drew. "Every number 0-999"
# is therefore every *held-out* number 0-999, and the round numbers
# that the split happened to put into training are not in their
# family. The sparse numbers that training adds are drawn outside every
# family too (`training_numbers` excludes them), so no member of any
# family is ever trained on:

# %%
families = number_slices(splits, size=config.slice_size,
                         max_digits=config.max_digits, seed=config.seed)
trained_on = set(train_numbers)
print(pd.Series({name: len(xs) for name, xs in families.items()},
                name="numbers").to_frame().T.to_string())
print("family members trained on:",
      sum(len(trained_on & set(xs)) for xs in families.values()))

# %% tags=["remove-cell"]
assert all(not trained_on & set(xs) for xs in families.values())
assert families[HELD_OUT] == sorted(splits["test"])
assert len(families["round k x 10^n"]) >= 10

# %% [markdown]
# Here is the table that the first recipe gave for both language pairs
# with seed 0 (exact match in %, decoded with a beam of 4, as the
# command line does). It is a record, not run here, because it would
# double the chapter's training time; the command
# `python -m transformer_lite.tasks.translate train --sparse-share 0
# --repeat-share 0` prints it.
#
# | family | de-en | fr-en |
# |---|---:|---:|
# | 0-999 | 100.0 | 100.0 |
# | round k x 10^n | 44.0 | 8.0 |
# | 3+ zeros | 46.5 | 32.0 |
# | 11-19, x1 | 100.0 | 100.0 |
# | largest | 98.0 | 95.5 |
# | 4 digits | 100.0 | 99.0 |
# | 5 digits | 100.0 | 98.5 |
# | 6 digits | 99.5 | 98.5 |
# | random held-out | 99.0 | 98.6 |
#
# In words, a zero is silent: 800 047 is
# *achthunderttausendsiebenundvierzig* and "eight hundred thousand and
# forty-seven", with nothing said for the empty tens and units of the
# thousands, and 10 000 is *zehntausend*, with nothing after the
# *tausend* at all. The model must notice that a part is *missing*,
# which is harder than translating a part that is there, and a model
# that has seen few such gaps fills them. The largest numbers fail
# another way: they say the same words twice, and the model copies the
# wrong one. The recipe of this chapter trains on 5000 numbers with gaps
# (`sparse_numbers`) and 3000 with repeated digits (`repeated_numbers`),
# and the same families, scored on the model trained above, now read:

# %%
scored = score_slices(translator, families, pair=config.pair)
print(slice_table(scored))

# %% tags=["remove-cell"]
FLOOR = 90  # measured, seeds 0-2: de-en 94 at worst (the goal: 99)
assert all(s.exact >= FLOOR for s in scored.values()), slice_table(scored)
assert translator.translate(["zehntausend", "einhunderttausend"]) == [
    "ten thousand", "one hundred thousand"]

# %% [markdown]
# Every family is now at least 90% exact (checked), where two of them
# were below 50%, and the random held-out numbers did not pay for it.
# It is not yet the 99% we want for every family and every seed. Over
# seeds 0 to 2, a few numbers that end in *tausend* still gain a tail
# in German (930 000 became "nine hundred and thirty thousand and
# thirty"), and in French a few of the largest numbers whose last part
# is a bare *cent*, "one hundred", borrow the digit that follows it
# (999 103 became "... three hundred and three"). Both are the model
# finding its place in the source by what the words say rather than
# where they stand; closing that gap is the second exercise.
#
# The lesson reaches beyond numbers: a single score over a test set
# drawn like the training data tells how the model does on *that*
# distribution, and nothing about the inputs its users try first. Name
# those inputs, build a family for each, keep
# them out of training, and score every family.
#
# ## Inside the model: every attention map
#
# What has the model learnt? Its attention weights tell part of the
# story. `collect_attention` runs one teacher-forced pass with
# `keep_weights` switched on in every `MultiHeadAttention` and returns the
# weights of every layer; `attention_explorer` turns them into one
# interactive heatmap. Choose an example, the kind of attention (the
# encoder's self-attention over the German pieces, the decoder's masked
# self-attention over the English words written so far, or the
# cross-attention from English to German), a layer and a head. The rows
# of the decoder's maps are labelled with the word each position
# *writes*, so a row of the cross-attention map shows where the model
# looked while writing that word.

# %%
shown = [21, 97, 421097]  # three examples keep the page small
shown_src = [number_words(n, "de") for n in shown]
shown_tgt = [number_words(n, "en") for n in shown]
src_batch = src_tok.encode_batch(shown_src).to(device)  # (B, S)
tgt_batch = tgt_tok.encode_batch(shown_tgt).to(device)  # (B, T + 1)
weights = collect_attention(model, src_batch, tgt_batch[:, :-1])


def labels(tokenizer, text: str) -> list[str]:
    return ["<bos>", *tokenizer.pieces(text), "<eos>"]


sources = [labels(src_tok, s) for s in shown_src]
targets = [labels(tgt_tok, t)[:-1] for t in shown_tgt]  # decoder input
written = [labels(tgt_tok, t)[1:] for t in shown_tgt]  # what each writes
explorer = attention_explorer(
    weights, sources, targets, [str(n) for n in shown], predicted=written,
    title="Attention of the trained model (choose below the chart)",
)
print(f"{len(explorer.data)} weights in the chart")
explorer

# %% tags=["remove-cell"]
assert len(explorer.data) < 5000
spec = explorer.to_dict()
assert {p["name"] for p in spec["params"]} == {
    "pick_example", "pick_attention", "pick_layer", "pick_head"}

# %% [markdown]
# Start with the cross-attention of the last layer, the chart's first
# view. For 21 the decoder writes "twenty", "-", "one" while the German
# says *ein* first and *undzwanzig* second; for each word written, here
# is the German piece that gets the most weight, averaged over the four
# heads:

# %%
def cross_focus(example: int, layer: int) -> pd.DataFrame:
    """For each English word written, the German piece that the
    cross-attention of one layer weights most, averaged over heads."""
    w = weights["cross"][layer][example].mean(0)  # (T, S)
    rows = []
    for i, word in enumerate(written[example]):
        j = int(w[i, : len(sources[example])].argmax())
        rows.append({"writes": word, "looks at": sources[example][j],
                     "weight": round(float(w[i, j]), 2)})
    return pd.DataFrame(rows)


last = config.n_layers - 1
print(cross_focus(0, last).T.to_string(header=False))
print()
print(cross_focus(1, last).T.to_string(header=False))

# %% tags=["remove-cell"]
def focus(example: int) -> dict:
    frame = cross_focus(example, last)
    return dict(zip(frame["writes"], frame["looks at"], strict=True))


assert focus(0)["▁twenty"] == "undzwanzig" and focus(0)["one"] == "▁ein"
assert focus(1)["▁ninety"] == "undneunzig"
assert focus(1)["seven"] == "▁sieben"


def head_alignment(example: int, layer: int, head: int) -> dict:
    w = weights["cross"][layer][example, head]  # (T, S)
    return {word: sources[example][int(w[i, : len(sources[example])]
                                       .argmax())]
            for i, word in enumerate(written[example])}


aligned = [head_alignment(2, last, h) for h in range(config.n_heads)]
assert any(a["▁twenty"] == "undzwanzigtausend" and a["one"] == "ein"
           and a["▁ninety"] == "undneunzig" and a["seven"] == "sieben"
           for a in aligned)

# %% [markdown]
# The model reorders by *where it looks*: it writes "twenty" while
# attending to *undzwanzig*, the second German piece, and then "one"
# while attending to *ein*, the first; "ninety" comes from *undneunzig*
# and "seven" from *sieben*. Nobody told it which pieces correspond; the
# alignment is a by-product of learning to translate. Choose 421097 in
# the explorer and look through the heads of the last layer: in one of
# them the alignment crosses over twice, at "twenty-one" and at
# "ninety-seven", where "twenty" looks most at *undzwanzigtausend* and
# "one" at *ein*, "ninety" at *undneunzig* and "seven" at *sieben*.
# (Checked: for 21 and 97, the four words above in the weights averaged
# over the heads; for 421097, these four words in at least one head.
# Where the other English tokens look is for the eye, not asserted.)
# The other views are worth a look too: the decoder's self-attention
# can only look back, and the encoder's self-attention mixes the pieces
# of the one German word.

# %% [markdown]
# ## Training on several processes
#
# One process on two cores is enough for this chapter. For a larger
# corpus, **data parallelism** spreads each batch over several
# processes, on several cores, GPUs or machines. Every process holds a
# full copy of the model and takes its share of the rows of each global
# batch; during `backward`, PyTorch's `DistributedDataParallel` (DDP)
# averages the gradients over the processes, so all of them take the same
# optimizer step and their copies stay identical.
#
# One detail decides whether the result equals single-process training:
# the loss is a *mean over target tokens*, and the shares of a batch hold
# different numbers of tokens. If process $r$ holds tokens $\mathcal{T}_r$
# of a batch with $N_{tok}$ in all, the loss we want is
#
# $$\mathcal{L} = \frac{1}{N_{tok}} \sum_{r=1}^{R}
# \sum_{i \in \mathcal{T}_r} \ell_i
# = \frac{1}{R} \sum_{r=1}^{R} \Big(\frac{R}{N_{tok}}
# \sum_{i \in \mathcal{T}_r} \ell_i\Big),$$
#
# so each process backpropagates its *sum* times $R / N_{tok}$, and DDP's
# average over the $R$ processes does the rest. Averaging each process's
# own mean instead would weight a short share's tokens more than a long
# one's. Every process knows $N_{tok}$ without talking to the others,
# because all of them build the same global batches from the same seed.
# This is the formula of chapter 6's `train_step`, the package's one
# training step, with $W = R$ processes: when a process group exists it
# takes this process's share of each batch (`shard`) and scales its
# summed loss by $R / N_{tok}$. `train` calls it for every batch:

# %%
show(shard)

# %% [markdown]
# `tests/test_distributed.py` starts two processes that talk over
# `gloo` on 127.0.0.1, lets each take two steps on its share of two
# batches whose shares hold different numbers of tokens, and checks that
# both end with the same weights as one process that took the two steps
# on the whole batches.
#
# `train` joins the process group when `torchrun` starts it
# (`WORLD_SIZE` > 1 in its environment): `gloo` on CPUs, `nccl` on
# GPUs, one GPU per process. Only rank 0 shows progress and writes
# checkpoints. To train this chapter's model on two processes:
#
# ```bash
# OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 \
#     -m transformer_lite.tasks.translate train --pair de-en
# ```
#
# On two cores, expect no gain over one process with two threads: the
# same two cores do the same work, plus the exchange of gradients. Data
# parallelism pays off with more cores, and above all with several GPUs.
#
# ## Using the model outside the notebook
#
# The same training runs from the command line, and the saved model then
# translates whatever you type:
#
# ```bash
# python -m transformer_lite.tasks.translate train     # 1.5 minutes
# python -m transformer_lite.tasks.translate "dreihundertzwölf"
# three hundred and twelve
# python -m transformer_lite.tasks.translate train --pair fr-en
# python -m transformer_lite.tasks.translate --pair fr-en \
#     "quatre-vingt-dix-sept"
# ```
#
# The model goes to `~/.cache/transformer-lite/de-en.pt` (or under
# `$XDG_CACHE_HOME`), its checkpoints next to it; `--model-dir DIR` or
# `--model FILE` choose another place. After training, `train` prints
# the scores on the test numbers and the slice table of this chapter,
# so a weak family shows at once. Every field of `TranslateConfig`
# is an option (`--steps 2000`, `--d-model 256`), and
# `--tsv corpus.tsv` trains on any parallel corpus with one
# `source<TAB>target` pair per line, such as Multi30k
# (`paste train.de train.en > train.tsv`) or sentence pairs from Tatoeba.
# `transformer_lite.tasks.corpus.read_tsv` reads it and names the line
# of any malformed entry.

# %% tags=["remove-cell"]
assert translator.translate(["dreihundertzwölf"]) == [
    "three hundred and twelve"]

# %% [markdown]
# ## French
#
# French is the harder source: it counts in twenties from 60 to 99
# (*soixante-dix* for 70, *quatre-vingts* for 80), and writes with spaces
# and hyphens. Here is how its tokenizer would cut a
# few numbers:

# %%
fr_pairs = number_pairs(splits["train"], "fr-en")
fr_tok, _ = train_tokenizers(fr_pairs, config)
for n in (71, 80, 97, 421097):
    french = number_words(n, "fr")
    print(f"{n:>6}  {french:40s} {' '.join(fr_tok.pieces(french))}")
fr_lengths = [len(fr_tok.encode(s)) for s, _ in fr_pairs]
print(f"French: {sum(fr_lengths) / len(fr_lengths):.1f} tokens on average"
      f" (German: {sum(map(len, src_ids)) / len(src_ids):.1f})")

# %% tags=["remove-cell"]
assert fr_tok.pieces("quatre-vingt-dix-sept") == [
    "▁quatre", "-", "vingt", "-", "dix", "-", "sept"]
assert sum(fr_lengths) > sum(map(len, src_ids))

# %% [markdown]
# For 97 the English "ninety" has no single French counterpart: the model
# must read *quatre*, *vingt* and *dix* together, and "seven" must come
# from the *sept* at the end. Training on French is the first exercise.
#
# ## Summary
#
# - Number words make a small but real translation task, generated
#   offline: German compounds must be segmented and their units and tens
#   swapped; French counts in twenties. The corpus is split **by number**,
#   so the test set holds only unseen numbers.
# - **Byte-pair encoding** learns subword pieces from frequency alone and
#   found the parts of the German compounds; the round trip
#   `decode(encode(x))` is exact.
# - **Length-bucketed batches** cut the padding to a fraction of that of
#   random batches.
# - A Transformer of under a million parameters, trained for a minute
#   and a half on two CPU cores with label smoothing and the Noam schedule,
#   translates at least 95% of unseen numbers exactly, with a BLEU above
#   90. Short numbers are rare in a split of distinct numbers; repeating
#   them in training (`balance_digits`) keeps the model from learning
#   that every number is long.
# - **Beam search** keeps $k$ hypotheses and ranks them by
#   $\log P / lp$ with GNMT's length penalty; $k = 1$ *is* greedy
#   decoding. It is not guaranteed to beat greedy decoding (in this
#   run its outputs scored at least as high, checked); on a model this
#   sure of itself it changes almost nothing, at many times the cost.
# - **BLEU** and **chrF** (from `sacrebleu`) give partial credit; for
#   numbers, exact match is the measure that counts.
# - The **cross-attention** of the trained model aligns English words
#   with the German pieces they translate, reordering included.
# - **Averaging the last checkpoints** gives a steadier model than the
#   last step, for the price of a few files; checkpoints load with
#   `weights_only=True`.
# - **An aggregate score can hide a failure.** 99% exact on random
#   held-out numbers went with round numbers translated wrong, because
#   they are a sliver of a random test set. Named families of held-out
#   numbers (`number_slices`), each scored on its own
#   (`score_slices`), show it; training on numbers with many zeros
#   (`sparse_numbers`) and with repeated digits (`repeated_numbers`),
#   drawn outside every family, brings every family above 90%, from
#   below 50%.
# - **Data-parallel training** with `torchrun` and DDP equals
#   single-process training when each process's summed loss is divided
#   by the global token count, times the number of processes.
#
# ## Exercises
#
# 1. **French to English.** Train with
#    `train(number_pairs(splits["train"], "fr-en"), TranslateConfig(
#    pair="fr-en"), ...)` (or `python -m transformer_lite.tasks.translate train
#    --pair fr-en`). Is French harder: more steps to reach 95%, or other
#    errors? Look at the cross-attention of "quatre-vingt-dix-sept" in
#    the explorer: which French pieces does "ninety" look at?
# 2. **Silent zeros.** Train with `TranslateConfig(sparse_share=0)` (or
#    `--sparse-share 0` on the command line) and print the slice table:
#    which families fall, and what do their worst outputs have in
#    common? How small can `sparse_share` be before a family drops below
#    99%, and does a large one (0.5) cost the random held-out numbers?
#    Try `repeat_share=0` too. After chapter 9, come back with its
#    relative positions: does RoPE help the model tell a repeated word's
#    two places apart?
#    Then add a family of your own: every number whose last two digits
#    are 12, removed from training. Does BPE's odd split of *zwölf*
#    hurt, or does the model cope?
# 3. **The length penalty.** Decode the test set with `beam_size=4` and
#    `length_penalty` 0, 0.6 and 2. Count the outputs that are shorter
#    and longer than their reference in each case, and find an example
#    where $\alpha = 0$ gives a wrong, shorter output.

# %% [markdown]
# ## Graded exercises
#
# Nine exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand.
# In the book the reference solutions are folded: try first, then
# open them. The classroom edition (the teaching page) hands out the
# same exercises with the solutions removed, and nbgrader scores them.
# None of them trains a translator: they rebuild the pieces around
# one, from the number words to the tokenizer, the score and the
# search, each on inputs small enough to follow by hand.

# %% tags=["exercise-setup"]
import collections
import json
import math

import sacrebleu
import torch

from transformer_lite import Transformer, TransformerConfig
from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
)
from transformer_lite.decoding import gnmt_length_penalty
from transformer_lite.tasks.numbers import number_words
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID

# German number words: 0 to 19, and the tens by their digit (2 to 9).
ONES_DE = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs",
           "sieben", "acht", "neun", "zehn", "elf", "zwölf", "dreizehn",
           "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn",
           "neunzehn"]  # fmt: skip
TENS_DE = ["", "zehn", "zwanzig", "dreißig", "vierzig", "fünfzig",
           "sechzig", "siebzig", "achtzig", "neunzig"]  # fmt: skip

# A BPE corpus: each German number below 100 is one word, a tuple of
# symbols (at first its characters), with the tokenizer's "▁" in front.
TEXTS = [number_words(n, "de") for n in range(1, 100)]
WORDS = collections.Counter(tuple("▁" + text) for text in TEXTS)

# Outputs of an imagined translator, and their references.
REFS = ["four hundred and twenty-one", "ninety-seven",
        "three hundred and twelve", "five",
        "eight hundred thousand and forty-seven", "one hundred and one"]
HYPS = ["four hundred and twenty-one", "ninety-seven",
        "three hundred and twelve thousand and twelve",
        "five hundred and five",
        "eight hundred and forty-seven thousand and forty-seven",
        "one hundred and one hundred and one"]  # fmt: skip
SHORT = ["four hundred", "ninety-seven", "three hundred and twelve",
         "five", "eight hundred thousand and forty-seven",
         "one hundred"]  # fmt: skip

# An untrained model to search with (float64, no dropout). Like a
# trained one, it never writes PAD_ID or BOS_ID.
V = 12
torch.manual_seed(2)
config = TransformerConfig(V, V, n_layers=1, d_model=16, d_ff=32,
                           n_heads=2, dropout=0.0)  # fmt: skip
model = Transformer(config).double().eval()
with torch.no_grad():
    model.generator.bias[[PAD_ID, BOS_ID]] -= 30.0
sources = torch.randint(3, V, (3, 5),
                        generator=torch.Generator().manual_seed(7))  # (B, S)

# %% [markdown]
# ### Exercise 7.1: German number words (2 points)
#
# Write `german(n)` for $0 \le n < 1000$: the German words for $n$,
# exactly as `number_words(n, "de")` writes them, built from the tables
# `ONES_DE` and `TENS_DE` of the setup. Below 20, the table says it. A
# multiple of ten is its tens word. Any other number below 100 says its
# unit first, then *und*, then the tens: 97 is *siebenundneunzig*, and
# the unit 1 is *ein* there (*einundzwanzig*), not *eins*. From 100 on,
# the hundreds digit comes first (1 as *ein*), then *hundert*, then
# the rest with no space: 101 is *einhunderteins*.

# %% tags=["solution", "hide-input"]
def german(n):
    ### BEGIN SOLUTION
    if n >= 100:
        hundreds, rest = divmod(n, 100)
        head = "ein" if hundreds == 1 else ONES_DE[hundreds]
        return head + "hundert" + (german(rest) if rest else "")
    if n < 20:
        return ONES_DE[n]
    tens, unit = divmod(n, 10)
    if unit == 0:
        return TENS_DE[tens]
    return ("ein" if unit == 1 else ONES_DE[unit]) + "und" + TENS_DE[tens]
    ### END SOLUTION


# %% tags=["check"]
from num2words import num2words
from num2words.base import Num2Word_Base

want = {n: number_words(n, "de") for n in range(100)}
number_words.cache_clear()  # german() must not read the words from there
with exercise("7.1", twins=[num2words, Num2Word_Base.to_cardinal]):
    wrong = [n for n in range(100) if german(n) != want[n]]
    first = wrong[0] if wrong else 21
    expect_equal(f"german({first})", german(first), want[first],
                 hint="below 100 the unit comes first and joins the tens "
                 "with 'und'; the unit 1 is 'ein' there, 'eins' only "
                 "alone")  # fmt: skip

# %% tags=["check"]
want = {n: number_words(n, "de") for n in range(100, 1000)}
number_words.cache_clear()
with exercise("7.1", twins=[num2words, Num2Word_Base.to_cardinal]):
    wrong = [n for n in range(100, 1000) if german(n) != want[n]]
    first = wrong[0] if wrong else 101
    expect_equal(f"german({first})", german(first), want[first],
                 hint="say the hundreds digit (1 as 'ein'), then "
                 "'hundert', then the rest as below 100, and nothing for "
                 "a rest of 0")  # fmt: skip

# %% [markdown]
# ### Exercise 7.2: the merges of byte-pair encoding (3 points)
#
# A corpus for BPE is a `Counter` such as `WORDS`: a word, as a tuple of
# symbols, maps to the number of times it occurs. Write three
# functions:
#
# - `pair_counts(words)`: a `Counter` from each pair of adjacent
#   symbols `(a, b)` to the number of times it occurs in the corpus (a
#   word that occurs $m$ times counts $m$ times);
# - `merge_pair(words, pair)`: a new corpus in which each occurrence of
#   `pair` is replaced by the single symbol `a + b`, scanning every word
#   from left to right without overlaps (`a a a` becomes `aa a`);
# - `learn_merges(words, n)`: the first `n` merges, a list of pairs.
#   Each time, merge the most frequent pair, then count again. Break
#   ties as the `tokenizers` library does: prefer the pair whose first
#   symbol is older, then the one whose second symbol is older. The
#   single characters are the oldest symbols, in sorted order, and every
#   merged symbol is younger than all symbols made before it.
#
# The check compares your merges with those our `SubwordTokenizer`
# learns from the same words.

# %% tags=["solution", "hide-input"]
def pair_counts(words):
    ### BEGIN SOLUTION
    counts = collections.Counter()
    for word, m in words.items():
        for pair in zip(word[:-1], word[1:], strict=True):
            counts[pair] += m
    return counts
    ### END SOLUTION


def merge_pair(words, pair):
    ### BEGIN SOLUTION
    merged = collections.Counter()
    for word, m in words.items():
        symbols, i = [], 0
        while i < len(word):
            if word[i : i + 2] == pair:
                symbols.append(word[i] + word[i + 1])
                i += 2
            else:
                symbols.append(word[i])
                i += 1
        merged[tuple(symbols)] += m
    return merged
    ### END SOLUTION


def learn_merges(words, n):
    ### BEGIN SOLUTION
    characters = sorted({c for word in words for c in word})
    age = {c: i for i, c in enumerate(characters)}
    merges = []
    for _ in range(n):
        counts = pair_counts(words)
        if not counts:
            break

        def rank(pair, counts=counts):
            return -counts[pair], age[pair[0]], age[pair[1]]

        pair = min(counts, key=rank)
        merges.append(pair)
        age[pair[0] + pair[1]] = len(age)
        words = merge_pair(words, pair)
    return merges
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.tasks.tokenizer import SubwordTokenizer

toy = collections.Counter({("a", "a", "a"): 2, ("a", "b"): 3})
# SubwordTokenizer.train ends in SubwordTokenizer.__init__
with exercise("7.2", twins=[SubwordTokenizer.__init__]):
    expect_equal("pair_counts(toy)", dict(pair_counts(toy)),
                 {("a", "a"): 4, ("a", "b"): 3},
                 hint="every place a pair occurs counts, times the count "
                 "of its word")  # fmt: skip
    expect_equal("merge_pair(toy, ('a', 'a'))",
                 dict(merge_pair(toy, ("a", "a"))),
                 {("aa", "a"): 2, ("a", "b"): 3},
                 hint="merge from left to right without overlaps: a a a "
                 "becomes aa a")  # fmt: skip
    expect_equal("learn_merges(toy, 2)",
                 [tuple(pair) for pair in learn_merges(toy, 2)],
                 [("a", "a"), ("a", "b")],
                 hint="merge the most frequent pair, then count the "
                 "pairs of the merged corpus again")  # fmt: skip

# %% tags=["check", "points-2"]
n_merges = 30
characters = {c for word in WORDS for c in word}
vocab_size = 4 + len(characters) + n_merges  # <pad> <bos> <eos> <unk>
tokenizer = SubwordTokenizer.train(TEXTS, vocab_size)
merges = json.loads(tokenizer.to_json())["model"]["merges"]
want = [tuple(m.split(" ") if isinstance(m, str) else m) for m in merges]
with exercise("7.2", twins=[SubwordTokenizer.__init__]):
    got = [tuple(pair) for pair in learn_merges(WORDS, n_merges)]
    expect_equal("the number of merges", len(got), len(want),
                 hint="stop after n merges")  # fmt: skip
    for i, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        expect_equal(f"merge {i + 1}", mine, theirs,
                     hint="count the pairs again after every merge, and "
                     "on a tie prefer the older symbols: characters in "
                     "sorted order first, then merges in the order they "
                     "were made")  # fmt: skip

# %% [markdown]
# ### Exercise 7.3: clipped n-gram precision (1 point)
#
# Write `clipped_counts(hypothesis, reference, n)` for two sentences,
# with words split at spaces (`str.split()`). That is how `sacrebleu`
# splits these sentences only because they hold no punctuation: its
# default tokenisation (`13a`) also cuts a comma or a bracket off the
# word it follows, so "one thousand, one" is four words to it and three
# to `str.split()`, and on sentences with commas the counts would
# differ. It returns
# `(matches, total)`: `total` is the number of $n$-grams of the
# hypothesis, and `matches` counts those that occur in the reference,
# each distinct $n$-gram *at most as often as it occurs in the
# reference*. For "one hundred and one hundred and one" against "one
# hundred and one", "one" occurs three times but matches twice. The
# check compares the sums over a small corpus with `sacrebleu`'s own
# counts.

# %% tags=["solution", "hide-input"]
def clipped_counts(hypothesis, reference, n):
    ### BEGIN SOLUTION
    def ngrams(words):
        return collections.Counter(
            tuple(words[i : i + n]) for i in range(len(words) - n + 1)
        )

    hyp, ref = ngrams(hypothesis.split()), ngrams(reference.split())
    matches = sum(min(m, ref[gram]) for gram, m in hyp.items())
    return matches, sum(hyp.values())
    ### END SOLUTION


# %% tags=["check"]
from sacrebleu.metrics.helpers import extract_all_word_ngrams

stats = sacrebleu.corpus_bleu(HYPS, [REFS])
# every sacrebleu score counts its n-grams with extract_all_word_ngrams
with exercise("7.3", twins=[extract_all_word_ngrams]):
    for n in range(1, 5):
        counts = [clipped_counts(h, r, n)
                  for h, r in zip(HYPS, REFS, strict=True)]  # fmt: skip
        expect_equal(f"the {n}-gram totals", sum(t for _, t in counts),
                     stats.totals[n - 1],
                     hint="a sentence of L words has L - n + 1 n-grams, "
                     "or none if it is shorter than n")  # fmt: skip
        expect_equal(f"the {n}-gram matches", sum(m for m, _ in counts),
                     stats.counts[n - 1],
                     hint="clip: an n-gram matches at most as often as it "
                     "occurs in the reference")  # fmt: skip

# %% [markdown]
# ### Exercise 7.4: BLEU (2 points)
#
# Write `corpus_bleu(hypotheses, references)`, BLEU from 0 to 100, with
# your `clipped_counts`. For $n = 1, \dots, 4$ the precision $p_n$ is
# the sum of the matches over the whole corpus divided by the sum of
# the totals; with $c$ and $r$ the total numbers of words of the
# hypotheses and of the references (split at spaces, as in exercise
# 7.3, which agrees with `sacrebleu` only on sentences without
# punctuation, such as these),
# $\mathrm{BLEU} = 100 \cdot BP \cdot
# \exp\big(\frac14 \sum_n \log p_n\big)$,
# $BP = \min(1, e^{1 - r/c})$. You may assume every $p_n > 0$.

# %% tags=["solution", "hide-input"]
def corpus_bleu(hypotheses, references):
    ### BEGIN SOLUTION
    pairs = list(zip(hypotheses, references, strict=True))
    log_p = 0.0
    for n in range(1, 5):
        counts = [clipped_counts(h, r, n) for h, r in pairs]
        matches = sum(m for m, _ in counts)
        total = sum(t for _, t in counts)
        log_p += math.log(matches / total) / 4
    c = sum(len(h.split()) for h in hypotheses)
    r = sum(len(ref.split()) for ref in references)
    brevity = min(1.0, math.exp(1 - r / c))
    return 100 * brevity * math.exp(log_p)
    ### END SOLUTION


# %% tags=["check"]
from sacrebleu.metrics.bleu import BLEUScore

from transformer_lite.tasks.metrics import bleu

want = bleu(HYPS, REFS)
# every sacrebleu BLEU, from text or from counts, ends in a BLEUScore
with exercise("7.4", after=["7.3"], twins=[
        bleu, extract_all_word_ngrams, BLEUScore.__init__]):
    expect_close("corpus_bleu(HYPS, REFS)",
                 torch.tensor(float(corpus_bleu(HYPS, REFS))),
                 torch.tensor(want),
                 hint="sum matches and totals over all sentences before "
                 "dividing (not a mean of sentence scores), and take the "
                 "geometric mean of p_1 to p_4")  # fmt: skip

# %% tags=["check"]
want = bleu(SHORT, REFS)
with exercise("7.4", after=["7.3"], twins=[
        bleu, extract_all_word_ngrams, BLEUScore.__init__]):
    expect_close("corpus_bleu(SHORT, REFS)",
                 torch.tensor(float(corpus_bleu(SHORT, REFS))),
                 torch.tensor(want),
                 hint="outputs shorter than the references pay the "
                 "brevity penalty exp(1 - r / c), with the corpus totals "
                 "c and r")  # fmt: skip

# %% [markdown]
# ### Exercise 7.5: one step of beam search (2 points)
#
# Write `beam_step(log_p, length, finished, step_log_p, k, alpha)` for
# one source and its $k$ hypotheses: `log_p` $(k,)$ their
# log-probabilities so far, `length` $(k,)$ their lengths (tokens after
# BOS, as floats), `finished` $(k,)$ bool, and `step_log_p` $(k, V)$ the
# log-probabilities of every next token. An unfinished hypothesis $r$
# extended by token $v$ is a candidate with log-probability
# `log_p[r] + step_log_p[r, v]` and length `length[r] + 1`. A finished
# hypothesis has a single candidate, extended by `PAD_ID`, with its
# log-probability and length unchanged. Rank all candidates by
# $\log P / lp$, with `gnmt_length_penalty(length, alpha)` as $lp$, and
# keep the $k$ best, best first. Return the kept candidates'
# `(rows, tokens, log_p, length, finished)`, each $(k,)$: the
# hypotheses they extend, their last tokens, their log-probabilities
# and lengths, and whether they are finished (already, or now by
# `EOS_ID`).

# %% tags=["solution", "hide-input"]
def beam_step(log_p, length, finished, step_log_p, k, alpha):
    ### BEGIN SOLUTION
    V = step_log_p.size(-1)
    step = step_log_p.masked_fill(finished.unsqueeze(1), -torch.inf)
    step[finished, PAD_ID] = 0.0  # (k, V): PAD, for free, if finished
    candidate = log_p.unsqueeze(1) + step  # (k, V)
    grown = length + (~finished).to(length.dtype)  # (k,)
    lp = gnmt_length_penalty(grown, alpha).unsqueeze(1)  # (k, 1)
    best = (candidate / lp).flatten().topk(k).indices  # (k,)
    rows, tokens = best // V, best % V
    done = finished[rows] | (tokens == EOS_ID)
    return rows, tokens, candidate[rows, tokens], grown[rows], done
    ### END SOLUTION


# %% tags=["check"]
def best_candidates(log_p, length, finished, step_log_p, k, alpha):
    """The k best candidates by the definition, one at a time:
    (score, row, token, log_p, length, finished), best first."""
    found = []
    for r, (lp_r, len_r) in enumerate(zip(log_p.tolist(), length.tolist(),
                                          strict=True)):  # fmt: skip
        if finished[r]:
            penalty = float(gnmt_length_penalty(torch.tensor(len_r), alpha))
            found.append((lp_r / penalty, r, PAD_ID, lp_r, len_r, True))
            continue
        penalty = float(gnmt_length_penalty(torch.tensor(len_r + 1), alpha))
        for v, s in enumerate(step_log_p[r].tolist()):
            found.append(((lp_r + s) / penalty, r, v, lp_r + s, len_r + 1,
                          v == EOS_ID))  # fmt: skip
    return sorted(found, reverse=True)[:k]


def expect_step(name, args, hint):
    """beam_step(*args) keeps what best_candidates(*args) finds."""
    got = beam_step(*args)
    want = best_candidates(*args)
    for i, part in enumerate(("rows", "tokens")):
        expect_equal(f"{name}: {part}", [int(x) for x in got[i]],
                     [c[i + 1] for c in want], hint=hint)  # fmt: skip
    for i, part in enumerate(("log_p", "length"), start=2):
        expect_close(f"{name}: {part}", got[i].double(),
                     torch.tensor([c[i + 1] for c in want],
                                  dtype=torch.float64),
                     hint=hint)  # fmt: skip
    expect_equal(f"{name}: finished", [bool(x) for x in got[4]],
                 [c[5] for c in want], hint=hint)  # fmt: skip


gen = torch.Generator().manual_seed(75)
step_log_p = torch.randn(3, V, generator=gen, dtype=torch.float64)
step_log_p = step_log_p.log_softmax(dim=-1)  # (k, V)
start = (torch.tensor([-0.4, -1.1, -1.5], dtype=torch.float64),
         torch.full((3,), 2.0, dtype=torch.float64),
         torch.zeros(3, dtype=torch.bool))  # fmt: skip
with exercise("7.5"):
    expect_step("beam_step, nothing finished",
                (*start, step_log_p, 3, 0.6),
                hint="rank all k * V candidates together (flatten them); "
                "the flat index i is row i // V and token i % "
                "V")  # fmt: skip

# %% tags=["check"]
late = (torch.tensor([-1.0, -1.5, -1.1], dtype=torch.float64),
        torch.tensor([4.0, 2.0, 4.0], dtype=torch.float64),
        torch.tensor([False, True, False]))  # fmt: skip
with exercise("7.5"):
    expect_step("beam_step, one finished", (*late, step_log_p, 3, 1.0),
                hint="a finished hypothesis has one candidate, PAD_ID at "
                "no cost, and its length does not grow; score every "
                "candidate by log_p / lp(its length)")  # fmt: skip

# %% [markdown]
# ### Exercise 7.6: beam search (2 points)
#
# Write `beam_decode(model, src, k, max_len, alpha)` for one source
# `src` of shape $(1, S)$, with your `beam_step`. Encode the source once
# (`src_mask = (src != PAD_ID).unsqueeze(1)`, $(1, 1, S)$) and give the
# memory and the mask to the $k$ hypotheses (`expand(k, -1, -1)`). The
# outputs `ys` $(k, 1)$ start as `BOS_ID`; only hypothesis 0 is alive
# at first (log-probability 0, the others $-\infty$, so that $k$ copies
# of BOS do not fill the beam), all of length 0 and unfinished. Each
# step computes `model.generator(model.decode(memory, src_mask,
# ys)[:, -1]).log_softmax(-1)`, calls `beam_step`, and sets `ys` to
# `ys[rows]` with `tokens` appended. Stop when every hypothesis has
# finished or `ys` has `max_len` columns. Return `(ys_best, score)`:
# the hypothesis with the best $\log P / lp$, as $(1, L)$ without its
# trailing `PAD_ID`s, and that score (a 0-dim tensor).

# %% tags=["solution", "hide-input"]
def beam_decode(model, src, k, max_len, alpha):
    ### BEGIN SOLUTION
    src_mask = (src != PAD_ID).unsqueeze(1)  # (1, 1, S)
    with torch.no_grad():
        memory = model.encode(src, src_mask).expand(k, -1, -1)  # (k, S, C)
        src_mask = src_mask.expand(k, -1, -1)  # (k, 1, S)
        ys = torch.full((k, 1), BOS_ID)  # (k, 1)
        log_p = torch.full((k,), -torch.inf, dtype=torch.float64)
        log_p[0] = 0.0
        length = torch.zeros(k, dtype=torch.float64)
        finished = torch.zeros(k, dtype=torch.bool)
        while ys.size(1) < max_len and not finished.all():
            hidden = model.decode(memory, src_mask, ys)  # (k, L, C)
            step = model.generator(hidden[:, -1]).log_softmax(-1)  # (k, V)
            rows, tokens, log_p, length, finished = beam_step(
                log_p, length, finished, step, k, alpha)
            ys = torch.cat([ys[rows], tokens.unsqueeze(1)], dim=1)
    scores = log_p / gnmt_length_penalty(length, alpha)  # (k,)
    best = int(scores.argmax())
    keep = int((ys[best] != PAD_ID).nonzero().max()) + 1
    return ys[best, :keep].unsqueeze(0), scores[best]  # (1, L), ()
    ### END SOLUTION


# %% tags=["check", "points-2"]
from transformer_lite.decoding import _beam_search, beam_search

cases = [(i, k, alpha) for i in range(len(sources))
         for k, alpha in ((3, 0.6), (3, 0.0), (2, 2.0))]  # fmt: skip
wants = [beam_search(model, sources[i : i + 1], max_len=9, bos_id=BOS_ID,
                     eos_id=EOS_ID, beam_size=k, length_penalty=alpha,
                     return_scores=True)
         for i, k, alpha in cases]  # fmt: skip
with exercise("7.6", after=["7.5"], twins=[beam_search, _beam_search]):
    for (i, k, alpha), (want_ys, want_score) in zip(cases, wants,
                                                    strict=True):
        src = sources[i : i + 1]  # (1, S)
        got_ys, got_score = beam_decode(model, src, k, 9, alpha)
        name = f"beam_decode(model, sources[{i}:{i + 1}], {k}, 9, {alpha})"
        expect_equal(name, got_ys, want_ys,
                     hint="keep ys in step with the beam, ys = "
                     "cat(ys[rows], tokens), and cut the best output's "
                     "trailing padding")  # fmt: skip
        expect_close(f"the score of {name}", got_score.reshape(1),
                     want_score,
                     hint="the score is log P / lp(length), the length "
                     "counting the tokens after BOS")  # fmt: skip

# %% [markdown]
# ### Exercise 7.7: predict, then run (1 point)
#
# Decide before you run the cell below it. The chapter's corpus is split
# *by number*: a number is in training or in the test set, never both.
# Suppose instead that the 20,000 training numbers and the 1000 test
# numbers had been drawn independently, each by `number_splits`'s
# recipe (a count of digits from 1 to 6, then a number of that length;
# distinct numbers within each set). What share of the test numbers
# would also be training numbers? Set `prediction` to one of the
# strings `"none"`, `"about 5%"`, `"about 20%"` or `"about half"`; then
# run the experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "about half"
### END SOLUTION

# %% [markdown]
# The experiment: two independent draws, seeded, and the test numbers
# that training saw, counted by their number of digits.

# %%
from transformer_lite.tasks.numbers import number_splits

train_drawn = set(number_splits(20_000, 1, 1, seed=0)["train"])
test_drawn = number_splits(1, 1, 1000, seed=1)["test"]
seen = [n for n in test_drawn if n in train_drawn]
share_seen = len(seen) / len(test_drawn)
print(f"{len(seen)} of {len(test_drawn)} test numbers were also drawn "
      f"for training ({share_seen:.0%})")
for d in range(1, 7):
    of_d = [n for n in test_drawn if len(str(n)) == d]
    print(f"  {d} digits: {sum(n in train_drawn for n in of_d):3d} of "
          f"{len(of_d):3d} seen")

# %% tags=["check", "hide-input"]
choices = ("none", "about 5%", "about 20%", "about half")
with exercise("7.7", prediction=True):
    expect(prediction in choices,
           f"prediction is {prediction!r}: choose one of "
           + ", ".join(f'"{c}"' for c in choices))  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(0.35 < share_seen < 0.65 and prediction == "about half",
           f"{share_seen:.0%} of the test numbers had been drawn for "
           f"training, not {prediction!r}",
           hint="there are only 10 one-digit, 90 two-digit and 900 "
           "three-digit numbers, and each length gets a sixth of the "
           "20,000 draws (a repeat is drawn again): the short numbers "
           "are all drawn, and about half the four-digit ones; half the "
           "test set would then test memory, not translation")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 7.8: predict, then run (1 point)
#
# Decide before you run the cell below it. The reference is "four
# hundred and twenty-one thousand and ninety-seven", eight words. Two
# translations each get one of its words wrong: one says "ninety-eight"
# at the end, the other "twenty-two" in the middle. The package's
# `bleu` scores each against the reference. Set `prediction` to
# `"end"` if the one wrong at the end scores lower, `"middle"` if the
# one wrong in the middle does, or `"same"` if both get the same
# score; then run the experiment and the check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "middle"
### END SOLUTION

# %% [markdown]
# The experiment: BLEU of each translation alone, and its 4-gram
# matches.

# %%
from transformer_lite.tasks.metrics import bleu

reference = "four hundred and twenty-one thousand and ninety-seven"
wrong = {"end": "four hundred and twenty-one thousand and ninety-eight",
         "middle": "four hundred and twenty-two thousand and "
         "ninety-seven"}  # fmt: skip
one_wrong = {where: bleu([text], [reference])
             for where, text in wrong.items()}  # fmt: skip
for where, text in wrong.items():
    stats = sacrebleu.corpus_bleu([text], [[reference]])
    print(f"wrong at the {where:6s}: BLEU {one_wrong[where]:5.1f}, "
          f"4-grams matched {stats.counts[3]} of {stats.totals[3]}")

# %% tags=["check", "hide-input"]
with exercise("7.8", prediction=True):
    expect(prediction in ("end", "middle", "same"),
           f"prediction is {prediction!r}: choose one of \"end\", "
           f"\"middle\" or \"same\"")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    lower = min(one_wrong, key=one_wrong.get)
    expect(one_wrong["middle"] < one_wrong["end"] - 10
           and prediction == "middle",
           f"BLEU was {one_wrong['end']:.1f} wrong at the end and "
           f"{one_wrong['middle']:.1f} in the middle: the {lower} one "
           f"scored lower, not {prediction!r}",
           hint="BLEU counts n-grams up to 4: a wrong word breaks every "
           "n-gram that covers it, four 4-grams in the middle of a "
           "sentence but one at its end, so the same mistake costs "
           "about half the score in the middle")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 7.9: alignment in French (2 points, written)
#
# Reading the German model's cross-attention, we saw it write "twenty"
# while looking at *undzwanzig* and then "one" at *ein*: the alignment
# crosses over. Imagine the same reading of a model trained on French,
# for *quatre-vingt-dix-sept* $\to$ "ninety-seven". In two to four
# sentences: where would you expect "ninety" and "seven" to look, would
# the map cross over, and why is such a map evidence of how the model
# translates but not proof?

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# French says the parts of 97 in the English order, the larger first
# ($4 \cdot 20 + 10 + 7$), so the map should run forward without
# crossing: "ninety" drawing on the pieces of *quatre-vingt* and *dix*
# together (one English word from two French parts, 80 + 10), "seven"
# on *sept* (or on *dix-sept*, if the tokenizer keeps it whole). It is
# only evidence: a weight says where a head reads in one layer, but the
# encoder's self-attention has already mixed the pieces of the word
# into each other, so the vector at *sept* may carry *dix* too, and
# other heads, layers and the residual path carry information as well.
#
# *Rubric (2 points).* 1 point: the French map is monotone (no
# crossing), with "ninety" attending to the *quatre-vingt* / *dix*
# pieces, several French pieces for one English word, and "seven" to
# *sept*. 1 point: a map is not proof because the encoder's
# self-attention mixes the positions before cross-attention reads them
# (or: other heads, layers and the residual stream also carry what is
# used; a weight is where it reads, not what it uses).
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 3
# message: Hint: clip: an n-gram matches at most as often as it occurs
# def clipped_counts(hypothesis, reference, n):
#     hyp, ref = hypothesis.split(), reference.split()
#     grams = [tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1)]
#     seen = {tuple(ref[i : i + n]) for i in range(len(ref) - n + 1)}
#     return sum(gram in seen for gram in grams), len(grams)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def german(n):
#     from num2words import num2words
#     return num2words(n, lang="de")

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def german(n):
#     return ONES_DE[n % 20]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def pair_counts(words):
#     counts = collections.Counter()
#     for word, m in words.items():
#         for pair in zip(word[:-1], word[1:], strict=True):
#             counts[pair] += m
#     return counts
#
#
# def merge_pair(words, pair):
#     merged = collections.Counter()
#     for word, m in words.items():
#         symbols, i = [], 0
#         while i < len(word):
#             if word[i : i + 2] == pair:
#                 symbols.append(word[i] + word[i + 1])
#                 i += 2
#             else:
#                 symbols.append(word[i])
#                 i += 1
#         merged[tuple(symbols)] += m
#     return merged
#
#
# def learn_merges(words, n):
#     from transformer_lite.tasks.tokenizer import SubwordTokenizer
#     characters = {c for word in words for c in word}
#     texts = ["".join(word).lstrip("▁") for word, m in words.items()
#              for _ in range(m)]
#     tokenizer = SubwordTokenizer.train(texts, 4 + len(characters) + n)
#     merges = json.loads(tokenizer.to_json())["model"]["merges"]
#     return [tuple(m.split(" ") if isinstance(m, str) else m)
#             for m in merges]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def pair_counts(words):
#     return collections.Counter()
#
#
# def merge_pair(words, pair):
#     return words
#
#
# def learn_merges(words, n):
#     return []

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def clipped_counts(hypothesis, reference, n):
#     stats = sacrebleu.sentence_bleu(hypothesis, [reference])
#     return stats.counts[n - 1], stats.totals[n - 1]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def clipped_counts(hypothesis, reference, n):
#     return 0, 0

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: delegate
# def corpus_bleu(hypotheses, references):
#     from transformer_lite.tasks.metrics import bleu
#     return bleu(hypotheses, references)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def corpus_bleu(hypotheses, references):
#     return 100.0

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def beam_step(log_p, length, finished, step_log_p, k, alpha):
#     rows = torch.arange(k)
#     tokens = torch.full((k,), EOS_ID)
#     return rows, tokens, log_p, length, torch.ones(k, dtype=torch.bool)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: delegate
# def beam_decode(model, src, k, max_len, alpha):
#     from transformer_lite.decoding import beam_search
#     ys, scores = beam_search(model, src, max_len=max_len, bos_id=BOS_ID,
#                              eos_id=EOS_ID, beam_size=k,
#                              length_penalty=alpha, return_scores=True)
#     return ys, scores[0]

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 6
# kind: trivial
# def beam_decode(model, src, k, max_len, alpha):
#     return torch.full((1, 1), BOS_ID), torch.zeros((), dtype=torch.float64)
