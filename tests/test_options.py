"""Options are checked before work starts: a bool is not an int, a str
is not a bool, a float is not a token id, and the message names the
option (transformer_lite.checks and its callers)."""

import pytest
import torch
from torch import nn

from transformer_lite import (
    SinusoidalPositionalEncoding,
    TransformerConfig,
    causal_mask,
    seed_everything,
    sinusoidal_table,
)
from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.interop import (
    from_torch_decoder_layer,
    from_torch_encoder_layer,
)
from transformer_lite.masks import local_mask


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(norm_first="no"), "norm_first"),
        (dict(norm_first=0), "norm_first"),
        (dict(tie_embeddings="yes"), "tie_embeddings"),
        (dict(pad_id=1.0), "pad_id"),
        (dict(pad_id=True), "pad_id"),
        (dict(n_layers=True), "n_layers"),
        (dict(d_model=64.0), "d_model"),
        (dict(dropout=True), "dropout"),
        (dict(dropout="0.1"), "dropout"),
        (dict(dropout=float("nan")), "dropout"),
        (dict(max_len=None), "max_len"),
    ],
)
def test_config_rejects_wrong_types(fields, named):
    with pytest.raises(ValueError, match=named):
        TransformerConfig(11, 11, **fields)


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: seed_everything(True), "seed"),
        (lambda: seed_everything(2**64), "seed"),
        (lambda: seed_everything(None), "seed"),
        (lambda: causal_mask(True), "size"),
        (lambda: local_mask(4, True), "window"),
        (lambda: sinusoidal_table(True, 4), "max_len"),
        (lambda: sinusoidal_table(8, 4, base=0.0), "base"),
    ],
)
def test_core_functions_reject_bools_with_a_clear_error(call, named):
    with pytest.raises(ValueError, match=named):
        call()


@pytest.mark.parametrize("offset", [-1, -5, 1.0, True])
def test_positional_offset_must_be_a_non_negative_int(offset):
    """A negative offset used to read rows from the end of the table (or
    row 0): silently wrong positions."""
    pe = SinusoidalPositionalEncoding(8, dropout=0.0, max_len=10)
    with pytest.raises(ValueError, match="offset"):
        pe(torch.zeros(1, 2, 8), offset)


@pytest.mark.parametrize(
    "convert, layer",
    [
        (from_torch_encoder_layer, nn.TransformerEncoderLayer),
        (from_torch_decoder_layer, nn.TransformerDecoderLayer),
    ],
)
def test_interop_refuses_layers_without_biases(convert, layer):
    theirs = layer(8, 2, 16, batch_first=True, bias=False)
    with pytest.raises(ValueError, match="bias"):
        convert(theirs)


def test_the_checks_themselves():
    assert check_int("n", 3, low=1) == 3
    assert check_real("p", 1, low=0.0) == 1.0
    assert check_bool("b", False) is False
    for call, message in [
        (lambda: check_int("n", True), "n must be an int"),
        (lambda: check_int("n", 0, low=1), "n must be a positive int"),
        (lambda: check_int("n", -1, low=0), "non-negative"),
        (lambda: check_int("n", 9, low=1, high=5), r"\[1, 5\]"),
        (lambda: check_real("p", 1.0, high=1.0, high_open=True), r"1.0\)"),
        (lambda: check_real("p", float("inf")), "finite"),
        (lambda: check_bool("b", "no"), "True or False"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(accumulate=2.0), "accumulate"),
        (dict(accumulate=True), "accumulate"),
        (dict(accumulate=0), "accumulate"),
        (dict(clip_norm=True), "clip_norm"),
        (dict(clip_norm=float("inf")), "clip_norm"),
        (dict(clip_norm=float("nan")), "clip_norm"),
        (dict(clip_norm=0.0), "clip_norm"),
        (dict(clip_norm="1"), "clip_norm"),
        (dict(progress="no"), "progress"),
        (dict(progress=1), "progress"),
        (dict(amp_dtype="bfloat16"), "amp_dtype"),
        (dict(amp_dtype=torch.float32), "amp_dtype"),
    ],
)
def test_train_options_are_checked_when_built(options, named):
    from transformer_lite.training import TrainOptions

    with pytest.raises(ValueError, match=named):
        TrainOptions(**options)


def test_train_options_accept_every_documented_choice():
    """The values the bad ones above are told apart from."""
    from transformer_lite.training import TrainOptions

    for options in (
        dict(clip_norm=None),
        dict(clip_norm=2),
        dict(accumulate=4),
        dict(amp_dtype=torch.bfloat16),
        dict(amp_dtype=torch.float16),  # the step checks the device
        dict(progress=False),
    ):
        built = TrainOptions(**options)
        for name, value in options.items():
            assert getattr(built, name) == value


def tiny_fit_setup():
    from transformer_lite import make_model
    from transformer_lite.training import (
        Batch,
        LabelSmoothingLoss,
        seq2seq_loss,
    )

    model = make_model(9, 9, n_layers=1, d_model=8, d_ff=8, n_heads=2)
    batch = Batch(torch.randint(1, 9, (2, 4)), torch.randint(1, 9, (2, 5)), 0)
    objective = seq2seq_loss(LabelSmoothingLoss(9, 0, reduction="sum"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, [batch], objective, optimizer


@pytest.mark.parametrize(
    "arguments, named",
    [
        (dict(epochs=True), "epochs"),
        (dict(epochs=0), "epochs"),
        (dict(max_steps=0), "max_steps"),
        (dict(max_steps=2.0), "max_steps"),
        (dict(on_step="print"), "on_step"),
        (dict(options=dict(clip_norm=None)), "options must be TrainOptions"),
        (dict(objective=None), "objective must be"),
        (dict(patience=0, val_batches=[]), "patience"),
    ],
)
def test_fit_checks_its_arguments_before_the_first_step(arguments, named):
    from transformer_lite.training import fit

    model, batches, objective, optimizer = tiny_fit_setup()
    objective = arguments.pop("objective", objective)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=named):
        fit(model, batches, objective, optimizer, **arguments)
    after = list(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_evaluate_wants_an_objective():
    from transformer_lite.training import evaluate

    model, batches, _, _ = tiny_fit_setup()
    with pytest.raises(ValueError, match="objective must be callable"):
        evaluate(model, batches, "cross_entropy")


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(norm_first="no"), "norm_first"),
        (dict(steps=True), "steps"),
        (dict(steps=0), "steps"),
        (dict(keep_last=0), "keep_last"),
        (dict(save_every=0), "save_every"),
        (dict(batch_size=1.5), "batch_size"),
        (dict(smoothing=1.0), "smoothing"),
        (dict(digits_share=-0.1), "digits_share"),
        (dict(lr_factor=0), "lr_factor"),
        (dict(seed=None), "seed"),
        (dict(src_vocab=4), "src_vocab"),
        (dict(pair="en-de"), "pair"),
        (dict(d_model=130), "divisible"),
    ],
)
def test_translate_config_checks_every_field(fields, named):
    from transformer_lite.tasks.trainer import TranslateConfig

    with pytest.raises(ValueError, match=named):
        TranslateConfig(**fields)


@pytest.mark.parametrize("seed", [None, True, 1.0, -1])
def test_number_splits_wants_an_int_seed(seed):
    """seed=None drew different splits on every call."""
    from transformer_lite.tasks.numbers import number_splits

    with pytest.raises(ValueError, match="seed"):
        number_splits(10, 2, 2, seed=seed)


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: _mha(8.0, 2), "d_model"),
        (lambda: _mha(8, 2, dropout=True), "dropout"),
        (lambda: _mha(8, 2, kernel="fast"), "kernel must be one of"),
        (lambda: _chunked(chunk_size=True), "chunk_size"),
        (lambda: _sdpa_of_ints(), "floating"),
        (lambda: sinusoidal_table(4, 8, dtype=torch.int64), "dtype"),
        (lambda: _padding(True), "pad_id"),
        (lambda: _noam(warmup=True), "warmup"),
    ],
)
def test_more_options_found_while_trying_bad_input(call, named):
    with pytest.raises(ValueError, match=named):
        call()


def _mha(*args, **kwargs):
    from transformer_lite import MultiHeadAttention

    return MultiHeadAttention(*args, **kwargs)


def _chunked(**kwargs):
    from transformer_lite import chunked_attention

    q = torch.randn(2, 3, 4)
    return chunked_attention(q, q, q, **kwargs)


def _sdpa_of_ints():
    from transformer_lite import scaled_dot_product_attention

    q = torch.ones(1, 2, 4, dtype=torch.long)
    return scaled_dot_product_attention(q, q, q)


def _padding(pad_id):
    from transformer_lite import padding_mask

    return padding_mask(torch.ones(2, 3, dtype=torch.long), pad_id)


def _noam(**kwargs):
    from transformer_lite.training import noam_scheduler

    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    return noam_scheduler(optimizer, 16, **kwargs)


def test_decoders_check_source_ids_on_the_cpu():
    from transformer_lite import make_model
    from transformer_lite.decoding import greedy_decode

    model = make_model(10, 10, n_layers=1, d_model=8, d_ff=8, n_heads=2)
    src = torch.full((2, 3), 15)  # an IndexError deep inside, before
    with pytest.raises(ValueError, match="outside the vocabulary"):
        greedy_decode(model, src, max_len=3, bos_id=1)


def test_saving_into_a_missing_directory_says_so(tmp_path):
    from transformer_lite import make_model
    from transformer_lite.training import save_checkpoint

    model = make_model(10, 10, n_layers=1, d_model=8, d_ff=8, n_heads=2)
    with pytest.raises(ValueError, match="no directory"):
        save_checkpoint(tmp_path / "missing" / "m.pt", model)
