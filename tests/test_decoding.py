"""Tests for transformer_lite.decoding (chapter 6)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

from transformer_lite import (
    TransformerConfig,
    make_model,
    padding_mask,
    seed_everything,
)
from transformer_lite.decoding import beam_search, exact_match, greedy_decode

V = 12
PAD, BOS, EOS = 3, 1, 2  # a pad id other than 0: read from the config


class ScriptedModel(nn.Module):
    """Emits ``script[row][t]`` as token t + 1 whatever came before; the
    row is read from ``src[:, 0]``. Records how it was called."""

    def __init__(self, script: list[list[int]]) -> None:
        super().__init__()
        self.config = TransformerConfig(
            V,
            V,
            n_layers=1,
            d_model=2,
            d_ff=2,
            n_heads=1,
            max_len=50,
            pad_id=PAD,
        )
        self.script = torch.tensor(script)  # (rows, steps)
        self.weight = nn.Parameter(torch.zeros(()))  # gives it a device
        self.calls = []

    def _record(self, name: str) -> None:
        self.calls.append((name, self.training, torch.is_grad_enabled()))

    def source_mask(self, src):
        return padding_mask(src, PAD)  # (B, 1, S)

    def logits(self, hidden):
        return hidden  # decode's output is already the scores

    def encode(self, src, src_mask):
        self._record("encode")
        return src[:, :1, None].float()  # (B, 1, 1): the row's script

    def decode(self, memory, src_mask, tgt, tgt_mask=None):
        self._record("decode")
        rows = memory[:, 0, 0].long()  # (B,)
        next_token = self.script[rows, tgt.size(1) - 1]  # (B,)
        scores = nn.functional.one_hot(next_token, V).float()  # (B, V)
        return scores.unsqueeze(1).expand(-1, tgt.size(1), -1)  # (B, L, V)


SCRIPT = [
    [5, 6, EOS, 7, 8, 9],
    [5, EOS, 9, 9, 9, 9],
    [4, 4, 4, 4, EOS, 9],
]


def scripted_src(rows=(0, 1, 2)) -> torch.Tensor:
    return torch.tensor([[r, 7, 7] for r in rows])  # (B, 3)


def test_rows_stop_at_eos_and_are_padded_after_it():
    model = ScriptedModel(SCRIPT)
    out = greedy_decode(
        model,
        scripted_src(),
        max_len=7,
        bos_id=BOS,
        eos_id=EOS,
    )
    expected = torch.tensor(
        [
            [BOS, 5, 6, EOS, PAD, PAD],
            [BOS, 5, EOS, PAD, PAD, PAD],
            [BOS, 4, 4, 4, 4, EOS],
        ]
    )
    assert torch.equal(out, expected)  # 6 < max_len: all rows finished
    assert [c[0] for c in model.calls] == ["encode"] + ["decode"] * 5


def test_without_eos_every_row_runs_to_max_len():
    model = ScriptedModel(SCRIPT)
    out = greedy_decode(model, scripted_src(), max_len=7, bos_id=BOS)
    assert torch.equal(out[:, 1:], model.script)
    assert out.shape == (3, 7)
    assert torch.equal(out[:, 0], torch.full((3,), BOS))


def test_max_len_cuts_rows_that_have_not_finished():
    model = ScriptedModel(SCRIPT)
    out = greedy_decode(
        model,
        scripted_src(),
        max_len=3,
        bos_id=BOS,
        eos_id=EOS,
    )
    assert torch.equal(
        out, torch.tensor([[BOS, 5, 6], [BOS, 5, EOS], [BOS, 4, 4]])
    )
    out = greedy_decode(
        model,
        scripted_src(),
        max_len=1,
        bos_id=BOS,
        eos_id=EOS,
    )
    assert torch.equal(out, torch.full((3, 1), BOS))


@pytest.mark.parametrize("training", [True, False])
def test_decoding_runs_in_eval_mode_without_gradients(training):
    model = ScriptedModel(SCRIPT)
    model.train(training)
    greedy_decode(model, scripted_src(), max_len=5, bos_id=BOS, eos_id=EOS)
    assert model.calls[0][0] == "encode"
    assert {c[1:] for c in model.calls} == {(False, False)}
    assert model.training == training  # the mode is restored


def test_mode_is_restored_when_decoding_fails():
    model = ScriptedModel(SCRIPT)
    model.train()
    with pytest.raises(IndexError):  # the script has only 6 steps
        greedy_decode(model, scripted_src(), max_len=9, bos_id=BOS)
    assert model.training


def real_model(seed: int = 0) -> nn.Module:
    seed_everything(seed)
    model = make_model(
        V,
        V,
        n_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=4,
        dropout=0.1,
        pad_id=PAD,
    )
    return model.double()


def padded_source(seed: int = 0) -> tuple[torch.Tensor, list[int]]:
    """Five rows of different real lengths, padded to the longest."""
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 2, 4, 6, 3]
    src = torch.randint(4, V, (len(lengths), max(lengths)), generator=g)
    for row, n in enumerate(lengths):
        src[row, n:] = PAD
    return src, lengths


def test_each_row_equals_the_row_decoded_alone():
    model = real_model()
    src, lengths = padded_source()
    free = greedy_decode(
        model,
        src,
        src_mask=padding_mask(src, PAD),
        max_len=9,
        bos_id=BOS,
    )
    eos = int(free[1, 3])  # a token row 1 emits: some rows will stop
    batched = greedy_decode(
        model,
        src,
        src_mask=padding_mask(src, PAD),
        max_len=9,
        bos_id=BOS,
        eos_id=eos,
    )
    alone = [
        greedy_decode(
            model,
            src[i : i + 1, :n],
            max_len=9,
            bos_id=BOS,
            eos_id=eos,
        )[0]
        for i, n in enumerate(lengths)
    ]
    assert batched.size(1) == max(len(row) for row in alone)
    assert any(len(row) < 9 for row in alone)  # eos did stop some row
    for i, row in enumerate(alone):
        assert torch.equal(batched[i, : len(row)], row)
        assert (batched[i, len(row) :] == PAD).all()


def test_greedy_choice_is_the_argmax_of_the_full_forward_pass():
    """Teacher-forcing the decoded output reproduces it: each token is the
    most likely next token given the ones before."""
    model = real_model().eval()
    src, _ = padded_source(seed=1)
    src_mask = padding_mask(src, PAD)
    out = greedy_decode(model, src, src_mask=src_mask, max_len=8, bos_id=BOS)
    with torch.no_grad():
        logits = model(src, out[:, :-1], src_mask)  # (B, 7, V)
    assert torch.equal(logits.argmax(-1), out[:, 1:])


def test_inputs_are_checked():
    model = real_model()
    src, _ = padded_source()
    mask = padding_mask(src, PAD)
    bad = [
        (dict(src=src[0]), "src must be a"),
        (dict(src_mask=mask[:, 0]), "src_mask must be"),
        (dict(src_mask=mask.long()), "src_mask must be"),
        (dict(src_mask=mask[:2]), "src_mask must be"),
        (dict(max_len=0), "max_len"),
        (dict(max_len=model.config.max_len + 1), "max_len"),
        (dict(bos_id=V), "bos_id"),
        (dict(bos_id=-1), "bos_id"),
        (dict(eos_id=V), "eos_id"),
    ]
    for override, match in bad:
        kwargs = dict(src=src, src_mask=mask, max_len=5, bos_id=BOS)
        with pytest.raises(ValueError, match=match):
            greedy_decode(model, **{**kwargs, **override})


def test_exact_match_pads_the_shorter_side():
    expected = torch.tensor([[BOS, 5, 6, EOS, PAD], [BOS, 7, EOS, PAD, PAD]])
    predicted = torch.tensor([[BOS, 5, 6, EOS], [BOS, 7, 7, EOS]])
    assert exact_match(predicted, expected, PAD).tolist() == [True, False]
    assert exact_match(expected, predicted, PAD).tolist() == [True, False]
    assert exact_match(predicted[:, :2], expected, PAD).tolist() == [
        False,
        False,
    ]
    with pytest.raises(ValueError, match="batch sizes"):
        exact_match(predicted[:1], expected, PAD)
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        exact_match(predicted[0], expected, PAD)


def test_decoding_never_changes_the_models_mode():
    """The decoders read the model and never switch it to eval mode and
    back, which would race with another thread using it."""
    model = make_model(V, V, n_layers=1, d_model=16, d_ff=32, n_heads=2)
    model.train()
    modes = []
    hook = model.encoder.register_forward_pre_hook(
        lambda module, args: modes.append(model.training)
    )
    src = torch.randint(4, V, (2, 5))
    greedy_decode(model, src, max_len=4, bos_id=BOS)
    beam_search(model, src, max_len=4, bos_id=BOS, eos_id=EOS, beam_size=2)
    hook.remove()
    assert modes == [True, True]  # the original stays in training mode
    assert all(m.training for m in model.modules())


def test_threads_decoding_one_model_in_training_mode_agree():
    """Eight threads decode with one model (dropout 0.3, training mode):
    every output equals the eval-mode output, and the mode stays."""
    seed_everything(0)
    model = make_model(
        V, V, n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.3
    ).train()
    src = torch.randint(4, V, (3, 6))
    expected = greedy_decode(model, src, max_len=8, bos_id=BOS)

    def decode(_):
        return [
            greedy_decode(model, src, max_len=8, bos_id=BOS) for _ in range(5)
        ]

    with ThreadPoolExecutor(max_workers=8) as pool:
        outputs = [ys for run in pool.map(decode, range(8)) for ys in run]
    differ = sum(not torch.equal(ys, expected) for ys in outputs)
    assert differ == 0, f"{differ} of {len(outputs)} outputs differ"
    assert all(m.training for m in model.modules())
    with torch.no_grad():
        assert torch.equal(
            expected, greedy_decode(model.eval(), src, max_len=8, bos_id=BOS)
        )


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(max_len=True), "max_len"),
        (dict(bos_id=True), "bos_id"),
        (dict(bos_id=1.0), "bos_id"),
        (dict(eos_id=False), "eos_id"),
        (dict(use_cache="yes"), "use_cache"),
    ],
)
def test_greedy_rejects_bools_and_floats(options, named):
    model = make_model(V, V, n_layers=1, d_model=16, d_ff=32, n_heads=2)
    src = torch.randint(4, V, (2, 5))
    kwargs = dict(max_len=4, bos_id=BOS) | options
    with pytest.raises(ValueError, match=named):
        greedy_decode(model, src, **kwargs)
