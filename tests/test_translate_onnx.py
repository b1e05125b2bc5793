"""The translator shipped (chapter 12): its graphs in ONNX Runtime give
the tokens PyTorch gives, greedy and beam, and the command line exports
them and translates with them."""

import json
import shutil
from dataclasses import replace

import pytest
import torch

from transformer_lite.decoding import beam_search, greedy_decode
from transformer_lite.shipping.export import (
    export_onnx,
    manifest_path,
    onnx_paths,
    weights_fingerprint,
)
from transformer_lite.shipping.runtime import (
    CompiledTransformer,
    OnnxTransformer,
    onnx_session,
)
from transformer_lite.tasks.translate import main
from transformer_lite.tasks.translator import Translator
from transformer_lite.tokens import BOS_ID, EOS_ID

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def shipped(tiny_translator, tmp_path_factory):
    """The tiny translator exported by the command line, and the runtime
    over its ONNX files."""
    directory = tmp_path_factory.mktemp("onnx")
    model = directory / "de-en.pt"
    shutil.copy(tiny_translator.path, model)
    torch.set_num_threads(1)
    assert main(["export", "--model", str(model)]) == 0
    config = tiny_translator.translator.model.config
    graphs = OnnxTransformer(directory, config, stem="de-en", threads=1)
    return directory, graphs


@pytest.fixture(scope="module")
def held_out(tiny_translator):
    translator = tiny_translator.translator
    texts = [s for s, _ in tiny_translator.test]
    return translator.src_tokenizer.encode_batch(texts)  # (B, S), padded


def test_greedy_tokens_equal_pytorch(tiny_translator, shipped, held_out):
    model, (_, graphs) = tiny_translator.translator.model, shipped
    options = dict(max_len=30, bos_id=BOS_ID, eos_id=EOS_ID, use_cache=True)
    expected = greedy_decode(model, held_out, **options)
    assert torch.equal(greedy_decode(graphs, held_out, **options), expected)
    one = greedy_decode(graphs, held_out[:1], **options)  # batch of one
    assert torch.equal(one, expected[:1, : one.size(1)])


@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_tokens_equal_pytorch(
    tiny_translator, shipped, held_out, beam_size
):
    model, (_, graphs) = tiny_translator.translator.model, shipped
    options = dict(max_len=30, bos_id=BOS_ID, eos_id=EOS_ID,
                   beam_size=beam_size, return_scores=True)  # fmt: skip
    ys, scores = beam_search(model, held_out, **options)
    ys_onnx, scores_onnx = beam_search(graphs, held_out, **options)
    assert torch.equal(ys_onnx, ys)
    torch.testing.assert_close(scores_onnx, scores, rtol=1e-4, atol=1e-4)


def test_a_translator_over_the_graphs_gives_the_same_texts(
    tiny_translator, shipped
):
    translator, (_, graphs) = tiny_translator.translator, shipped
    texts = [s for s, _ in tiny_translator.test]
    tokenizers = translator.src_tokenizer, translator.tgt_tokenizer
    onnx_translator = Translator(graphs, *tokenizers)
    assert onnx_translator.translate(texts) == translator.translate(texts)


def test_the_graphs_run_one_cached_step_only(shipped, held_out):
    _, graphs = shipped
    memory = graphs.encode(held_out)
    with pytest.raises(ValueError, match="one cached step"):
        graphs.decode(memory, None, torch.full((len(held_out), 1), BOS_ID))
    with pytest.raises(ValueError, match="use_cache=True"):
        greedy_decode(graphs, held_out, max_len=5, bos_id=BOS_ID)


def test_missing_files_are_explained(tmp_path, tiny_translator):
    config = tiny_translator.translator.model.config
    with pytest.raises(ValueError, match="export the model first"):
        OnnxTransformer(tmp_path, config)


@pytest.mark.parametrize("threads", [True, -1, 0, 1.5])
def test_a_session_wants_a_positive_count_of_threads(shipped, threads):
    # Before: True and -1 were accepted.
    directory, _ = shipped
    path = onnx_paths(directory, "de-en")["encoder"]
    with pytest.raises(ValueError, match="threads must be a positive int"):
        onnx_session(path, threads=threads)


def test_the_cli_exports_and_translates_with_onnx(
    tiny_translator, shipped, capsys
):
    directory, _ = shipped  # exported there by the command line
    for path in onnx_paths(directory, "de-en").values():
        assert path.is_file()
    model = directory / "de-en.pt"
    texts = [s for s, _ in tiny_translator.test[:5]]
    assert main(["--model", str(model), *texts]) == 0
    with_torch = capsys.readouterr().out
    assert main(["text", "--runtime", "onnx", "--model", str(model),
                 *texts]) == 0  # fmt: skip
    assert capsys.readouterr().out == with_torch
    assert len(with_torch.splitlines()) == len(texts)


def test_onnx_runtime_without_export_is_explained(
    tiny_translator, tmp_path, capsys
):
    model = tmp_path / "de-en.pt"
    shutil.copy(tiny_translator.path, model)
    assert main(["--model", str(model), "--runtime", "onnx", "zwölf"]) == 2
    err = capsys.readouterr().err
    assert "export the model first" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, named",
    [
        (["export", "zwölf"], "export takes no texts"),
        (["export", "--beam-size", "2"], "--beam-size"),
        (["export", "--steps", "2"], "--steps"),
        (["train", "--runtime", "onnx"], "--runtime"),
        (["--runtime", "tensorrt", "zwölf"], "invalid choice"),
    ],
)
def test_bad_export_options_are_one_line(tmp_path, capsys, argv, named):
    assert main(["--model-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.splitlines()) == 1


def test_the_same_graphs_in_pytorch_give_the_same_tokens(
    tiny_translator, held_out
):
    """The loop over the graphs, without ONNX: the graphs themselves
    add nothing to the model (torch.compile's row in chapter 12)."""
    model = tiny_translator.translator.model
    graphs = CompiledTransformer(model, compile=False)
    options = dict(max_len=30, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=3)
    expected = beam_search(model, held_out, **options)
    assert torch.equal(beam_search(graphs, held_out, **options), expected)


def test_an_uncompiled_runtime_decodes_without_dropout(tiny_translator):
    # Before: over a model in training mode, five runs, five outputs.
    model = tiny_translator.translator.model
    assert model.config.dropout > 0
    model.train()
    try:
        runtime = CompiledTransformer(model, compile=False)
        src = tiny_translator.translator.src_tokenizer.encode_batch(
            [s for s, _ in tiny_translator.test[:4]]
        )
        runs = [greedy_decode(runtime, src, max_len=12, bos_id=BOS_ID,
                              use_cache=True,
                              eos_id=EOS_ID) for _ in range(5)]  # fmt: skip
        assert all(torch.equal(run, runs[0]) for run in runs)
        assert model.training  # the caller's model is left as it was
    finally:
        model.eval()


def copy_shipped(shipped, tmp_path):
    """A private copy of the exported files, to tamper with."""
    directory, _ = shipped
    for path in directory.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_a_retrained_checkpoint_is_not_translated_with_old_graphs(
    tiny_translator, shipped, tmp_path, capsys
):
    # Before: --runtime onnx translated with the old weights, status 0.
    directory = copy_shipped(shipped, tmp_path)
    model = directory / "de-en.pt"
    translator = Translator.load(model)
    with torch.no_grad():
        translator.model.generator.weight.add_(0.01)  # "retrained"
    translator.save(model)
    status = main(["--runtime", "onnx", "--model", str(model), "zwölf"])
    err = capsys.readouterr().err
    assert status == 2 and "other weights" in err
    assert len(err.strip().splitlines()) == 1


def test_graphs_that_do_not_match_the_config_are_named(
    tiny_translator, shipped, tmp_path
):
    # Before: a smaller vocabulary printed ONNX Runtime's own log line,
    # then "unexpected InvalidArgument"; another config failed at decode.
    directory = copy_shipped(shipped, tmp_path)
    config = tiny_translator.translator.model.config
    other = replace(config, tgt_vocab=config.tgt_vocab - 1)
    with pytest.raises(ValueError, match="another configuration .*tgt_vocab"):
        OnnxTransformer(directory, other, stem="de-en")
    deeper = replace(config, n_layers=config.n_layers + 1)
    with pytest.raises(ValueError, match="differs in n_layers"):
        OnnxTransformer(directory, deeper, stem="de-en")


def test_a_truncated_or_replaced_graph_is_named(
    tiny_translator, shipped, tmp_path, capfd
):
    # Before: a truncated graph raised InvalidProtobuf, not ValueError.
    directory = copy_shipped(shipped, tmp_path)
    config = tiny_translator.translator.model.config
    step = onnx_paths(directory, "de-en")["step"]
    data = step.read_bytes()
    step.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="de-en.step.onnx is not the file"):
        OnnxTransformer(directory, config, stem="de-en")
    step.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size
    with pytest.raises(ValueError, match="its SHA-256 differs"):
        OnnxTransformer(directory, config, stem="de-en")
    step.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="is not a graph ONNX Runtime"):
        onnx_session(step)  # the session alone: a clear error too
    assert "\x1b[" not in capfd.readouterr().err  # no runtime log line


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"format": "other"}'])
def test_a_bad_manifest_is_named(tiny_translator, shipped, tmp_path, text):
    directory = copy_shipped(shipped, tmp_path)
    config = tiny_translator.translator.model.config
    manifest_path(directory, "de-en").write_text(text)
    with pytest.raises(ValueError, match="de-en.onnx.json"):
        OnnxTransformer(directory, config, stem="de-en")
    manifest_path(directory, "de-en").unlink()
    with pytest.raises(ValueError, match="no manifest"):
        OnnxTransformer(directory, config, stem="de-en")


def test_the_graphs_make_the_models_input_checks(
    tiny_translator, shipped, held_out
):
    # Before: a source longer than max_len failed inside ONNX Runtime
    # ("broadcast 16 by 20"), an int32 source raised InvalidArgument.
    _, graphs = shipped
    config = tiny_translator.translator.model.config
    long = torch.full((1, config.max_len + 1), 5)
    with pytest.raises(ValueError, match="max_len is"):
        graphs.encode(long)
    with pytest.raises(ValueError, match="src holds token ids"):
        graphs.encode(torch.full((1, 3), config.src_vocab))
    with pytest.raises(ValueError, match="integer token ids"):
        graphs.encode(held_out.float())
    options = dict(max_len=30, bos_id=BOS_ID, eos_id=EOS_ID, use_cache=True)
    as_int32 = greedy_decode(graphs, held_out.int(), **options)
    assert torch.equal(as_int32, greedy_decode(graphs, held_out, **options))


def test_export_replaces_files_and_never_follows_a_link(
    tiny_translator, tmp_path
):
    # Before: a link planted at a graph's path made export overwrite its
    # target, and a dangling link created its target.
    model = tiny_translator.translator.model
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    paths = onnx_paths(tmp_path, "m")
    paths["cross"].symlink_to(victim)
    paths["step"].symlink_to(tmp_path / "created-by-export")
    export_onnx(model, tmp_path, stem="m")
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "created-by-export").exists()
    assert not any(p.is_symlink() for p in paths.values())
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left
    manifest = json.loads(manifest_path(tmp_path, "m").read_text())
    assert manifest["weights"] == weights_fingerprint(model)
    OnnxTransformer(tmp_path, model.config, stem="m",
                    weights=weights_fingerprint(model))  # fmt: skip
