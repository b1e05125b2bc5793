"""Tests for transformer_lite.training.checkpoint (chapters 6, 7 and 9):
resuming from a checkpoint equals training straight through, a model is
rebuilt from its saved config with the same outputs (its position scheme
too), a model of another configuration or vocabulary is named field by
field, and missing, corrupt, pickled and foreign files are clear errors.
tests/test_checkpoint_safety.py feeds it untrusted files and
tests/test_average_checkpoints.py averages checkpoints."""

import pytest
import torch
from conftest import (
    PAD,
    padded_src_tgt,
    random_batch,
    same_parameters,
    tiny_model,
)
from conftest import VOCAB as V

from transformer_lite import make_model
from transformer_lite.training import (
    History,
    LabelSmoothingLoss,
    TrainOptions,
    fit,
    noam_scheduler,
    seq2seq_loss,
)
from transformer_lite.training.checkpoint import (
    CHECKPOINT_FORMAT,
    load_checkpoint,
    save_checkpoint,
)

FOUR_HEADS = dict(n_layers=2, d_model=16, d_ff=32, n_heads=4)


def _train(model, epochs, optimizer, scheduler):
    batches = [random_batch(seed=s) for s in range(3)]
    fit(
        model,
        batches,
        seq2seq_loss(LabelSmoothingLoss(V, PAD, reduction="sum")),
        optimizer,
        scheduler=scheduler,
        epochs=epochs,
        options=TrainOptions(progress=False),
    )


def _optimizer_and_scheduler(model):
    optimizer = torch.optim.Adam(model.parameters())
    return optimizer, noam_scheduler(optimizer, 16, warmup=2)


def test_resuming_from_a_checkpoint_equals_training_straight_through(
    tmp_path,
):
    straight = tiny_model()
    _train(straight, 2, *_optimizer_and_scheduler(straight))

    first = tiny_model()
    optimizer, scheduler = _optimizer_and_scheduler(first)
    _train(first, 1, optimizer, scheduler)
    history = History(train_loss=[1.5])
    save_checkpoint(
        tmp_path / "ckpt.pt",
        first,
        optimizer,
        scheduler,
        epoch=1,
        history=history.to_dict(),
    )

    resumed = tiny_model(seed=1)  # other initial weights, overwritten
    optimizer, scheduler = _optimizer_and_scheduler(resumed)
    model, extra = load_checkpoint(
        tmp_path / "ckpt.pt", resumed, optimizer, scheduler
    )
    assert model is resumed
    assert extra == {"epoch": 1, "history": history.to_dict()}
    assert scheduler.last_epoch == 3
    _train(resumed, 1, optimizer, scheduler)
    assert same_parameters(resumed, straight)


def test_load_rebuilds_the_model_from_its_config(tmp_path):
    saved = tiny_model(n_heads=4, norm_first=True)
    save_checkpoint(tmp_path / "m.pt", saved)
    raw = torch.load(tmp_path / "m.pt", weights_only=True)
    assert raw["config"] == saved.config.to_dict()
    model, extra = load_checkpoint(tmp_path / "m.pt")
    assert model.config == saved.config and extra == {}
    batch = random_batch()
    saved.eval()
    model.eval()
    torch.testing.assert_close(
        model(batch.src, batch.tgt_in),
        saved(batch.src, batch.tgt_in),
        rtol=0,
        atol=0,
    )


def test_load_accepts_another_dropout(tmp_path):
    save_checkpoint(tmp_path / "m.pt", tiny_model(dropout=0.1))
    model, _ = load_checkpoint(tmp_path / "m.pt", tiny_model(seed=3))
    assert same_parameters(model, tiny_model(dropout=0.1))


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(d_model=32), ["d_model: checkpoint 16, model 32"]),
        (dict(n_layers=2, norm_first=True), ["n_layers", "norm_first"]),
    ],
)
def test_load_names_the_config_fields_that_differ(tmp_path, fields, named):
    save_checkpoint(tmp_path / "m.pt", tiny_model())
    with pytest.raises(ValueError, match="another configuration") as info:
        load_checkpoint(tmp_path / "m.pt", tiny_model(**fields))
    for text in named:
        assert text in str(info.value)


def test_load_names_a_different_vocabulary(tmp_path):
    save_checkpoint(tmp_path / "m.pt", tiny_model())
    other = make_model(V + 2, V, n_layers=1, d_model=16, d_ff=32, n_heads=2)
    with pytest.raises(ValueError, match=f"src_vocab: checkpoint {V}, model"):
        load_checkpoint(tmp_path / "m.pt", other)


def test_load_rejects_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint file"):
        load_checkpoint(tmp_path / "missing.pt")
    save_checkpoint(tmp_path / "good.pt", tiny_model())
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    for name in ("truncated.pt", "garbage.pt"):
        with pytest.raises(ValueError, match="cannot read checkpoint"):
            load_checkpoint(tmp_path / name)


def test_load_rejects_pickled_objects_and_foreign_files(tmp_path):
    torch.save(
        {"format": CHECKPOINT_FORMAT, "x": History()}, tmp_path / "pickled.pt"
    )
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "pickled.pt")
    torch.save(tiny_model().state_dict(), tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="not a transformer-lite"):
        load_checkpoint(tmp_path / "weights.pt")


def test_save_refuses_what_weights_only_cannot_load(tmp_path):
    with pytest.raises(ValueError, match=r"\['history'\] is a History"):
        save_checkpoint(tmp_path / "m.pt", tiny_model(), history=History())
    assert not (tmp_path / "m.pt").exists()


def test_load_needs_saved_optimizer_state_to_restore_it(tmp_path):
    model = tiny_model()
    save_checkpoint(tmp_path / "m.pt", model)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(
            tmp_path / "m.pt", model, torch.optim.Adam(model.parameters())
        )


@pytest.mark.parametrize("position", ["learned", "t5", "shaw"])
def test_checkpoints_keep_the_scheme(position, tmp_path):
    torch.manual_seed(0)
    model = make_model(13, 13, **FOUR_HEADS, max_len=20, position=position)
    for p in model.parameters():  # every table away from its start
        torch.nn.init.normal_(p)
    path = tmp_path / "model.pt"
    save_checkpoint(path, model)
    loaded, _ = load_checkpoint(path)
    assert loaded.config.position == position
    src, tgt = padded_src_tgt()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.eval()(src, tgt), model.eval()(src, tgt)
        )
    if position == "t5":  # still one table per stack after loading
        scheme = [layer.self_attn.position for layer in loaded.encoder.layers]
        assert scheme[0] is scheme[1]
