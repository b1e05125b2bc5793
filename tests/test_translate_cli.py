"""The chapter 7 command line and Translator: the plumbing, not the
quality (a few training steps of a tiny model)."""

import subprocess
import sys

import pytest
import torch

from transformer_lite.device import module_device
from transformer_lite.tasks import translate as translate_cli
from transformer_lite.tasks.trainer import (
    TranslateConfig,
    default_model_dir,
    train,
)
from transformer_lite.tasks.translate import main
from transformer_lite.tasks.translator import Translator

TINY = [
    "--n-train", "200", "--n-valid", "20", "--n-test", "20",
    "--steps", "4", "--save-every", "2", "--keep-last", "2",
    "--d-model", "16", "--d-ff", "32", "--n-layers", "1", "--n-heads", "2",
    "--batch-size", "32", "--max-len", "40", "--quiet",
]  # fmt: skip

META = torch.device("meta")  # a device that is not the CPU; holds no data


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("models")
    assert main(["train", "--model-dir", str(path), *TINY]) == 0
    return path


def test_train_saves_the_averaged_model_and_checkpoints(model_dir):
    assert (model_dir / "de-en.pt").is_file()
    saved = sorted(p.name for p in (model_dir / "de-en-checkpoints").iterdir())
    assert saved == ["step-000002.pt", "step-000004.pt"]
    state = torch.load(model_dir / "de-en.pt", weights_only=True)
    assert state["extra"]["config"]["steps"] == 4
    assert "src_tokenizer" in state["extra"]


def test_translate_prints_one_line_per_text(model_dir, capsys):
    capsys.readouterr()
    texts = ["dreihundertzwölf", "einundzwanzig"]
    assert (
        main(["--model-dir", str(model_dir), "--beam-size", "2", *texts]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    translator = Translator.load(model_dir / "de-en.pt")
    assert translator.translate(texts, beam_size=2) == lines


def test_module_runs_as_a_program(model_dir):
    done = subprocess.run(
        [sys.executable, "-m", "transformer_lite.tasks.translate",
         "--model", str(model_dir / "de-en.pt"), "--beam-size", "1",
         "vierhunderteinundzwanzig"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1


def test_missing_model_is_explained(tmp_path, capsys):
    assert main(["--model-dir", str(tmp_path), "--pair", "fr-en", "cent"]) == 2
    err = capsys.readouterr().err
    assert "fr-en.pt" in err and "translate train --pair fr-en" in err


def test_tsv_corpus_and_default_dir(tmp_path, monkeypatch):
    corpus = tmp_path / "pairs.tsv"
    corpus.write_text("eins\tone\nzwei\ttwo\ndrei\tthree\n", encoding="utf-8")
    model = tmp_path / "tiny.pt"
    args = ["train", "--tsv", str(corpus), "--model", str(model), *TINY]
    assert main(args) == 0
    assert Translator.load(model).translate(["zwei"], beam_size=1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_model_dir() == tmp_path / "transformer-lite"


def test_train_is_reproducible(tmp_path):
    config = TranslateConfig(
        n_layers=1,
        d_model=16,
        d_ff=32,
        n_heads=2,
        steps=3,
        save_every=3,
        keep_last=1,
        batch_size=4,
        max_len=40,
    )
    pairs = [("eins", "one"), ("zwei", "two"), ("drei", "three")] * 4
    runs = [
        train(pairs, config, tmp_path / str(i), progress=False)
        for i in range(2)
    ]
    assert runs[0].step_loss == runs[1].step_loss
    assert len(runs[0].step_loss) == 3 and len(runs[0].checkpoints) == 1
    first, second = (r.translator.model.state_dict() for r in runs)
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_cli_trains_on_digit_balanced_numbers(tmp_path, monkeypatch):
    """The command line trains as chapter 7 does: short numbers repeated
    (balance_digits), tokenizers learnt on the distinct numbers."""
    import transformer_lite.tasks.translate as translate

    seen = {}

    def recording_train(pairs, config, out_dir, valid, tokenizers, **kw):
        seen.update(pairs=pairs, config=config, tokenizers=tokenizers)
        return train(pairs, config, out_dir, valid, tokenizers, **kw)

    monkeypatch.setattr(translate, "train", recording_train)
    args = ["train", "--model-dir", str(tmp_path), "--digits-share", "0.2"]
    assert main([*args, *TINY]) == 0
    english = [target for _, target in seen["pairs"]]
    one_digit = {"zero", "one", "two", "three", "four", "five", "six",
                 "seven", "eight", "nine"}  # fmt: skip
    assert sum(t in one_digit for t in english) >= 0.15 * 200  # ~ 0.2 * 200
    assert len(english) > 200  # the repeats come on top of the split
    assert seen["tokenizers"] is not None


def test_the_cli_translates_on_the_default_device(model_dir, monkeypatch):
    """Checkpoints are averaged and loaded on the CPU; the model then goes
    to default_device() (here a stand-in device that records it)."""
    devices = []

    def translate(self, texts, *args, **kwargs):
        devices.append(module_device(self.model))
        return [""] * len(texts)

    monkeypatch.setattr(translate_cli, "default_device", lambda: META)
    monkeypatch.setattr(Translator, "translate", translate)
    assert main(["--model-dir", str(model_dir), "einundzwanzig"]) == 0
    assert main(["train", "--model-dir", str(model_dir), *TINY]) == 0
    assert devices == [META, META]
