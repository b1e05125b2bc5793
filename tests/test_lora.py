"""LoRA (chapter 13): the adapted layer against its formula written out
in plain torch, the start equal to the base model, merging, what
trains and what stays frozen, counts, tied weights, and adapter files
that are trusted only once checked (transformer_lite/adapt/lora.py and
lora_checks.py)."""

import math
import zipfile

import pytest
import torch
from conftest import assert_close, lm_tokens, tiny_lm, tiny_model
from torch import nn

from transformer_lite import (
    EncoderLayer,
    MultiHeadAttention,
    seed_everything,
    set_attention_kernel,
)
from transformer_lite.adapt.lora import (
    ADAPTER_FORMAT,
    LoRALinear,
    add_lora,
    count_parameters,
    load_adapter,
    lora_layers,
    merge_lora,
    remove_lora,
    save_adapter,
    unmerge_lora,
)
from transformer_lite.training import Examples, supervised_loss, train_step
from transformer_lite.training.checkpoint import save_checkpoint

F64 = torch.float64
LM = dict(n_layers=2, d_model=16, d_ff=32, n_heads=2, dropout=0.0)


def small_lm(seed: int = 0, **fields):
    """make_lm(19, n_layers=2, d_model=16, d_ff=32, n_heads=2), no
    dropout, float64, in eval mode; the same weights for one seed."""
    return tiny_lm(seed=seed, **{**LM, **fields})


def randomise_updates(model: nn.Module, seed: int = 1) -> None:
    """Give every B random values, so that the update is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g))


def snapshot(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model: nn.Module, before: dict) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name


# ----------------------------------------------------------------------------
# The layer


def plain_lora(x, weight, bias, a, b, scaling):
    """y = x W^T + b + (alpha / r) x A^T B^T, written out."""
    return x @ weight.T + bias + scaling * (x @ a.T @ b.T)


def test_lora_linear_equals_its_formula_in_plain_torch():
    torch.manual_seed(0)
    base = nn.Linear(6, 5).double()
    layer = LoRALinear(base, r=3, alpha=6.0)
    randomise_updates(layer)
    x = torch.randn(2, 4, 6, dtype=F64)
    want = plain_lora(
        x, base.weight, base.bias, layer.lora_a, layer.lora_b, 6.0 / 3
    )
    assert_close(layer(x), want, F64)
    assert layer.scaling == 2.0
    assert not torch.equal(layer(x), base(x))  # the update is there


def test_lora_linear_gradients_equal_autograd_of_the_formula():
    """A and B get the formula's gradients; the base layer gets none.
    gradcheck compares autograd with finite differences, in float64."""
    torch.manual_seed(0)
    base = nn.Linear(5, 4).double()
    layer = LoRALinear(base, r=2, alpha=3.0)
    randomise_updates(layer)
    x = torch.randn(3, 5, dtype=F64)
    layer(x).square().sum().backward()
    a = layer.lora_a.detach().clone().requires_grad_(True)
    b = layer.lora_b.detach().clone().requires_grad_(True)
    y = plain_lora(x, base.weight, base.bias, a, b, 1.5)
    y.square().sum().backward()
    assert_close(layer.lora_a.grad, a.grad, F64)
    assert_close(layer.lora_b.grad, b.grad, F64)
    assert base.weight.grad is None and base.bias.grad is None

    def output(a, b, x):
        params = {"lora_a": a, "lora_b": b}
        return torch.func.functional_call(layer, params, (x,))

    inputs = (
        a.detach().requires_grad_(True),
        b.detach().requires_grad_(True),
        x.requires_grad_(True),
    )
    assert torch.autograd.gradcheck(output, inputs)


def test_lora_linear_starts_with_b_zero_and_a_as_linear_draws_weights():
    """B = 0; A is Kaiming-uniform with a = sqrt(5), i.e. uniform in
    +-1/sqrt(in): the same numbers as nn.init draws from the same seed."""
    base = nn.Linear(12, 7).double()
    torch.manual_seed(3)
    layer = LoRALinear(base, r=4, alpha=8.0)
    torch.manual_seed(3)
    want = torch.empty(4, 12, dtype=F64)
    nn.init.kaiming_uniform_(want, a=math.sqrt(5))
    assert_close(layer.lora_a.detach(), want, F64)
    assert layer.lora_a.abs().max() <= 1 / math.sqrt(12)
    assert torch.equal(layer.lora_b, torch.zeros(7, 4, dtype=F64))
    assert layer.lora_a.shape == (4, 12) and layer.lora_b.shape == (7, 4)
    assert not base.weight.requires_grad and not base.bias.requires_grad
    assert layer.lora_a.requires_grad and layer.lora_b.requires_grad


def test_lora_linear_keeps_the_base_layers_device_and_dtype(device, dtype):
    base = nn.Linear(8, 8).to(device=device, dtype=dtype)
    layer = LoRALinear(base, r=2)
    for p in (layer.lora_a, layer.lora_b):
        assert p.device == base.weight.device and p.dtype == dtype
    assert layer.base is base  # used in place, not copied
    x = torch.randn(3, 8, device=device, dtype=dtype)
    assert layer(x).dtype == dtype


def test_lora_linear_merges_and_unmerges():
    torch.manual_seed(0)
    base = nn.Linear(6, 5).double()
    w = base.weight.detach().clone()
    layer = LoRALinear(base, r=3, alpha=4.0).eval()
    randomise_updates(layer)
    x = torch.randn(4, 6, dtype=F64)
    unmerged = layer(x)
    layer.merge()
    assert layer.merged
    want = w + (4.0 / 3) * layer.lora_b @ layer.lora_a
    assert_close(base.weight.detach(), want.detach(), F64)
    assert_close(layer(x), unmerged, F64)
    with pytest.raises(ValueError, match="merged already"):
        layer.merge()
    layer.unmerge()
    assert not layer.merged
    assert_close(base.weight.detach(), w, F64)
    assert_close(layer(x), unmerged, F64)
    with pytest.raises(ValueError, match="not merged"):
        layer.unmerge()


def test_lora_linear_refuses_bad_settings():
    base = nn.Linear(4, 3)
    with pytest.raises(ValueError, match="base must be an nn.Linear"):
        LoRALinear(nn.LayerNorm(4))
    with pytest.raises(ValueError, match="rank at most min"):
        LoRALinear(base, r=4)  # min(4, 3) = 3
    assert base.weight.requires_grad  # nothing frozen by a refusal


def test_lora_linear_repr_names_its_settings():
    text = repr(LoRALinear(nn.Linear(4, 3), r=2, alpha=5, dropout=0.1))
    for part in (
        "in_features=4",
        "out_features=3",
        "r=2",
        "alpha=5.0",
        "merged=False",
        "Dropout(p=0.1",
    ):
        assert part in text, text


# ----------------------------------------------------------------------------
# A model adapted


def mha():
    seed_everything(0)
    return MultiHeadAttention(16, 2, dropout=0.0).double()


def encoder_layer():
    seed_everything(0)
    return EncoderLayer(16, 2, 32, dropout=0.0).double().eval()


def run(model, x):
    if isinstance(model, MultiHeadAttention):
        return model(x, x, x)
    if isinstance(model, EncoderLayer):
        mask = torch.ones(x.size(0), 1, x.size(1), dtype=torch.bool)
        mask[0, 0, -2:] = False  # padding in the first row
        return model(x, mask)
    return model(x)


MODELS = {
    "mha": (mha, lambda: torch.randn(2, 5, 16, dtype=F64)),
    "encoder_layer": (encoder_layer, lambda: torch.randn(2, 5, 16, dtype=F64)),
    "lm": (small_lm, lambda: lm_tokens(2, 7)),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_an_adapted_model_starts_as_the_base_model_exactly(kind):
    build, inputs = MODELS[kind]
    torch.manual_seed(0)
    x = inputs()
    base = build()
    model = build()
    replaced = add_lora(model, r=4, alpha=8.0)
    assert replaced and all(n.endswith(("w_q", "w_v")) for n in replaced)
    assert torch.equal(run(model, x), run(base, x))
    randomise_updates(model)  # and a non-zero update changes it
    assert not torch.allclose(run(model, x), run(base, x))


def test_add_lora_replaces_the_named_layers_of_every_attention():
    """An encoder-decoder of one layer each: self-attention in both
    stacks and the decoder's cross-attention, two projections each."""
    model = tiny_model()
    replaced = add_lora(model, r=2)
    assert replaced == [
        f"{block}.{w}"
        for block in (
            "encoder.layers.0.self_attn",
            "decoder.layers.0.self_attn",
            "decoder.layers.0.cross_attn",
        )
        for w in ("w_q", "w_v")
    ]
    assert [n for n, _ in lora_layers(model)] == replaced
    assert model.lora_settings.replaced == tuple(replaced)
    for block in (
        model.encoder.layers[0].self_attn,
        model.decoder.layers[0].cross_attn,
    ):
        assert type(block.w_k) is nn.Linear  # not a target


def test_merged_model_gives_the_unmerged_output_and_unmerges_back():
    model = small_lm()
    add_lora(model, r=4, alpha=8.0, targets=("w_q", "w_k", "w_v", "w_o"))
    randomise_updates(model)
    x = lm_tokens(2, 7)
    weights = {
        n: m.base.weight.detach().clone()
        for n, m in model.named_modules()
        if isinstance(m, LoRALinear)
    }
    unmerged = model(x)
    assert merge_lora(model) == 8
    assert_close(model(x), unmerged, F64)
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            assert not torch.equal(m.base.weight, weights[name])
    before = snapshot(model)
    with pytest.raises(ValueError, match="merged already"):
        merge_lora(model)
    assert_same_state(model, before)  # refused, nothing merged twice
    assert unmerge_lora(model) == 8
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            assert_close(m.base.weight.detach(), weights[name], F64)
    assert_close(model(x), unmerged, F64)
    with pytest.raises(ValueError, match="not merged"):
        unmerge_lora(model)


def test_a_half_merged_model_is_refused_whole():
    """One layer merged by hand: merge_lora and unmerge_lora refuse
    before touching any layer, so no model is left half done."""
    model = small_lm()
    add_lora(model, r=2)
    randomise_updates(model)
    model.layers[1].self_attn.w_v.merge()  # the last adapted layer
    unchanged_after(model, lambda: merge_lora(model), "w_v is merged")
    unchanged_after(model, lambda: unmerge_lora(model), "w_q is not merged")


def test_a_merged_layer_refuses_to_train():
    """A merged layer's forward is the base alone: A and B would get no
    gradient, so training it is refused (evaluating is not)."""
    model = small_lm()
    add_lora(model, r=2)
    merge_lora(model)
    x = lm_tokens(2, 5)
    model.train()
    with pytest.raises(ValueError, match="unmerge"):
        model(x)
    with torch.no_grad():
        model(x)
    model.eval()
    model(x)


def train_lm(model, steps: int = 3):
    """A few steps of the package's own training step (AdamW with weight
    decay over every parameter, frozen ones included)."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-2, weight_decay=0.1
    )
    objective = supervised_loss(nn.CrossEntropyLoss(reduction="sum"))
    for step in range(steps):
        tokens = lm_tokens(4, 9, seed=step)
        batch = Examples(tokens[:, :-1], tokens[:, 1:])
        train_step(model, batch, objective, optimizer)


def test_only_lora_and_trainable_parameters_change_in_training(one_thread):
    model = small_lm()
    add_lora(model, r=4, alpha=8.0, dropout=0.1, trainable=("norm",))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_lm(model)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained == [
        *(
            f"layers.{i}.self_attn.{w}.lora_{ab}"
            for i in range(2)
            for w in ("w_q", "w_v")
            for ab in "ab"
        ),
        "norm.weight",
        "norm.bias",
    ]
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert not torch.equal(p, before[name]), f"{name} did not train"
        else:
            assert p.grad is None, name
            assert torch.equal(p, before[name]), f"{name} changed"


def test_the_trainable_count_is_r_times_in_plus_out_per_layer():
    model = small_lm()
    _, total = count_parameters(model)
    assert count_parameters(model) == (total, total)  # all trainable
    r = 3
    targets = ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2")
    add_lora(model, r=r, targets=targets, trainable=("norm",))
    C, F_ = 16, 32  # d_model, d_ff
    per_layer = 4 * r * (C + C) + r * (C + F_) + r * (F_ + C)
    lora = 2 * per_layer  # two layers
    assert count_parameters(model) == (lora + 2 * C, total + lora)


def test_shared_tensors_are_counted_once():
    tied = small_lm(tie_embeddings=True)
    untied = small_lm(tie_embeddings=False)
    V, C = 19, 16
    assert count_parameters(untied)[1] - count_parameters(tied)[1] == V * C
    assert count_parameters(tied)[1] == tied.count_parameters()


def test_tied_weights_stay_tied():
    """The language model's output layer is its embedding: after
    add_lora, and after remove_lora, it still is; trained through the
    embedding, both change as one."""
    model = small_lm(tie_embeddings=True)
    add_lora(model, r=2, trainable=("embed",))
    assert model.generator.weight is model.embed.weight
    assert model.generator.weight.requires_grad
    train_lm(model, steps=1)
    assert model.generator.weight is model.embed.weight
    remove_lora(model)
    assert model.generator.weight is model.embed.weight


def unchanged_after(model, call, match: str) -> None:
    """``call`` raises a ValueError matching ``match`` and leaves the
    model as it was: weights, LoRA layers, what trains."""
    before = snapshot(model)
    grads = [p.requires_grad for p in model.parameters()]
    layers = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match=match):
        call()
    assert_same_state(model, before)
    assert [p.requires_grad for p in model.parameters()] == grads
    assert [type(m) for m in model.modules()] == layers


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(r=0), "r must be a positive int"),
        (dict(r=2.0), "r must be a positive int"),
        (dict(r=True), "r must be a positive int"),
        (dict(alpha=0), "alpha must be a positive number"),
        (dict(alpha=-1.0), "alpha must be a positive number"),
        (dict(alpha=math.nan), "alpha must be a finite number"),
        (dict(dropout=1.0), r"dropout must be a finite number in \[0.0"),
        (dict(dropout=-0.1), r"dropout must be a finite number in \[0.0"),
        (dict(targets="w_q"), "targets must be a list of names"),
        (dict(targets=()), "at least one layer"),
        (dict(targets=("w_q", "w_x")), "no layer named 'w_x'.*w_1, w_2"),
        (dict(targets=("norm1",)), "norm1, a LayerNorm; LoRA adapts"),
        (dict(targets=("generator",)), "tied weights"),
        (dict(r=17), r"rank at most min\(in_features=16"),
        (dict(trainable=("head",)), "'head' matches no parameter.*embed"),
        (dict(trainable=("layers.0",)), "covers layers.0.self_attn.w_q"),
        (dict(trainable=("layers.1.self_attn.w_v.bias",)), "covers"),
        (dict(trainable=[1]), "non-empty strings"),
    ],
)
def test_add_lora_refuses_and_changes_nothing(options, match):
    model = small_lm()
    unchanged_after(model, lambda: add_lora(model, **options), match)


def test_add_lora_refuses_a_model_with_lora_and_a_shared_layer():
    model = small_lm()
    add_lora(model, r=2)
    unchanged_after(model, lambda: add_lora(model, r=2), "LoRA layers")
    twice = nn.Sequential(mha(), nn.Identity())
    twice.append(twice[0])  # one attention module in two places
    unchanged_after(twice, lambda: add_lora(twice), "same layer as 0.w_q")


def test_remove_lora_puts_plain_linear_layers_back():
    model = small_lm()
    add_lora(model, r=4, alpha=8.0, trainable=("norm",))
    randomise_updates(model)
    x = lm_tokens(2, 7)
    adapted = model(x)
    names = remove_lora(model)
    assert len(names) == 4 and not hasattr(model, "lora_settings")
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert type(model.layers[0].self_attn.w_q) is nn.Linear
    assert_close(model(x), adapted, F64)  # the update, folded in
    fresh = small_lm()
    fresh.load_state_dict(model.state_dict())  # the base model's names
    assert_close(fresh(x), adapted, F64)


@pytest.mark.parametrize("merged", [False, True])
def test_remove_lora_without_merging_gives_the_base_model_back(merged):
    base = small_lm()
    model = small_lm()
    add_lora(model, r=4)
    randomise_updates(model)
    if merged:
        merge_lora(model)
    remove_lora(model, merge=False)
    x = lm_tokens(2, 7)
    if merged:  # W + dW - dW: W to within rounding
        assert_close(model(x), base(x), F64)
    else:
        assert torch.equal(model(x), base(x))


def test_adapted_attention_agrees_across_kernels():
    model = small_lm()
    add_lora(model, r=4, targets=("w_q", "w_k", "w_v", "w_o"))
    randomise_updates(model)
    x = lm_tokens(2, 7)
    set_attention_kernel(model, "plain")
    plain = model(x)
    assert set_attention_kernel(model, "fused") == 2
    assert_close(model(x), plain, F64)
    assert model.layers[0].self_attn.why_not_fused == ""


def test_eval_mode_with_lora_dropout_is_deterministic():
    model = small_lm()
    add_lora(model, r=4, dropout=0.5)
    randomise_updates(model)
    x = lm_tokens(2, 7)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(x), model(x))  # dropout is on
    model.eval()
    first = model(x)
    assert torch.equal(model(x), first)
    merge_lora(model)  # the update without dropout, folded in
    assert_close(model(x), first, F64)


@pytest.mark.slow  # compiling takes about 5 s
def test_adapted_attention_compiles_to_one_graph():
    """torch.compile(fullgraph=True) of an adapted MultiHeadAttention:
    no graph break, the eager output; merged, a graph without the
    update (reusing the first would add the update twice)."""
    torch._dynamo.reset()
    model = mha()
    add_lora(model, r=4)
    randomise_updates(model)
    x = torch.randn(2, 5, 16, dtype=F64)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        want = model(x, x, x)
        assert_close(compiled(x, x, x), want, F64)
        merge_lora(model)
        assert_close(compiled(x, x, x), want, F64)


# ----------------------------------------------------------------------------
# Adapter files


def classifier(seed: int = 0):
    """An encoder layer and a new head: the head trains in full."""
    seed_everything(seed)
    model = nn.Module()
    model.encoder = EncoderLayer(16, 2, 32, dropout=0.0)
    model.head = nn.Linear(16, 3)
    return model.double().eval()


def adapted_lm(seed: int = 0, r: int = 4, **options):
    model = small_lm()  # the same base weights, whatever the seed
    torch.manual_seed(seed)  # A drawn from it
    add_lora(model, r=r, alpha=8.0, trainable=("norm",), **options)
    return model


@pytest.fixture
def saved(tmp_path):
    """An adapted language model with a non-zero update and a changed
    final norm, and the adapter file it saved."""
    model = adapted_lm(seed=0)
    randomise_updates(model)
    with torch.no_grad():
        model.norm.weight.add_(0.5)
    path = tmp_path / "adapter.pt"
    save_adapter(model, path)
    return model, path


def test_an_adapter_loads_into_a_fresh_model_bit_for_bit(saved):
    model, path = saved
    fresh = adapted_lm(seed=1, dropout=0.2)  # other A; dropout may differ
    x = lm_tokens(2, 7)
    assert not torch.equal(fresh(x), model(x))
    load_adapter(fresh, path)
    assert torch.equal(fresh(x), model(x))


def test_an_adapter_holds_only_what_trains_and_the_settings(saved):
    model, path = saved
    state = torch.load(path, weights_only=True)
    assert state["format"] == ADAPTER_FORMAT
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(state["tensors"]) == trained
    assert state["settings"] == dict(
        r=4,
        alpha=8.0,
        dropout=0.0,
        targets=["w_q", "w_v"],
        trainable=["norm"],
        replaced=[
            f"layers.{i}.self_attn.{w}"
            for i in range(2)
            for w in ("w_q", "w_v")
        ],
    )
    assert state["shapes"]["layers.1.self_attn.w_v"] == [16, 16]
    size = sum(t.numel() for t in state["tensors"].values())
    assert size == count_parameters(model)[0]


def test_a_new_heads_weights_travel_in_the_adapter(tmp_path):
    model = classifier()
    add_lora(model, r=2, trainable=("head",))
    randomise_updates(model)
    with torch.no_grad():
        model.head.weight.mul_(3.0)
    save_adapter(model, tmp_path / "a.pt")
    fresh = classifier()
    add_lora(fresh, r=2, trainable=("head",))
    load_adapter(fresh, tmp_path / "a.pt")
    x = torch.randn(2, 5, 16, dtype=F64)
    assert torch.equal(
        fresh.head(fresh.encoder(x)), model.head(model.encoder(x))
    )


LORA_A = "layers.0.self_attn.w_q.lora_a"
# name -> (how a good adapter's state is broken, what the refusal says)
BROKEN = {
    "a missing tensor": (
        lambda s: s["tensors"].pop(LORA_A),
        "missing.*w_q.lora_a",
    ),
    "an extra tensor": (
        lambda s: s["tensors"].update(extra=torch.zeros(1)),
        "unexpected.*extra",
    ),
    "a wrong shape": (
        lambda s: s["tensors"].update({LORA_A: torch.zeros(4, 8)}),
        r"shape \(4, 8\), expected a floating tensor of shape \(4, 16\)",
    ),
    "a non-tensor": (
        lambda s: s["tensors"].update({LORA_A: [1.0, 2.0]}),
        "is a list, expected a floating tensor",
    ),
    "an integer tensor": (
        lambda s: s["tensors"].update({LORA_A: torch.zeros(4, 16).long()}),
        "torch.int64",
    ),
    "a NaN": (
        lambda s: s["tensors"][LORA_A].fill_(math.nan),
        "NaN or inf",
    ),
    "another r": (
        lambda s: s["settings"].update(r=2),
        "r: file 2, model 4",
    ),
    "an r of the wrong type": (
        lambda s: s["settings"].update(r="4"),
        "bad settings: r must be a positive int",
    ),
    "another trainable": (
        lambda s: s["settings"].update(trainable=["head"]),
        "trainable: file",
    ),
    "a missing setting": (
        lambda s: s["settings"].pop("alpha"),
        "settings hold",
    ),
    "another layer size": (
        lambda s: s["shapes"].update({"layers.0.self_attn.w_q": [16, 8]}),
        "other sizes",
    ),
    "a checkpoint's tag": (
        lambda s: s.update(format="transformer-lite-checkpoint-1"),
        "not a transformer-lite LoRA adapter",
    ),
    "no tensors": (lambda s: s.pop("tensors"), "tensors are missing"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_adapter_is_refused_and_the_model_unchanged(
    saved, tmp_path, case
):
    _, path = saved
    state = torch.load(path, weights_only=True)
    change, match = BROKEN[case]
    change(state)
    torch.save(state, tmp_path / "broken.pt")
    fresh = adapted_lm(seed=1)
    load = lambda: load_adapter(fresh, tmp_path / "broken.pt")
    unchanged_after(fresh, load, match)


def test_an_adapter_of_another_rank_or_size_is_refused(saved, tmp_path):
    _, path = saved
    other_rank = adapted_lm(r=2)
    unchanged_after(
        other_rank,
        lambda: load_adapter(other_rank, path),
        r"r: file 4, model 2 .*add_lora\(model, r=4",
    )
    narrow = small_lm(d_model=8, d_ff=16)
    add_lora(narrow, r=4, alpha=8.0, trainable=("norm",))
    unchanged_after(
        narrow,
        lambda: load_adapter(narrow, path),
        "other sizes.*file \\[16, 16\\], model \\[8, 8\\]",
    )
    other_targets = small_lm()
    add_lora(
        other_targets, r=4, alpha=8.0, targets=("w_k",), trainable=("norm",)
    )
    unchanged_after(
        other_targets,
        lambda: load_adapter(other_targets, path),
        "targets: file \\['w_q', 'w_v'\\]",
    )


def test_an_unreadable_file_is_refused(saved, tmp_path):
    model, path = saved
    data = path.read_bytes()
    fresh = adapted_lm(seed=1)
    compressed = tmp_path / "compressed.pt"
    with zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("adapter/data.pkl", bytes(10_000))
    torch.save([1, 2], tmp_path / "list.pt")
    cases = {
        "truncated.pt": (data[: len(data) // 2], "cannot read adapter"),
        "noise.pt": (bytes(range(256)) * 8, "cannot read adapter"),
        "empty.pt": (b"", "cannot read adapter"),
        "compressed.pt": (None, "adapter .* is compressed"),
        "list.pt": (None, "not a transformer-lite LoRA adapter"),
    }
    for name, (content, match) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        load = lambda n=name: load_adapter(fresh, tmp_path / n)
        unchanged_after(fresh, load, match)
    unchanged_after(
        fresh,
        lambda: load_adapter(fresh, tmp_path / "none"),
        "no adapter file",
    )
    checkpoint = tmp_path / "checkpoint.pt"
    save_checkpoint(checkpoint, tiny_model())
    unchanged_after(
        fresh,
        lambda: load_adapter(fresh, checkpoint),
        "not a transformer-lite LoRA adapter.*load_checkpoint",
    )


def test_an_adapter_needs_a_model_prepared_and_unmerged(saved):
    _, path = saved
    plain = small_lm()
    unchanged_after(
        plain,
        lambda: load_adapter(plain, path),
        r"not prepared by add_lora.*add_lora\(model, r=4, "
        r"alpha=8.0, targets=\('w_q', 'w_v'\), "
        r"trainable=\('norm',\)\)",
    )
    merged = adapted_lm(seed=1)
    merge_lora(merged)
    unchanged_after(
        merged, lambda: load_adapter(merged, path), "merged: unmerge_lora"
    )
    with pytest.raises(ValueError, match="not prepared by add_lora"):
        save_adapter(plain, path)
