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
# # 14. Tables and time series
#
# Medicine and finance keep much of their data in two shapes that are
# not text: **tables**, a row of measured features per patient, and
# **time series**, one value (or a few) per day, month or quarter. This
# chapter asks what it takes to point the Transformer of
# {cite:t}`vaswani2017attention` at them, and whether it is worth it.
#
# The encoder stays chapter 5's, layer for layer. What changes is
# everything around it: how an input becomes tokens, what a position
# means, which mask applies, what the head reads and which loss trains
# it. For tables we build the **FT-Transformer**
# {cite:p}`gorishniy2021revisiting`, which makes every feature a token;
# for series, a forecaster in the style of **PatchTST**
# {cite:p}`nie2023time`, which makes every stretch of a few time steps a
# token, on windows normalised by **RevIN** {cite:p}`kim2022reversible`.
#
# Then we measure them against what a practitioner would use first:
# logistic regression and gradient-boosted trees for the table; the
# last value, the last season and a linear model (DLinear,
# {cite:t}`zeng2023transformers`) for the series. On the table the
# Transformer does not beat the linear model; on a synthetic series it
# beats the naive forecasts and, by a tenth, the linear one; on real
# growth rates the two are close and nobody forecasts well. The
# chapter also shows how a forecasting experiment flatters a model when
# the future leaks into training.
#
# This chapter teaches the package's `transformer_lite/domains/` tier
# (`tabular.py`, `series.py`, `baselines.py`, `splits.py`) and the data
# in `transformer_lite/tasks/tables.py` and `tasks/series_data.py`.
# Shapes keep the book's legend; a table adds F for its features, a
# series H for the horizon forecast (heads are not counted here), and P
# and S for a patch's length and stride.

# %% tags=["remove-input"]
from transformer_lite.classroom import chapter_card

chapter_card(14)

# %%
import inspect
import platform
import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import sklearn
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

import transformer_lite
from transformer_lite import default_device, seed_everything
from transformer_lite.device import book_seed
from transformer_lite.domains import (
    DLinear,
    FeatureTokenizer,
    FTTransformer,
    LastValue,
    PastScaler,
    PatchForecaster,
    RevIN,
    SeasonalLastValue,
    make_windows,
    walk_forward,
)
from transformer_lite.tasks.series_data import macro_series, synthetic_series
from transformer_lite.tasks.tables import breast_cancer, kfold, standardise

device = default_device()
SEED = book_seed()  # BOOK_SEED from the environment; the book uses 0
seed_everything(SEED)
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"scikit-learn {sklearn.__version__}")
print(f"transformer_lite {transformer_lite.__version__}, device: {device}")
print(f"BOOK_SEED={SEED}")


def show(*objects) -> None:
    """Print the source code of package classes, methods or functions."""
    for obj in objects:
        print(textwrap.dedent(inspect.getsource(obj)))


# %% [markdown]
# Every model of this chapter is small; a CPU trains them fastest on
# one thread, and all of them run on the CPU.

# %%
threads_available = torch.get_num_threads()
torch.set_num_threads(1)
print(f"threads: {torch.get_num_threads()} of {threads_available}")
chapter_start = time.perf_counter()

# %% [markdown]
# ## What changes from one kind of data to the next
#
# Attention reads a set of vectors. Text, images, tables and series
# differ in how they become that set, and in what is asked of the
# output. Chapters 5 to 11 filled the first two columns of this table;
# this chapter fills the last two.
#
# ```{list-table} What to customise for each kind of data
# :header-rows: 1
# :stub-columns: 1
#
# * -
#   - text
#   - images
#   - tables
#   - time series
# * - input to tokens
#   - a token id looked up in an embedding table
#   - a $P \times P$ patch times one matrix
#   - each numeric feature $x_j$ times its own vector, $x_j w_j + b_j$; each
#     category looked up
#   - a patch of $P$ consecutive values times one matrix
# * - positions
#   - sine or learned, by place in the sentence
#   - learned, by row and column
#   - none: the features are a set, and each token's own $w_j, b_j$ say which
#     feature it is
#   - learned, by patch
# * - mask
#   - padding; causal in a decoder
#   - none (or windows)
#   - none
#   - none, or causal over patches
# * - head
#   - a distribution over the vocabulary
#   - the class token's output to class scores
#   - the [CLS] token's output to a logit or a value
#   - every patch's output, flattened, to the H future values
# * - loss
#   - cross-entropy of the next or the masked token
#   - cross-entropy of the label
#   - binary cross-entropy, or squared error for regression
#   - squared error, in the window's normalised units
# * - pretraining objective
#   - the next token; masked tokens
#   - masked patches; image-text pairs
#   - masked or corrupted feature values
#   - masked patches, forecast ahead
# * - normalisation of the input
#   - none
#   - pixel scale
#   - each feature by the training rows' mean and spread
#   - each window by its own mean and spread (RevIN)
# ```
#
# Two columns need one more word. A table's features have no order: the
# 13th column is not "after" the 12th the way a word follows a word.
# The FT-Transformer therefore adds no position at all; a feature's
# identity lives in its own embedding weights. A series has order, and
# more: the future must not be used to predict the past. That rule
# reaches beyond the mask, into how the data are split and scaled, and
# the chapter's second half spends most of its care there.

# %% [markdown]
# ## Tables: breast cancer
#
# scikit-learn ships the Wisconsin diagnostic breast cancer table: 569
# tumours, each described by 30 measurements of the cell nuclei in an
# image of a fine-needle biopsy (radius, texture, smoothness and so on,
# each as a mean, a spread and a worst value), and a diagnosis, benign
# or malignant (the target is 1 for benign, 0 for malignant, as
# scikit-learn codes it). The rows are anonymous measurements of tissue, not of
# people: there is nothing here that could identify a patient.

# %%
table = breast_cancer()
print(f"{len(table)} rows, {table.numeric.shape[1]} numeric features, "
      f"{table.categorical.shape[1]} categorical; task: {table.task}")
print(f"target 1 ({table.target_names[1]}): "
      f"{int(table.target.sum())} rows; 0 ({table.target_names[0]}): "
      f"{int((table.target == 0).sum())}")
print("first features:", ", ".join(table.numeric_names[:4]), "...")

# %% tags=["remove-cell"]
assert len(table) == 569 and table.numeric.shape[1] == 30
assert table.categorical.shape[1] == 0
assert int(table.target.sum()) == 357
assert table.target_names == ("malignant", "benign")

# %% [markdown]
# ### Every feature a token
#
# The FT-Transformer's **feature tokenizer** gives numeric feature $j$
# its own vector $w_j$ and bias $b_j$, both of width C, and turns the
# value $x_j$ into the token $T_j = x_j w_j + b_j$. A categorical
# feature looks its value up in an embedding table, as a word would. A
# learned [CLS] token joins them, last, and its output alone feeds the
# head, as the ViT's class token did in chapter 11. A row of F features
# becomes $F + 1$ tokens; the encoder attends between features.

# %%
show(FeatureTokenizer.forward, FTTransformer.forward)

# %% [markdown]
# Because nothing marks a token's place, reordering the features
# reorders the tokens and nothing else: the [CLS] token's output, and
# so the prediction, cannot tell. The package's tests check this; here
# it is once more, on a fresh model whose per-feature weights are
# permuted along with the features.

# %%
with torch.random.fork_rng():  # leaves the book's random state alone
    ft_check = FTTransformer(30, (), d_model=16, n_heads=2, n_layers=1,
                             d_ff=32, dropout=0.0).double().eval()
rows = table.numeric[:5].double()
order = torch.randperm(30, generator=torch.Generator().manual_seed(SEED))
with torch.no_grad():
    before = ft_check(rows)
    ft_check.tokenizer.weight.copy_(ft_check.tokenizer.weight[order])
    ft_check.tokenizer.bias.copy_(ft_check.tokenizer.bias[order])
    after = ft_check(rows[:, order])
print(f"largest change after permuting the features: "
      f"{(before - after).abs().max():.1e}")

# %% tags=["remove-cell"]
torch.testing.assert_close(before, after, rtol=1e-12, atol=1e-12)

# %% [markdown]
# ### Three models, five folds
#
# A fair comparison trains every model on the same rows and tests it on
# the same held-out rows. We cut the table into five **stratified
# folds** (each with the table's share of malignant tumours); each model
# is trained five times, on four folds, and tested on the fifth. The
# features are standardised with the mean and spread of the training
# folds only.
#
# - **Logistic regression**: a weighted sum of the 30 standardised
#   features through a sigmoid; scikit-learn's defaults.
# - **Gradient-boosted trees**: scikit-learn's
#   `HistGradientBoostingClassifier` with its defaults, the model that
#   wins most tabular benchmarks {cite:p}`grinsztajn2022why`. Trees do
#   not care about scale, so it reads the raw values.
# - **The FT-Transformer**: C = 32, 4 heads, 2 pre-LN layers, a
#   feed-forward width of 64 and dropout 0.1 (the paper's default is
#   C = 192 and 3 layers: this table has 455 training rows), one logit,
#   trained with AdamW for 20 epochs of batches of 64.
#
# The FT-Transformer's training loop is short enough to write out: it
# is chapter 6's step (clear the gradients, compute the loss, go back,
# step the optimiser), with the binary cross-entropy of one logit as the
# loss.
#
# We score each model by **accuracy** and by two measures of its
# probabilities: the **log-loss** $-\frac1n \sum_i [y_i \log p_i +
# (1 - y_i) \log (1 - p_i)]$ and the **Brier score**
# $\frac1n \sum_i (p_i - y_i)^2$. Both are *proper*: a model scores
# best on them by reporting the probabilities it believes, so they
# reward probabilities a clinician could act on, not only the right
# side of 0.5.

# %%
FT_EPOCHS = 20


def probability_scores(p: np.ndarray, y: np.ndarray) -> dict:
    """Accuracy, log-loss and Brier score of probabilities p for 0/1
    labels y."""
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return {"accuracy": float(((p > 0.5) == y).mean()),
            "log-loss": float(-(y * np.log(p)
                                + (1 - y) * np.log(1 - p)).mean()),
            "Brier": float(((p - y) ** 2).mean())}


def train_ft(x: torch.Tensor, y: torch.Tensor, seed: int) -> FTTransformer:
    seed_everything(seed)
    model = FTTransformer(30, (), d_model=32, n_heads=4, n_layers=2,
                          d_ff=64, dropout=0.1, n_outputs=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3,
                                  weight_decay=1e-5)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(FT_EPOCHS):
        for rows in torch.randperm(len(y), generator=g).split(64):
            optimizer.zero_grad()
            logit = model(x[rows])[:, 0]  # (B,)
            loss = F.binary_cross_entropy_with_logits(logit, y[rows].float())
            loss.backward()
            optimizer.step()
    return model.eval()


def ft_probabilities(model: FTTransformer, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return torch.sigmoid(model(x)[:, 0]).double().numpy()


folds = kfold(len(table), 5, seed=SEED, labels=table.target)
X = table.numeric.double().numpy()
Y = table.target.numpy()
scores, seconds = [], {}
for k, fold in enumerate(folds):
    train, test = fold.train.numpy(), fold.test.numpy()
    scaled, scaler = standardise(table, fold.train)  # training rows' scale
    Z = scaled.numeric.double().numpy()

    tic = time.perf_counter()
    logistic = LogisticRegression(max_iter=2000).fit(Z[train], Y[train])
    p_lr = logistic.predict_proba(Z[test])[:, 1]
    seconds["logistic regression"] = (seconds.get("logistic regression", 0)
                                      + time.perf_counter() - tic)
    tic = time.perf_counter()
    trees = HistGradientBoostingClassifier(random_state=SEED)
    p_gb = trees.fit(X[train], Y[train]).predict_proba(X[test])[:, 1]
    seconds["gradient boosting"] = (seconds.get("gradient boosting", 0)
                                    + time.perf_counter() - tic)
    tic = time.perf_counter()
    ft = train_ft(scaled.numeric[fold.train], table.target[fold.train],
                  SEED + k)
    p_ft = ft_probabilities(ft, scaled.numeric[fold.test])
    seconds["FT-Transformer"] = (seconds.get("FT-Transformer", 0)
                                 + time.perf_counter() - tic)
    for name, p in [("logistic regression", p_lr),
                    ("gradient boosting", p_gb), ("FT-Transformer", p_ft)]:
        scores.append({"model": name, "fold": k,
                       **probability_scores(p, Y[test])})

scores = pd.DataFrame(scores)
table_results = scores.groupby("model", sort=False)[
    ["accuracy", "log-loss", "Brier"]].agg(["mean", "std"])
table_results[("seconds", "")] = pd.Series(seconds)
mean = scores.groupby("model", sort=False).mean()

# %%
# NBVAL_IGNORE_OUTPUT
table_results.round(4)

# %% tags=["remove-cell"]
n_ft = sum(p.numel() for p in ft.parameters())
assert 15_000 < n_ft < 25_000, n_ft  # "about twenty thousand"
# Floors from the sweep (notebooks/sweeps/14.json, 16 runs: BOOK_SEED
# 0-2 under AVX-512, AVX2 and SSE kernels at one thread and AVX-512 at
# two, 3-4 under AVX-512 and AVX2),
# less about half a point. Accuracy: logistic 0.975-0.979, trees
# 0.958-0.968, FT 0.965-0.977, FT at most 1.3 points from logistic.
# Log-loss: logistic 0.075-0.082 < FT 0.085-0.118 < trees 0.101-0.141
# in every run. Brier: FT minus logistic -0.0011 to +0.0071 (the FT
# lower at BOOK_SEED 2), so only their closeness is asserted.
_acc, _ll, _brier = mean["accuracy"], mean["log-loss"], mean["Brier"]
assert _acc["logistic regression"] >= 0.97, mean
assert _acc["gradient boosting"] >= 0.95, mean
assert _acc["FT-Transformer"] >= 0.955, mean
assert abs(_acc["FT-Transformer"] - _acc["logistic regression"]) < 0.02
assert _ll["FT-Transformer"] > _ll["logistic regression"], mean
assert _ll["gradient boosting"] > _ll["FT-Transformer"], mean
assert abs(_brier["FT-Transformer"] - _brier["logistic regression"]) < 0.01

# %% [markdown]
# The three are close on accuracy: over the sweep's runs (three seeds,
# three kinds of CPU kernels, one and two threads) the FT-Transformer
# reached 96.5% to 97.7% and logistic regression 97.5% to 97.9%, never
# more than 1.3 points apart; the trees 95.8% to 96.8%. On the
# log-loss the order held in every run: **logistic regression (0.075
# to 0.082) beats the FT-Transformer (0.085 to 0.118)**, which beats
# the trees (0.101 to 0.141). The Brier scores of the first two are
# within 0.01 of each other, and which is lower depends on the seed.
# The Transformer also takes far longer to train (the last column).
#
# That is the honest result, and it is the expected one. The benign and
# malignant tumours of this table are nearly separated by a plane in
# the 30 standardised measurements, so the linear model already has
# the right shape, with 31 weights fitted to about 455 rows. The
# FT-Transformer's twenty thousand or so weights buy flexibility this
# table does not need. {cite:t}`grinsztajn2022why` found, over 45
# medium-sized tables, that tree ensembles still beat deep models,
# Transformers included, and {cite:t}`gorishniy2021revisiting`, who
# introduced the FT-Transformer, found no model that won everywhere. A
# practitioner facing a new table should fit the linear model and the
# trees first; a Transformer earns its place with more rows, with many
# categorical features, or when pretraining on related tables is
# possible.

# %% [markdown]
# ### What the [CLS] token attends to
#
# A trained FT-Transformer can tell us where its [CLS] token looks:
# its row of each layer's attention weights, a distribution over the 31
# tokens. `cls_attention` keeps them in one pass, as the charts of
# chapter 3 did. Beside it we put two measures of what the models
# *use*: the size of logistic regression's standardised weights, and
# **permutation importance**, how much a model's log-loss on the test
# fold grows when one feature's values are shuffled between rows. We
# take the last fold's models.

# %%
test_rows = scaled.numeric[fold.test]
attention = ft.cls_attention(test_rows)  # (layers, B, H, F + 1)
to_features = attention.mean(dim=(0, 1, 2))[:30].double().numpy()  # (F,)


def permutation_gain(predict, Zt: np.ndarray, yt: np.ndarray,
                     repeats: int = 5) -> np.ndarray:
    """How much the log-loss grows, on average over ``repeats``
    shuffles, when one feature's column is shuffled between rows."""
    rng = np.random.default_rng(SEED)
    base = probability_scores(predict(Zt), yt)["log-loss"]
    gain = np.zeros(Zt.shape[1])
    for j in range(Zt.shape[1]):
        for _ in range(repeats):
            shuffled = Zt.copy()
            shuffled[:, j] = rng.permutation(shuffled[:, j])
            worse = probability_scores(predict(shuffled), yt)["log-loss"]
            gain[j] += (worse - base) / repeats
    return gain  # (F,)


Zt, yt = Z[test], Y[test]
gain_lr = permutation_gain(lambda z: logistic.predict_proba(z)[:, 1], Zt, yt)
gain_ft = permutation_gain(
    lambda z: ft_probabilities(ft, torch.as_tensor(z, dtype=torch.float32)),
    Zt, yt)
weights_lr = np.abs(logistic.coef_[0])  # (F,)
rho = {name: spearmanr(to_features, other).statistic
       for name, other in [("FT permutation", gain_ft),
                           ("logistic permutation", gain_lr),
                           ("logistic |weight|", weights_lr)]}
rho["FT vs logistic permutation"] = spearmanr(gain_ft, gain_lr).statistic
print("rank correlation of the [CLS] attention with:")
for name, value in rho.items():
    print(f"  {name:28s} {value:+.2f}")

# %%
order = np.argsort(-gain_ft)[:12]  # the FT's twelve most used features
names = [table.numeric_names[j] for j in order]
fig, axes = plt.subplots(1, 3, figsize=(10, 4), sharey=True)
for ax, values, title in [
        (axes[0], to_features[order], "[CLS] attention (mean)"),
        (axes[1], gain_ft[order], "FT permutation gain"),
        (axes[2], gain_lr[order], "logistic permutation gain")]:
    ax.barh(range(12), values, color="tab:blue")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("weight" if ax is axes[0] else "log-loss increase")
axes[0].set_yticks(range(12), names, fontsize=8)
axes[0].invert_yaxis()
fig.suptitle("Breast cancer, last fold: where the [CLS] token looks, "
             "and what the models use")
fig.tight_layout()
plt.show()

# %% tags=["remove-cell"]
torch.testing.assert_close(attention.sum(-1),
                           torch.ones_like(attention.sum(-1)))
# Floors from the sweep (notebooks/sweeps/14.json, 16 runs): attention
# against the FT's permutation gains 0.04-0.48, the two models'
# permutation gains against each other 0.54-0.76.
assert rho["FT permutation"] < 0.55, rho
assert rho["FT vs logistic permutation"] > 0.45, rho
assert rho["FT vs logistic permutation"] > rho["FT permutation"], rho

# %% [markdown]
# Attention is not importance. The [CLS] token's weights are spread
# over many features, and their ranking hardly agrees with how much the
# model's own log-loss suffers when a feature is shuffled: over the
# sweep's runs the rank correlation between the two lay between
# 0.04 and 0.48. The two models' permutation importances agree with
# each other better (0.54 to 0.76, and more than the attention in every
# run): what a
# model's output depends on is a property of the data as much as of
# the model, and two very different models find much of the same
# thing. An attention map shows where information flows inside a
# layer, not what the prediction depends on; to audit a model, measure
# what its output depends on.

# %% [markdown]
# ## Time series: forecasting in walk-forward folds
#
# A forecaster reads a window of the last L values, $x_{t-L}, \dots,
# x_{t-1}$, and predicts the next H, $x_t, \dots, x_{t+H-1}$. Three
# rules keep the test honest, and the package's `splits.py` enforces
# each of them:
#
# 1. **Walk-forward folds.** The last part of the series is cut into
#    test spans in time order; fold k trains on everything before its
#    span, so the training window expands fold by fold
#    (`walk_forward`). No target of a test window, and no value after
#    it, is ever seen in training.
# 2. **Windows inside their span** (`make_windows`): a training window's
#    targets lie in the training span; its inputs may reach back, never
#    forward.
# 3. **Scales from the past** (`PastScaler`): the mean and spread that
#    standardise a fold are those of its training span.
#
# On top of those, each model's window is normalised by its own mean and
# spread (RevIN): a series whose level drifts, as prices and totals
# do, then shows every window at the same scale, and the forecast is
# mapped back by the same two numbers.

# %%
show(RevIN.normalise, RevIN.denormalise)

# %% [markdown]
# ### The patch forecaster
#
# PatchTST pads the normalised window's end with S copies of its last
# value, cuts it into patches of P values every S steps, embeds each
# patch with one matrix, adds a learned position per patch, runs
# chapter 5's encoder over the $N = \lfloor (L - P) / S \rfloor + 2$
# patch tokens, and maps all of their outputs, flattened,
# to the H forecasts with one linear layer. Each channel of a
# multivariate series is forecast on its own, by the same weights
# ("channel independence"). With `causal=True` a causal mask lets patch
# k attend to patches $0, \dots, k$ only.

# %%
show(PatchForecaster.forward)

# %% [markdown]
# The baselines are what a forecaster at a bank or a statistics office
# would try first. The **last value** repeats $x_{t-1}$ for every
# horizon; the **seasonal last value** repeats the values one season
# (p steps) earlier; the **window mean** forecasts the mean of the
# window; **DLinear** {cite:p}`zeng2023transformers` splits the window
# into a moving average and the rest and maps each to the horizon with
# one linear layer over time: $2 L H$ weights in all.
#
# Every trained forecaster is fitted with the same short loop (chapter
# 6's step, with the mean squared error in the scaler's units as the
# loss) and judged by the mean squared error of its forecasts in the
# series' own units, at each horizon step, over the test windows of
# every fold.

# %%
def fit_forecaster(model, x, y, *, epochs: int, seed: int,
                   batch: int = 32, lr: float = 1e-3):
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr,
                                  weight_decay=1e-4)
    model.train()
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=g).split(batch):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x[rows]), y[rows])
            loss.backward()
            optimizer.step()
    return model.eval()


class WindowMean(torch.nn.Module):
    """Every future value is the window's mean."""

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.horizon = horizon

    def forward(self, x):
        return x.mean(1, keepdim=True).expand(-1, self.horizon, -1)


def walk_forward_errors(series, L, H, n_folds, test_size, builders, *,
                        epochs, seed, leak=False):
    """Mean squared error at each horizon step (series units) of each
    model over the test windows of every fold; with ``leak``, the
    training windows are every window of the series but the test
    windows themselves, as a random split of the windows would have
    it."""
    errors, seconds = {}, {}
    for k, fold in enumerate(walk_forward(len(series), L, H, n_folds,
                                          test_size)):
        scaler = PastScaler(series, fold.train.stop)
        z = scaler.transform(series)
        x, y = make_windows(z, L, H, fold.train.start, fold.train.stop)
        if leak:  # every window whose origin is not a test origin
            x, y = make_windows(z, L, H, 0, len(series))
            origins = torch.arange(L, len(series) - H + 1)  # (n,)
            tested = ((origins >= fold.test.start)
                      & (origins <= fold.test.stop - H))
            x, y = x[~tested], y[~tested]
        x_test, y_test = make_windows(series, L, H, fold.test.start,
                                      fold.test.stop)
        for name, build in builders.items():
            tic = time.perf_counter()
            seed_everything(seed + k)
            model = build()
            if any(p.requires_grad for p in model.parameters()):
                fit_forecaster(model, x, y, epochs=epochs, seed=seed + k)
            with torch.no_grad():
                forecast = scaler.inverse(model(scaler.transform(x_test)))
            error = (forecast - y_test).pow(2).mean(dim=(0, 2))  # (H,)
            errors.setdefault(name, []).append(error)
            seconds[name] = (seconds.get(name, 0.0)
                             + time.perf_counter() - tic)
    return ({name: torch.stack(e).mean(0) for name, e in errors.items()},
            seconds)


def error_table(errors, seconds, steps):
    return pd.DataFrame(
        {**{f"h={h}": {n: float(e[h - 1]) for n, e in errors.items()}
            for h in steps},
         "mean": {n: float(e.mean()) for n, e in errors.items()},
         "seconds": seconds})


# %% [markdown]
# ### A series whose structure we know
#
# `synthetic_series` adds four parts we chose: a slow trend, a season of
# 12 steps, three regime jumps at random times, and noise of standard
# deviation 0.3. The noise cannot be forecast by anyone: its variance,
# 0.09, is the **noise floor** below which no model's mean squared error
# can go. The jumps cannot be foreseen either, but after one the level
# stays, and a good model follows it: the third jump falls early in the
# second test span.
#
# The series is drawn once, from a fixed seed (0), whatever the book's
# seed: the sweep varies the models' seeds and the machine, not the
# data, so that a comparison between models compares models. (A new
# draw moves the jumps, and a jump inside a test span raises every
# model's error.)

# %%
SERIES_SEED = 0
synthetic = synthetic_series(720, seed=SERIES_SEED, trend=0.004,
                             period=12, regimes=3, noise=0.3)
values = synthetic.values.float().unsqueeze(1)  # (720, 1)
noise_floor = 0.3**2
L_syn, H_syn = 48, 12

fig, ax = plt.subplots(figsize=(9, 2.8))
ax.plot(synthetic.values, lw=0.7, label="series")
ax.plot(synthetic.signal, lw=1.2, label="signal (no noise)")
for k, fold in enumerate(walk_forward(720, L_syn, H_syn, 3, 96)):
    ax.axvspan(fold.test.start, fold.test.stop, color="tab:red",
               alpha=0.08 + 0.04 * k)
ax.set_xlabel("time step")
ax.set_ylabel("value")
ax.set_title("The synthetic series: trend, season of 12, three jumps, "
             "noise; shaded: the three test spans")
ax.legend(loc="upper left", fontsize=8)
plt.show()

# %%
syn_builders = {
    "last value": lambda: LastValue(H_syn),
    "seasonal last value": lambda: SeasonalLastValue(H_syn, 12),
    "DLinear": lambda: DLinear(L_syn, H_syn, 1, kernel_size=13),
    "PatchTST": lambda: PatchForecaster(
        L_syn, H_syn, 1, patch_len=8, stride=4, d_model=32, n_heads=4,
        n_layers=2, d_ff=64, dropout=0.1),
}
syn_errors, syn_seconds = walk_forward_errors(
    values, L_syn, H_syn, 3, 96, syn_builders, epochs=30, seed=SEED)
syn_table = error_table(syn_errors, syn_seconds, (1, 4, 12))
syn_mean = syn_table["mean"]

# %%
# NBVAL_IGNORE_OUTPUT
syn_table.round(3)

# %% tags=["remove-cell"]
# The series and the baselines do not depend on the seed: the third
# jump lies in the second test span; the last value is worst near half
# a season ahead and equals the seasonal last value at h = 12.
_jumps = torch.nonzero(synthetic.regime.diff()).flatten() + 1
_spans = walk_forward(720, L_syn, H_syn, 3, 96)
assert _spans[1].test.start <= int(_jumps[-1]) < _spans[1].test.stop
assert int(syn_errors["last value"].argmax()) + 1 in (5, 6, 7), syn_table
torch.testing.assert_close(syn_errors["last value"][-1],
                           syn_errors["seasonal last value"][-1])
# Floors from the sweep (notebooks/sweeps/14.json, 16 runs): mean MSE
# PatchTST 0.146-0.148, DLinear 0.161-0.166, seasonal 0.268, last value
# 1.519; the lowest MSE at any horizon 0.128-0.143.
assert min(float(e.min()) for e in syn_errors.values()) > noise_floor, \
    syn_table
assert syn_mean["PatchTST"] < syn_mean["DLinear"], syn_table
assert syn_mean["DLinear"] < syn_mean["seasonal last value"], syn_table
assert syn_mean["seasonal last value"] < syn_mean["last value"], syn_table
assert syn_mean["PatchTST"] < 2 * noise_floor, syn_table

# %% [markdown]
# The last value is the worst forecast of a seasonal series, worst
# half a season ahead, where the season has turned around; at
# $h = 12$, a full season later, it is the seasonal last value itself
# (both copy the window's last value). The seasonal last value repeats
# last season's values and so pays the noise twice, once in the value
# it copies and once in the value it is judged against (about
# $2 \times 0.09$), plus the trend and the jump it cannot follow. Both
# learned models beat it on the mean over the twelve horizons, in
# every run of the sweep (PatchTST 0.146 to 0.148, DLinear 0.161 to
# 0.166, against 0.268), by averaging the noise over several seasons
# of the window; PatchTST was ahead of DLinear in every run, by about
# a tenth. No model reaches the noise floor: the lowest error at any
# horizon was 0.128 to 0.143, against 0.09.

# %% [markdown]
# ### A real series: US growth, quarter by quarter
#
# For finance we take a series from statsmodels' macroeconomic data
# (shipped with the package, 1959 to 2009): the United States' real
# gross domestic product, quarterly. We model its **growth rate**, the
# percentage change from one quarter to the next, not its level. The
# level trends upward for fifty years: a model fitted on the 1960s
# would be asked, in the 2000s, for values it never saw, and the
# last value would win by default while saying nothing about the
# economy. Growth rates have a stable mean and spread, are what an
# economist forecasts and what an investor's returns are made of, and
# make errors comparable across decades. The package's data function
# returns them directly.

# %%
gdp = macro_series(("realgdp",), torch.float32)
growth = gdp.values  # (202, 1): percent per quarter
print(f"{growth.shape[0]} quarters, {gdp.quarters[0]} to "
      f"{gdp.quarters[-1]}; transform: {gdp.transforms[0]}")
print(f"mean growth {float(growth.mean()):.2f}% per quarter, variance "
      f"{float(growth.var()):.2f}")
L_gdp, H_gdp = 16, 4


def gdp_patchtst(causal: bool = False):
    return lambda: PatchForecaster(
        L_gdp, H_gdp, 1, patch_len=4, stride=2, d_model=16, n_heads=2,
        n_layers=1, d_ff=32, dropout=0.2, causal=causal)


gdp_builders = {
    "last value": lambda: LastValue(H_gdp),
    "seasonal last value": lambda: SeasonalLastValue(H_gdp, 4),
    "window mean": lambda: WindowMean(H_gdp),
    "DLinear": lambda: DLinear(L_gdp, H_gdp, 1, kernel_size=5),
    "PatchTST": gdp_patchtst(),
    "PatchTST, causal": gdp_patchtst(causal=True),
}
gdp_errors, gdp_seconds = walk_forward_errors(
    growth, L_gdp, H_gdp, 4, 20, gdp_builders, epochs=60, seed=SEED)
gdp_table = error_table(gdp_errors, gdp_seconds, (1, 2, 4))
gdp_mean = gdp_table["mean"]

# %%
# NBVAL_IGNORE_OUTPUT
gdp_table.round(3)

# %% tags=["remove-cell"]
# The data do not depend on the seed: the test period's variance.
assert abs(float(growth[-80:].var()) - 0.41) < 0.01
assert abs(float(growth[:-80].var()) - 0.99) < 0.01
# Floors from the sweep (notebooks/sweeps/14.json, 16 runs): PatchTST
# 0.412-0.439, DLinear 0.006-0.037 from it, the causal variant 0.001-
# 0.024 from it; the baselines do not depend on the seed.
assert gdp_mean["seasonal last value"] == gdp_mean.max(), gdp_table
assert gdp_mean["window mean"] < gdp_mean["last value"], gdp_table
assert gdp_mean["PatchTST"] < gdp_mean["window mean"], gdp_table
assert abs(gdp_mean["PatchTST"] - 0.41) < 0.04, gdp_table
assert abs(gdp_mean["PatchTST"] - gdp_mean["DLinear"]) < 0.05, gdp_table
assert abs(gdp_mean["PatchTST, causal"]
           - gdp_mean["PatchTST"]) < 0.04, gdp_table

# %% [markdown]
# Growth is hard to forecast, and the table shows how hard. The test
# spans cover 1989 to 2009, years in which growth varied less than
# before: its variance over those 80 quarters is about 0.41, against
# about 0.99 over the quarters before them. A forecaster who knew the
# test period's mean in advance, which nobody does, would reach an
# error of about 0.41; PatchTST reached 0.41 to 0.44 over the sweep,
# about the same. The seasonal last value is the
# worst of all: the series is seasonally adjusted before publication,
# so last year's quarter says nothing about this year's. The window
# mean beats the last value on the mean over the four horizons: a
# quarter's surprise does not persist. PatchTST and DLinear land
# close together (within 0.04 of each other on the mean), which is
# the finding of {cite:t}`zeng2023transformers` in miniature: on
# series like this a linear map of the window forecasts about as well
# as a Transformer.
#
# The causal variant changes little (its mean error differs by at most
# 0.024): the head reads every patch's output either way, and the
# non-causal encoder's extra freedom, earlier patches seeing later
# ones, is not what a forecast of four quarters needs.

# %% [markdown]
# ### Error by horizon

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for ax, errors, title, unit in [
        (axes[0], syn_errors, "synthetic series", "time steps"),
        (axes[1], gdp_errors, "US real GDP growth", "quarters")]:
    for name, e in errors.items():
        ax.plot(range(1, len(e) + 1), e.numpy(), marker="o", ms=3,
                label=name)
    ax.set_xlabel(f"horizon h ({unit} ahead)")
    ax.set_ylabel("mean squared error")
    ax.set_title(title)
    ax.legend(fontsize=7)
axes[0].axhline(noise_floor, color="grey", ls="--", lw=1)
axes[0].text(1, noise_floor * 1.15, "noise floor", fontsize=8, color="grey")
axes[0].set_yscale("log")
fig.suptitle("Forecast error by horizon, walk-forward test windows")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The leakage trap, made on purpose
#
# The most common mistake in forecasting experiments is to let the
# future into training. It happens quietly: the windows of a series are
# shuffled and split at random, as the rows of a table would be, or a
# scaler is fitted on the whole series before it is cut. A window whose
# inputs overlap a test window's targets then teaches the model the
# very values it will be asked to forecast.
#
# We make the first mistake on purpose, and only it: the same folds,
# the same test windows and the same scalers as above, but the training
# set is every other window of the series, before, inside and after the
# test span, as a random split of the windows would leave it. No test
# window is trained on; but the window that starts one quarter later
# shares three of its four targets, and its inputs hold the first.

# %%
leak_builders = {"PatchTST": gdp_patchtst(), "DLinear":
                 gdp_builders["DLinear"]}
leak_errors, _ = walk_forward_errors(
    growth, L_gdp, H_gdp, 4, 20, leak_builders, epochs=60, seed=SEED,
    leak=True)
leak = pd.DataFrame({
    "walk-forward": {n: float(gdp_errors[n].mean()) for n in leak_errors},
    "future in training": {n: float(e.mean())
                           for n, e in leak_errors.items()}})
leak["looks better by"] = 1 - leak["future in training"] / leak[
    "walk-forward"]

# %%
# NBVAL_IGNORE_OUTPUT
leak.round(3)

# %% tags=["remove-cell"]
# Floors from the sweep (notebooks/sweeps/14.json, 16 runs): DLinear
# looks 2.3-5.7% better with the leak; PatchTST moves by 0.6-1.8%.
assert leak.loc["DLinear", "looks better by"] > 0.015, leak
assert abs(leak.loc["PatchTST", "looks better by"]) < 0.03, leak

# %% [markdown]
# The leak flatters the linear model: on the very same test windows
# DLinear's error drops by 2% to 6% over the sweep's runs, part of its
# gap to PatchTST. PatchTST, with dropout and few windows to learn from,
# moves by less than 2%. A few percent is the size of the gaps between
# the models in the tables above, and that is the treacherous part:
# how much a leak helps depends on the model and the data, so it cannot
# be subtracted after the fact, only prevented. Walk-forward splits and
# scales fitted on the past cost nothing, and the package's tests check
# that no future value reaches a training window or a scaler.

# %% [markdown]
# ## What a regulated domain adds
#
# A hospital or a bank asks more of a model than a low error.
#
# - **Privacy of records.** Rows of a medical table belong to people.
#   The table above holds measurements of tissue with no identifier;
#   real records need consent, de-identification (removing names,
#   dates and rare combinations that single a person out), access
#   control, and care that the model does not memorise a row: a model
#   trained on records can leak them through its predictions. Training
#   with differential privacy, or inside the institution, are the usual
#   answers.
# - **Audit.** A decision that affects a patient or a borrower must be
#   explainable after the fact: which data trained the model, which
#   version made the decision, what it depended on. Fixed seeds, pinned
#   versions and recorded folds, as in this book, are the beginning;
#   measured dependence (permutation importance, not attention maps) is
#   the explanation an auditor can check.
# - **Uncertainty.** A forecast or a diagnosis without its uncertainty
#   invites overconfidence. Proper scores such as the log-loss and the
#   Brier score reward honest probabilities; a forecaster should give
#   intervals (quantile losses, conformal intervals from walk-forward
#   errors) and say when an input lies outside what it was trained on.
# - **Shift.** Hospitals change machines and economies change regimes;
#   a model validated once must be watched, and walk-forward evaluation
#   is how a forecaster's error on the next period is estimated before
#   it happens.

# %% tags=["remove-cell"]
chapter_seconds = time.perf_counter() - chapter_start
print(f"chapter: {chapter_seconds:.0f} s")

# %% [markdown]
# ## Summary
#
# - The encoder is the same for every kind of data; the customisation is
#   in the tokens (feature tokens, patches), the positions (none for a
#   table's features, learned for patches), the mask, the head and the
#   loss.
# - On the breast-cancer table the FT-Transformer comes within 1.3
#   points of logistic regression's accuracy, loses to it on log-loss
#   and ties it on the Brier score, at many times the cost: on small
#   tables fit the linear model and the trees first.
# - What the [CLS] token attends to hardly agrees with what the
#   model's predictions depend on: audit with measured dependence.
# - On a series with known structure both PatchTST and DLinear beat the
#   naive forecasts and stay above the noise floor; on US growth no
#   model beats the test period's own variance, and PatchTST and
#   DLinear are close.
# - Letting the future into training made the linear model look better
#   than it is on the very same test windows; how much a leak helps
#   depends on the model, so it must be prevented, not corrected for.
#
# ### Try it
#
# 1. **Diabetes.** `tasks.tables.diabetes()` is a regression table (442
#    patients, 10 features, one of them categorical). Train the
#    FT-Transformer with `n_outputs=1` and a squared error, beside
#    ridge regression and `HistGradientBoostingRegressor`.
# 2. **Bigger FT-Transformer.** Double C and the epochs. Does the
#    log-loss move toward logistic regression's?
# 3. **The scaler trap.** Fit the `Standardiser` on the whole series
#    instead of `PastScaler`; how much does each model's error change?
# 4. **More channels.** Forecast growth of GDP, consumption and
#    investment together (`macro_series` takes several columns): does
#    channel independence help or hurt?

# %% [markdown]
# ## Graded exercises
#
# Seven exercises, each with a check that runs when you run its cell,
# save the last, which a teacher marks by hand. In the book the
# reference solutions are folded: try first, then open them. The
# classroom edition (the teaching page) hands out the same exercises
# with the solutions removed, and nbgrader scores them.

# %% tags=["exercise-setup"]
import torch

from transformer_lite.classroom import (
    exercise,
    expect,
    expect_close,
    expect_equal,
    expect_raises,
)

gen = torch.Generator().manual_seed(14)

# %% [markdown]
# ### Exercise 14.1: feature tokens (2 points)
#
# Write `feature_tokens(x, weight, bias, cls)`: from a table's numeric
# rows `x` of shape $(B, F)$, per-feature vectors `weight` and `bias` of
# shape $(F, C)$ and a [CLS] vector `cls` of shape $(C,)$, the tokens
# $T_j = x_j w_j + b_j$ of every row, with the [CLS] token appended
# last: shape $(B, F + 1, C)$. The check compares your tokens with the
# package's `FeatureTokenizer`, which does not serve your code.

# %% tags=["solution", "hide-input"]
def feature_tokens(x, weight, bias, cls):
    ### BEGIN SOLUTION
    tokens = x[:, :, None] * weight + bias  # (B, F, C)
    cls = cls.expand(x.size(0), 1, -1)  # (B, 1, C)
    return torch.cat([tokens, cls], dim=1)  # (B, F + 1, C)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.domains import FeatureTokenizer

torch.manual_seed(14)
tokenizer = FeatureTokenizer(5, (), 6).double()
with torch.no_grad():
    tokenizer.cls.normal_()  # not zeros, so that it shows
rows = torch.randn(3, 5, generator=gen, dtype=torch.float64)
with torch.no_grad():
    want = tokenizer(rows)  # (B, F + 1, C)
with exercise("14.1", twins=[FeatureTokenizer.forward]):
    expect_close("feature_tokens(x, weight, bias, cls)",
                 feature_tokens(rows, tokenizer.weight.detach(),
                                tokenizer.bias.detach(),
                                tokenizer.cls.detach()),
                 want,
                 hint="feature j's token is x[:, j] times weight[j] plus "
                 "bias[j], its own vectors; the [CLS] token comes after "
                 "the F feature tokens, not before")  # fmt: skip

# %% [markdown]
# ### Exercise 14.2: proper scores (1 point)
#
# Write `proper_scores(p, y)`: from predicted probabilities `p` of the
# positive class and 0/1 labels `y` (float tensors of shape $(n,)$), the
# pair (log-loss, Brier score) as two 0-dimensional tensors, with the
# formulas of the chapter. You may assume $0 < p < 1$. scikit-learn's
# `log_loss` and `brier_score_loss` check your answer and do not serve
# it.

# %% tags=["solution", "hide-input"]
def proper_scores(p, y):
    ### BEGIN SOLUTION
    log_loss = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    brier = (p - y).pow(2).mean()
    return log_loss, brier
    ### END SOLUTION


# %% tags=["check"]
from sklearn.metrics import brier_score_loss, log_loss

p = torch.rand(40, generator=gen, dtype=torch.float64) * 0.98 + 0.01
y = (torch.rand(40, generator=gen) < 0.4).double()
want = (torch.tensor(log_loss(y.numpy(), p.numpy()), dtype=torch.float64),
        torch.tensor(brier_score_loss(y.numpy(), p.numpy()),
                     dtype=torch.float64))
with exercise("14.2", twins=[log_loss, brier_score_loss]):
    got = proper_scores(p, y)
    expect_close("proper_scores(p, y)[0], the log-loss", got[0], want[0],
                 hint="a negative label (y = 0) is scored by log(1 - p): "
                 "both terms, averaged over the n rows, with a minus "
                 "sign")  # fmt: skip
    expect_close("proper_scores(p, y)[1], the Brier score", got[1],
                 want[1],
                 hint="the Brier score is the mean of (p - y) squared, "
                 "with no square root")  # fmt: skip

# %% [markdown]
# ### Exercise 14.3: the seasonal last value (1 point)
#
# Write `seasonal_naive(x, horizon, period)`: from windows `x` of shape
# $(B, L, C)$ with $L \ge p$, the forecasts $\hat x_{t+h}$ for
# $h = 0, \dots, H - 1$ that repeat the value at the same phase of the
# last whole season in the window, $x_{t - p + (h \bmod p)}$ in the
# window's own time: shape $(B, H, C)$. Horizons longer than a season
# repeat it again. Raise a `ValueError` when the window is shorter than
# a season.

# %% tags=["solution", "hide-input"]
def seasonal_naive(x, horizon, period):
    ### BEGIN SOLUTION
    L = x.size(1)
    if L < period:
        raise ValueError(f"a window of {L} holds no season of {period}")
    index = L - period + torch.arange(horizon) % period  # (H,)
    return x[:, index]  # (B, H, C)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite import domains

windows = torch.randn(2, 8, 3, generator=gen, dtype=torch.float64)
with exercise("14.3", twins=[domains.seasonal_last_value,
                             domains.SeasonalLastValue.forward]):
    for horizon, period in ((3, 3), (7, 3), (2, 8)):
        expect_close(f"seasonal_naive(x, {horizon}, {period})",
                     seasonal_naive(windows, horizon, period),
                     domains.seasonal_last_value(windows, horizon, period),
                     hint="the last season is the window's last p values, "
                     "x[:, L - p:]; step h reads its value at h mod p, so a "
                     "horizon longer than p starts the season "
                     "again")  # fmt: skip
    expect_raises(ValueError, lambda: seasonal_naive(windows, 2, 9),
                  hint="a window of 8 values holds no whole season of 9: "
                  "check L >= period")  # fmt: skip

# %% [markdown]
# ### Exercise 14.4: patches of a series (2 points)
#
# Write `series_patches(series, P, S)`: from windows of shape $(B, L)$,
# the patches PatchTST reads: append S copies of each window's last
# value, then take P consecutive values every S steps, from the start:
# shape $(B, N, P)$ with $N = \lfloor (L - P) / S \rfloor + 2$. Raise a
# `ValueError` when the window is shorter than one patch. Cut them with
# indexing: the check refuses the package's `to_patches` and torch's
# `unfold` to your code.

# %% tags=["solution", "hide-input"]
def series_patches(series, P, S):
    ### BEGIN SOLUTION
    B, L = series.shape
    if L < P:
        raise ValueError(f"a window of {L} is shorter than a patch of {P}")
    padded = torch.cat([series, series[:, -1:].expand(B, S)], dim=1)
    N = (L - P) // S + 2
    starts = torch.arange(N) * S  # (N,)
    index = starts[:, None] + torch.arange(P)  # (N, P)
    return padded[:, index]  # (B, N, P)
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.domains import to_patches

series = torch.randn(3, 13, generator=gen, dtype=torch.float64)
with exercise("14.4", twins=[to_patches, torch.Tensor.unfold]):
    for P, S in ((4, 2), (5, 3), (13, 4), (1, 1)):
        expect_close(f"series_patches(series, {P}, {S})",
                     series_patches(series, P, S), to_patches(series, P, S),
                     hint="append S copies of the last value first (so the "
                     "window's last values start a patch too); patch k "
                     "holds values k S .. k S + P - 1 of the padded "
                     "window")  # fmt: skip
    expect_raises(ValueError, lambda: series_patches(series, 14, 2),
                  hint="13 values cannot fill a patch of 14: check "
                  "L >= P")  # fmt: skip

# %% [markdown]
# ### Exercise 14.5: walk-forward folds (2 points)
#
# Write `expanding_folds(n, input_len, horizon, n_folds, test_size)`:
# the folds of a series of n values as a list of `(train, test)` pairs
# of `range`s. The last `n_folds * test_size` values are cut into test
# spans in time order; fold k trains on every value before its test
# span. Raise a `ValueError` when `test_size < horizon` (a test span
# holds whole forecasts) and when the first fold would train on fewer
# than `input_len + horizon` values (not one window). The package's
# `walk_forward` checks your answer and does not serve it.

# %% tags=["solution", "hide-input"]
def expanding_folds(n, input_len, horizon, n_folds, test_size):
    ### BEGIN SOLUTION
    if test_size < horizon:
        raise ValueError("a test span must hold a whole forecast")
    first = n - n_folds * test_size
    if first < input_len + horizon:
        raise ValueError("the first fold has not one window to train on")
    return [(range(0, first + k * test_size),
             range(first + k * test_size, first + (k + 1) * test_size))
            for k in range(n_folds)]
    ### END SOLUTION


# %% tags=["check"]
from transformer_lite.domains import walk_forward

with exercise("14.5", twins=[walk_forward]):
    for args in ((100, 10, 3, 4, 15), (60, 8, 4, 1, 20), (40, 5, 5, 5, 5)):
        want = [tuple(fold) for fold in walk_forward(*args)]
        expect_equal(f"expanding_folds{args}",
                     [tuple(fold) for fold in expanding_folds(*args)], want,
                     hint="the test spans are the LAST n_folds * test_size "
                     "values, in time order; fold k's training span is "
                     "range(0, its test span's start), so it grows fold by "
                     "fold")  # fmt: skip
    expect_raises(ValueError, lambda: expanding_folds(100, 10, 6, 4, 5),
                  hint="a test span of 5 cannot hold a forecast of 6: "
                  "check test_size >= horizon")  # fmt: skip
    expect_raises(ValueError, lambda: expanding_folds(100, 30, 5, 4, 17),
                  hint="4 folds of 17 leave 32 values, fewer than one window "
                  "of 30 + 5: check the first fold's training "
                  "span")  # fmt: skip

# %% [markdown]
# ### Exercise 14.6: predict, then run (1 point)
#
# Decide before you run the cell below it. The walk-forward evaluation
# of the last-value forecast on US growth standardised each fold with a
# `PastScaler`, the training span's mean and spread. Fit the scaler on
# the *whole* series instead, the future included, and evaluate the
# last value again, in the series' own units. Does its mean squared
# error rise, fall, or stay unchanged? Set `prediction` to one of
# `"rises"`, `"falls"` or `"unchanged"`; then run the experiment and the
# check.

# %% tags=["solution", "prediction", "hide-input"]
### BEGIN SOLUTION
prediction = "unchanged"
### END SOLUTION

# %% [markdown]
# The experiment: each fold's last-value forecasts, made in the units of
# a scaler fitted on the past or on everything, and mapped back.

# %%
from transformer_lite import domains
from transformer_lite.tasks.series_data import macro_series

growth = macro_series(("realgdp",), torch.float64).values  # (202, 1)
mse = {"past": [], "whole series": []}
for fold in domains.walk_forward(len(growth), 16, 4, 4, 20):
    x_test, y_test = domains.make_windows(growth, 16, 4, fold.test.start,
                                  fold.test.stop)
    for name, scaler in (
            ("past", domains.PastScaler(growth, fold.train.stop)),
            ("whole series", domains.Standardiser(growth))):
        last = domains.last_value(scaler.transform(x_test), 4)  # (n, H, C)
        forecast = scaler.inverse(last)
        mse[name].append(float((forecast - y_test).pow(2).mean()))
past, whole = sum(mse["past"]) / 4, sum(mse["whole series"]) / 4
print(f"last value, scaler from the past: {past:.6f}; from the whole "
      f"series: {whole:.6f}")
outcome = ("unchanged" if abs(past - whole) < 1e-9 * past
           else "rises" if whole > past else "falls")

# %% tags=["check", "hide-input"]
with exercise("14.6", prediction=True):
    expect(prediction in ("rises", "falls", "unchanged"),
           f"prediction is {prediction!r}: choose one of 'rises', 'falls' "
           "or 'unchanged'")  # fmt: skip
    ### BEGIN HIDDEN TESTS
    expect(prediction == outcome,
           f"the error {outcome}, it did not {prediction!r}",
           hint="the last value learns nothing: standardising, repeating "
           "the last value and mapping back gives the last value whatever "
           "mean and spread the scaler used, so the leak cannot help it. "
           "A leaky scaler matters to a model that learns from the scaled "
           "values")  # fmt: skip
    ### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 14.7: a Transformer for a table? (2 points, written)
#
# On the 569-row breast-cancer table the FT-Transformer tied logistic
# regression on accuracy and the Brier score and lost to it on
# log-loss, at many times the training time. In two to four sentences:
# why does the linear model do so well here, and name two properties of
# a table (or of the data around it) that would make you expect the
# FT-Transformer to pull ahead, with the reason for each.

# %% [markdown] tags=["written", "points-2"]
# ```{dropdown} A model answer, and the rubric
# The two diagnoses are close to linearly separable in the 30
# standardised measurements, so a weighted sum already has the right
# shape; with 455 training rows its 31 weights are estimated well,
# while the Transformer's twenty thousand weights add variance and
# nothing the data need, and its probabilities come out less well
# calibrated. It should pull ahead with many more rows (its capacity
# can then be used without overfitting), with interactions between
# features that a linear model cannot represent (attention between
# feature tokens can model them), with many or high-cardinality
# categorical features (embeddings share strength between values), or
# when it can be pretrained on many related tables and fine-tuned.
#
# *Rubric (2 points).* 1 point: the linear model suits this table
# because the classes are (nearly) linearly separable or because the
# table is small relative to the Transformer's parameters (bias and
# variance, overfitting). 1 point: two properties, each with its reason,
# among more rows, non-linear feature interactions, many or
# high-cardinality categorical features, pretraining or transfer from
# related tables. "Transformers are more powerful" without a reason
# earns nothing.
# ```

# %% [raw] tags=["planted", "remove-cell"]
# exercise: 1
# message: Hint: feature j's token is x[:, j] times weight[j] plus
# def feature_tokens(x, weight, bias, cls):
#     tokens = x[:, :, None] * weight + bias  # (B, F, C)
#     cls = cls.expand(x.size(0), 1, -1)  # (B, 1, C)
#     return torch.cat([cls, tokens], dim=1)  # [CLS] first: wrong

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: delegate
# def feature_tokens(x, weight, bias, cls):
#     from types import SimpleNamespace
#     from transformer_lite.domains import FeatureTokenizer
#     fake = SimpleNamespace(n_numeric=x.size(1), categories=(),
#                            weight=weight, bias=bias, cls=cls)
#     return FeatureTokenizer.forward(fake, x, None)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 1
# kind: trivial
# def feature_tokens(x, weight, bias, cls):
#     tokens = bias.expand(x.size(0), -1, -1)  # (B, F, C), no values
#     return torch.cat([tokens, cls.expand(x.size(0), 1, -1)], dim=1)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: delegate
# def proper_scores(p, y):
#     from sklearn.metrics import brier_score_loss, log_loss
#     return (torch.tensor(log_loss(y.numpy(), p.numpy())),
#             torch.tensor(brier_score_loss(y.numpy(), p.numpy())))

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 2
# kind: trivial
# def proper_scores(p, y):
#     return p.new_zeros(()), p.new_zeros(())

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: delegate
# def seasonal_naive(x, horizon, period):
#     from transformer_lite.domains import seasonal_last_value
#     return seasonal_last_value(x, horizon, period)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 3
# kind: trivial
# def seasonal_naive(x, horizon, period):
#     if x.size(1) < period:
#         raise ValueError("too short")
#     return x[:, -1:].expand(-1, horizon, -1)  # the last value

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: delegate
# def series_patches(series, P, S):
#     if series.size(1) < P:
#         raise ValueError("too short")
#     padded = torch.cat([series, series[:, -1:].expand(-1, S)], dim=1)
#     return padded.unfold(1, P, S)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 4
# kind: trivial
# def series_patches(series, P, S):
#     if series.size(1) < P:
#         raise ValueError("too short")
#     N = (series.size(1) - P) // S + 2
#     return series[:, :P].unsqueeze(1).expand(-1, N, -1)  # one patch

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: delegate
# def expanding_folds(n, input_len, horizon, n_folds, test_size):
#     from transformer_lite.domains import walk_forward
#     return walk_forward(n, input_len, horizon, n_folds, test_size)

# %% [raw] tags=["cheat", "remove-cell"]
# exercise: 5
# kind: trivial
# def expanding_folds(n, input_len, horizon, n_folds, test_size):
#     if test_size < horizon or n - n_folds * test_size < input_len + horizon:
#         raise ValueError("no folds")
#     cut = n - test_size
#     return [(range(0, cut), range(cut, n))] * n_folds  # one fold, again
