"""The translator shipped (chapter 12): its graphs in ONNX Runtime give
the tokens PyTorch gives, greedy and beam, and the command line exports
them and translates with them."""

import shutil

import pytest
import torch

from transformer_lite.decoding import beam_search, greedy_decode
from transformer_lite.shipping.export import onnx_paths
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
