"""What a checkpoint file must be before it is trusted (chapters 6 and 7).

:func:`~transformer_lite.training.checkpoint.load_checkpoint` calls these
in order: the archive (records stored inside the file, uncompressed), the
structure (the parts ``save_checkpoint`` writes), the config (fields this
version can build), the size (a limit before anything is allocated) and
the weights (names, shapes, floating dtypes, finite values, checked
against a model built on the meta device). ``check_plain`` is the
saving side: only what ``torch.load(weights_only=True)`` can read.
"""

import zipfile
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

import torch
from torch import Tensor

from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.schemes import scheme

__all__ = [
    "ADDED_FIELDS",
    "CHECKPOINT_FORMAT",
    "PARTS",
    "check_archive",
    "check_named_tensors",
    "check_plain",
    "check_size",
    "check_structure",
    "check_weights",
    "stored_config",
]

CHECKPOINT_FORMAT = "transformer-lite-checkpoint-1"  # tag in every file
PARTS = ("format", "config", "model", "optimizer", "scheduler", "extra")


# Tensor types the safe loader reads; nn.Parameter is stored as a tensor.
PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


def check_plain(value: object, where: str) -> None:
    """Raise unless ``torch.load(weights_only=True)`` can read ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain(key, f"a key of {where}")
            check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
    elif isinstance(value, Tensor) and type(value) not in PLAIN_TENSORS:
        raise ValueError(
            f"{where} is a {type(value).__name__}, a tensor subclass that "
            "torch.load(weights_only=True) cannot read back (a quantised "
            "model, for one): save the float model and quantise it after "
            "loading"
        )
    elif not isinstance(value, Tensor | str | int | float | bool | None):
        raise ValueError(
            f"{where} is a {type(value).__name__}; a checkpoint holds only "
            "tensors, numbers, strings and lists/tuples/dicts of them "
            "(save e.g. history.to_dict())"
        )


def check_archive(
    path: Path, *, kind: str = "checkpoint", saver: str = "save_checkpoint"
) -> None:
    """The file must be a zip archive (what ``torch.save`` writes) whose
    records are stored uncompressed inside the file: then reading it
    allocates no more than the file's size. ``kind`` and ``saver`` name
    the file and the function that writes it in the messages (a LoRA
    adapter, chapter 13, is read the same way)."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (
        zipfile.BadZipFile,
        OSError,
        ValueError,
        NotImplementedError,
    ) as err:  # NotImplementedError: a zip version or method zipfile lacks
        raise ValueError(
            f"cannot read {kind} {path} (corrupt, truncated, or not "
            f"saved by {saver}): {err}"
        ) from err
    for record in records:
        if (
            record.compress_type != zipfile.ZIP_STORED
            or record.file_size != record.compress_size
            or record.header_offset + record.compress_size > size
        ):
            raise ValueError(
                f"cannot read {kind} {path}: record {record.filename!r} "
                "is compressed or reaches past the end of the file "
                "(torch.save stores records uncompressed)"
            )


def check_structure(state: object, path: Path) -> None:
    """The parts :func:`save_checkpoint` writes, each of the right type."""
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a transformer-lite checkpoint")
    missing = [part for part in PARTS if part not in state]
    if missing:
        raise ValueError(f"checkpoint {path} lacks {', '.join(missing)}")
    kinds = dict(config=dict, model=dict, extra=dict)
    for part, kind in kinds.items():
        if not isinstance(state[part], kind):
            raise ValueError(
                f"checkpoint {path}: {part} is a "
                f"{type(state[part]).__name__}, expected a dict"
            )
    for part in ("optimizer", "scheduler"):
        if not isinstance(state[part], dict | None):
            raise ValueError(f"checkpoint {path}: {part} is not a dict")


# Config fields added after the checkpoint format began, each with the
# value that reproduces what a model saved before it computed: a file
# without the field is read with that value.
ADDED_FIELDS = {"position": "sinusoidal"}  # chapter 9's schemes


def stored_config(stored: dict, path: Path) -> TransformerConfig:
    """The config a checkpoint stores, every field known to this version;
    fields in ``ADDED_FIELDS`` may be absent (older files)."""
    stored = {**ADDED_FIELDS, **stored}
    names = {f.name for f in fields(TransformerConfig)}
    unknown = sorted(map(repr, set(stored) - names))
    missing = sorted(names - set(stored))
    if unknown or missing:
        raise ValueError(
            f"checkpoint {path} has a config this version cannot build "
            f"(unknown fields: {', '.join(unknown) or 'none'}; missing: "
            f"{', '.join(missing) or 'none'})"
        )
    try:
        return TransformerConfig(**stored)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {path} has a bad config: {err}") from err


def built_elements(config: TransformerConfig) -> int:
    """The tensor elements a config makes the model build that no
    checkpoint stores: the sinusoidal positional table (max_len x
    d_model, computed in float64 on building). Every other position
    scheme stores what it has, or has nothing of length max_len."""
    position = scheme(config.position)
    return position.elements_built(config.d_model, config.max_len)


def check_size(
    config: TransformerConfig, limit: int, built_limit: int | None, path: Path
) -> None:
    """Refuse a model larger than ``limit`` elements, or one that would
    build more than ``built_limit`` elements it does not store (a small
    file could ask for gigabytes through ``max_len``), before building;
    ``built_limit=None`` when the model exists already."""
    table = config.max_len * config.d_model  # the positional table
    elements = config.n_parameters() + table
    if elements > limit:
        raise ValueError(
            f"checkpoint {path} describes a model of {elements:,} tensor "
            f"elements ({config.n_parameters():,} parameters and a "
            f"positional table of {table:,}), more than the limit of "
            f"{limit:,}; pass max_elements={elements} to load it anyway"
        )
    built = built_elements(config)
    if built_limit is not None and built > built_limit:
        raise ValueError(
            f"checkpoint {path} describes a sinusoidal positional table "
            f"of {built:,} elements (max_len={config.max_len:,} x "
            f"d_model={config.d_model}), built on loading and stored "
            f"nowhere in the file: more than the limit of {built_limit:,} "
            f"for built tensors; pass max_built_elements={built} to load "
            "it anyway"
        )


def check_weights(weights: dict, config: TransformerConfig, path: Path):
    """Every stored tensor against the model the config describes: the
    same names, shapes, a floating dtype, finite values. The model is
    built on the meta device, which allocates no memory."""
    for stack in ("encoder", "decoder"):
        prefix = f"{stack}.layers."
        layers = {
            name[len(prefix) :].split(".")[0]
            for name in weights
            if isinstance(name, str) and name.startswith(prefix)
        }
        if layers != {str(i) for i in range(config.n_layers)}:
            raise ValueError(
                f"checkpoint {path} holds {len(layers)} {stack} layers, "
                f"its config says n_layers={config.n_layers}"
            )
    with torch.device("meta"):
        expected = Transformer(config).state_dict()
    check_named_tensors(
        weights, expected, f"checkpoint {path}", "the weights its config "
        "describes"
    )  # fmt: skip


def check_named_tensors(
    stored: dict, expected: Mapping[str, Tensor], file: str, needs: str
) -> None:
    """``stored`` holds the names of ``expected``, no more and no fewer,
    each a strided floating tensor of the expected shape with finite
    values; else a ``ValueError`` that names the ``file`` and what it
    ``needs`` (a checkpoint's weights, an adapter's tensors)."""
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected), key=str)
    if missing or unexpected:
        raise ValueError(
            f"{file} does not hold {needs}: "
            f"missing {missing[:5]}{'...' * (len(missing) > 5)}, "
            f"unexpected {unexpected[:5]}{'...' * (len(unexpected) > 5)}"
        )
    for name, want in expected.items():
        got = stored[name]
        if (
            not isinstance(got, Tensor)
            or got.layout != torch.strided
            or not got.dtype.is_floating_point
            or got.shape != want.shape
        ):
            what = (
                f"{got.dtype} {got.layout} tensor of shape {tuple(got.shape)}"
                if isinstance(got, Tensor)
                else type(got).__name__
            )
            raise ValueError(
                f"{file}: {name} is a {what}, expected a floating tensor "
                f"of shape {tuple(want.shape)}"
            )
        if not torch.isfinite(got).all():
            raise ValueError(f"{file}: {name} holds NaN or inf")
