"""Shared fixtures: devices, dtypes and tolerances."""

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
