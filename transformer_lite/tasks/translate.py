"""The translator's command line (chapter 7)::

    python -m transformer_lite.tasks.translate train [--pair de-en|fr-en]
    python -m transformer_lite.tasks.translate text "dreihundertzwölf"
    python -m transformer_lite.tasks.translate "dreihundertzwölf"
    torchrun --nproc_per_node=2 -m transformer_lite.tasks.translate train
    python -m transformer_lite.tasks.translate export
    python -m transformer_lite.tasks.translate --runtime onnx "zwölf"

The first word is the command, ``train``, ``export`` or ``text`` (the
default: the words are the texts to translate); options may come before
or after it. ``export`` writes the model's ONNX graphs next to it
(``de-en.encoder.onnx``, ``de-en.cross.onnx``, ``de-en.step.onnx``;
chapter 12), and ``--runtime onnx`` translates with them in ONNX
Runtime instead of PyTorch.
The model is saved to ``--model-dir`` (default: ``$XDG_CACHE_HOME`` or
``~/.cache``, then ``transformer-lite/``) as ``de-en.pt`` or ``fr-en.pt``,
with its two tokenizers inside, and the checkpoints it averages in
``de-en-checkpoints/``; ``--model FILE`` names another file. ``--tsv
FILE`` trains on a corpus of ``source<TAB>target`` lines instead.
Every field of :class:`~transformer_lite.tasks.trainer.TranslateConfig`
is an option (``--steps 300``).

Every option is checked before any work starts. An error is one line on
stderr and exit status 2, never a traceback. A text that cannot be
translated (too long for the model, say, or not a number word of the
trained range) gets its reason on stderr and an empty line on stdout, so
that output line i still answers text i; the others are translated, and
the exit status is 1. So does a translation that does not round-trip
(read as a number, written out in the source language, it must give the
text again): ``--unchecked`` prints what the model says instead.
"""

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

import torch

from transformer_lite.device import default_device
from transformer_lite.shipping.export import (
    export_onnx,
    manifest_path,
    onnx_paths,
    weights_fingerprint,
)
from transformer_lite.shipping.runtime import OnnxTransformer
from transformer_lite.tasks import corpus, numbers
from transformer_lite.tasks.metrics import scores
from transformer_lite.tasks.slices import (
    number_slices,
    score_slices,
    slice_table,
)
from transformer_lite.tasks.trainer import (
    TranslateConfig,
    default_model_dir,
    train,
    train_tokenizers,
    training_numbers,
)
from transformer_lite.tasks.translator import Translator
from transformer_lite.training.checkpoint import average_checkpoints
from transformer_lite.training.distributed import is_main_process

__all__ = ["main"]

PROG = "python -m transformer_lite.tasks.translate"
COMMANDS = ("train", "export", "text")
RUNTIMES = ("torch", "onnx")
TEXT_OPTIONS = {
    "beam_size": 4,
    "length_penalty": 0.6,
    "runtime": "torch",
    "unchecked": False,
}
TRAIN_ONLY = {f.name for f in fields(TranslateConfig)} - {"pair"}
TRAIN_ONLY |= {"tsv", "quiet"}


class UsageError(Exception):
    """A bad command line; main prints it as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    """Options of both commands; those of one command default to
    SUPPRESS, so that main can tell which were given."""
    parser = _Parser(
        prog=PROG,
        description="Train a translator of number words (train), "
        "export it to ONNX (export), or translate texts with a trained "
        "one (text, the default).",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "words",
        nargs="*",
        default=[],
        help="train | export | text TEXT ... | TEXT",
    )
    parser.add_argument("--pair", choices=numbers.PAIRS, default="de-en")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=default_model_dir(),
        help="where models live (default: %(default)s)",
    )
    parser.add_argument(
        "--model", type=Path, help="the model file (MODEL_DIR/PAIR.pt)"
    )
    text = parser.add_argument_group("text (translating)")
    text.add_argument("--beam-size", type=int, help="default: 4")
    text.add_argument("--length-penalty", type=float, help="default: 0.6")
    text.add_argument(
        "--runtime",
        choices=RUNTIMES,
        help="torch (default), or onnx: the files written by export",
    )
    text.add_argument(
        "--unchecked",
        action="store_true",
        help="print the model's answers even outside its domain and "
        "when they do not round-trip",
    )
    fit = parser.add_argument_group("train")
    fit.add_argument(
        "--tsv",
        type=Path,
        help="train on this corpus (source<TAB>target lines) instead of "
        "number words",
    )
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    for f in fields(TranslateConfig):
        if f.name == "pair":
            continue
        option = "--" + f.name.replace("_", "-")
        how = {"help": f"default: {f.default}"}
        if isinstance(f.default, bool):
            fit.add_argument(
                option, action=argparse.BooleanOptionalAction, **how
            )
        else:
            fit.add_argument(option, type=type(f.default), **how)
    return parser


def _parse(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """The command and its options, checked against each other."""
    args = _parser().parse_intermixed_args(argv)
    words = args.words
    command = words.pop(0) if words and words[0] in COMMANDS else "text"
    given = set(vars(args))
    wrong = (
        given
        & {
            "text": TRAIN_ONLY,
            "train": set(TEXT_OPTIONS),
            "export": TRAIN_ONLY | set(TEXT_OPTIONS),
        }[command]
    )
    if wrong:
        options = ", ".join(sorted("--" + w.replace("_", "-") for w in wrong))
        raise UsageError(f"{options}: not an option of {command!r}")
    if command in ("train", "export") and words:
        raise UsageError(f"{command} takes no texts, got {words[0]!r}")
    if command == "text" and not words:
        raise UsageError(
            f"nothing to translate; try {PROG} text TEXT, or {PROG} "
            "train to train a model"
        )
    for name, default in TEXT_OPTIONS.items():
        if name not in args:
            setattr(args, name, default)
    return command, args


def _train_command(args: argparse.Namespace) -> int:
    config = TranslateConfig(
        **{
            f.name: getattr(args, f.name)
            for f in fields(TranslateConfig)
            if hasattr(args, f.name)
        }
    )
    tsv = getattr(args, "tsv", None)
    name = config.pair if tsv is None else tsv.stem
    path = args.model if "model" in args else args.model_dir / f"{name}.pt"
    if path.is_dir():
        raise ValueError(f"--model {path} is a directory, not a file")
    valid = test = tokenizers = None
    if tsv is not None:
        pairs = corpus.read_tsv(tsv)
    else:
        splits = numbers.number_splits(
            config.n_train,
            config.n_valid,
            config.n_test,
            config.max_digits,
            config.seed,
        )
        pairs, valid, test = (
            numbers.number_pairs(splits[split], config.pair)
            for split in ("train", "valid", "test")
        )
        tokenizers = train_tokenizers(pairs, config)  # distinct numbers
        pairs = numbers.number_pairs(
            training_numbers(splits, config), config.pair
        )
    checkpoints = path.with_name(path.stem + "-checkpoints")
    quiet = getattr(args, "quiet", False)
    result = train(
        pairs, config, checkpoints, valid, tokenizers, progress=not quiet
    )
    if not is_main_process():
        return 0
    model, extra = average_checkpoints(result.checkpoints)  # on the CPU
    translator = Translator.from_model(model, extra)
    if tsv is None:  # a translator of number words knows its domain
        translator.domain = numbers.NumberDomain(
            config.pair, config.max_digits
        )
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
        families = number_slices(
            splits,
            size=config.slice_size,
            max_digits=config.max_digits,
            seed=config.seed,
        )
        scored = score_slices(translator, families, pair=config.pair)
        print("exact match by family of held-out numbers:")
        print(slice_table(scored))
    return 0


def _model_path(args: argparse.Namespace) -> Path:
    """The trained model's file; a ``ValueError`` if there is none."""
    path = (
        args.model if "model" in args else args.model_dir / f"{args.pair}.pt"
    )
    if not Path(path).is_file():
        raise ValueError(
            f"no model at {path}; train one first: "
            f"{PROG} train --pair {args.pair}"
        )
    return Path(path)


def _export_command(args: argparse.Namespace) -> int:
    path = _model_path(args)
    translator = Translator.load(path, map_location="cpu")
    paths = export_onnx(translator.model, path.parent, stem=path.stem)
    written = [*paths.values(), manifest_path(path.parent, path.stem)]
    print("\n".join(f"wrote {p}" for p in written))
    return 0


def _onnx_translator(path: Path) -> Translator:
    """The translator at ``path`` with its model replaced by the
    exported graphs next to it, run in ONNX Runtime on the CPU."""
    paths = onnx_paths(path.parent, path.stem).values()
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ValueError(
            f"no ONNX file at {missing[0]}; export the model first: "
            f"{PROG} export --model {path}"
        )
    translator = Translator.load(path, map_location="cpu")
    graphs = OnnxTransformer(
        path.parent,
        translator.model.config,
        stem=path.stem,
        weights=weights_fingerprint(translator.model),
    )
    tokenizers = translator.src_tokenizer, translator.tgt_tokenizer
    return Translator(graphs, *tokenizers, domain=translator.domain)


def _text_command(args: argparse.Namespace) -> int:
    path = _model_path(args)
    if args.runtime == "onnx":
        translator = _onnx_translator(path)
    else:
        translator = Translator.load(path)
        translator.model.to(default_device())
    if args.unchecked:
        translator.domain = None
    texts = args.words
    problems = {i: translator.problem(text) for i, text in enumerate(texts)}
    reasons = {  # text i -> why its line is empty
        i: f"cannot translate: {why}"
        for i, why in problems.items()
        if why is not None
    }
    good = [i for i, why in problems.items() if why is None]
    out = [""] * len(texts)
    if good:
        translated = translator.translate(
            [texts[i] for i in good], args.beam_size, args.length_penalty
        )
        for i, line in zip(good, translated, strict=True):
            doubt = translator.doubt(texts[i], line)
            if doubt is None:
                out[i] = line
            else:
                reasons[i] = f"cannot trust the translation: {doubt}"
    for i in sorted(reasons):
        _say(f"text {i + 1} ({texts[i][:40]!r}): {reasons[i]}")
    print("\n".join(out))
    return 1 if reasons else 0


def _say(message: str) -> None:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0: done, 1: some texts
    not translated, 2: an error, 130: interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        command, args = _parse(argv)
        if command == "train":
            return _train_command(args)
        if command == "export":
            return _export_command(args)
        return _text_command(args)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except (UsageError, ValueError, OSError, FloatingPointError) as err:
        _say(str(err))
        return 2
    except Exception as err:  # a bug: still one line, never a traceback
        _say(f"unexpected {type(err).__name__}: {err}")
        return 2
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
