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
    "--batch-size", "32", "--max-len", "40", "--slice-size", "5",
    "--quiet",
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
        main(
            [
                "--model-dir",
                str(model_dir),
                "--beam-size",
                "2",
                "--unchecked",
                *texts,
            ]
        )
        == 0  # fmt: skip
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    translator = Translator.load(model_dir / "de-en.pt")
    assert translator.translate(texts, beam_size=2) == lines


def test_module_runs_as_a_program(model_dir):
    done = subprocess.run(
        [sys.executable, "-m", "transformer_lite.tasks.translate",
         "--model", str(model_dir / "de-en.pt"), "--beam-size", "1",
         "--unchecked", "vierhunderteinundzwanzig"],
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
        return ["twenty-one"] * len(texts)  # right for einundzwanzig

    monkeypatch.setattr(translate_cli, "default_device", lambda: META)
    monkeypatch.setattr(Translator, "translate", translate)
    assert main(["--model-dir", str(model_dir), "einundzwanzig"]) == 0
    assert main(["train", "--model-dir", str(model_dir), *TINY]) == 0
    assert devices == [META] * 3  # the text; the test split; the slices


# ----------------------------------------------------------------------------
# Every option checked before work starts; errors as one line, status 2


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("python -m transformer_lite.tasks.translate")
    return lines[0]


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if training starts."""
    import transformer_lite.tasks.translate as translate

    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(translate, "train", refuse)


@pytest.mark.parametrize(
    "option, value, named",
    [
        ("--keep-last", "0", "keep_last"),
        ("--steps", "0", "steps"),
        ("--save-every", "0", "save_every"),
        ("--warmup", "0", "warmup"),
        ("--batch-size", "-1", "batch_size"),
        ("--dropout", "1.5", "dropout"),
        ("--lr-factor", "nan", "lr_factor"),
        ("--n-heads", "3", "divisible"),
        ("--max-digits", "400", "max_digits"),
        ("--steps", "many", "invalid int"),
    ],
)
def test_bad_train_options_fail_before_training(
    tmp_path, capsys, no_training, option, value, named
):
    args = ["train", "--model-dir", str(tmp_path), *TINY, option, value]
    assert main(args) == 2
    assert named in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_as_model_fails_before_training(
    tmp_path, capsys, no_training
):
    (tmp_path / "here").mkdir()
    args = ["train", "--model", str(tmp_path / "here"), *TINY]
    assert main(args) == 2
    assert "is a directory" in one_error_line(capsys)


def test_a_tsv_line_longer_than_max_len_fails_before_step_one(
    tmp_path, capsys
):
    corpus = tmp_path / "pairs.tsv"
    long_line = " ".join(["eins zwei drei"] * 20)
    corpus.write_text(f"eins\tone\n{long_line}\tone two\n", encoding="utf-8")
    args = ["train", "--tsv", str(corpus), "--model", str(tmp_path / "m.pt")]
    assert main([*args, *TINY, "--max-len", "16"]) == 2
    message = one_error_line(capsys)
    assert "pairs[1]: the source" in message and "max_len=16" in message
    assert not (tmp_path / "m-checkpoints").exists()


def test_commands_and_options_in_any_order(model_dir, capsys):
    model = str(model_dir / "de-en.pt")
    orders = [
        ["text", "--model", model, "--beam-size", "1", "--unchecked", "zwei"],
        ["--beam-size", "1", "text", "zwei", "--unchecked", "--model", model],
        ["--unchecked", "--model", model, "zwei", "--beam-size", "1"],
    ]
    outputs = []
    for argv in orders:
        capsys.readouterr()
        assert main(argv) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].strip()
    assert main(["--quiet", "text", "--model", model, "zwei"]) == 2
    assert "--quiet: not an option of 'text'" in one_error_line(capsys)
    assert main(["train", "--beam-size", "2", "--model", model]) == 2
    assert "--beam-size" in one_error_line(capsys)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--beam-size", "0", "zwei"], "beam_size"),
        (["--length-penalty", "inf", "zwei"], "length_penalty"),
        (["--pair", "xx-en", "zwei"], "invalid choice"),
        (["text"], "nothing to translate"),
    ],
)
def test_bad_translate_options_are_one_line(model_dir, capsys, argv, named):
    assert main(["--model-dir", str(model_dir), *argv]) == 2
    assert named in one_error_line(capsys)


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage", b"PK\x03\x04 truncated zip"],
    ids=["empty", "garbage", "zip"],
)
def test_a_corrupt_model_file_is_one_line(tmp_path, capsys, content):
    (tmp_path / "m.pt").write_bytes(content)
    assert main(["--model", str(tmp_path / "m.pt"), "zwei"]) == 2
    assert "cannot read checkpoint" in one_error_line(capsys)


def test_a_model_file_without_tokenizers_is_one_line(tmp_path, capsys):
    from transformer_lite import make_model
    from transformer_lite.training.checkpoint import save_checkpoint

    model = make_model(9, 9, n_layers=1, d_model=8, d_ff=8, n_heads=2)
    save_checkpoint(tmp_path / "m.pt", model, src_tokenizer="{not json")
    assert main(["--model", str(tmp_path / "m.pt"), "zwei"]) == 2
    assert "src_tokenizer" in one_error_line(capsys)


def test_an_untranslatable_text_is_reported_and_the_others_translated(
    model_dir, capsys
):
    translator = Translator.load(model_dir / "de-en.pt")
    too_long = " ".join(["dreihundertzwölf"] * 30)  # > max_len=40 tokens
    texts = ["zwei", too_long, "einundzwanzig"]
    with pytest.raises(ValueError, match="text 1: .* more than the model"):
        translator.translate(texts, beam_size=1)
    capsys.readouterr()
    argv = ["--model-dir", str(model_dir), "--beam-size", "1", *texts]
    argv.append("--unchecked")  # the tiny model's answers are wrong
    assert main(argv) == 1
    out = capsys.readouterr()
    lines = out.out.split("\n")[:3]
    assert lines[1] == "" and lines[0] and lines[2]
    assert [lines[0], lines[2]] == translator.translate(
        [texts[0], texts[2]], beam_size=1
    )
    assert "text 2" in out.err and "Traceback" not in out.err


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(batch_size=-1), "batch_size"),
        (dict(batch_size=True), "batch_size"),
        (dict(beam_size=0), "beam_size"),
        (dict(length_penalty=float("inf")), "length_penalty"),
    ],
)
def test_translator_checks_its_options(model_dir, options, named):
    translator = Translator.load(model_dir / "de-en.pt")
    with pytest.raises(ValueError, match=named):
        translator.translate(["zwei"], **options)


def test_no_traceback_and_no_carriage_returns_from_the_program(
    model_dir, tmp_path
):
    """Run as a program with stderr to a pipe (a log): a bad file is one
    line and status 2; training shows no progress bar, since nobody
    watches, so no carriage returns reach the log."""
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 100)
    program = [sys.executable, "-m", "transformer_lite.tasks.translate"]
    done = subprocess.run(
        [*program, "--model", str(bad), "zwei"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    tiny = [a for a in TINY if a != "--quiet"]
    done = subprocess.run(
        [*program, "train", "--model-dir", str(tmp_path), *tiny],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "\r" not in done.stdout


# ----------------------------------------------------------------------------
# The translator knows its domain: inputs outside it refused, answers that
# do not round-trip flagged (one line each on stderr, an empty stdout line)

OUTSIDE = ["Guten Morgen", "eine Million", "dreiundzwanzig Äpfel"]


def test_inputs_outside_the_domain_are_reported_and_not_translated(
    model_dir, capsys
):
    texts = [*OUTSIDE, "einundzwanzig"]
    capsys.readouterr()
    assert (
        main(["--model-dir", str(model_dir), "--beam-size", "1", *texts]) == 1
    )
    out = capsys.readouterr()
    assert out.out.split("\n")[:3] == ["", "", ""]
    errors = out.err.splitlines()
    for i, text in enumerate(OUTSIDE):
        (line,) = [e for e in errors if f"text {i + 1} ({text!r})" in e]
        assert "not the German words of a number below 1,000,000" in line
    assert "Traceback" not in out.err
    translator = Translator.load(model_dir / "de-en.pt")
    assert translator.domain is not None
    with pytest.raises(ValueError, match="text 0: not the German words"):
        translator.translate(OUTSIDE[:1])


@pytest.mark.parametrize(
    "answer, flagged",
    [
        ("twenty-one", None),
        ("seventy-one thousand and seventy-seven", "is 71,077, which is"),
        ("zero thousand and seven", "not the English words of a number"),
        ("twenty one", "not the English words of a number"),
    ],
)
def test_answers_that_do_not_round_trip_are_flagged(
    model_dir, capsys, monkeypatch, answer, flagged
):
    monkeypatch.setattr(
        Translator, "translate", lambda self, texts, *a: [answer] * len(texts)
    )
    capsys.readouterr()
    status = main(["--model-dir", str(model_dir), "einundzwanzig"])
    out = capsys.readouterr()
    if flagged is None:
        assert (status, out.out, out.err) == (0, "twenty-one\n", "")
    else:
        assert (status, out.out) == (1, "\n")
        assert "text 1 ('einundzwanzig'): cannot trust" in out.err
        assert flagged in out.err
    # --unchecked prints what the model says
    assert (
        main(["--model-dir", str(model_dir), "--unchecked", "einundzwanzig"])
        == 0
    )
    assert capsys.readouterr().out == answer + "\n"


@pytest.mark.parametrize(
    "domain",
    [{"pair": "xx-en", "max_digits": 6}, {"pair": "de-en"}, [1], "de-en",
     {"pair": "de-en", "max_digits": True}],
)  # fmt: skip
def test_a_crafted_domain_in_a_checkpoint_is_refused(
    model_dir, tmp_path, capsys, domain
):
    state = torch.load(model_dir / "de-en.pt", weights_only=True)
    state["extra"]["domain"] = domain
    torch.save(state, tmp_path / "m.pt")
    with pytest.raises(ValueError, match="the checkpoint's domain"):
        Translator.load(tmp_path / "m.pt")
    assert main(["--model", str(tmp_path / "m.pt"), "zwei"]) == 2
    assert "domain" in one_error_line(capsys)
