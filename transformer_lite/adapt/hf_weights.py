"""What both Hugging Face loaders check before copying a weight
(:mod:`transformer_lite.adapt.gpt2`, :mod:`transformer_lite.adapt.bert`):
where the weights are, and which one dropout rate the book's model takes.
"""

import torch
from torch import nn

from transformer_lite.checks import check_real

__all__ = ["one_dropout", "weights_place"]


def weights_place(
    model: nn.Module, what: str
) -> tuple[torch.device, torch.dtype]:
    """The one device and floating dtype of every weight of ``model``
    (``what`` names it in the errors: "GPT-2", "BERT")."""
    places = {(p.device, p.dtype) for p in model.parameters()}
    if len(places) != 1:
        found = ", ".join(sorted(f"{d} {t}" for d, t in places))
        raise ValueError(
            f"the {what}'s weights must share one device and one dtype, "
            f"found {found}"
        )
    ((device, dtype),) = places
    if not dtype.is_floating_point:
        raise ValueError(
            f"the {what}'s weights must be floating point, got {dtype}"
        )
    if device.type == "meta":
        raise ValueError(
            f"the {what}'s weights are on the meta device: they hold no "
            "values to copy (load the model without device_map offloading)"
        )
    return device, dtype


def one_dropout(
    what: str, config: object, names: tuple[str, ...], dropout: float | None
) -> float:
    """The book's one dropout rate: ``dropout`` if given, else the
    published model's rates (the fields ``names`` of its ``config``)
    if they agree."""
    if dropout is not None:
        return check_real(
            "dropout", dropout, low=0.0, high=1.0, high_open=True
        )
    rates = {name: getattr(config, name) for name in names}
    if len(set(rates.values())) > 1:
        given = ", ".join(f"{k}={v}" for k, v in rates.items())
        raise ValueError(
            f"{what}'s dropout rates differ ({given}) and the book's "
            "model has one: pass dropout= to choose it (it changes "
            "training, not the outputs)"
        )
    return float(next(iter(rates.values())))
