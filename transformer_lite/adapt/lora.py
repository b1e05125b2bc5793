"""LoRA: a small trainable update to the linear layers of a frozen model
(chapter 13).

Hu et al. (2021) keep a trained layer y = x W^T + b as it is and learn
a change of rank r beside it:

.. math::

    y = x W^\\top + b + \\frac{\\alpha}{r}\\,
        \\mathrm{dropout}(x)\\, A^\\top B^\\top,
    \\qquad A \\in \\mathbb{R}^{r \\times d_{in}},\\;
    B \\in \\mathbb{R}^{d_{out} \\times r}

B starts at zero, so the adapted model starts as the base model,
exactly; only A and B learn, r (d_in + d_out) numbers a layer instead
of d_in d_out, together with any module named ``trainable`` (a new
classification head). After training, W' = W + (alpha / r) B A folds
the update into the layer (:func:`merge_lora`), and inference costs
nothing more than the base model's.

:func:`add_lora` adapts a model in place; :func:`save_adapter` writes
only what was trained, and :func:`load_adapter` reads it into a model
prepared the same way, trusting nothing in the file (the archive check
of :mod:`~transformer_lite.training.checkpoint_checks`, then the
settings, names, shapes and dtypes, before anything is copied).
"""

import functools
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lite.adapt.lora_checks import (
    ADAPTER_FORMAT,
    add_lora_call,
    check_names,
    check_rank_and_scale,
    check_rank_fits,
    check_settings,
    check_shapes,
    check_tensors,
    check_trainable,
    check_untied,
    find_targets,
    parameters_under,
    read_adapter,
    stored_settings,
)
from transformer_lite.training.checkpoint import write_atomically
from transformer_lite.training.checkpoint_checks import check_plain

__all__ = [
    "ADAPTER_FORMAT",
    "LoRALinear",
    "LoRASettings",
    "adapter_tensors",
    "add_lora",
    "count_parameters",
    "load_adapter",
    "lora_layers",
    "merge_lora",
    "remove_lora",
    "save_adapter",
    "unmerge_lora",
]


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` and a trainable low-rank update beside it:
    y = base(x) + (alpha / r) dropout(x) A^T B^T.

    The start: B = 0, so the layer computes what ``base`` computes, bit
    for bit. A must not be zero too, or neither would get a gradient
    (B's is proportional to A x, A's to B). Hu et al. draw A from a
    Gaussian whose width they do not state; their released code, and
    PEFT, draw it as PyTorch draws an ``nn.Linear`` weight (Kaiming-
    uniform with a = sqrt(5)), uniform in +-1/sqrt(in_features), which
    is what we do: A x then has the scale of the model's other
    projections of the same input, whatever r is. The scale alpha / r
    is Hu et al.'s: with Adam, changing r then needs little retuning.

    Args:
        base: the layer to adapt. Its parameters are frozen
            (``requires_grad=False``) and used in place, not copied; A
            and B are made on its device, in its dtype, and the layer
            takes its mode (training or eval).
        r: the rank of the update, at most min(in, out).
        alpha: the update is scaled by alpha / r.
        dropout: on the update's input only (the base layer sees x).

    Attributes:
        lora_a: A, (r, in). lora_b: B, (out, r). scaling: alpha / r.
        merged: True while the update is folded into ``base.weight``
            (:meth:`merge`); the forward pass is then ``base`` alone.

    Shape:
        x: (..., in); output: (..., out).
    """

    def __init__(
        self,
        base: nn.Linear,
        r: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(
                f"base must be an nn.Linear, got {type(base).__name__}"
            )
        check_rank_and_scale(r, alpha, dropout)
        check_rank_fits("the base layer", base, r)
        self.base = base.requires_grad_(False)
        self.r = r
        self.alpha = float(alpha)
        self.scaling = self.alpha / r
        like = dict(device=base.weight.device, dtype=base.weight.dtype)
        bound = 1 / base.in_features**0.5  # as nn.Linear draws its weight
        a = torch.empty(r, base.in_features, **like).uniform_(-bound, bound)
        self.lora_a = nn.Parameter(a)  # (r, in)
        self.lora_b = nn.Parameter(
            torch.zeros(base.out_features, r, **like)
        )  # (out, r): zero, so the layer starts as the base layer
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False
        self.train(base.training)  # in a model in eval mode, eval too

    def delta_weight(self) -> Tensor:
        """(alpha / r) B A, the update as a change of ``base.weight``:
        (out, in)."""
        return self.scaling * (self.lora_b @ self.lora_a)  # (out, in)

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)  # (..., out)
        if self.merged:
            if self.training and torch.is_grad_enabled():
                raise ValueError(
                    "this LoRA layer is merged: its update is inside "
                    "base.weight and lora_a, lora_b would get no gradient; "
                    "unmerge it (unmerge_lora) before training"
                )
            return y
        h = F.linear(self.dropout(x), self.lora_a)  # (..., r)
        return y + self.scaling * F.linear(h, self.lora_b)  # (..., out)

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + (alpha / r) B A: one matrix product per layer."""
        if self.merged:
            raise ValueError("this LoRA layer is merged already")
        self.base.weight += self.delta_weight()
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W <- W - (alpha / r) B A: W back, to within rounding."""
        if not self.merged:
            raise ValueError("this LoRA layer is not merged")
        self.base.weight -= self.delta_weight()
        self.merged = False

    def extra_repr(self) -> str:
        return (
            f"in_features={self.base.in_features}, "
            f"out_features={self.base.out_features}, r={self.r}, "
            f"alpha={self.alpha}, merged={self.merged}"
        )


@dataclass(frozen=True)
class LoRASettings:
    """How :func:`add_lora` adapted a model (kept as
    ``model.lora_settings``): what an adapter file stores, and what
    :func:`load_adapter` compares with the model."""

    r: int  # the rank of every update
    alpha: float  # every update is scaled by alpha / r
    dropout: float  # on the updates' inputs, in training
    targets: tuple[str, ...]  # attribute names of the adapted layers
    trainable: tuple[str, ...]  # names of what else trains (a new head)
    replaced: tuple[str, ...]  # qualified names of the adapted layers

    def to_dict(self) -> dict:
        """Plain data for a file: the tuples as lists."""
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in asdict(self).items()
        }


def lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    """Every :class:`LoRALinear` in ``model``, with its qualified name."""
    modules = model.named_modules()
    return [(name, m) for name, m in modules if isinstance(m, LoRALinear)]


def add_lora(
    model: nn.Module,
    *,
    r: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Sequence[str] = ("w_q", "w_v"),
    trainable: Sequence[str] = (),
) -> list[str]:
    """Adapt ``model`` in place: every ``nn.Linear`` whose attribute name
    is in ``targets`` becomes a :class:`LoRALinear` around it; every
    parameter is frozen except A and B and those under the names in
    ``trainable``. Everything is checked before anything changes.

    Args:
        model: any module; ``MultiHeadAttention`` names its projections
            ``w_q``, ``w_k``, ``w_v`` and ``w_o``.
        r, alpha, dropout: as in :class:`LoRALinear`, for every layer.
        targets: attribute names of the layers to adapt (Hu et al.
            adapt W^Q and W^V). Each must name an ``nn.Linear`` that is
            neither shared by two places nor tied to another parameter.
        trainable: qualified names of modules or parameters that train
            in full, as a new head does (``"head"``, ``"layers.1.norm1"``).

    Returns:
        the qualified names of the adapted layers. How the model was
        adapted is kept as ``model.lora_settings`` (:class:`LoRASettings`).
    """
    check_rank_and_scale(r, alpha, dropout)
    targets = check_names("targets", targets)
    if not targets:
        raise ValueError("targets must name at least one layer to adapt")
    trainable = check_names("trainable", trainable)
    present = [name for name, _ in lora_layers(model)]
    if present:
        raise ValueError(
            f"the model has LoRA layers already ({', '.join(present[:3])}"
            f"{', ...' * (len(present) > 3)}): remove_lora(model) first"
        )
    places = find_targets(model, targets)
    check_untied(model, places)
    for name, _, _, layer in places:
        check_rank_fits(name, layer, r)
    check_trainable(model, trainable, [p[0] for p in places])
    model.requires_grad_(False)
    for _, parent, attr, layer in places:  # each A drawn in model order
        setattr(parent, attr, LoRALinear(layer, r, alpha, dropout))
    for p in parameters_under(model, trainable).values():
        p.requires_grad_(True)
    replaced = tuple(name for name, _ in lora_layers(model))
    model.lora_settings = LoRASettings(
        r, float(alpha), float(dropout), targets, trainable, replaced
    )
    return list(replaced)


def _adapted(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA layers: add_lora(model) first")
    return layers


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA update into its layer's weight (W + (alpha/r) B A);
    returns how many layers were merged. Refused, with nothing changed,
    if any is merged already."""
    layers = _adapted(model)
    merged = [name for name, layer in layers if layer.merged]
    if merged:
        raise ValueError(f"{merged[0]} is merged already: nothing merged")
    for _, layer in layers:
        layer.merge()
    return len(layers)


def unmerge_lora(model: nn.Module) -> int:
    """Take every LoRA update out of its layer's weight again; returns
    how many layers were unmerged. Refused, with nothing changed, unless
    every one is merged."""
    layers = _adapted(model)
    unmerged = [name for name, layer in layers if not layer.merged]
    if unmerged:
        raise ValueError(f"{unmerged[0]} is not merged: nothing unmerged")
    for _, layer in layers:
        layer.unmerge()
    return len(layers)


def remove_lora(model: nn.Module, *, merge: bool = True) -> list[str]:
    """Put every adapted layer's ``nn.Linear`` back in its place, with
    the update folded into its weight (``merge=True``: the fine-tuned
    model in plain layers, for export or quantisation) or taken out
    (``merge=False``: the base model again, to within rounding if it
    was merged). Parameters keep the
    ``requires_grad`` that :func:`add_lora` gave them. Returns the names
    of the layers put back."""
    if not isinstance(merge, bool):
        raise ValueError(f"merge must be True or False, got {merge!r}")
    layers = _adapted(model)
    if layers[0][0] == "":
        raise ValueError("the model is a LoRALinear itself: take its .base")
    parents = dict(model.named_modules())
    for name, layer in layers:
        if merge and not layer.merged:
            layer.merge()
        elif not merge and layer.merged:
            layer.unmerge()
        parent_name, _, attr = name.rpartition(".")
        setattr(parents[parent_name], attr, layer.base)
    if "lora_settings" in vars(model):
        del model.lora_settings
    return [name for name, _ in layers]


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts, a shared (tied) tensor
    counted once (``model.count_parameters()`` of the book's models is
    the first)."""
    params = list(model.parameters())  # each tensor once
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return trainable, sum(p.numel() for p in params)


# ----------------------------------------------------------------------------
# Adapter files: only what trains, and the settings that shaped it.


def _settings(model: nn.Module) -> LoRASettings:
    settings = getattr(model, "lora_settings", None)
    if not isinstance(settings, LoRASettings):
        raise ValueError(
            "the model was not prepared by add_lora (it has no lora_settings)"
        )
    names = tuple(name for name, _ in lora_layers(model))
    if names != settings.replaced:
        raise ValueError(
            f"the model's LoRA layers {list(names)} are not those add_lora "
            f"made ({list(settings.replaced)})"
        )
    return settings


def adapter_tensors(model: nn.Module) -> dict[str, nn.Parameter]:
    """What an adapter file holds: every layer's A and B, and the
    parameters under the ``trainable`` names, by qualified name."""
    settings = _settings(model)
    tensors = {}
    for name, layer in lora_layers(model):
        tensors[f"{name}.lora_a"] = layer.lora_a
        tensors[f"{name}.lora_b"] = layer.lora_b
    tensors.update(parameters_under(model, settings.trainable))
    return tensors


def _shapes(model: nn.Module) -> dict[str, list[int]]:
    """[in_features, out_features] of every adapted layer."""
    return {
        name: [layer.base.in_features, layer.base.out_features]
        for name, layer in lora_layers(model)
    }


def save_adapter(model: nn.Module, path: str | os.PathLike) -> None:
    """Write the LoRA tensors (and the ``trainable`` modules' weights) of
    a model prepared by :func:`add_lora`, with its settings and the
    adapted layers' shapes, to ``path``. Read back with
    ``torch.load(weights_only=True)``; written as checkpoints are
    (:func:`~transformer_lite.training.checkpoint.write_atomically`)."""
    settings = _settings(model)
    state = {
        "format": ADAPTER_FORMAT,
        "settings": settings.to_dict(),
        "shapes": _shapes(model),
        "tensors": {
            name: p.detach().to("cpu", copy=True)
            for name, p in adapter_tensors(model).items()
        },
    }
    check_plain(state, "adapter")
    write_atomically(Path(path), functools.partial(torch.save, state))


def load_adapter(model: nn.Module, path: str | os.PathLike) -> None:
    """Load a file written by :func:`save_adapter` into a model that
    :func:`add_lora` prepared the same way (``dropout`` may differ).

    Nothing in the file is trusted: the archive is checked before it is
    read (records inside the file, uncompressed), ``torch.load`` runs
    with ``weights_only=True``, and the settings, the adapted layers and
    their shapes, and every tensor's name, shape, floating dtype and
    finite values are compared with the model before anything is
    copied; a tensor of another floating dtype is cast to the model's,
    as ``load_state_dict`` does. Anything wrong raises a ``ValueError``
    that names it, and the model is left as it was. The model's layers
    must not be merged (a merged weight holds the old update).
    """
    path = Path(path)
    state = read_adapter(path)
    stored = stored_settings(state["settings"], path)
    if not isinstance(getattr(model, "lora_settings", None), LoRASettings):
        raise ValueError(
            f"the model was not prepared by add_lora; adapter {path} "
            f"needs {add_lora_call(stored)}"
        )
    check_settings(stored, _settings(model).to_dict(), path)
    if any(layer.merged for _, layer in lora_layers(model)):
        raise ValueError(
            "the model's LoRA layers are merged: unmerge_lora(model) "
            "before loading another update"
        )
    check_shapes(state["shapes"], _shapes(model), path)
    want = adapter_tensors(model)
    check_tensors(state["tensors"], want, path)
    with torch.no_grad():
        for name, p in want.items():
            p.copy_(state["tensors"][name])
