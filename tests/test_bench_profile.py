"""The training step's profile (transformer_lite/bench/profile.py)."""

import dataclasses

import pytest

from transformer_lite.bench.fixtures import QUICK
from transformer_lite.bench.profile import GROUPS, group_of, main, profile_step


@pytest.mark.parametrize(
    ("name", "in_optimizer", "rank", "group"),
    [
        ("aten::addmm", False, 2, "linear products"),
        ("aten::mm", False, 2, "linear products"),
        ("aten::bmm", False, 3, "attention products"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", False, 4,
         "fused attention"),
        ("aten::_softmax", False, 4, "attention, the rest"),
        ("aten::masked_fill", False, 4, "attention, the rest"),
        ("aten::native_dropout", False, 4, "attention, the rest"),
        ("aten::native_dropout", False, 3, "dropout"),
        ("aten::native_layer_norm_backward", False, 3, "layer norm"),
        ("aten::_log_softmax", False, 2, "other"),
        ("aten::add_", True, 2, "optimizer"),
        ("aten::mm", True, 2, "optimizer"),
        ("aten::add", False, 0, "other"),
    ],
)  # fmt: skip
def test_each_operator_has_its_group(name, in_optimizer, rank, group):
    assert group_of(name, in_optimizer, rank) == group


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_the_groups_add_up_to_the_profiled_step(kernel):
    result = profile_step(QUICK, kernel, steps=1, repeats=1)
    assert list(result["groups"]) == list(GROUPS)
    assert sum(result["groups"].values()) == pytest.approx(result["step_s"])
    assert result["groups"]["linear products"] > 0
    assert 0 < result["product_flops"] <= result["flops"]
    assert 0 < result["ceiling"] <= 1
    assert 0 < result["attention_share"] < 1
    if kernel == "plain":  # the plain path never calls PyTorch's kernel
        assert result["sdpa_kernels"] == []
        assert result["groups"]["fused attention"] == 0


def test_on_the_cpu_dropout_sends_the_fused_path_to_the_math_kernel():
    # What the README's benchmark section says of the fused target: with
    # attention dropout, PyTorch's CPU kernel falls back to the math one.
    trained = profile_step(QUICK, "fused", steps=1, repeats=1)
    assert trained["sdpa_kernels"] == [
        "aten::_scaled_dot_product_attention_math"
    ]
    without = dataclasses.replace(QUICK, dropout=0.0)
    flash = profile_step(without, "fused", steps=1, repeats=1)
    assert (
        "aten::_scaled_dot_product_attention_math"
        not in (flash["sdpa_kernels"])
    )
    assert any("flash" in k for k in flash["sdpa_kernels"])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"kernel": "chunked"}, "kernel must be 'plain' or 'fused'"),
        ({"kernel": "plain", "steps": 0}, "steps and repeats must be >= 1"),
    ],
)
def test_bad_arguments_are_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        profile_step(QUICK, **kwargs)


def test_the_command_prints_both_kernels(capsys):
    main(["--quick", "--steps", "1"])
    out = capsys.readouterr().out
    assert "### plain attention" in out and "### fused attention" in out
    assert "ceiling on the share of peak" in out
