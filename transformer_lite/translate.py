"""Translate number words offline: train, save, load, translate (chapter 7).

One training function serves the book, the command line and
``torchrun``::

    python -m transformer_lite.translate train [--pair de-en|fr-en]
    python -m transformer_lite.translate "dreihundertzwölf"
    torchrun --nproc_per_node=2 -m transformer_lite.translate train

The model is saved to ``--model-dir`` (default: ``$XDG_CACHE_HOME`` or
``~/.cache``, then ``transformer-lite/``) as ``de-en.pt`` or ``fr-en.pt``,
with its two tokenizers inside, and the checkpoints it averages in
``de-en-checkpoints/``; ``--model FILE`` names another file.
``--tsv FILE`` trains on your own corpus (``source<TAB>target`` lines)
and saves ``FILE``'s name with ``.pt`` (translate with ``--model``).
Every field of :class:`TranslateConfig` is an option (``--steps 300``).
"""

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from transformer_lite import data
from transformer_lite.checkpoint import average_checkpoints
from transformer_lite.device import default_device, seed_everything
from transformer_lite.distributed import (
    init_distributed,
    is_main_process,
    train_step,
    world,
)
from transformer_lite.metrics import scores
from transformer_lite.model import make_model
from transformer_lite.tokenizer import PAD_ID
from transformer_lite.tokenizer import SubwordTokenizer as Tokenizer
from transformer_lite.training import (
    LabelSmoothingLoss,
    evaluate,
    noam_scheduler,
)
from transformer_lite.translator import Translator

__all__ = [
    "TrainResult",
    "TranslateConfig",
    "default_model_dir",
    "main",
    "train",
    "train_tokenizers",
]


@dataclass
class TranslateConfig:
    """Data, tokens, model and optimisation of the chapter 7 task."""

    pair: str = "de-en"  # source-target language pair of the number words
    n_train: int = 20_000  # distinct numbers to train on
    n_valid: int = 500  # held out, for the validation loss
    n_test: int = 1000  # held out, for the final scores
    max_digits: int = 6  # numbers below a million
    digits_share: float = 0.15  # repeat short numbers up to this share
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
    0 alone shows progress and saves (:mod:`transformer_lite.distributed`).

    Args:
        tokenizers: ``(source, target)``; None trains them on ``pairs``.
        device: None: this rank's GPU under torchrun, else
            ``default_device()``.
    """
    seed_everything(config.seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src_tok, tgt_tok = tokenizers or train_tokenizers(pairs, config)
    src_ids = [src_tok.encode(s) for s, _ in pairs]
    tgt_ids = [tgt_tok.encode(t) for _, t in pairs]
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        device = init_distributed()
    device = torch.device(device or default_device())
    model = make_model(
        src_tok.vocab_size,
        tgt_tok.vocab_size,
        n_layers=config.n_layers,
        d_model=config.d_model,
        d_ff=config.d_ff,
        n_heads=config.n_heads,
        dropout=config.dropout,
        norm_first=config.norm_first,
        max_len=config.max_len,
        pad_id=PAD_ID,
    ).to(device)
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
    V, eps = tgt_tok.vocab_size, config.smoothing
    loss_fn = LabelSmoothingLoss(V, PAD_ID, eps, reduction="sum")
    mean_loss_fn = LabelSmoothingLoss(V, PAD_ID, eps)  # for validation
    valid = None
    if valid_pairs:
        valid = data.bucket_batches(
            [src_tok.encode(s) for s, _ in valid_pairs],
            [tgt_tok.encode(t) for _, t in valid_pairs],
            config.batch_size,
            config.seed,
        )
    result = TrainResult(Translator(model, src_tok, tgt_tok), [])
    generator = torch.Generator().manual_seed(config.seed)
    first_saved = config.steps - (config.keep_last - 1) * config.save_every
    main = is_main_process()
    quiet = not progress or not main
    bar = tqdm(total=config.steps, desc="train", disable=quiet, leave=False)
    start, cpu_start = time.perf_counter(), time.process_time()
    step = 0
    while step < config.steps:
        for batch in data.bucket_batches(
            src_ids, tgt_ids, config.batch_size, generator
        ):
            if step == config.steps:
                break
            if batch.src.size(0) < world()[1]:
                continue  # too few rows to give every process a share
            result.lr.append(optimizer.param_groups[0]["lr"])
            loss = train_step(replica, batch, loss_fn, optimizer, scheduler)
            result.step_loss.append(loss)
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if step % config.save_every and step != config.steps:
                continue
            if valid is not None:
                valid_loss = evaluate(model, valid, mean_loss_fn)
                result.valid_loss.append((step, valid_loss))
            if step >= first_saved and main:
                path = out_dir / f"step-{step:06d}.pt"
                result.translator.save(path, step=step)
                result.checkpoints.append(path)
    bar.close()
    result.seconds = time.perf_counter() - start
    result.cpu_seconds = time.process_time() - cpu_start
    model.eval()
    return result


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    prog = "python -m transformer_lite.translate"
    use = argparse.ArgumentParser(
        prog=prog,
        description="Translate number words with a trained "
        f"model. Train one first: {prog} train --help",
    )
    use.add_argument("texts", nargs="+", help="the sentences to translate")
    use.add_argument("--beam-size", type=int, default=4)
    use.add_argument("--length-penalty", type=float, default=0.6)
    fit = argparse.ArgumentParser(
        prog=f"{prog} train",
        description="Train a translator; save the "
        "average of its last checkpoints.",
    )
    fit.add_argument(
        "--tsv",
        type=Path,
        help="train on this corpus "
        "(source<TAB>target lines) instead of number words",
    )
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    for f in fields(TranslateConfig):
        option = "--" + f.name.replace("_", "-")
        how = {"default": f.default, "help": "default: %(default)s"}
        if isinstance(f.default, bool):
            fit.add_argument(
                option, action=argparse.BooleanOptionalAction, **how
            )
        elif f.name != "pair":
            fit.add_argument(option, type=type(f.default), **how)
    for parser in (use, fit):
        parser.add_argument("--pair", choices=data.PAIRS, default="de-en")
        parser.add_argument(
            "--model-dir",
            type=Path,
            default=default_model_dir(),
            help="where models live (default: %(default)s)",
        )
        parser.add_argument(
            "--model",
            type=Path,
            help="the model file (default: MODEL_DIR/PAIR.pt)",
        )
    return use, fit


def _train_command(args: argparse.Namespace) -> int:
    config = TranslateConfig(
        **{f.name: getattr(args, f.name) for f in fields(TranslateConfig)}
    )
    name = config.pair if args.tsv is None else args.tsv.stem
    path = args.model or args.model_dir / f"{name}.pt"
    valid = test = tokenizers = None
    if args.tsv is not None:
        pairs = data.read_tsv(args.tsv)
    else:
        splits = data.number_splits(
            config.n_train,
            config.n_valid,
            config.n_test,
            config.max_digits,
            config.seed,
        )
        pairs, valid, test = (
            data.number_pairs(splits[name], config.pair)
            for name in ("train", "valid", "test")
        )
        tokenizers = train_tokenizers(pairs, config)  # distinct numbers
        at_least = round(config.digits_share * config.n_train)
        balanced = data.balance_digits(splits["train"], at_least)
        pairs = data.number_pairs(balanced, config.pair)
    checkpoints = path.with_name(path.stem + "-checkpoints")
    result = train(
        pairs, config, checkpoints, valid, tokenizers, progress=not args.quiet
    )
    if not is_main_process():
        return 0
    model, extra = average_checkpoints(result.checkpoints)
    translator = Translator.from_model(model, extra)
    translator.save(path, config=asdict(config))
    print(f"trained in {result.seconds:.0f} s; saved {path}")
    if test:
        hypotheses = translator.translate([s for s, _ in test])
        references = [t for _, t in test]
        measured = scores(hypotheses, references)
        print(
            ", ".join(f"{k} {v:.1f}" for k, v in measured.items()),
            f"on {len(test)} held-out numbers",
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    use, fit = _parsers()
    if argv[:1] == ["train"]:
        try:
            return _train_command(fit.parse_args(argv[1:]))
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
    args = use.parse_args(argv)
    path = args.model or args.model_dir / f"{args.pair}.pt"
    if not Path(path).is_file():
        print(
            f"no model at {path}; train one first: python -m "
            f"transformer_lite.translate train --pair {args.pair}",
            file=sys.stderr,
        )
        return 2
    translator = Translator.load(path)
    for line in translator.translate(
        args.texts, args.beam_size, args.length_penalty
    ):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
