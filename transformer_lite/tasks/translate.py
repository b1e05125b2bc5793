"""The translator's command line (chapter 7)::

    python -m transformer_lite.tasks.translate train [--pair de-en|fr-en]
    python -m transformer_lite.tasks.translate "dreihundertzwölf"
    torchrun --nproc_per_node=2 -m transformer_lite.tasks.translate train

The model is saved to ``--model-dir`` (default: ``$XDG_CACHE_HOME`` or
``~/.cache``, then ``transformer-lite/``) as ``de-en.pt`` or ``fr-en.pt``,
with its two tokenizers inside, and the checkpoints it averages in
``de-en-checkpoints/``; ``--model FILE`` names another file.
``--tsv FILE`` trains on your own corpus (``source<TAB>target`` lines)
and saves ``FILE``'s name with ``.pt`` (translate with ``--model``).
Every field of :class:`~transformer_lite.tasks.trainer.TranslateConfig`
is an option (``--steps 300``).
"""

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

import torch

from transformer_lite.device import default_device
from transformer_lite.tasks import corpus, numbers
from transformer_lite.tasks.metrics import scores
from transformer_lite.tasks.trainer import (
    TranslateConfig,
    default_model_dir,
    train,
    train_tokenizers,
)
from transformer_lite.tasks.translator import Translator
from transformer_lite.training.checkpoint import average_checkpoints
from transformer_lite.training.distributed import is_main_process

__all__ = ["main"]

PROG = "python -m transformer_lite.tasks.translate"


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    prog = PROG
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
        parser.add_argument("--pair", choices=numbers.PAIRS, default="de-en")
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
        pairs = corpus.read_tsv(args.tsv)
    else:
        splits = numbers.number_splits(
            config.n_train,
            config.n_valid,
            config.n_test,
            config.max_digits,
            config.seed,
        )
        pairs, valid, test = (
            numbers.number_pairs(splits[name], config.pair)
            for name in ("train", "valid", "test")
        )
        tokenizers = train_tokenizers(pairs, config)  # distinct numbers
        at_least = round(config.digits_share * config.n_train)
        balanced = numbers.balance_digits(splits["train"], at_least)
        pairs = numbers.number_pairs(balanced, config.pair)
    checkpoints = path.with_name(path.stem + "-checkpoints")
    result = train(
        pairs, config, checkpoints, valid, tokenizers, progress=not args.quiet
    )
    if not is_main_process():
        return 0
    model, extra = average_checkpoints(result.checkpoints)  # on the CPU
    translator = Translator.from_model(model, extra)
    translator.save(path, config=asdict(config))
    translator.model.to(default_device())  # translates on the GPU if any
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
            f"no model at {path}; train one first: "
            f"{PROG} train --pair {args.pair}",
            file=sys.stderr,
        )
        return 2
    translator = Translator.load(path)
    translator.model.to(default_device())
    for line in translator.translate(
        args.texts, args.beam_size, args.length_penalty
    ):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
