"""Transformer-XL's segment memory (Dai et al., 2019; chapter 10).

A model trained on segments of T tokens sees, at the first position of
a segment, one token of context. Transformer-XL keeps the hidden states
that entered each block during the previous segment and lets the next
segment attend to them as extra keys and values:

.. math::

    \\tilde h^{n-1}_\\tau = [\\mathrm{SG}(m^{n-1}_{\\tau}) ;
    h^{n-1}_\\tau], \\qquad
    q = h^{n-1}_\\tau W^Q, \\quad k = \\tilde h^{n-1}_\\tau W^K, \\quad
    v = \\tilde h^{n-1}_\\tau W^V,

where SG stops the gradient: the memory is a constant of this segment's
backward pass, so training costs one segment's backward pass while the
forward pass reaches back N x M positions through N blocks. Positions
must be relative (the memory's tokens were seen at other offsets).
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from transformer_lite.checks import check_int

__all__ = ["SegmentMemory"]


@dataclass
class SegmentMemory:
    """The last ``mem_len`` inputs of each of ``n_layers`` blocks,
    detached; :meth:`update` appends a segment's and keeps the newest.

    Args:
        mem_len: M, how many past positions each block may attend to.
        n_layers: N, blocks in the model.

    Shape:
        each of ``states``: (B, M_held, C), M_held <= M; None before the
        first segment.
    """

    mem_len: int
    n_layers: int
    states: list[Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_int("mem_len", self.mem_len, low=1)
        check_int("n_layers", self.n_layers, low=1)

    def check_fits(
        self,
        *,
        n_layers: int,
        batch: int,
        d_model: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """Raise a ``ValueError`` naming what differs unless this memory
        can serve a model of ``n_layers`` blocks of width ``d_model``
        reading a segment of ``batch`` rows in ``dtype`` on ``device``:
        checked before the forward pass, not inside it."""
        if self.n_layers != n_layers:
            raise ValueError(
                f"the memory is for {self.n_layers} blocks; the model has "
                f"{n_layers}: make it with model.new_memory(mem_len)"
            )
        if self.states is None:
            return
        held = self.states[0]
        if held.size(0) != batch:
            raise ValueError(
                f"the memory holds a batch of {held.size(0)} rows, the "
                f"segment has {batch}; call reset() before another batch"
            )
        if held.size(-1) != d_model:
            raise ValueError(
                f"the memory holds states of width {held.size(-1)}, the "
                f"model's d_model is {d_model}: it was filled by another "
                "model"
            )
        if held.dtype != dtype or held.device != device:
            raise ValueError(
                f"the memory holds {held.dtype} states on {held.device}; "
                f"the model computes in {dtype} on {device}: call reset() "
                "after moving or casting the model"
            )

    def layer(self, i: int) -> Tensor | None:
        """What block ``i`` attends to before the segment (None at first)."""
        return None if self.states is None else self.states[i]

    @property
    def length(self) -> int:
        """M_held: the positions held (0 before the first segment)."""
        return 0 if self.states is None else self.states[0].size(1)

    def update(self, inputs: list[Tensor]) -> None:
        """Keep the newest ``mem_len`` positions of [memory; inputs] for
        every block, with no gradient (the SG above).

        Shape:
            inputs: one (B, L, C) tensor per block.
        """
        if len(inputs) != self.n_layers:
            raise ValueError(
                f"expected the inputs of {self.n_layers} blocks, got "
                f"{len(inputs)}"
            )
        if self.states is not None and (
            inputs[0].size(0) != self.states[0].size(0)
        ):
            raise ValueError(
                f"the memory holds a batch of {self.states[0].size(0)} "
                f"rows, the segment has {inputs[0].size(0)}; call reset() "
                "before another batch"
            )
        new = []
        for i, x in enumerate(inputs):
            old = self.layer(i)
            both = x if old is None else torch.cat([old, x], dim=1)
            new.append(both[:, -self.mem_len :].detach())  # (B, <= M, C)
        self.states = new

    def reset(self) -> None:
        """Forget everything (a new batch of streams)."""
        self.states = None
