"""Checkpoints (chapters 6 and 7): save and load a model with its
optimizer and scheduler, readable with ``torch.load(weights_only=True)``,
and average the last checkpoints of a run.

A checkpoint may come from anywhere, so :func:`load_checkpoint` trusts
nothing in it: ``weights_only=True`` runs no code, the archive's records
must lie inside the file uncompressed (a few bytes cannot ask for
gigabytes), and the stored config and every tensor's shape and dtype are
checked, and the model's size held to a limit, before a model is built.
Saving writes a fresh temporary file beside the target, flushes it to
disk and renames it over the target in one step.
"""

import contextlib
import copy
import functools
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from transformer_lite.checks import check_int
from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.training.checkpoint_checks import (
    CHECKPOINT_FORMAT,
    check_archive,
    check_plain,
    check_size,
    check_structure,
    check_weights,
    stored_config,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "FREE_FIELDS",
    "MAX_BUILT_ELEMENTS",
    "MAX_ELEMENTS",
    "average_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
    "write_atomically",
]

# Config fields a checkpoint may differ in: they change training, not the
# function the weights compute.
FREE_FIELDS = ("dropout",)
# The largest model load_checkpoint builds unless told otherwise, in
# tensor elements (parameters and positional table): 1 GiB of float32,
# room for the paper's big model (213 million parameters).
MAX_ELEMENTS = 2**28
# The most elements a checkpoint's config may make the model build that
# the file does not store (the sinusoidal table): 64 MiB of float32, the
# table of max_len = 16,384 at d_model = 1,024. Building it in float64
# needs about five times that at its peak.
MAX_BUILT_ELEMENTS = 2**24
_UMASK = os.umask(0o022)  # read once, at import, while single-threaded
os.umask(_UMASK)


def save_checkpoint(
    path: str | os.PathLike,
    model: Transformer,
    optimizer: Optimizer | None = None,
    scheduler: LRScheduler | None = None,
    **extra: object,
) -> None:
    """Save the model's config and weights, optimizer and scheduler state,
    and ``extra`` plain data (epoch, history.to_dict(), ...) to ``path``.

    Only plain containers and tensors are stored, so the file loads with
    ``torch.load(path, weights_only=True)``. It is written to a new,
    uniquely named file in the same directory (never an existing path,
    so never through a planted link), flushed to disk, then renamed over
    ``path``: a reader sees the old file or the new one, never half of
    one, and a failed save leaves nothing behind.
    """
    if not isinstance(getattr(model, "config", None), TransformerConfig):
        raise ValueError("model must have a TransformerConfig as .config")
    state = {
        "format": CHECKPOINT_FORMAT,
        "config": model.config.to_dict(),
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "extra": extra,
    }
    check_plain(state, "checkpoint")
    write_atomically(Path(path), functools.partial(torch.save, state))


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(file)`` on a new, uniquely named file in ``path``'s
    directory, flush it to disk and rename it over ``path``: a reader sees
    the old file or the new one, never half of one; a planted link at
    ``path`` is replaced, never followed; a failure leaves nothing."""
    if path.is_dir():
        raise ValueError(f"cannot write {path}: it is a directory")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"cannot save {path}: no directory {folder}")
    fd, temporary = tempfile.mkstemp(
        dir=folder, prefix=f".{path.name}.", suffix=".tmp"
    )  # O_EXCL: a new file, whatever already exists
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the data on disk before the rename
        os.chmod(temporary, 0o666 & ~_UMASK)  # as open() would create it
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself, on disk
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def load_checkpoint(
    path: str | os.PathLike,
    model: Transformer | None = None,
    optimizer: Optimizer | None = None,
    scheduler: LRScheduler | None = None,
    map_location: torch.device | str | None = None,
    *,
    max_elements: int = MAX_ELEMENTS,
    max_built_elements: int = MAX_BUILT_ELEMENTS,
) -> tuple[Transformer, dict]:
    """Load a file written by :func:`save_checkpoint`, trusting nothing
    in it (the module docstring says what is checked).

    With ``model=None`` the model is rebuilt from the stored config (on
    ``map_location``, default CPU), once the config, every tensor and the
    model's size (at most ``max_elements`` parameters and positional
    table entries, of which at most ``max_built_elements`` built rather
    than stored) have been checked; a given model must have the same
    config except for ``FREE_FIELDS``. The optimizer and scheduler, when
    given, get their saved state. Anything wrong (a missing, corrupt,
    truncated, foreign or oversized file, another configuration) raises
    a ``ValueError`` that names it; no file is written.

    Returns:
        ``(model, extra)``: the model and the extra data that was saved.
    """
    path = Path(path)
    check_int("max_elements", max_elements, low=1)
    check_int("max_built_elements", max_built_elements, low=1)
    if model is not None and not isinstance(model, Transformer):
        raise ValueError(f"model must be a Transformer, got {type(model)}")
    if not path.is_file():
        raise ValueError(f"no checkpoint file at {path}")
    if map_location is None:
        map_location = "cpu" if model is None else model.device
    check_archive(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many kinds for a bad file
        raise ValueError(
            f"cannot read checkpoint {path} (corrupt, truncated, or not "
            f"saved by save_checkpoint): {err}"
        ) from err
    check_structure(state, path)
    config = stored_config(state["config"], path)
    if model is not None:
        differ = [
            f"{name}: checkpoint {value!r}, model "
            f"{getattr(model.config, name)!r}"
            for name, value in config.to_dict().items()
            if name not in FREE_FIELDS and getattr(model.config, name) != value
        ]
        if differ:
            raise ValueError(
                f"checkpoint {path} was saved from another configuration: "
                + "; ".join(differ)
            )
    built_limit = max_built_elements if model is None else None
    check_size(config, max_elements, built_limit, path)
    check_weights(state["model"], config, path)
    if model is None:
        model = Transformer(config).to(map_location)
    model.load_state_dict(state["model"])
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        if target is not None:
            if state[name] is None:
                raise ValueError(f"checkpoint {path} holds no {name} state")
            try:
                target.load_state_dict(state[name])
            except (KeyError, ValueError, TypeError, RuntimeError) as err:
                raise ValueError(
                    f"checkpoint {path}: its {name} state does not fit the "
                    f"given {name}: {err!r}"
                ) from err
    return model, state["extra"]


def average_checkpoints(
    paths: Iterable[str | os.PathLike],
    map_location: torch.device | str | None = None,
    *,
    max_elements: int = MAX_ELEMENTS,
    max_built_elements: int = MAX_BUILT_ELEMENTS,
) -> tuple[Transformer, dict]:
    """One model whose weights are the mean of those in ``paths``
    (chapter 7), as Vaswani et al. (2017) average the last checkpoints of
    a run: the mean of the weights along the end of the trajectory sits
    nearer the minimum than any one of them.

    Every file must come from :func:`save_checkpoint` with the same
    configuration (except ``FREE_FIELDS``). Integer tensors (none in a
    Transformer) are taken from the last file.

    Returns:
        ``(model, extra)``: the averaged model, rebuilt as by
        :func:`load_checkpoint`, and the last file's extra data.
    """
    if isinstance(paths, str | bytes | os.PathLike):
        raise ValueError(
            f"paths must be a list of paths, got one: {paths!r}; "
            "pass [path] to load a single checkpoint"
        )
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one path")
    model, extra = load_checkpoint(
        paths[-1],
        map_location=map_location,
        max_elements=max_elements,
        max_built_elements=max_built_elements,
    )
    state = {k: v.clone() for k, v in model.state_dict().items()}
    floats = [k for k, v in state.items() if v.is_floating_point()]
    for path in paths[:-1]:
        other, _ = load_checkpoint(path, model=copy.deepcopy(model))
        for key in floats:
            state[key] += other.state_dict()[key]
    for key in floats:
        state[key] /= len(paths)
    model.load_state_dict(state)
    return model, extra
