"""The benchmark's plumbing, on tiny sizes with one repeat: what it
writes and prints, that contenders take turns, that the nn.Transformer it
races is our model's exact twin. No timing is asserted."""

import json

import pytest
import torch

from transformer_lite.bench.cases import alternate
from transformer_lite.bench.fixtures import (
    GPU,
    QUICK,
    TorchReference,
    our_model,
    random_batch,
)
from transformer_lite.bench.report import (
    SIZES,
    check_targets,
    main,
    peak_tflops,
    report,
    sizes_for,
)
from transformer_lite.interop import (
    from_torch_decoder_layer,
    from_torch_encoder_layer,
)
from transformer_lite.tokens import PAD_ID

TRAINING = (
    "ours (plain)",
    "ours (fused)",
    "nn.Transformer",
    "ours (compiled)",
    "nn.Transformer (compiled)",
)
ATTENTION = ("plain", "chunked", "fused")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One ``--quick --repeats 1`` run: its result, JSON and printout.
    About a minute, most of it compiling the compiled contenders."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    with pytest.MonkeyPatch.context() as mp:
        printed = []
        mp.setattr("builtins.print", lambda *a, **k: printed.append(a))
        result = main(["--quick", "--repeats", "1", "--json", str(path)])
    text = "\n".join(" ".join(str(x) for x in args) for args in printed)
    return result, json.loads(path.read_text()), text


def test_json_holds_every_measurement(quick_run):
    result, written, _ = quick_run
    assert written == json.loads(json.dumps(result))
    assert set(written) == {
        "machine",
        "sizes_name",
        "sizes",
        "repeats",
        "peak",
        "training",
        "decoding",
        "attention",
        "generation",
        "rivals",
        "targets",
    }
    assert written["repeats"] == 1
    assert written["machine"]["torch"] == torch.__version__
    training = written["training"]
    for name in TRAINING:
        assert len(training[name]["times_s"]) == 1
        assert training[name]["median_s"] > 0
        assert training[name]["tokens_per_s"] > 0
    assert training["flops_per_step"] > 0
    assert training["contenders"] == list(TRAINING)
    assert set(training["compile_s"]) == {n for n in TRAINING if "comp" in n}
    assert written["peak"]["tflops"] > 0
    assert training["ratio_fused"] == pytest.approx(
        training["ours (fused)"]["median_s"]
        / training["nn.Transformer"]["median_s"]
    )
    lengths = [row["new_tokens"] for row in written["decoding"]]
    assert lengths == list(QUICK.decode_tokens)
    for row in written["decoding"]:
        assert len(row["recompute"]["times_s"]) == 1
    lengths = [row["length"] for row in written["attention"]]
    assert lengths == list(QUICK.attention_lengths)
    for row in written["attention"]:
        for name in ATTENTION:
            assert row[name]["peak_bytes"] > 0
            assert len(row[name]["times_s"]) == 1


def test_decoding_rows_give_the_same_tokens(quick_run):
    _, written, _ = quick_run
    for row in written["decoding"]:
        assert {"recompute", "cached", "compiled"} <= set(row)
        assert row["same_tokens"] is True
        assert row["speedup"] > 0 and row["compiled_speedup"] > 0


def test_the_language_model_row_gives_the_same_tokens(quick_run):
    _, written, _ = quick_run
    row = written["generation"]
    assert row["new_tokens"] == max(QUICK.decode_tokens)
    assert row["batch"] == QUICK.decode_batch
    assert len(row["cached"]["times_s"]) == 1
    assert row["same_tokens"] is True and row["speedup"] > 0


def test_the_rivals_compute_the_same_function(quick_run):
    """Ours is loaded from the Hugging Face GPT-2 it is timed against:
    same parameter count in all three, same greedy tokens as HF's
    generate, and a paired ratio for each rival."""
    _, written, _ = quick_run
    rivals = written["rivals"]
    training = rivals["training"]
    assert training["same_parameter_count"] is True
    for name in ("Hugging Face GPT-2", "nn.TransformerEncoder"):
        assert training[name]["paired_ratio"] > 0
        assert len(training[name]["times_s"]) == 1
    generation = rivals["generation"]
    assert generation["same_tokens"] is True
    assert generation["new_tokens"] == max(QUICK.decode_tokens)
    targets = written["targets"]
    assert {"lm_over_hf", "lm_over_torch", "generation_over_hf"} <= set(
        targets
    )


def test_printout_is_markdown_tables(quick_run):
    _, written, text = quick_run
    for title in ("Machine", "Training step", "Greedy decoding"):
        assert f"## {title}" in text
    assert "## Attention alone" in text and "## Targets" in text
    assert "## Language model: generation (greedy)" in text
    assert "## Language model against its rivals" in text
    tables = [
        block.splitlines()
        for block in text.split("\n\n")
        if block.startswith("| ")
    ]
    assert len(tables) == 8
    for lines in tables:
        columns = lines[0].count("|")
        assert lines[1].startswith("|---")
        assert all(line.count("|") == columns for line in lines)
    assert f"{written['training']['parameters']:,}" in text


def test_contenders_take_turns():
    calls = []
    contenders = {name: lambda n=name: calls.append(n) for name in "ABC"}
    times = alternate(contenders, 3, torch.device("cpu"))
    assert "".join(calls) == "ABCABCABC"
    assert all(len(t) == 3 for t in times.values())


def test_reference_is_our_model_built_from_torch_modules():
    """Same parameter count, and with our weights copied in, the same
    logits (float64, eval mode): the race compares like with like."""
    torch.manual_seed(0)
    reference = TorchReference(QUICK).double().eval()
    ours = our_model(QUICK).double()
    assert sum(p.numel() for p in ours.parameters()) == sum(
        p.numel() for p in reference.parameters()
    )
    torch_stacks = reference.transformer
    for i, layer in enumerate(torch_stacks.encoder.layers):
        ours.encoder.layers[i] = from_torch_encoder_layer(layer).double()
    for i, layer in enumerate(torch_stacks.decoder.layers):
        ours.decoder.layers[i] = from_torch_decoder_layer(layer).double()
    ours.src_embed.load_state_dict(reference.src_embed.state_dict())
    ours.tgt_embed.load_state_dict(reference.tgt_embed.state_dict())
    ours.generator.load_state_dict(reference.generator.state_dict())
    ours.eval()  # the layers just built are in training mode
    src, tgt = random_batch(QUICK, 3, torch.device("cpu"))
    assert (src == PAD_ID).any()  # the masks are exercised
    tgt = tgt[:, :-1]
    torch.testing.assert_close(
        ours(src, tgt), reference(src, tgt), rtol=1e-10, atol=1e-10
    )


def test_peak_tflops_known_and_unknown_devices():
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA L40S") == 362.0
    assert peak_tflops("AMD EPYC 7B13") is None


def test_targets_are_checked_in_the_right_direction():
    results = {
        "peak": {"tflops": 0.1},
        "training": {
            "paired_ratio_fused": 0.99,
            "paired_ratio_plain": 0.99,
            "contenders": ["a", "b"],
            "a": {"tflops": 0.05},
            "b": {"tflops": 0.072},
        },
        "decoding": [{"new_tokens": 64, "speedup": 2.5}],
        "attention": [{"length": 8192, "plain_over_chunked_memory": 9.0}],
    }
    met = {key: c["met"] for key, c in check_targets(results).items()}
    assert met == {
        "fused_over_torch": False,
        "plain_over_torch": True,
        "share_of_peak": True,
        "cache_speedup": False,
        "memory_saving": True,
    }


def test_a_gpu_gets_gpu_sized_cases():
    """At the CPU's sizes a GPU is launch-bound: on CUDA the benchmark
    runs larger ones, unless told otherwise."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert sizes_for(cuda) == "gpu" and sizes_for(cpu) == "cpu"
    assert sizes_for(cuda, "cpu") == "cpu" and sizes_for(cpu, "gpu") == "gpu"
    assert sizes_for(cuda, quick=True) == "quick"
    assert SIZES["gpu"] is GPU
    cpu_sizes = SIZES["cpu"]
    for name in ("d_model", "d_ff", "length", "matmul_size"):
        assert getattr(GPU, name) > getattr(cpu_sizes, name), name
    assert GPU.batch * GPU.length > cpu_sizes.batch * cpu_sizes.length
    assert 8192 in GPU.attention_lengths  # the memory ratio is comparable
    assert 64 in GPU.decode_tokens


def test_targets_apply_to_the_cpu_sizes_only(quick_run):
    """The quick run used other sizes: its targets are n/a, and the
    printout says why."""
    _, written, text = quick_run
    assert written["sizes_name"] == "quick"
    assert written["targets"]
    for checked in written["targets"].values():
        assert checked["applies"] is False and checked["met"] is None
    assert "they do not apply" in text
    results = dict(written, sizes_name="cpu")
    results["targets"] = check_targets(results)
    assert all(c["applies"] for c in results["targets"].values())
    assert "they do not apply" not in report(results)
