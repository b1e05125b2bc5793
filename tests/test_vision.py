"""Tests for transformer_lite.vision and transformer_lite.tasks.digits
(chapter 11): patches against a convolution and ``F.unfold``, the ViT's
class token and positions, the image-to-text model against the text
Transformer's decoder, and the composed handwritten numbers."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_VIT, tiny_vit
from torch import nn

from transformer_lite import make_model
from transformer_lite.decoding import beam_search, greedy_decode
from transformer_lite.model import Transformer
from transformer_lite.tasks.digits import (
    DIGIT_SIZE,
    compose_numbers,
    digit_columns,
    digit_splits,
    draw_numbers,
    number_images,
    number_targets,
    number_tokenizer,
    shift_images,
)
from transformer_lite.tasks.numbers import number_words
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_lite.vision import (
    ImageToText,
    ImageToTextConfig,
    PatchEmbedding,
    PatchPositions,
    VisionTransformer,
    ViTConfig,
    patch_grid,
    to_patches,
    window_mask,
)


@pytest.mark.parametrize("patch, channels", [((2, 2), 1), ((2, 3), 3)])
def test_patch_embedding_is_a_strided_convolution_and_an_unfold(
    patch, channels
):
    torch.manual_seed(0)
    embed = PatchEmbedding(patch, channels, 5).double()
    images = torch.randn(2, channels, 4, 6, dtype=torch.float64)
    ours = embed(images)  # (B, N, C)
    conv = nn.Conv2d(channels, 5, patch, stride=patch).double()
    with torch.no_grad():
        conv.weight.copy_(embed.proj.weight.view(5, channels, *patch))
        conv.bias.copy_(embed.proj.bias)
    by_conv = conv(images).flatten(2).transpose(1, 2)  # (B, N, C)
    columns = F.unfold(images, patch, stride=patch)  # (B, K*P*P, N)
    by_unfold = columns.transpose(1, 2) @ embed.proj.weight.T
    by_unfold = by_unfold + embed.proj.bias
    assert ours.shape == (2, patch_grid((4, 6), patch)[0] * (6 // patch[1]), 5)
    torch.testing.assert_close(ours, by_conv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, by_unfold, rtol=1e-12, atol=1e-12)


def test_patches_are_read_row_by_row():
    image = torch.arange(16.0).view(1, 1, 4, 4)
    patches = to_patches(image, 2)  # (1, 4, 4)
    assert patches[0, 0].tolist() == [0, 1, 4, 5]  # top left
    assert patches[0, 1].tolist() == [2, 3, 6, 7]  # top right
    assert patches[0, 2].tolist() == [8, 9, 12, 13]  # bottom left


def test_patches_must_tile_the_image():
    with pytest.raises(ValueError, match="must tile"):
        patch_grid((8, 8), 3)
    with pytest.raises(ValueError, match="must tile"):
        ViTConfig(image_size=(8, 10), patch_size=(2, 4))


def test_two_d_positions_are_a_row_plus_a_column():
    positions = PatchPositions((2, 3), 4, "2d")
    table = positions.table().view(2, 3, 4)
    for i, j in itertools.product(range(2), range(3)):
        expected = positions.rows[i] + positions.columns[j]
        torch.testing.assert_close(table[i, j], expected)
    with pytest.raises(ValueError, match="kind must be"):
        PatchPositions((2, 3), 4, "3d")


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_tiled_positions_copy_the_small_grid(kind):
    small = PatchPositions((2, 2), 3, kind)
    big = small.tiled((2, 6))
    table, source = big.table().view(2, 6, 3), small.table().view(2, 2, 3)
    for i, j in itertools.product(range(2), range(6)):
        torch.testing.assert_close(table[i, j], source[i, j % 2])
    with pytest.raises(ValueError, match="whole"):
        small.tiled((2, 5))


def test_vit_scores_classes_and_checks_its_images():
    vit = tiny_vit()
    images = torch.rand(3, 1, 8, 8)
    assert vit(images).shape == (3, 10)
    assert vit.features(images).shape == (3, 17, 16)
    assert vit.features(images, class_tokens=0).shape == (3, 16, 16)
    assert vit.features(images, class_tokens=3).shape == (3, 19, 16)
    for bad, match in [
        (torch.rand(3, 8, 8), "shape"),
        (torch.rand(3, 1, 8, 10), "shape"),
        (torch.ones(3, 1, 8, 8, dtype=torch.long), "floating-point"),
    ]:
        with pytest.raises(ValueError, match=match):
            vit(bad)
    with pytest.raises(ValueError, match="no head"):
        tiny_vit(n_classes=0)(images)


def test_without_positions_the_patches_are_an_unordered_set():
    """Self-attention alone cannot tell where a patch was: with the
    position table at zero, shuffling the patches leaves the class
    token's scores unchanged; the learned positions are what break the
    symmetry."""
    vit = tiny_vit()
    image = torch.rand(1, 1, 8, 8)
    shuffled = to_patches(image, 2)[:, torch.randperm(16)]  # (1, 16, 4)
    shuffled = shuffled.view(1, 4, 4, 1, 2, 2).permute(0, 3, 1, 4, 2, 5)
    shuffled = shuffled.reshape(1, 1, 8, 8)
    assert not torch.equal(shuffled, image)
    with torch.no_grad():
        assert not torch.allclose(vit(image), vit(shuffled), atol=1e-5)
        vit.positions.patches.zero_()
        torch.testing.assert_close(vit(image), vit(shuffled))


def image_to_text(vocab: int = 11) -> ImageToText:
    torch.manual_seed(0)
    vision = ViTConfig(image_size=(8, 24), **TINY_VIT)
    config = ImageToTextConfig(
        vocab, vision=vision, n_layers=2, d_ff=32, n_heads=2, dropout=0.0
    )
    return ImageToText(config).eval()


def test_the_text_transformers_decoder_reads_image_memory_unchanged():
    """Copy the decoder's weights into a text Transformer: given the
    image memory, its decode gives the same hidden states and scores."""
    model = image_to_text()
    text = make_model(
        5, 11, n_layers=2, d_model=16, d_ff=32, n_heads=2, norm_first=True
    )
    text.eval()
    for name in ("tgt_embed", "decoder", "generator"):
        getattr(text, name).load_state_dict(getattr(model, name).state_dict())
    images = torch.rand(2, 1, 8, 24)
    tgt = torch.tensor([[BOS_ID, 5, 6, 7], [BOS_ID, 8, PAD_ID, PAD_ID]])
    with torch.no_grad():
        memory = model.encode(images)  # (2, 48, 16)
        mask = model.source_mask(images)
        ours = model.decode(memory, mask, tgt)
        theirs = text.decode(memory, mask, tgt)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        torch.testing.assert_close(
            model(images, tgt), text.generator(theirs), rtol=0, atol=0
        )
    assert memory.shape == (2, 48, 16)
    assert mask.shape == (2, 1, 48) and bool(mask.all())


def test_bad_target_ids_are_clear_errors_as_in_the_text_model():
    """The reader checks its targets with the Transformer's own code:
    shape and dtype always, the vocabulary's range on the CPU."""
    model = image_to_text(vocab=11)
    memory = model.encode(torch.rand(1, 1, 8, 24))
    with pytest.raises(ValueError, match=r"tgt .*integer"):
        model.decode(memory, None, torch.rand(1, 3))
    with pytest.raises(ValueError, match=r"tgt is empty"):
        model.decode(memory, None, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tgt holds .*\[0, 10\]: id 11"):
        model.decode(memory, None, torch.tensor([[BOS_ID, 11]]))
    assert ImageToText.decode is Transformer.decode  # one decoder side
    assert model.count_parameters() == sum(
        p.numel() for p in model.parameters()
    )
    assert model.device == torch.device("cpu")


def test_greedy_and_beam_decode_images_with_and_without_the_cache():
    model = image_to_text()
    images = torch.rand(3, 1, 8, 24)
    options = dict(max_len=6, bos_id=BOS_ID, eos_id=EOS_ID)
    plain = greedy_decode(model, images, **options)
    cached = greedy_decode(model, images, use_cache=True, **options)
    one_beam = beam_search(model, images, beam_size=1, **options)
    assert torch.equal(plain, cached)
    assert torch.equal(plain, one_beam)
    with torch.no_grad():  # each token is the argmax given the prefix
        logits = model(images, plain[:, :-1])
    finished = (plain[:, :-1] == EOS_ID).cumsum(1) > 0
    argmax = logits.argmax(-1).masked_fill(finished, PAD_ID)
    assert torch.equal(argmax, plain[:, 1:])
    assert beam_search(model, images, beam_size=3, **options).size(0) == 3


def test_decoding_asks_the_model_for_its_memory_mask():
    model = image_to_text()
    images = torch.rand(2, 1, 8, 24)
    assert model.source_mask(images).shape == (2, 1, 48)
    options = dict(max_len=4, bos_id=BOS_ID)
    with pytest.raises(ValueError, match=r"images must have shape"):
        greedy_decode(model, torch.rand(2, 1, 8, 8), **options)
    wrong = torch.ones(2, 1, 7, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"src_mask must be .*\(2, 1, 48\)"):
        greedy_decode(model, images, src_mask=wrong, **options)
    text = make_model(7, 7, n_layers=1, d_model=8, d_ff=16, n_heads=2)
    src = torch.tensor([[3, 4, PAD_ID]])
    assert text.source_mask(src).tolist() == [[[True, True, False]]]
    with pytest.raises(ValueError, match=r"src must be a \(B, S\) tensor"):
        text.source_mask(torch.rand(1, 1, 8, 8))


def test_from_vit_starts_from_the_vits_weights():
    vit = tiny_vit()
    with torch.no_grad():
        vit.class_token.normal_()
    model = ImageToText.from_vit(vit, image_to_text().config)
    assert torch.equal(model.encoder.class_token, vit.class_token)
    encoder = model.encoder
    for name, p in vit.encoder.state_dict().items():
        assert torch.equal(encoder.encoder.state_dict()[name], p)
    assert torch.equal(
        encoder.patch_embed.proj.weight, vit.patch_embed.proj.weight
    )
    table = encoder.positions.table().view(4, 12, 16)
    torch.testing.assert_close(
        table[:, 4:8], vit.positions.table().view(4, 4, 16)
    )
    other = tiny_vit(d_ff=64)
    with pytest.raises(ValueError, match="d_ff"):
        ImageToText.from_vit(other, image_to_text().config)


def test_window_mask_groups_the_patches_of_each_window():
    mask = window_mask((2, 6), (2, 2))  # three windows of 2 x 2 patches
    cell = torch.tensor([0, 0, 1, 1, 2, 2] * 2)  # each patch's window
    assert torch.equal(mask, cell[:, None] == cell[None])
    assert mask.sum().item() == 3 * 4 * 4
    with_classes = window_mask((2, 6), (2, 2), class_tokens=True)
    cell = torch.cat([torch.arange(3), cell])  # a class token per window
    assert torch.equal(with_classes, cell[:, None] == cell[None])
    with pytest.raises(ValueError, match="must tile"):
        window_mask((2, 6), (2, 4))
    with pytest.raises(ValueError, match="must tile"):
        ImageToTextConfig(
            5, vision=ViTConfig(image_size=(8, 24)), window=(4, 5)
        )


def test_a_windowed_encoder_reads_each_window_as_the_vit_would():
    """With windows of one digit cell and positions tiled from the ViT,
    each cell's class token and patch outputs are the ViT's outputs for
    that cell alone; the memory adds its own positions, which tell the
    cells apart."""
    vit = tiny_vit()
    with torch.no_grad():  # as if trained: not its zero start
        vit.class_token.normal_()
    vision = ViTConfig(image_size=(8, 24), **TINY_VIT)
    config = ImageToTextConfig(11, vision=vision, window=(4, 4), n_heads=2)
    model = ImageToText.from_vit(vit, config).eval()
    images = torch.rand(2, 1, 8, 24)
    with torch.no_grad():
        memory = model.encode(images)  # (2, 3 + 48, 16)
        assert memory.shape == (2, 51, 16)
        assert model.source_mask(images).shape == (2, 1, 51)
        classes = memory[:, :3] - model.window_positions
        patches = memory[:, 3:] - model.memory_positions.table()
        grid = patches.view(2, 4, 12, 16)
        for cell in range(3):
            alone = vit.features(images[..., 8 * cell : 8 * cell + 8])
            torch.testing.assert_close(classes[:, cell], alone[:, 0])
            torch.testing.assert_close(
                grid[:, :, 4 * cell : 4 * cell + 4],
                alone[:, 1:].reshape(2, 4, 4, 16),
            )
        whole = ImageToText.from_vit(vit, image_to_text().config).eval()
        mixed = whole.encode(images) - whole.memory_positions.table()
    assert not torch.allclose(mixed, patches, atol=1e-4)
    out = greedy_decode(model, images, max_len=5, bos_id=BOS_ID)
    cached = greedy_decode(
        model, images, max_len=5, bos_id=BOS_ID, use_cache=True
    )
    assert torch.equal(out, cached)


def test_digit_splits_are_disjoint_and_stratified():
    splits = digit_splits(test_fraction=0.25, seed=0)
    (train, y_train), (test, y_test) = splits["train"], splits["test"]
    assert len(train) + len(test) == 1797
    assert train.shape[1:] == (1, 8, 8) and 0 <= float(train.min())
    assert float(train.max()) == 1.0
    counts = torch.bincount(y_test, minlength=10).float()
    share = counts / torch.bincount(torch.cat([y_train, y_test]))
    assert ((share - 0.25).abs() < 0.01).all()
    again = digit_splits(test_fraction=0.25, seed=0)["test"][0]
    assert torch.equal(again, test)
    assert not torch.equal(digit_splits(seed=1)["test"][0], test)


def test_shift_images_moves_each_image_by_at_most_the_shift():
    images = torch.zeros(50, 1, 8, 8)
    images[:, :, 2:6, 2:6] = torch.rand(50, 1, 4, 4)  # a blank border
    assert torch.equal(shift_images(images, 0), images)
    shifted = shift_images(images, 1, generator=0)
    moves = set()
    for image, out in zip(images, shifted, strict=True):
        found = [
            (dy, dx)
            for dy, dx in itertools.product((-1, 0, 1), repeat=2)
            if torch.equal(out, image.roll((dy, dx), dims=(1, 2)))
        ]
        assert len(found) == 1
        moves.add(found[0])
    assert len(moves) == 9  # every shift occurs among 50 images


def test_composed_numbers_use_only_the_given_handwriting():
    splits = digit_splits(seed=0)
    images, labels = splits["test"]
    numbers = [7, 42, 305, 999]
    canvas = compose_numbers(images, labels, numbers, generator=0)
    assert canvas.shape == (4, 1, 8, 24)
    for row, number in enumerate(numbers):
        columns = digit_columns(number)
        ink = canvas[row, 0].sum(0) > 0  # (24,) columns with ink
        used = {c for span in columns for c in span}
        assert not any(ink[c] for c in range(24) if c not in used)
        for digit, span in zip(str(number), columns, strict=True):
            cell = canvas[row, :, :, span.start : span.stop]  # (1, 8, 8)
            same = (images == cell).flatten(1).all(1)  # (n,)
            assert bool(same.any()), "a cell is not one of the images"
            assert set(labels[same].tolist()) == {int(digit)}
    train_images = splits["train"][0]
    cell = canvas[3, :, :, 0:8]
    assert not (train_images == cell).flatten(1).all(1).any()


def test_numbers_are_drawn_evenly_by_digit_count():
    numbers = draw_numbers(3000, seed=0)
    counts = torch.bincount(torch.tensor([len(str(n)) for n in numbers]))
    assert counts[1:].tolist() == pytest.approx([1000] * 3, abs=100)
    assert 0 <= min(numbers) and max(numbers) < 1000
    assert digit_columns(7) == [range(16, 24)]
    assert digit_columns(42) == [range(8, 16), range(16, 24)]
    assert digit_columns(305)[0] == range(0, DIGIT_SIZE)
    with pytest.raises(ValueError, match="number"):
        digit_columns(1000)
    images, numbers = number_images(*digit_splits()["train"], 5, seed=3)
    assert images.shape == (5, 1, 8, 24) and numbers == draw_numbers(5, seed=3)


def test_number_targets_are_whole_words():
    tokenizer = number_tokenizer()
    targets = number_targets([312, 77, 5], tokenizer)
    assert targets[:, 0].tolist() == [BOS_ID] * 3
    assert tokenizer.decode_batch(targets) == [
        number_words(n, "en") for n in (312, 77, 5)
    ]
    pieces = tokenizer.pieces("seven hundred and seventy-seven")
    assert pieces == ["▁seven", "▁hundred", "▁and", "▁seventy", "-", "seven"]


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float16, torch.bfloat16]
)
def test_images_of_any_float_dtype_are_read_in_the_models(dtype):
    # Before: "mat1 and mat2 must have the same dtype" (scikit-learn's
    # digits are float64).
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=(8, 8),
        patch_size=2,
        n_layers=1,
        d_model=16,
        d_ff=16,
        n_heads=2,
        n_classes=3,
    )
    vit = VisionTransformer(config).eval()
    images = torch.rand(2, 1, 8, 8)
    expected = vit(images)
    got = vit(images.to(dtype))
    assert got.dtype == torch.float32
    tolerance = 1e-6 if dtype == torch.float64 else 0.1
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)


def test_a_window_mask_of_the_wrong_shape_or_kind_is_named():
    vit = VisionTransformer(ViTConfig(image_size=(8, 8), patch_size=2,
                                      n_layers=1, d_model=16, d_ff=16,
                                      n_heads=2, n_classes=3))  # fmt: skip
    images = torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"mask must have shape \(17, 17\)"):
        vit.features(images, mask=torch.ones(16, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        vit.features(images, mask=torch.ones(17, 17))
    out = vit.features(images, mask=torch.ones(2, 17, 17, dtype=torch.bool))
    assert out.shape == (2, 17, 16)


@pytest.mark.parametrize("patch_size", [2.0, "2", None, (2, 2, 2), True])
def test_a_patch_size_that_is_not_an_int_or_pair_is_named(patch_size):
    with pytest.raises(ValueError, match="patch_size"):
        ViTConfig(image_size=(8, 8), patch_size=patch_size)


@pytest.mark.parametrize("d_model", [0, True, -3, 2.5])
def test_patch_positions_want_a_positive_width(d_model):
    with pytest.raises(ValueError, match="d_model must be"):
        PatchPositions((4, 4), d_model)
