"""transformer_lite.training.checkpoint.average_checkpoints (chapter 7)."""

import pytest
import torch

from transformer_lite import make_model
from transformer_lite.training.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


def saved_models(tmp_path, n=3, **config):
    paths, models = [], []
    for i in range(n):
        torch.manual_seed(i)
        model = make_model(
            9, 7, n_layers=1, d_model=8, d_ff=16, n_heads=2, **config
        )
        path = tmp_path / f"step-{i}.pt"
        save_checkpoint(path, model, step=i)
        paths.append(path)
        models.append(model)
    return paths, models


def test_weights_are_the_mean(tmp_path):
    paths, models = saved_models(tmp_path)
    average, extra = average_checkpoints(paths)
    assert extra == {"step": 2}  # the last file's extra data
    for name, value in average.state_dict().items():
        mean = sum(m.state_dict()[name] for m in models) / len(models)
        torch.testing.assert_close(value, mean, rtol=1e-6, atol=1e-7)
    first = models[0].state_dict()["generator.weight"]
    assert not torch.equal(average.state_dict()["generator.weight"], first)


def test_one_checkpoint_is_itself(tmp_path):
    paths, _ = saved_models(tmp_path, n=1)
    average, _ = average_checkpoints(paths)
    loaded, _ = load_checkpoint(paths[0])
    for name, value in loaded.state_dict().items():
        assert torch.equal(average.state_dict()[name], value)


def test_tied_embeddings_stay_tied(tmp_path):
    torch.manual_seed(0)
    paths = []
    for i in range(2):
        model = make_model(
            9,
            9,
            n_layers=1,
            d_model=8,
            d_ff=16,
            n_heads=2,
            tie_embeddings=True,
        )
        paths.append(tmp_path / f"tied-{i}.pt")
        save_checkpoint(paths[-1], model)
    average, _ = average_checkpoints(paths)
    assert average.generator.weight is average.src_embed.weight


def test_different_configurations_are_refused(tmp_path):
    paths, _ = saved_models(tmp_path, n=1)
    other = make_model(9, 7, n_layers=2, d_model=8, d_ff=16, n_heads=2)
    save_checkpoint(tmp_path / "other.pt", other)
    with pytest.raises(ValueError, match="n_layers"):
        average_checkpoints([tmp_path / "other.pt", paths[0]])
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])
