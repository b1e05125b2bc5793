"""Shared fixtures: devices, dtypes and tolerances; one tiny model per
model family (``tiny_model``, ``tiny_lm``, ``tiny_vit``) and the random
batches the training tests feed them."""

import pytest
import torch

CUDA = torch.cuda.is_available()

# float32 means float32 on every device. NVIDIA GPUs since Ampere can round
# the inputs of float32 matrix products (cuBLAS) and convolutions (cuDNN)
# to TF32, 10 bits of fraction: errors near 1e-3, far above the float32
# tolerances below. cuDNN does it by default; cuBLAS does it where
# TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 is set, as in NVIDIA's container
# images. Setting the flags overrides both (tests/test_device.py runs the
# suite's check under that variable).
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
if torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32:
    raise RuntimeError(
        "could not turn TF32 off; float32 comparisons would fail on a GPU"
    )

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device")
    ),
]

# dtype -> (rtol, atol) for comparing against PyTorch's own modules.
TOLERANCES = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
}
DTYPES = list(TOLERANCES)


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=DTYPES, ids=["float64", "float32"])
def dtype(request) -> torch.dtype:
    return request.param


@pytest.fixture
def one_thread():
    """Training tiny models: matrices this small gain little from a second
    thread, and on a busy machine its waiting made tests several times
    slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def assert_close(actual, expected, dtype, msg=""):
    torch.testing.assert_close(
        actual, expected, **TOLERANCES[dtype], msg=lambda m: f"{msg}\n{m}"
    )


def random_padding(lengths, max_len, device=None) -> torch.Tensor:
    """(B, 1, L) bool mask, True for the first lengths[b] positions."""
    positions = torch.arange(max_len, device=device)
    lengths = torch.as_tensor(lengths, device=device)
    return (positions < lengths[:, None]).unsqueeze(1)


# ----------------------------------------------------------------------------
# Tiny models, one factory per model family. Each seeds every generator
# (``seed_everything``) before building, so that a call with the same
# arguments builds the same weights, bit for bit. Keyword arguments are
# config fields and override the sizes below.

VOCAB = 11  # tiny_model's vocabularies, source and target
PAD = 0  # the pad id of VOCAB
LM_VOCAB = 19  # tiny_lm's vocabulary; lm_tokens draws from it
TINY_VIT = dict(n_layers=2, d_model=16, d_ff=32, n_heads=2, dropout=0.0)


def tiny_model(
    src_vocab: int = VOCAB,
    tgt_vocab: int | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    **fields,
):
    """An encoder-decoder ``Transformer`` (``make_model``): one layer,
    d_model 16, d_ff 32, two heads, no dropout, in training mode;
    ``tgt_vocab`` defaults to ``src_vocab``. Moved to ``dtype`` and
    ``device`` when given."""
    from transformer_lite import make_model, seed_everything

    seed_everything(seed)
    sizes = dict(n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0)
    tgt_vocab = src_vocab if tgt_vocab is None else tgt_vocab
    model = make_model(src_vocab, tgt_vocab, **{**sizes, **fields})
    if dtype is not None or device is not None:
        model = model.to(device=device, dtype=dtype)
    return model


def tiny_lm(
    vocab: int = LM_VOCAB,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    **fields,
):
    """A decoder-only language model (``make_lm``): two blocks, d_model
    32, d_ff 64, four heads, max_len 64, in eval mode (no dropout), in
    ``dtype``."""
    from transformer_lite import seed_everything
    from transformer_lite.lm import make_lm

    seed_everything(seed)
    sizes = dict(n_layers=2, d_model=32, d_ff=64, n_heads=4, max_len=64)
    return make_lm(vocab, **{**sizes, **fields}).to(dtype).eval()


def tiny_vit(*, seed: int = 0, **fields):
    """A ``VisionTransformer`` of ``TINY_VIT``'s sizes (two layers,
    d_model 16, no dropout) on ``ViTConfig``'s 8x8 grey images, in eval
    mode."""
    from transformer_lite import seed_everything
    from transformer_lite.vision import VisionTransformer, ViTConfig

    seed_everything(seed)
    return VisionTransformer(ViTConfig(**{**TINY_VIT, **fields})).eval()


def lm_tokens(B: int, L: int, seed: int = 0) -> torch.Tensor:
    """(B, L) random ids in [4, LM_VOCAB): no special token."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, LM_VOCAB, (B, L), generator=g)


def random_tokens(rows: int, width: int, seed: int, min_len: int = 2):
    """Random ids in [1, VOCAB) with each row padded after a random
    length."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (rows, width), generator=g)
    lengths = torch.randint(min_len, width + 1, (rows, 1), generator=g)
    return tokens.masked_fill(torch.arange(width) >= lengths, PAD)


def random_batch(rows: int = 4, seed: int = 0):
    """A ``Batch`` for ``tiny_model``: sources of 7 and targets of 6
    padded tokens."""
    from transformer_lite.training import Batch

    return Batch(
        random_tokens(rows, 7, seed), random_tokens(rows, 6, seed + 100), PAD
    )


def padded_src_tgt(vocab: int = 13):
    """(3, 7) sources and (3, 6) targets, ids in [3, vocab), seeded; the
    first source row and the second target row padded at the end."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, vocab, (3, 7), generator=g)
    src[0, 4:] = 0
    tgt = torch.randint(3, vocab, (3, 6), generator=g)
    tgt[1, 3:] = 0
    return src, tgt


def same_parameters(a, b, atol: float = 0.0) -> bool:
    """Whether two models' parameters are equal, within ``atol``."""
    return all(
        torch.allclose(p, q, rtol=0.0, atol=atol)
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


@pytest.fixture
def kernel_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every call to
    ``F.scaled_dot_product_attention`` during the test, in order."""
    import torch.nn.functional as F

    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


@pytest.fixture(scope="session")
def tiny_translator(tmp_path_factory):
    """A chapter 7 translator trained for a few seconds (two layers,
    d_model 32), saved as ``de-en.pt``, and held-out number pairs: the
    model that the shipping tests (chapter 12) export, quantise and
    split. Its translations are poor; its scores have clear winners."""
    from types import SimpleNamespace

    from transformer_lite.tasks import numbers
    from transformer_lite.tasks.trainer import TranslateConfig, train

    config = TranslateConfig(
        n_train=400, n_valid=20, n_test=24, max_digits=3, steps=80,
        save_every=40, keep_last=1, d_model=32, d_ff=64, n_layers=2,
        n_heads=4, batch_size=32, max_len=40, src_vocab=60, tgt_vocab=60,
    )  # fmt: skip
    splits = numbers.number_splits(
        config.n_train, config.n_valid, config.n_test, config.max_digits
    )
    pairs = numbers.number_pairs(splits["train"], config.pair)
    test = numbers.number_pairs(splits["test"], config.pair)
    directory = tmp_path_factory.mktemp("tiny_translator")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(
            pairs, config, directory / "checkpoints", device="cpu",
            progress=False,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    translator = result.translator
    translator.model.eval()
    path = directory / "de-en.pt"
    translator.save(path)
    return SimpleNamespace(translator=translator, test=test, path=path)
