import pytest
import torch

from transformer_lite.masks import (
    causal_mask,
    check_mask,
    local_mask,
    padding_mask,
    target_mask,
    to_torch_attn_mask,
)


@pytest.mark.parametrize("size", [1, 2, 7])
def test_causal_mask_allows_exactly_the_past(size, device):
    mask = causal_mask(size, device=device)
    assert mask.shape == (1, size, size)
    assert mask.dtype == torch.bool and mask.device.type == device.type
    for i in range(size):
        for j in range(size):
            assert mask[0, i, j].item() == (j <= i)


def test_local_mask_is_a_causal_window():
    size, window = 9, 3
    mask = local_mask(size, window)
    assert mask.shape == (1, size, size)
    for i in range(size):
        for j in range(size):
            assert mask[0, i, j].item() == (i - window < j <= i)
    assert torch.equal(local_mask(size, size), causal_mask(size))


def test_padding_mask_marks_real_tokens():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 9]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 4)
    expected = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask[:, 0], expected)


def test_target_mask_is_padding_and_causal():
    tgt = torch.tensor([[3, 4, 5, 0], [3, 0, 0, 0]])
    mask = target_mask(tgt, pad_id=0)
    assert mask.shape == (2, 4, 4)
    for b in range(2):
        for i in range(4):
            for j in range(4):
                expected = j <= i and tgt[b, j].item() != 0
                assert mask[b, i, j].item() == expected


def test_torch_conversion_flips_and_is_its_own_inverse():
    mask = causal_mask(5)
    flipped = to_torch_attn_mask(mask)
    assert torch.equal(flipped, ~mask)
    assert torch.equal(to_torch_attn_mask(flipped), mask)
    with pytest.raises(ValueError, match="bool"):
        to_torch_attn_mask(mask.float())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: causal_mask(0), "positive int"),
        (lambda: causal_mask(2.5), "positive int"),
        (lambda: local_mask(4, 0), "window"),
        (lambda: padding_mask(torch.zeros(2, 3), 0), "integer"),
        (lambda: padding_mask(torch.zeros(3, dtype=torch.long), 0), "(B, L)"),
        (
            lambda: target_mask(torch.zeros(1, 2, 3, dtype=torch.long), 0),
            "(B, L)",
        ),
    ],
)
def test_bad_input_names_the_problem(call, message):
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        call()


def test_check_mask_explains_shape_and_dtype():
    scores = torch.Size((2, 4, 3, 5))
    check_mask(torch.ones(2, 1, 3, 5, dtype=torch.bool), scores)
    check_mask(torch.ones(3, 5, dtype=torch.bool), scores)
    with pytest.raises(ValueError, match=r"\(2, 1, 3, 4\).*\(2, 4, 3, 5\)"):
        check_mask(torch.ones(2, 1, 3, 4, dtype=torch.bool), scores)
    with pytest.raises(ValueError, match="does not broadcast"):
        # would broadcast *up* to a bigger shape, but not to the scores
        check_mask(torch.ones(2, 2, 4, 3, 5, dtype=torch.bool), scores)
    with pytest.raises(ValueError, match="bool"):
        check_mask(torch.ones(2, 1, 3, 5), scores)
