"""Tests for transformer_lite.training.batch (chapter 6): ``Batch`` shifts
the target and builds the masks that ``padding_mask`` and
``target_mask`` build, moves every tensor (from pinned memory, without
waiting, to a GPU), and refuses bad inputs with a clear error."""

import pytest
import torch
from conftest import PAD, random_batch, random_tokens

from transformer_lite import padding_mask, target_mask
from transformer_lite.training import Batch


def test_batch_shifts_the_target_and_builds_the_masks():
    src, tgt = random_tokens(3, 7, seed=1), random_tokens(3, 6, seed=2)
    batch = Batch(src, tgt, PAD)
    assert torch.equal(batch.tgt_in, tgt[:, :-1])
    assert torch.equal(batch.tgt_out, tgt[:, 1:])
    assert batch.src_mask.shape == (3, 1, 7)
    assert torch.equal(batch.src_mask, padding_mask(src, PAD))
    assert batch.tgt_mask.shape == (3, 5, 5)
    assert torch.equal(batch.tgt_mask, target_mask(tgt[:, :-1], PAD))
    assert batch.n_tokens == int((tgt[:, 1:] != PAD).sum())
    assert batch.n_tokens < tgt[:, 1:].numel()  # there is padding
    assert "n_tokens" in repr(batch)


def test_batch_to_moves_every_tensor():
    batch = random_batch()
    moved = batch.to("meta")
    tensors = [
        name for name, v in vars(batch).items() if isinstance(v, torch.Tensor)
    ]
    assert len(tensors) == 6
    for name in tensors:
        assert getattr(moved, name).device.type == "meta"
        assert getattr(batch, name).device.type == "cpu"
    assert moved.n_tokens == batch.n_tokens
    assert moved.tgt_in._base is moved.tgt  # views, as in the batch
    assert moved.tgt_out._base is moved.tgt


def copies_to(monkeypatch, device: str) -> list[tuple]:
    """Batch.to(device) with the copies recorded instead of made (this
    machine may have no GPU): ('pin',) and ('to', device, non_blocking)."""
    calls = []

    def pin_memory(tensor):
        calls.append(("pin",))
        return tensor

    def to(tensor, device, non_blocking=False):
        calls.append(("to", torch.device(device).type, non_blocking))
        return tensor

    batch = random_batch()
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    moved = batch.to(device)
    monkeypatch.undo()
    for name in ("src", "tgt", "src_mask", "tgt_mask", "tgt_in", "tgt_out"):
        assert torch.equal(getattr(moved, name), getattr(batch, name)), name
    return calls


def test_batch_to_a_gpu_copies_from_pinned_memory_without_waiting(
    monkeypatch,
):
    calls = copies_to(monkeypatch, "cuda")
    assert calls == [("pin",), ("to", "cuda", True)] * 4


def test_batch_to_another_device_pins_nothing(monkeypatch):
    for device in ("cpu", "meta"):
        calls = copies_to(monkeypatch, device)
        assert calls == [("to", device, False)] * 4


@pytest.mark.parametrize(
    "src, tgt, match",
    [
        (torch.ones(0, 4).long(), torch.ones(0, 4).long(), "empty"),
        (torch.ones(2, 0).long(), torch.ones(2, 4).long(), "empty"),
        (torch.ones(2, 4).long(), torch.ones(3, 4).long(), "batch size"),
        (torch.ones(2, 4).long(), torch.ones(2, 1).long(), "at least 2"),
        (torch.ones(2, 4), torch.ones(2, 4).long(), "integer"),
        (torch.ones(4).long(), torch.ones(2, 4).long(), r"\(B, L\)"),
    ],
)
def test_batch_rejects_bad_inputs(src, tgt, match):
    with pytest.raises(ValueError, match=match):
        Batch(src, tgt, PAD)
