"""Train a translator (chapter 7): one training function serves the book,
the command line (:mod:`transformer_lite.tasks.translate`) and
``torchrun``.
"""

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.device import default_device, seed_everything
from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.tasks.corpus import bucket_batches
from transformer_lite.tasks.numbers import (
    MAX_DIGITS_LIMIT,
    PAIRS,
    balance_digits,
    repeated_numbers,
    sparse_numbers,
)
from transformer_lite.tasks.slices import MAX_SLICE_SIZE, number_slices
from transformer_lite.tasks.tokenizer import SPECIAL_TOKENS
from transformer_lite.tasks.tokenizer import SubwordTokenizer as Tokenizer
from transformer_lite.tasks.translator import Translator
from transformer_lite.tokens import PAD_ID
from transformer_lite.training.batch import Batch
from transformer_lite.training.distributed import (
    init_distributed,
    is_main_process,
    world,
)
from transformer_lite.training.loop import evaluate, fit
from transformer_lite.training.loss import LabelSmoothingLoss
from transformer_lite.training.objectives import seq2seq_loss
from transformer_lite.training.schedule import noam_scheduler
from transformer_lite.training.step import TrainOptions

__all__ = [
    "TrainResult",
    "TranslateConfig",
    "check_lengths",
    "default_model_dir",
    "train",
    "train_tokenizers",
    "training_numbers",
]


# Fields with an upper bound: a larger value would make a run last hours.
HIGHEST = {"max_digits": MAX_DIGITS_LIMIT, "slice_size": MAX_SLICE_SIZE}


@dataclass
class TranslateConfig:
    """Data, tokens, model and optimisation of the chapter 7 task."""

    pair: str = "de-en"  # source-target language pair of the number words
    n_train: int = 20_000  # distinct numbers to train on
    n_valid: int = 500  # held out, for the validation loss
    n_test: int = 1000  # held out, for the final scores
    max_digits: int = 6  # numbers below a million
    digits_share: float = 0.15  # rare digit counts repeated to this x n_train
    sparse_share: float = 0.25  # add numbers with many zeros, this share
    repeat_share: float = 0.15  # and numbers with repeated digits
    slice_size: int = 200  # held-out numbers per sampled family (slices)
    src_vocab: int = 130  # BPE vocabulary of the source, specials included
    tgt_vocab: int = 120  # and of the target
    n_layers: int = 2  # small: the task needs little depth
    d_model: int = 128  # C: under a million parameters in all
    d_ff: int = 256  # 2 C: wider costs time, gains nothing here
    n_heads: int = 4  # H, so D = 32
    dropout: float = 0.1  # as the paper
    norm_first: bool = True  # pre-LN: faster to train here (chapter 6)
    batch_size: int = 128  # sentences per global batch
    steps: int = 1200  # optimizer steps
    warmup: int = 200  # Noam schedule warm-up steps
    lr_factor: float = 1.0  # Noam schedule factor
    smoothing: float = 0.1  # label smoothing eps
    save_every: int = 50  # steps between the last checkpoints ...
    keep_last: int = 5  # ... of which this many are saved, to average
    max_len: int = 64  # longest sequence (positional table), in tokens
    seed: int = 0  # data, initialisation and batch order

    def __post_init__(self) -> None:
        """Every field checked by type and range, before any work."""

        if self.pair not in PAIRS:
            raise ValueError(f"pair must be one of {PAIRS}: {self.pair!r}")
        lowest = dict(src_vocab=len(SPECIAL_TOKENS) + 1, seed=0)
        lowest["tgt_vocab"] = lowest["src_vocab"]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type is bool:
                check_bool(f.name, value)
            elif f.type is int:
                high = HIGHEST.get(f.name)  # counts that multiply work
                check_int(f.name, value, low=lowest.get(f.name, 1), high=high)
        for name in ("digits_share", "sparse_share", "repeat_share"):
            check_real(name, getattr(self, name), low=0.0, high=1.0)
        for name in ("dropout", "smoothing"):
            check_real(name, getattr(self, name), low=0.0, high=1.0,
                       high_open=True)  # fmt: skip
        if not check_real("lr_factor", self.lr_factor, low=0.0) > 0:
            raise ValueError(f"lr_factor must be > 0, got {self.lr_factor}")
        self.model_config(self.src_vocab, self.tgt_vocab)  # d_model, heads

    def model_config(
        self, src_vocab: int, tgt_vocab: int
    ) -> TransformerConfig:
        """The model these settings describe, for the tokenizers' sizes."""
        return TransformerConfig(
            src_vocab,
            tgt_vocab,
            n_layers=self.n_layers,
            d_model=self.d_model,
            d_ff=self.d_ff,
            n_heads=self.n_heads,
            dropout=self.dropout,
            norm_first=self.norm_first,
            max_len=self.max_len,
            pad_id=PAD_ID,
        )


def default_model_dir() -> Path:
    """``$XDG_CACHE_HOME/transformer-lite``, else
    ``~/.cache/transformer-lite``."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "transformer-lite"


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    translator: Translator  # the model after the last step
    checkpoints: list[Path]  # the last ``keep_last``, oldest first
    step_loss: list[float] = field(default_factory=list)  # per step
    lr: list[float] = field(default_factory=list)  # per step
    valid_loss: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock time of the training loop
    cpu_seconds: float = 0.0  # CPU time of this process, all threads


def train_tokenizers(
    pairs: Sequence[tuple[str, str]], config: TranslateConfig
) -> tuple[Tokenizer, Tokenizer]:
    """BPE tokenizers for the sources and the targets of ``pairs``."""
    sources, targets = zip(*pairs, strict=True)
    return (
        Tokenizer.train(sources, config.src_vocab),
        Tokenizer.train(targets, config.tgt_vocab),
    )


def training_numbers(
    splits: dict[str, list[int]], config: TranslateConfig
) -> list[int]:
    """The numbers to train on, with repeats (chapter 7): the training
    split with its short numbers repeated (``digits_share``,
    :func:`~transformer_lite.tasks.numbers.balance_digits`), then
    ``sparse_share * n_train`` numbers with many zeros
    (:func:`~transformer_lite.tasks.numbers.sparse_numbers`) and
    ``repeat_share * n_train`` numbers with repeated digits
    (:func:`~transformer_lite.tasks.numbers.repeated_numbers`), none of
    them in the validation or test split or in any family of
    :func:`~transformer_lite.tasks.slices.number_slices`: the families
    stay held out.
    """
    # a share of 0: every number once (balance_digits wants >= 1)
    at_least = max(1, round(config.digits_share * config.n_train))
    numbers = balance_digits(splits["train"], at_least)
    extra = {sparse_numbers: config.sparse_share,
             repeated_numbers: config.repeat_share}  # fmt: skip
    if config.max_digits < 4 or not any(extra.values()):
        return numbers
    families = number_slices(
        splits,
        size=config.slice_size,
        max_digits=config.max_digits,
        seed=config.seed,
    )
    exclude = {n for xs in families.values() for n in xs}
    exclude |= set(splits["valid"]) | set(splits["test"])
    for stream, (draw, share) in enumerate(extra.items()):
        if count := round(share * config.n_train):
            numbers += draw(
                count, exclude=exclude, max_digits=config.max_digits,
                seed=2 * config.seed + stream,
            )  # fmt: skip
    return numbers


def check_lengths(
    pairs: Sequence[tuple[str, str]],
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    max_len: int,
    name: str,
) -> None:
    """Raise a ``ValueError`` naming the first pair whose source or
    target has more than ``max_len`` tokens: the positional table ends
    there, so such a pair would stop training at a random step."""
    for i, (src, tgt) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        for side, ids, text in (("source", src, pairs[i][0]),
                                ("target", tgt, pairs[i][1])):  # fmt: skip
            if len(ids) > max_len:
                raise ValueError(
                    f"{name}[{i}]: the {side} {text[:40]!r} is {len(ids)} "
                    f"tokens long (BOS and EOS included), more than "
                    f"max_len={max_len}; raise max_len or drop the pair"
                )


def _encoded(
    pairs: Sequence[tuple[str, str]],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    config: TranslateConfig,
    name: str,
) -> tuple[list[list[int]], list[list[int]]]:
    """The ids of ``pairs``, every one checked against ``max_len``."""
    src_ids = [src_tok.encode(s) for s, _ in pairs]
    tgt_ids = [tgt_tok.encode(t) for _, t in pairs]
    check_lengths(pairs, src_ids, tgt_ids, config.max_len, name)
    return src_ids, tgt_ids


def _model_and_optimizer(config: TranslateConfig, vocabs, device):
    """The model on its device (wrapped in DDP under torchrun), Adam and
    the Noam schedule."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        device = init_distributed()
    device = torch.device(device or default_device())
    model = Transformer(config.model_config(*vocabs)).to(device)
    replica = model
    if distributed:
        ids = None if device.type == "cpu" else [device]
        replica = nn.parallel.DistributedDataParallel(model, ids)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9
    )
    scheduler = noam_scheduler(
        optimizer, config.d_model, config.warmup, config.lr_factor
    )
    return model, replica, optimizer, scheduler


def _endless_batches(ids, config: TranslateConfig) -> Iterator[Batch]:
    """Length-bucketed batches of ``ids``, a fresh order for every pass,
    without end; a batch of fewer rows than processes is left out (it
    could not give every process a share)."""
    generator = torch.Generator().manual_seed(config.seed)
    while True:
        for batch in bucket_batches(*ids, config.batch_size, generator):
            if batch.src.size(0) >= world()[1]:
                yield batch


def _every_save(valid, objective, config, out_dir: Path, result):
    """The callback after each step: every ``save_every`` steps (and at
    the last) the validation loss and, over the last ``keep_last`` of
    them, a checkpoint (rank 0 only)."""
    model = result.translator.model
    first_saved = config.steps - (config.keep_last - 1) * config.save_every
    main = is_main_process()

    def on_step(step: int, loss: float) -> None:
        if step % config.save_every and step != config.steps:
            return
        if valid is not None:
            result.valid_loss.append((step, evaluate(model, valid, objective)))
        if step >= first_saved and main:
            path = out_dir / f"step-{step:06d}.pt"
            result.translator.save(path, step=step)
            result.checkpoints.append(path)

    return on_step


def train(
    pairs: Sequence[tuple[str, str]],
    config: TranslateConfig,
    out_dir: str | os.PathLike,
    valid_pairs: Sequence[tuple[str, str]] | None = None,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train a translator on ``pairs``: length-bucketed batches, label
    smoothing, Adam with the Noam schedule, checkpoints of the last
    ``keep_last`` multiples of ``save_every`` steps in ``out_dir``.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every process runs this; each
    takes its share of every batch, DDP averages the gradients, and rank
    0 alone shows progress and saves
    (:mod:`transformer_lite.training.distributed`).

    Args:
        tokenizers: ``(source, target)``; None trains them on ``pairs``.
        device: None: this rank's GPU under torchrun, else
            ``default_device()``.

    Raises:
        ValueError: before the first step, for a bad option or a pair
            whose source or target is longer than ``config.max_len``
            tokens (BOS and EOS included).
    """
    if not isinstance(config, TranslateConfig):
        raise ValueError(f"config must be a TranslateConfig: {config!r}")
    check_bool("progress", progress)
    if not pairs:
        raise ValueError("pairs is empty: nothing to train on")
    seed_everything(config.seed)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out_dir {out_dir} exists and is not a directory")
    src_tok, tgt_tok = tokenizers or train_tokenizers(pairs, config)
    src_ids, tgt_ids = _encoded(pairs, src_tok, tgt_tok, config, "pairs")
    out_dir.mkdir(parents=True, exist_ok=True)
    model, replica, optimizer, scheduler = _model_and_optimizer(
        config, (src_tok.vocab_size, tgt_tok.vocab_size), device
    )
    V, eps = tgt_tok.vocab_size, config.smoothing
    loss_fn = LabelSmoothingLoss(V, PAD_ID, eps, reduction="sum")
    objective = seq2seq_loss(loss_fn)
    if min(config.batch_size, len(pairs)) < world()[1]:
        raise ValueError(
            f"{world()[1]} processes need batches of at least as many "
            f"rows: batch_size={config.batch_size}, {len(pairs)} pairs"
        )
    valid = None
    if valid_pairs:
        valid_ids = _encoded(
            valid_pairs, src_tok, tgt_tok, config, "valid_pairs"
        )
        valid = bucket_batches(*valid_ids, config.batch_size, config.seed)
    result = TrainResult(Translator(model, src_tok, tgt_tok), [])
    options = TrainOptions(progress=progress and is_main_process())
    start, cpu_start = time.perf_counter(), time.process_time()
    history = fit(
        replica, _endless_batches((src_ids, tgt_ids), config), objective,
        optimizer, scheduler=scheduler, epochs=1, max_steps=config.steps,
        options=options, on_step=_every_save(valid, objective, config,
                                             out_dir, result),
    )  # fmt: skip
    result.step_loss, result.lr = history.step_loss, history.lr
    result.seconds = time.perf_counter() - start
    result.cpu_seconds = time.process_time() - cpu_start
    model.eval()
    return result
