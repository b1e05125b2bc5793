"""Hugging Face's GPT-2 in the book's language model: after the copy,
the logits, every block's output, the gradients and greedy generation
equal Hugging Face's in float64, in both of its attention
implementations; every setting that cannot be reproduced is refused.

No weights are downloaded: each GPT-2 is built from a small config with
random weights, its biases and LayerNorm weights moved off zero and one
so that no copying error hides behind them."""

import importlib
import sys

import pytest
import torch
from conftest import assert_close

from transformer_lite.attention import KERNELS
from transformer_lite.device import seed_everything
from transformer_lite.lm import LanguageModel, LMConfig, generate

transformers = pytest.importorskip("transformers")

from transformer_lite.adapt.gpt2 import (  # noqa: E402
    ACTIVATION_NAMES,
    from_hf_gpt2,
    gpt2_lm_config,
)

V, MAX_LEN, C, N_LAYERS, H = 64, 32, 16, 2, 2


def hf_config(**fields) -> "transformers.GPT2Config":
    sizes = dict(
        vocab_size=V,
        n_positions=MAX_LEN,
        n_embd=C,
        n_layer=N_LAYERS,
        n_head=H,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        resid_pdrop=0.1,
        initializer_range=0.2,  # sharp enough attention to tell heads
        bos_token_id=None,  # no stop: generation runs its full length
        eos_token_id=None,
        pad_token_id=None,
    )
    return transformers.GPT2Config(**{**sizes, **fields})


def hf_gpt2(*, seed: int = 0, dtype=torch.float64, cls=None, **fields):
    """A small GPT-2 with random weights, in eval mode, in ``dtype``;
    keyword arguments are ``GPT2Config`` fields."""
    seed_everything(seed)
    cls = cls or transformers.GPT2LMHeadModel
    model = cls(hf_config(**fields)).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            # in dtype's own precision: a float64 weight rounded to
            # float32 on the way differs from it
            p.mul_(1 + 0.01 * torch.randn_like(p))
            if p.dim() == 1:  # biases at 0, LayerNorm weights at 1
                p.add_(0.3 * torch.randn_like(p))
    return model


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, length), generator=g)


def in_hf_layout(ours: LanguageModel, name: str, grad: bool = False):
    """The tensor of ``ours`` that stands for the GPT2Model weight
    ``name``, in Hugging Face's layout (``Conv1D``: (in, out); Q, K, V
    side by side); with ``grad``, its gradient instead."""

    def get(path: str) -> torch.Tensor:
        p = ours.get_parameter(path)
        return p.grad if grad else p

    fixed = {
        "wte.weight": "embed.weight",
        "wpe.weight": "positional.embedding.weight",
        "ln_f.weight": "norm.weight",
        "ln_f.bias": "norm.bias",
    }
    if name in fixed:
        return get(fixed[name])
    _, i, *rest = name.split(".")
    block, rest = f"layers.{i}", ".".join(rest)
    if rest.startswith(("ln_1.", "ln_2.")):
        norm = "norm1" if rest.startswith("ln_1.") else "norm2"
        return get(f"{block}.{norm}.{rest.split('.')[1]}")
    if rest == "attn.c_attn.weight":
        parts = [get(f"{block}.self_attn.w_{x}.weight").t() for x in "qkv"]
        return torch.cat(parts, dim=1)  # (C, 3C)
    if rest == "attn.c_attn.bias":
        parts = [get(f"{block}.self_attn.w_{x}.bias") for x in "qkv"]
        return torch.cat(parts)  # (3C,)
    linear = {
        "attn.c_proj": "self_attn.w_o",
        "mlp.c_fc": "feed_forward.w_1",
        "mlp.c_proj": "feed_forward.w_2",
    }
    module, kind = rest.rsplit(".", 1)
    tensor = get(f"{block}.{linear[module]}.{kind}")
    return tensor.t() if kind == "weight" else tensor


# ----------------------------------------------------------------------------
# The same function


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("length", [1, 2, 9, MAX_LEN])
def test_logits_equal_hugging_face(attn_implementation, length):
    theirs = hf_gpt2(attn_implementation=attn_implementation)
    ours = from_hf_gpt2(theirs)
    x = tokens(3, length)
    expected = theirs(x).logits  # (B, L, V)
    assert_close(ours(x), expected, torch.float64)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_gives_hugging_face_logits(kernel):
    theirs = hf_gpt2()
    ours = from_hf_gpt2(theirs, kernel=kernel)
    assert ours.config.kernel == kernel
    x = tokens(2, MAX_LEN)
    assert_close(ours(x), theirs(x).logits, torch.float64)


def test_every_weight_is_copied_bit_for_bit():
    """Each of GPT-2's weights equals ours exactly, in float64: a weight
    copied through float32, transposed wrongly or left out fails."""
    theirs = hf_gpt2()
    ours = from_hf_gpt2(theirs)
    named = list(theirs.transformer.named_parameters())
    assert len(named) == 4 + 12 * N_LAYERS
    for name, weight in named:
        mine = in_hf_layout(ours, name)
        assert mine.dtype == torch.float64, name
        assert torch.equal(mine, weight), name


def test_every_block_output_equals_hugging_face_hidden_states():
    """Hugging Face's hidden states are the embeddings, the outputs of
    every block but the last, and the last one after ln_f."""
    theirs = hf_gpt2()
    ours = from_hf_gpt2(theirs)
    outputs = []
    hooks = [
        layer.register_forward_hook(lambda m, i, out: outputs.append(out))
        for layer in ours.layers
    ]
    last = []
    hooks.append(
        theirs.transformer.h[-1].register_forward_hook(
            lambda m, i, out: last.append(out)
        )
    )
    x = tokens(2, 12)
    try:
        ours(x)
        hidden = theirs(x, output_hidden_states=True).hidden_states
    finally:
        for hook in hooks:
            hook.remove()
    assert len(hidden) == N_LAYERS + 1 and len(outputs) == N_LAYERS
    for i, out in enumerate(outputs[:-1]):
        assert_close(out, hidden[i + 1], torch.float64, f"block {i}")
    assert_close(outputs[-1], last[0], torch.float64, "last block")
    assert_close(ours.norm(outputs[-1]), hidden[-1], torch.float64, "ln_f")


def test_gradients_equal_hugging_face():
    """The gradient of one loss with respect to every weight, the tied
    embedding's two uses summed, equals Hugging Face's. (The loss is
    ours on both sides: Hugging Face's ``labels=`` computes it in
    float32.)"""
    theirs = hf_gpt2()
    ours = from_hf_gpt2(theirs)
    x = tokens(2, 10)
    target = tokens(2, 10, seed=2)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, V), target.reshape(-1)
        )

    expected = loss(theirs(x).logits)
    expected.backward()
    mine = loss(ours(x))
    assert_close(mine, expected, torch.float64, "loss")
    mine.backward()
    for name, weight in theirs.transformer.named_parameters():
        grad = in_hf_layout(ours, name, grad=True)
        assert weight.grad.abs().max() > 0, name
        assert_close(grad, weight.grad, torch.float64, name)


def test_greedy_generation_equals_hugging_face_generate():
    theirs = hf_gpt2()
    ours = from_hf_gpt2(theirs)
    prompt = tokens(2, 4)
    new = MAX_LEN - 4  # up to the last position
    expected = theirs.generate(prompt, max_new_tokens=new, do_sample=False)
    got = generate(ours, prompt, new, temperature=0)
    assert expected.shape == (2, MAX_LEN)
    assert torch.equal(got, expected)
    assert len(set(got[:, 4:].flatten().tolist())) > 1  # not one token


def test_cached_logits_equal_uncached():
    ours = from_hf_gpt2(hf_gpt2())
    x = tokens(2, 20)
    full = ours(x)
    cache = ours.new_cache()
    steps = [ours(x[:, :5], cache=cache)]
    steps += [ours(x[:, t : t + 1], cache=cache) for t in range(5, 20)]
    assert_close(torch.cat(steps, dim=1), full, torch.float64)


# ----------------------------------------------------------------------------
# The config


@pytest.mark.parametrize(
    "fields",
    [
        dict(activation_function="gelu"),
        dict(activation_function="relu"),
        dict(activation_function="gelu_pytorch_tanh"),
        dict(n_inner=24),
        dict(layer_norm_epsilon=1e-2),
    ],
    ids=["gelu", "relu", "gelu_pytorch_tanh", "n_inner", "epsilon"],
)
def test_each_setting_is_mapped_and_computes_the_same(fields):
    theirs = hf_gpt2(**fields)
    ours = from_hf_gpt2(theirs)
    c = ours.config
    name = theirs.config.activation_function
    assert c.activation == ACTIVATION_NAMES[name]
    assert c.d_ff == fields.get("n_inner", 4 * C)
    assert c.norm_eps == fields.get("layer_norm_epsilon", 1e-5)
    x = tokens(2, 16)
    assert_close(ours(x), theirs(x).logits, torch.float64)


def test_the_config_round_trips_and_the_parameters_count_as_gpt2s():
    theirs = hf_gpt2()
    ours = from_hf_gpt2(theirs)
    c = ours.config
    assert c == LMConfig(
        vocab=V,
        n_layers=N_LAYERS,
        d_model=C,
        d_ff=4 * C,
        n_heads=H,
        dropout=0.1,
        norm_first=True,
        tie_embeddings=True,
        position="learned",
        max_len=MAX_LEN,
        kernel="fused",
        activation="gelu_tanh",
        norm_eps=1e-5,
        scale_embeddings=False,
        output_bias=False,
        inner_dropout=False,  # GPT-2's MLP drops nothing inside
    )
    assert LMConfig(**c.to_dict()) == c
    assert gpt2_lm_config(theirs.config) == c
    rebuilt = LanguageModel(LMConfig(**c.to_dict())).double().eval()
    rebuilt.load_state_dict(ours.state_dict())
    x = tokens(2, 8)
    assert torch.equal(rebuilt(x), ours(x))
    assert ours.generator.weight is ours.embed.weight
    assert ours.count_parameters() == theirs.num_parameters()
    assert ours.count_parameters() == sum(
        p.numel() for p in theirs.parameters()
    )


def test_a_gpt2_model_without_its_head_gives_the_tied_logits():
    body = hf_gpt2(cls=transformers.GPT2Model)
    ours = from_hf_gpt2(body)
    x = tokens(2, 12)
    hidden = body(x).last_hidden_state  # (B, L, C), after ln_f
    expected = hidden @ body.wte.weight.t()  # (B, L, V)
    assert_close(ours(x), expected, torch.float64)


def test_the_copy_keeps_the_device_dtype_and_mode(device):
    theirs = hf_gpt2(dtype=torch.float32).to(device)
    ours = from_hf_gpt2(theirs)
    assert {p.dtype for p in ours.parameters()} == {torch.float32}
    assert ours.device.type == device.type
    assert not ours.training
    x = tokens(2, 12).to(device)
    assert_close(ours(x), theirs(x).logits, torch.float32)
    assert from_hf_gpt2(theirs.train()).training


def test_the_copy_leaves_the_random_generator_alone():
    theirs = hf_gpt2()
    before = torch.get_rng_state()
    from_hf_gpt2(theirs)
    assert torch.equal(torch.get_rng_state(), before)


def test_one_dropout_rate_is_taken_or_asked_for():
    rates = dict(embd_pdrop=0.2, attn_pdrop=0.2, resid_pdrop=0.2)
    same = from_hf_gpt2(hf_gpt2(**rates))
    assert same.config.dropout == 0.2
    differ = hf_gpt2(embd_pdrop=0.1, attn_pdrop=0.0, resid_pdrop=0.1)
    with pytest.raises(ValueError, match="attn_pdrop=0.0.*dropout="):
        from_hf_gpt2(differ)
    assert from_hf_gpt2(differ, dropout=0.05).config.dropout == 0.05
    with pytest.raises(ValueError, match="dropout"):
        from_hf_gpt2(differ, dropout=1.5)


# ----------------------------------------------------------------------------
# What is refused

ATTENTION_SETTINGS = [
    dict(scale_attn_weights=False),
    dict(scale_attn_by_inverse_layer_idx=True),
]


@pytest.mark.parametrize(
    "fields",
    [
        *ATTENTION_SETTINGS,
        dict(add_cross_attention=True),
        dict(activation_function="gelu_fast"),
        dict(activation_function="silu"),
    ],
    ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()),
)
def test_a_setting_the_book_cannot_reproduce_is_refused(fields):
    (name,) = fields
    theirs = hf_gpt2(**fields)
    with pytest.raises(ValueError, match=f"{name}={fields[name]!r}"):
        from_hf_gpt2(theirs)
    with pytest.raises(ValueError, match=name):
        gpt2_lm_config(theirs.config)


@pytest.mark.parametrize(
    "fields",
    ATTENTION_SETTINGS,
    ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()),
)
def test_each_refused_attention_setting_changes_what_gpt2_computes(fields):
    """The refusals are needed: the same weights under each setting give
    other logits in Hugging Face's own eager attention."""
    plain = hf_gpt2(attn_implementation="eager")
    other = hf_gpt2(attn_implementation="eager", **fields)
    other.load_state_dict(plain.state_dict())
    x = tokens(2, 12)
    difference = (other(x).logits - plain(x).logits).abs().max()
    assert difference > 1e-8


def test_upcast_and_reordered_attention_is_accepted():
    """reorder_and_upcast_attn changes Hugging Face's eager attention by
    rounding only: the copy gives its logits to float32's tolerance. (In
    float64 Hugging Face's own model raises: its float32 scores meet a
    float64 mask.)"""
    theirs = hf_gpt2(
        attn_implementation="eager",
        reorder_and_upcast_attn=True,
        dtype=torch.float32,
    )
    ours = from_hf_gpt2(theirs)
    x = tokens(2, MAX_LEN)
    assert_close(ours(x), theirs(x).logits, torch.float32)


def test_an_untied_output_layer_is_refused():
    theirs = hf_gpt2(tie_word_embeddings=False)
    assert theirs.lm_head.weight is not theirs.transformer.wte.weight
    with pytest.raises(ValueError, match="lm_head.*tie_word_embeddings"):
        from_hf_gpt2(theirs)


@pytest.mark.parametrize("kind", ["linear", "config", "classifier"])
def test_a_model_that_is_not_gpt2_is_refused(kind):
    if kind == "linear":
        model = torch.nn.Linear(4, 4)
    elif kind == "config":
        model = hf_config()
    else:
        model = hf_gpt2(cls=transformers.GPT2ForSequenceClassification)
    with pytest.raises(ValueError, match="GPT2LMHeadModel or GPT2Model"):
        from_hf_gpt2(model)
    if kind != "config":
        with pytest.raises(ValueError, match="config must be a GPT2Config"):
            gpt2_lm_config(model)


def test_weights_on_two_dtypes_or_without_values_are_refused():
    theirs = hf_gpt2()
    theirs.transformer.ln_f.float()
    with pytest.raises(ValueError, match="one device and one dtype"):
        from_hf_gpt2(theirs)
    with pytest.raises(ValueError, match="meta device"):
        from_hf_gpt2(hf_gpt2().to("meta"))


def test_without_transformers_the_module_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "transformer_lite.adapt.gpt2")
    with pytest.raises(ImportError, match=r"transformer-lite\[hf\]"):
        importlib.import_module("transformer_lite.adapt.gpt2")
