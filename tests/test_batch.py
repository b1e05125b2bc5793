"""Tests for transformer_lite.training.batch (chapters 6, 10 and 11):
``Batch`` shifts the target and builds the masks that ``padding_mask``
and ``target_mask`` build, moves every tensor (from pinned memory,
without waiting, to a GPU), and refuses bad inputs with a clear error;
``Examples`` counts the targets that are not ignored, keeps a tuple of
inputs, moves them all, and names what is wrong with bad inputs."""

import pytest
import torch
from conftest import PAD, random_batch, random_tokens

from transformer_lite import padding_mask, target_mask
from transformer_lite.training import Batch, Examples


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


# ----------------------------------------------------------------------------
# Examples: the batch of every other model


def test_examples_count_every_target_without_an_ignore_index():
    examples = Examples(torch.zeros(3, 5), torch.tensor([0, 4, 4]))
    assert examples.n_tokens == 3
    per_place = Examples(torch.zeros(2, 6), torch.zeros(2, 6).long())
    assert per_place.n_tokens == 12
    assert "n_tokens=12" in repr(per_place)


def test_examples_leave_out_the_ignored_targets():
    targets = random_tokens(4, 6, seed=3)  # padded with PAD
    examples = Examples(torch.zeros(4, 6).long(), targets, ignore_index=PAD)
    assert examples.n_tokens == int((targets != PAD).sum())
    assert examples.n_tokens < targets.numel()  # there is padding


def test_examples_keep_a_tuple_of_inputs_in_order():
    images, words = torch.randn(2, 1, 8, 8), torch.ones(2, 5).long()
    examples = Examples((images, words), torch.ones(2, 5).long())
    assert isinstance(examples.inputs, tuple)
    assert examples.inputs[0] is images and examples.inputs[1] is words
    single = Examples(images, torch.ones(2).long())
    assert single.inputs == (images,)  # one tensor: a tuple of one


def test_examples_to_moves_every_tensor_and_keeps_the_values():
    images, words = torch.randn(2, 3), torch.tensor([[1, 2], [3, 0]])
    targets = torch.tensor([[2, 3], [0, 0]])
    examples = Examples((images, words), targets, PAD, starts_stream=True)
    on_meta = examples.to("meta")
    assert [x.device.type for x in on_meta.inputs] == ["meta", "meta"]
    assert on_meta.targets.device.type == "meta"
    moved = examples.to("cpu")
    assert moved is not examples
    assert all(
        torch.equal(a, b)
        for a, b in zip(moved.inputs, examples.inputs, strict=True)
    )
    assert torch.equal(moved.targets, targets)
    assert (moved.n_tokens, moved.ignore_index, moved.starts_stream) == (
        2,
        PAD,
        True,
    )
    assert examples.inputs[0].device.type == "cpu"  # the original stays


@pytest.mark.parametrize(
    "inputs, targets, match",
    [
        (torch.ones(2, 3), torch.ones(2), r"torch\.long.*torch\.float32"),
        (torch.ones(2, 3), [0, 1], r"torch\.long.*list"),
        (torch.ones(3, 3), torch.ones(2).long(), r"inputs\[0\].*batch size"),
        (
            (torch.ones(2, 3), torch.ones(3, 1)),
            torch.ones(2).long(),
            r"inputs\[1\] of shape \(3, 1\).*batch size",
        ),
        (torch.ones(0, 3), torch.ones(0).long(), r"non-empty.*\(0,\)"),
        (torch.ones(2), torch.ones(2, 3, 4).long(), r"\(B, T\).*\(2, 3, 4\)"),
        ([torch.ones(2, 3)], torch.ones(2).long(), "tuple of tensors.*list"),
        ((torch.ones(2, 3), 5), torch.ones(2).long(), "tuple of tensors"),
        (torch.tensor(1.0), torch.ones(1).long(), r"inputs\[0\]"),
    ],
)
def test_examples_name_what_is_wrong_with_bad_inputs(inputs, targets, match):
    with pytest.raises(ValueError, match=match):
        Examples(inputs, targets)


def test_examples_want_an_int_ignore_index():
    with pytest.raises(ValueError, match="ignore_index"):
        Examples(torch.ones(2, 3), torch.ones(2).long(), ignore_index=0.0)
