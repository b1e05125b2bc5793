"""What LoRA's settings, its targets in a model, and an adapter file
must be before they are trusted (chapter 13).

:func:`~transformer_lite.adapt.lora.add_lora` checks its numbers and
names here, and finds its targets: ``nn.Linear`` layers, each in one
place only and tied to no other parameter, none too narrow for the
rank. :func:`~transformer_lite.adapt.lora.load_adapter` calls the rest
in order: the file (a zip archive whose records lie inside it
uncompressed, read with ``torch.load(weights_only=True)``, holding the
parts ``save_adapter`` writes), its settings (of the right types, equal
to the model's), the adapted layers' shapes and the tensors (the names
the model needs, floating, of the model's shapes, finite). Nothing is
copied into the model until all of them have passed.
"""

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from transformer_lite.checks import check_int, check_real
from transformer_lite.training.checkpoint_checks import (
    check_archive,
    check_named_tensors,
)

__all__ = [
    "ADAPTER_FORMAT",
    "FREE_SETTINGS",
    "PARTS",
    "SETTINGS",
    "add_lora_call",
    "check_names",
    "check_rank_and_scale",
    "check_rank_fits",
    "check_settings",
    "check_shapes",
    "check_tensors",
    "check_trainable",
    "check_untied",
    "find_targets",
    "is_under",
    "parameters_under",
    "read_adapter",
    "stored_settings",
]

ADAPTER_FORMAT = "transformer-lite-lora-adapter-1"  # tag in every file
PARTS = ("format", "settings", "shapes", "tensors")
# The fields of LoRASettings, as an adapter file stores them.
SETTINGS = ("r", "alpha", "dropout", "targets", "trainable", "replaced")
# Settings an adapter may differ in from the model it is loaded into:
# they change training, not the function the weights compute.
FREE_SETTINGS = ("dropout",)


def check_rank_and_scale(r: object, alpha: object, dropout: object) -> None:
    """The three numbers of LoRA: r a positive int, alpha a positive
    number, dropout in [0, 1)."""
    check_int("r", r, low=1)
    if check_real("alpha", alpha) <= 0:
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)


def check_names(what: str, names: object) -> tuple[str, ...]:
    """``names``, a list of non-empty strings, sorted and each once."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValueError(
            f"{what} must be a list of names such as ('w_q', 'w_v'), "
            f"got {names!r}"
        )
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{what} must hold non-empty strings, got {name!r}"
            )
    return tuple(sorted(set(names)))


def check_rank_fits(name: str, layer: nn.Linear, r: int) -> None:
    """B A has rank at most min(in, out): a larger r adds parameters
    that can express nothing more."""
    most = min(layer.in_features, layer.out_features)
    if r > most:
        raise ValueError(
            f"r={r} is larger than {name} allows: its update B A has rank "
            f"at most min(in_features={layer.in_features}, "
            f"out_features={layer.out_features}) = {most}"
        )


def is_under(name: str, prefix: str) -> bool:
    """Whether qualified name ``name`` is ``prefix`` or lies inside it."""
    return name == prefix or name.startswith(prefix + ".")


def find_targets(
    model: nn.Module, targets: tuple[str, ...]
) -> list[tuple[str, nn.Module, str, nn.Linear]]:
    """(qualified name, parent, attribute, layer) of every module whose
    attribute name is in ``targets``, in the order of
    ``named_modules``; each must be an ``nn.Linear`` that appears in one
    place only, and every target must be found."""
    modules = dict(model.named_modules(remove_duplicate=False))
    places, linears, seen = [], set(), {}
    for name, module in modules.items():
        parent_name, _, attr = name.rpartition(".")
        if not name:
            continue  # the model itself
        if isinstance(module, nn.Linear):
            linears.add(attr)
        if attr not in targets:
            continue
        if not isinstance(module, nn.Linear):
            raise ValueError(
                f"target {attr!r} names {name}, a "
                f"{type(module).__name__}; LoRA adapts nn.Linear layers"
            )
        if id(module) in seen:
            raise ValueError(
                f"{name} is the same layer as {seen[id(module)]}: a layer "
                "shared by two places cannot be adapted in one"
            )
        seen[id(module)] = name
        places.append((name, modules[parent_name], attr, module))
    missing = [t for t in targets if t not in {p[2] for p in places}]
    if missing:
        raise ValueError(
            f"no layer named {', '.join(map(repr, missing))} in the model; "
            "its nn.Linear layers are named: "
            f"{', '.join(sorted(linears)) or 'none'}"
        )
    return places


def check_untied(model: nn.Module, places: list) -> None:
    """Refuse a target whose weight or bias is also another parameter
    of the model (a language model's output layer tied to its
    embedding): merging the update would change both."""
    where: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        where.setdefault(id(p), []).append(name)
    for name, _, attr, layer in places:
        for p in layer.parameters():
            others = [n for n in where[id(p)] if not is_under(n, name)]
            if others:
                raise ValueError(
                    f"{name} shares a tensor with {others[0]} (tied "
                    "weights): merging its update would change both; "
                    f"leave {attr!r} out of targets or untie the weights"
                )


def parameters_under(
    model: nn.Module, prefixes: tuple[str, ...]
) -> dict[str, nn.Parameter]:
    """Every parameter whose qualified name lies under one of
    ``prefixes``; a shared (tied) tensor once, under its first name
    there."""
    found, seen = {}, set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in seen and any(is_under(name, x) for x in prefixes):
            seen.add(id(p))
            found[name] = p
    return found


def check_trainable(
    model: nn.Module, trainable: tuple[str, ...], adapted: list[str]
) -> None:
    """Each name must reach a parameter and must not reach (or lie
    inside) a layer that LoRA adapts: its weight stays frozen."""
    for prefix in trainable:
        if not parameters_under(model, (prefix,)):
            children = ", ".join(n for n, _ in model.named_children())
            raise ValueError(
                f"trainable name {prefix!r} matches no parameter of the "
                f"model; its modules are: {children or 'none'}"
            )
        for name in adapted:
            if is_under(name, prefix) or is_under(prefix, name):
                raise ValueError(
                    f"trainable name {prefix!r} covers {name}, which LoRA "
                    "adapts (its weight stays frozen); name the modules "
                    "to train one by one"
                )


def read_adapter(path: Path) -> dict:
    """The file's parts, each a dict, or a ``ValueError`` naming what is
    wrong (no file, not an archive, truncated, another kind of file)."""
    if not path.is_file():
        raise ValueError(f"no adapter file at {path}")
    check_archive(path, kind="adapter", saver="save_adapter")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a bad file
        raise ValueError(
            f"cannot read adapter {path} (corrupt, truncated, or not "
            f"saved by save_adapter): {err}"
        ) from err
    if not isinstance(state, dict) or state.get("format") != ADAPTER_FORMAT:
        raise ValueError(
            f"{path} is not a transformer-lite LoRA adapter (save_adapter "
            "writes one; a model checkpoint is loaded by load_checkpoint)"
        )
    for part in PARTS[1:]:
        if not isinstance(state.get(part), dict):
            raise ValueError(
                f"adapter {path}: its {part} are missing or not a dict"
            )
    return state


def stored_settings(stored: dict, path: Path) -> dict:
    """The file's settings, every field present and of its type: r an
    int, alpha and dropout numbers, the names lists of strings (the
    adapted layers in the model's order, the others sorted)."""
    if sorted(map(str, stored)) != sorted(SETTINGS):
        raise ValueError(
            f"adapter {path}: its settings hold {sorted(map(str, stored))}, "
            f"expected {sorted(SETTINGS)}"
        )
    try:
        check_rank_and_scale(stored["r"], stored["alpha"], stored["dropout"])
        for name in ("targets", "trainable", "replaced"):
            check_names(name, stored[name])
    except ValueError as err:
        raise ValueError(f"adapter {path} has bad settings: {err}") from err
    settings = {name: stored[name] for name in SETTINGS}
    for name in ("alpha", "dropout"):
        settings[name] = float(settings[name])
    for name in ("targets", "trainable", "replaced"):
        settings[name] = list(settings[name])
    return settings


def add_lora_call(settings: dict) -> str:
    """The call that prepares a model as ``settings`` describe."""
    return (
        f"add_lora(model, r={settings['r']}, alpha={settings['alpha']}, "
        f"targets={tuple(settings['targets'])}, "
        f"trainable={tuple(settings['trainable'])})"
    )


def check_settings(file: dict, model: dict, path: Path) -> None:
    """The file's settings (from :func:`stored_settings`) against the
    model's (``LoRASettings.to_dict()``); ``FREE_SETTINGS`` may differ."""
    differ = [
        f"{name}: file {file[name]!r}, model {model[name]!r}"
        for name in SETTINGS
        if name not in FREE_SETTINGS and file[name] != model[name]
    ]
    if differ:
        raise ValueError(
            f"adapter {path} was made for another adaptation: "
            + "; ".join(differ)
            + f" (it needs {add_lora_call(file)})"
        )


def check_shapes(stored: dict, shapes: dict, path: Path) -> None:
    """[in_features, out_features] of every adapted layer, as the
    model's (``shapes``)."""
    differ = [
        f"{name}: file {stored.get(name)!r}, model {shape}"
        for name, shape in shapes.items()
        if not isinstance(stored.get(name), list) or stored[name] != shape
    ]
    differ += [
        f"{name}: file {stored[name]!r}, not a layer of the model"
        for name in stored
        if name not in shapes
    ]
    if differ:
        raise ValueError(
            f"adapter {path} was made for layers of other sizes "
            f"([in_features, out_features]): {'; '.join(differ)}"
        )


def check_tensors(stored: dict, want: dict[str, Tensor], path: Path) -> None:
    """The names the model needs (``want``), no more and no fewer, each
    a strided floating tensor of the model's shape with finite values."""
    check_named_tensors(
        stored, want, f"adapter {path}", "the tensors the model needs"
    )
