"""A training batch: source, shifted targets and their masks (chapter 6)."""

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor

from transformer_lite.checks import check_int
from transformer_lite.masks import padding_mask, target_mask

__all__ = ["Batch"]


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
