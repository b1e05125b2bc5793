"""Training batches: a translator's source, shifted targets and masks
(:class:`Batch`, chapter 6), and the inputs and targets of every other
model (:class:`Examples`, chapters 10 and 11)."""

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor

from transformer_lite.checks import check_int
from transformer_lite.masks import padding_mask, target_mask

__all__ = ["Batch", "Examples"]


@dataclass(repr=False)
class Batch:
    """A source/target batch with shifted targets and masks (chapter 6).

    Built as ``Batch(src, tgt, pad_id)``. The decoder reads ``tgt_in``
    (all but the last token) and learns to predict ``tgt_out`` (all but
    the first): teacher forcing.

    Shape:
        src: (B, S); tgt: (B, T + 1); tgt_in, tgt_out: (B, T);
        src_mask: (B, 1, S); tgt_mask: (B, T, T). ``n_tokens``: the
        non-pad tokens of ``tgt_out``, the ones the loss counts.
    """

    src: Tensor
    tgt: Tensor
    pad_id: int
    tgt_in: Tensor = field(init=False)
    tgt_out: Tensor = field(init=False)
    src_mask: Tensor = field(init=False)
    tgt_mask: Tensor = field(init=False)
    n_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        src, tgt = self.src, self.tgt
        check_int("pad_id", self.pad_id)
        self.src_mask = padding_mask(src, self.pad_id)  # (B, 1, S)
        padding_mask(tgt, self.pad_id)  # checks tgt is (B, L) of ids
        if src.numel() == 0 or tgt.size(0) == 0:
            raise ValueError(
                f"empty batch: src {tuple(src.shape)}, tgt {tuple(tgt.shape)}"
            )
        if src.size(0) != tgt.size(0) or src.device != tgt.device:
            raise ValueError(
                f"src {tuple(src.shape)} on {src.device} and tgt "
                f"{tuple(tgt.shape)} on {tgt.device} must share the batch "
                "size and the device"
            )
        if tgt.size(1) < 2:
            raise ValueError(
                f"tgt needs at least 2 tokens (an input and a next token), "
                f"got shape {tuple(tgt.shape)}"
            )
        self.tgt_in = tgt[:, :-1]  # (B, T)
        self.tgt_out = tgt[:, 1:]  # (B, T)
        self.tgt_mask = target_mask(self.tgt_in, self.pad_id)  # (B, T, T)
        self.n_tokens = int((self.tgt_out != self.pad_id).sum())

    def to(self, device: torch.device | str) -> "Batch":
        """The same batch with every tensor on ``device``.

        From the CPU to a GPU each tensor goes through pinned (page-locked)
        memory and is copied without waiting (``non_blocking``): the host
        goes on while the copies run. ``tgt_in`` and ``tgt_out`` stay
        views of ``tgt``, copied once.
        """
        device = torch.device(device)
        moved = copy.copy(self)
        for name in ("src", "tgt", "src_mask", "tgt_mask"):
            setattr(moved, name, _copy_to(getattr(self, name), device))
        moved.tgt_in = moved.tgt[:, :-1]  # (B, T)
        moved.tgt_out = moved.tgt[:, 1:]  # (B, T)
        return moved

    def __repr__(self) -> str:
        (B, S), T = self.src.shape, self.tgt_in.size(1)
        return (
            f"Batch(B={B}, S={S}, T={T}, n_tokens={self.n_tokens}, "
            f"pad_id={self.pad_id})"
        )


def _copy_to(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``; from the CPU to CUDA, through pinned
    memory and without waiting for the copy."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@dataclass(repr=False)
class Examples:
    """Inputs and the targets a model learns to predict from them: the
    batch of every model that is not a translator (chapters 10 and 11).

    ``inputs`` is what the model is called with: one tensor, or a tuple
    of them passed in order (the image reader takes images and the words
    so far). ``targets`` are class ids, one per prediction: a label per
    image, the next token at every place of a text. Those equal to
    ``ignore_index`` (padding) count for nothing; ``n_tokens`` counts the
    others, the divisor of the training step.

    ``starts_stream`` is for a model with a memory of earlier batches
    (chapter 10's segment memory): True where the inputs do not continue
    the previous batch's text, so the memory must be cleared first.

    Shape:
        inputs: (B, ...) each; targets: (B,) or (B, T).
    """

    inputs: Tensor | tuple[Tensor, ...]
    targets: Tensor
    ignore_index: int | None = None
    starts_stream: bool = False
    n_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        inputs = self.inputs
        if isinstance(inputs, Tensor):
            inputs = (inputs,)
        if not isinstance(inputs, tuple) or not all(
            isinstance(x, Tensor) for x in inputs
        ):
            raise ValueError(
                "inputs must be a tensor or a tuple of tensors, got "
                f"{type(self.inputs).__name__}"
            )
        targets = self.targets
        if not isinstance(targets, Tensor) or targets.dtype != torch.long:
            raise ValueError(
                "targets must be a torch.long tensor of class ids, got "
                f"{getattr(targets, 'dtype', type(targets).__name__)}"
            )
        if targets.dim() not in (1, 2) or targets.numel() == 0:
            raise ValueError(
                "targets must be a non-empty (B,) or (B, T) tensor, got "
                f"shape {tuple(targets.shape)}"
            )
        for i, x in enumerate(inputs):
            if x.dim() == 0 or x.size(0) != targets.size(0):
                raise ValueError(
                    f"inputs[{i}] of shape {tuple(x.shape)} and targets of "
                    f"shape {tuple(targets.shape)} must share the batch "
                    "size (their first dimension)"
                )
        if self.ignore_index is not None:
            check_int("ignore_index", self.ignore_index)
        self.inputs = inputs
        self.n_tokens = (
            targets.numel() if self.ignore_index is None
            else int((targets != self.ignore_index).sum())
        )  # fmt: skip

    def to(self, device: torch.device | str) -> "Examples":
        """The same examples with every tensor on ``device`` (pinned
        memory and no wait from the CPU to a GPU, as :meth:`Batch.to`)."""
        device = torch.device(device)
        moved = copy.copy(self)
        moved.inputs = tuple(_copy_to(x, device) for x in self.inputs)
        moved.targets = _copy_to(self.targets, device)
        return moved

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(x.shape)) for x in self.inputs)
        return (
            f"Examples(inputs=[{shapes}], targets="
            f"{tuple(self.targets.shape)}, n_tokens={self.n_tokens})"
        )
