"""Tensor parallelism and FSDP2 (chapter 12) over 2 gloo processes on
the CPU: the same logits and gradients as one process, and each
process holding its share of the parameters."""

import pytest
import torch

from transformer_lite.attention import MultiHeadAttention
from transformer_lite.model import make_model
from transformer_lite.shipping.parallel import (
    local_parameter_bytes,
    run_split,
    tensor_parallel_plan,
)
from transformer_lite.tokens import PAD_ID

# float64: in float32 a ReLU input within rounding of zero can take the
# other side of the kink in one process, and its unit's gradient with it
TOL = dict(rtol=1e-10, atol=1e-10)


@pytest.fixture(scope="module")
def single():
    """A model, a batch with padding, and one process's logits and
    gradients (loss: the mean square of the logits)."""
    torch.manual_seed(0)
    model = make_model(30, 31, n_layers=2, d_model=32, d_ff=64, n_heads=4,
                       dropout=0.0, max_len=40).double()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 30, (3, 7), generator=g)
    tgt = torch.randint(4, 31, (3, 6), generator=g)
    src[1, 5:], tgt[2, 4:] = PAD_ID, PAD_ID
    logits = model(src, tgt)
    logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return model, src, tgt, logits.detach(), grads


@pytest.fixture(scope="module")
def ranks(single):
    model, src, tgt, _, _ = single
    return run_split(model, src, tgt, kinds=("tensor", "fsdp"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["tensor", "fsdp"])
def test_split_logits_and_gradients_equal_one_process(single, ranks, kind):
    _, _, _, logits, grads = single
    for result in ranks:
        got = result[kind]
        torch.testing.assert_close(got["logits"], logits, **TOL)
        assert got["grads"].keys() == grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(got["grads"][name], grad, **TOL)


@pytest.mark.timeout(180)
def test_fsdp_halves_the_parameters_of_each_process(single, ranks):
    whole = local_parameter_bytes(single[0])
    shares = [result["fsdp"]["local_bytes"] for result in ranks]
    assert sum(shares) == whole  # every parameter held exactly once
    # a tensor of odd length puts its extra row on the first process
    assert all(abs(share - whole / 2) < 0.01 * whole for share in shares)


@pytest.mark.timeout(180)
def test_tensor_parallel_splits_only_the_planned_matrices(single, ranks):
    model = single[0]
    planned = sum(
        model.get_submodule(name).weight.numel()
        + model.get_submodule(name).bias.numel()
        for name in tensor_parallel_plan(model)
    )
    whole = local_parameter_bytes(model)
    for result in ranks:
        # row-split W^O and W_2 keep their bias whole on each process
        assert result["tensor"]["local_bytes"] < whole - 8 * planned / 2.1


def test_the_plan_splits_q_k_v_and_w1_by_columns():
    model = make_model(30, 31, n_layers=1, d_model=16, d_ff=32, n_heads=2)
    styles = tensor_parallel_plan(model).items()
    plan = {name: type(style).__name__ for name, style in styles}
    assert plan["decoder.layers.0.cross_attn.w_k"] == "ColwiseParallel"
    assert plan["encoder.layers.0.self_attn.w_o"] == "RowwiseParallel"
    assert plan["encoder.layers.0.feed_forward.w_1"] == "ColwiseParallel"
    assert plan["decoder.layers.0.feed_forward.w_2"] == "RowwiseParallel"
    assert len(plan) == 6 + 10  # 4 + 2 in the encoder layer, 8 + 2


def test_heads_are_counted_from_the_tensor():
    """What a process holds under tensor parallelism: the first half of
    the columns of W^Q gives the first half of the heads."""
    attn = MultiHeadAttention(16, 4, dropout=0.0)
    x = torch.randn(2, 5, 16)
    heads = attn.split_heads(attn.w_q(x))  # (B, H, L, D)
    half = attn.split_heads(attn.w_q(x)[..., :8])  # (B, H / 2, L, D)
    assert half.shape == (2, 2, 5, 4)
    torch.testing.assert_close(half, heads[:, :2])
    torch.testing.assert_close(attn.merge_heads(half), attn.w_q(x)[..., :8])
