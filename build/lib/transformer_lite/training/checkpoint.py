"""Checkpoints (chapters 6 and 7): save and load a model with its
optimizer and scheduler, readable with ``torch.load(weights_only=True)``,
and average the last checkpoints of a run.
"""

import copy
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from transformer_lite.model import Transformer, TransformerConfig

__all__ = [
    "CHECKPOINT_FORMAT",
    "FREE_FIELDS",
    "average_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_FORMAT = "transformer-lite-checkpoint-1"  # tag in every file
# Config fields a checkpoint may differ in: they change training, not the
# function the weights compute.
FREE_FIELDS = ("dropout",)


def _check_plain(value: object, where: str) -> None:
    """Raise unless ``torch.load(weights_only=True)`` can read ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, f"a key of {where}")
            _check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif not isinstance(value, Tensor | str | int | float | bool | None):
        raise ValueError(
            f"{where} is a {type(value).__name__}; a checkpoint holds only "
            "tensors, numbers, strings and lists/tuples/dicts of them "
            "(save e.g. history.to_dict())"
        )


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
    ``torch.load(path, weights_only=True)``; it is written to a temporary
    file first, so an interrupted save leaves any old file intact.
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
    _check_plain(state, "checkpoint")
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def _stored_config(stored: dict, path: Path) -> TransformerConfig:
    try:
        return TransformerConfig(**stored)
    except TypeError as err:
        raise ValueError(
            f"checkpoint {path} has a config this version cannot build "
            f"({err}); stored config: {stored}"
        ) from err


def load_checkpoint(
    path: str | os.PathLike,
    model: Transformer | None = None,
    optimizer: Optimizer | None = None,
    scheduler: LRScheduler | None = None,
    map_location: torch.device | str | None = None,
) -> tuple[Transformer, dict]:
    """Load a file written by :func:`save_checkpoint`.

    With ``model=None`` the model is rebuilt from the stored config (on
    ``map_location``, default CPU); a given model must have the same
    config except for ``FREE_FIELDS``. The optimizer and scheduler, when
    given, get their saved state. A missing or corrupt file or another
    configuration raises ``ValueError`` saying what is wrong.

    Returns:
        ``(model, extra)``: the model and the extra data that was saved.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint file at {path}")
    if map_location is None:
        map_location = "cpu" if model is None else model.device
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many kinds for a bad file
        raise ValueError(
            f"cannot read checkpoint {path} (corrupt, truncated, or not "
            f"saved by save_checkpoint): {err}"
        ) from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a transformer-lite checkpoint")
    config = _stored_config(state["config"], path)
    if model is None:
        model = Transformer(config).to(map_location)
    differ = [
        f"{name}: checkpoint {value!r}, model {getattr(model.config, name)!r}"
        for name, value in config.to_dict().items()
        if name not in FREE_FIELDS and getattr(model.config, name) != value
    ]
    if differ:
        raise ValueError(
            f"checkpoint {path} was saved from another configuration: "
            + "; ".join(differ)
        )
    model.load_state_dict(state["model"])
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        if target is not None:
            if state[name] is None:
                raise ValueError(f"checkpoint {path} holds no {name} state")
            target.load_state_dict(state[name])
    return model, state["extra"]


def average_checkpoints(
    paths: Iterable[str | os.PathLike],
    map_location: torch.device | str | None = None,
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
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one path")
    model, extra = load_checkpoint(paths[-1], map_location=map_location)
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
