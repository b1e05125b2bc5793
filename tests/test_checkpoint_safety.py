"""Checkpoints from anywhere (chapters 6 and 7): a file is untrusted until
checked, and a save never leaves half a file or writes through a link.

The fuzz tests feed random bytes, truncations, flipped bytes, crafted
configs and wrong tensors to ``load_checkpoint``: every case must be a
``ValueError`` that names the problem, no model may be built on a real
device, and no file may appear.
"""

import os
import struct
import zipfile

import pytest
import torch
from conftest import tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_lite.model import Transformer
from transformer_lite.training import checkpoint
from transformer_lite.training.checkpoint import (
    CHECKPOINT_FORMAT,
    average_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


# The sizes of every model here; dropout 0.1 is the config's default.
SIZES = dict(n_layers=1, d_model=8, d_ff=16, n_heads=2, dropout=0.1)


@pytest.fixture(scope="module")
def good_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("good") / "m.pt"
    save_checkpoint(path, tiny_model(9, 7, **SIZES), step=3)
    return path.read_bytes()


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """The device type of every Transformer built from now on: the
    loader may build one on "meta" (no memory) to learn the shapes."""
    devices = []
    original = Transformer.__init__

    def spy(self, config):
        original(self, config)
        devices.append(self.generator.weight.device.type)

    monkeypatch.setattr(Transformer, "__init__", spy)
    return devices


def good_state() -> dict:
    model = tiny_model(9, 7, **SIZES)
    return {
        "format": CHECKPOINT_FORMAT,
        "config": model.config.to_dict(),
        "model": model.state_dict(),
        "optimizer": None,
        "scheduler": None,
        "extra": {},
    }


def refused(path, built, match: str = "") -> str:
    """Load ``path``: a ValueError matching ``match``, nothing built on a
    real device, no new file in the folder."""
    before = sorted(os.listdir(path.parent))
    built.clear()
    with pytest.raises(ValueError, match=match) as info:
        load_checkpoint(path)
    assert [d for d in built if d != "meta"] == []
    assert sorted(os.listdir(path.parent)) == before
    assert str(path) in str(info.value) or "checkpoint" in str(info.value)
    return str(info.value)


# ----------------------------------------------------------------------------
# Untrusted files: nothing is built before everything is checked


def test_a_small_file_cannot_ask_for_a_huge_model(tmp_path, built):
    """1.5 KB asking for max_len = src_vocab = 10**6 used to allocate
    hundreds of MiB before failing."""
    state = good_state()
    state["config"] |= dict(max_len=10**6, src_vocab=10**6)
    torch.save(state, tmp_path / "huge.pt")
    assert (tmp_path / "huge.pt").stat().st_size < 64 * 1024
    message = refused(tmp_path / "huge.pt", built, "src_embed.weight")
    assert "(1000000, 8)" in message  # what the config asked for


def test_a_small_file_cannot_ask_for_a_huge_built_table(tmp_path, built):
    """max_len = 3,000,000 in a 1.5 KB file: the sinusoidal table is
    built, not stored (192 million elements, under max_elements), and it
    used to allocate 740 MiB and more. It is counted on its own limit."""
    state = good_state()
    state["config"] |= dict(max_len=3_000_000, d_model=8)
    torch.save(state, tmp_path / "long.pt")
    assert (tmp_path / "long.pt").stat().st_size < 64 * 1024
    message = refused(tmp_path / "long.pt", built, "max_built_elements")
    assert "max_len=3,000,000 x d_model=8" in message
    assert "stored nowhere in the file" in message
    # The caller can raise it, and a model passed in builds nothing.
    model, _ = load_checkpoint(
        tmp_path / "long.pt", max_built_elements=24_000_000
    )
    assert model.config.max_len == 3_000_000
    load_checkpoint(tmp_path / "long.pt", model=model)


def test_the_caller_can_raise_the_limit(tmp_path, built):
    save_checkpoint(tmp_path / "m.pt", tiny_model(9, 7, **SIZES))
    elements = tiny_model(9, 7, **SIZES).config.n_parameters() + 5000 * 8
    with pytest.raises(ValueError, match=f"{elements:,} tensor elements"):
        load_checkpoint(tmp_path / "m.pt", max_elements=elements - 1)
    model, _ = load_checkpoint(tmp_path / "m.pt", max_elements=elements)
    assert built[-1] == "cpu"


@given(data=st.binary(max_size=4096))
@FUZZ
def test_random_bytes_are_refused(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("random")
    (folder / "m.pt").write_bytes(data)
    with pytest.raises(ValueError, match="checkpoint"):
        load_checkpoint(folder / "m.pt")
    assert os.listdir(folder) == ["m.pt"]


@given(cut=st.floats(0.0, 0.999))
@FUZZ
def test_truncated_files_are_refused(tmp_path_factory, good_bytes, cut):
    folder = tmp_path_factory.mktemp("cut")
    (folder / "m.pt").write_bytes(good_bytes[: int(cut * len(good_bytes))])
    with pytest.raises(ValueError, match="checkpoint"):
        load_checkpoint(folder / "m.pt")
    assert os.listdir(folder) == ["m.pt"]


@given(at=st.floats(0.0, 0.999), byte=st.integers(0, 255))
@FUZZ
def test_a_changed_byte_loads_or_is_refused(
    tmp_path_factory, good_bytes, at, byte
):
    """One byte changed anywhere: either the file still loads (a weight
    changed, say) or it is a ValueError; never another exception."""
    folder = tmp_path_factory.mktemp("flip")
    data = bytearray(good_bytes)
    data[int(at * len(data))] = byte
    (folder / "m.pt").write_bytes(bytes(data))
    try:
        model, _ = load_checkpoint(folder / "m.pt")
    except ValueError as err:
        assert "checkpoint" in str(err)
    else:
        assert all(torch.isfinite(p).all() for p in model.parameters())


CRAFTED_CONFIGS = [
    (dict(n_layers=True), "n_layers"),
    (dict(n_layers=-1), "n_layers"),
    (dict(d_model="8"), "d_model"),
    (dict(n_heads=3), "divisible"),
    (dict(norm_first="no"), "norm_first"),
    (dict(pad_id=1.0), "pad_id"),
    (dict(pad_id=99), "pad_id"),
    (dict(dropout=2.0), "dropout"),
    (dict(max_len=None), "max_len"),
    (dict(n_layers=10**6), "limit"),
    (dict(d_model=2**20, n_heads=1), "max_elements"),
    (dict(max_len=2**30), "limit"),
    (dict(unknown_field=1), "unknown_field"),
]


@pytest.mark.parametrize("fields, named", CRAFTED_CONFIGS)
def test_crafted_configs_are_refused(tmp_path, built, fields, named):
    state = good_state()
    state["config"] |= fields
    torch.save(state, tmp_path / "m.pt")
    refused(tmp_path / "m.pt", built, named)


def test_a_config_missing_a_field_is_refused(tmp_path, built):
    state = good_state()
    del state["config"]["d_ff"]
    torch.save(state, tmp_path / "m.pt")
    refused(tmp_path / "m.pt", built, "missing: d_ff")


def test_a_file_from_before_positions_were_a_choice_loads(tmp_path):
    """Checkpoints saved before ``position`` existed computed sinusoidal
    positions: they load as such, with the same outputs."""
    model = tiny_model(9, 7, **SIZES).eval()
    save_checkpoint(tmp_path / "new.pt", model)
    state = torch.load(tmp_path / "new.pt", weights_only=True)
    del state["config"]["position"]
    torch.save(state, tmp_path / "old.pt")
    loaded, _ = load_checkpoint(tmp_path / "old.pt")
    assert loaded.config.position == "sinusoidal"
    src = torch.randint(3, 9, (2, 5))  # (B, S)
    tgt = torch.randint(3, 7, (2, 4))  # (B, T)
    torch.testing.assert_close(loaded.eval()(src, tgt), model(src, tgt))


def wrong_tensors():
    name = "encoder.layers.0.self_attn.w_q.weight"
    return [
        ("shape", lambda w: w.__setitem__(name, torch.zeros(8, 9)), name),
        ("dtype", lambda w: w.__setitem__(name, w[name].long()), name),
        ("NaN", lambda w: w[name].fill_(float("nan")), "NaN"),
        ("missing", lambda w: w.pop(name), "missing"),
        ("extra", lambda w: w.__setitem__("x.weight", torch.zeros(1)), "x"),
        ("non-tensor", lambda w: w.__setitem__(name, [1.0]), name),
        ("sparse", lambda w: w.__setitem__(name, w[name].to_sparse()), name),
        ("more layers", lambda w: w.update(extra_layer(w)), "layers"),
    ]


def extra_layer(weights: dict) -> dict:
    return {
        k.replace("layers.0.", "layers.1."): v
        for k, v in weights.items()
        if k.startswith("encoder.layers.0.")
    }


@pytest.mark.parametrize(
    "change, named", [(c, n) for _, c, n in wrong_tensors()],
    ids=[i for i, _, _ in wrong_tensors()],
)  # fmt: skip
def test_wrong_tensors_are_refused(tmp_path, built, change, named):
    state = good_state()
    change(state["model"])
    torch.save(state, tmp_path / "m.pt")
    refused(tmp_path / "m.pt", built, named)


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda s: s.pop("config"), "lacks config"),
        (lambda s: s.pop("model"), "lacks model"),
        (lambda s: s.pop("extra"), "lacks extra"),
        (lambda s: s.__setitem__("config", [1, 2]), "config is a list"),
        (lambda s: s.__setitem__("model", None), "model is a NoneType"),
        (lambda s: s.__setitem__("optimizer", "adam"), "optimizer"),
        (lambda s: s.__setitem__("format", "other"), "not a transformer"),
    ],
)
def test_structurally_incomplete_files_are_value_errors(
    tmp_path, built, change, named
):
    """These used to raise KeyError or RuntimeError."""
    state = good_state()
    change(state)
    torch.save(state, tmp_path / "m.pt")
    refused(tmp_path / "m.pt", built, named)


@pytest.mark.parametrize(
    "stored", [{"state": {}}, {"state": {}, "param_groups": [{}]}]
)
def test_optimizer_state_that_does_not_fit_is_a_value_error(tmp_path, stored):
    """A KeyError inside torch's load_state_dict used to escape."""
    model = tiny_model(9, 7, **SIZES)
    state = good_state() | {"optimizer": stored}
    torch.save(state, tmp_path / "m.pt")
    optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="optimizer state does not fit"):
        load_checkpoint(tmp_path / "m.pt", model, optimizer)


def test_compressed_records_are_refused(tmp_path, good_bytes, built):
    """torch.save stores records uncompressed; a compressed one could
    inflate a few bytes into gigabytes while loading."""
    (tmp_path / "good.pt").write_bytes(good_bytes)
    with (
        zipfile.ZipFile(tmp_path / "good.pt") as good,
        zipfile.ZipFile(tmp_path / "m.pt", "w", zipfile.ZIP_DEFLATED) as bad,
    ):
        for info in good.infolist():
            bad.writestr(info.filename, good.read(info))
    os.remove(tmp_path / "good.pt")
    refused(tmp_path / "m.pt", built, "compressed")


def test_a_record_larger_than_the_file_is_refused(tmp_path, good_bytes, built):
    """A central directory that claims a 4 GiB record in a small file."""
    data = bytearray(good_bytes)
    entry = data.index(b"PK\x01\x02")  # the first central directory entry
    data[entry + 20 : entry + 28] = struct.pack("<II", 2**32 - 1, 2**32 - 1)
    (tmp_path / "m.pt").write_bytes(bytes(data))
    refused(tmp_path / "m.pt", built, "checkpoint")


def test_a_zip_version_zipfile_cannot_read_is_refused(
    tmp_path, good_bytes, built
):
    """A changed 'version needed to extract' makes zipfile raise
    NotImplementedError (found by the fuzz test above): still a
    ValueError naming the checkpoint."""
    data = bytearray(good_bytes)
    entry = data.index(b"PK\x01\x02")  # the first central directory entry
    data[entry + 6 : entry + 8] = struct.pack("<H", 64)  # version 6.4
    (tmp_path / "m.pt").write_bytes(bytes(data))
    refused(tmp_path / "m.pt", built, "checkpoint")


def test_average_checkpoints_wants_a_list(tmp_path):
    save_checkpoint(tmp_path / "a.pt", tiny_model(9, 7, **SIZES))
    with pytest.raises(ValueError, match="list of paths"):
        average_checkpoints(str(tmp_path / "a.pt"))
    with pytest.raises(ValueError, match="list of paths"):
        average_checkpoints(tmp_path / "a.pt")


# ----------------------------------------------------------------------------
# Safe saves: a fresh temporary file, fsync, one atomic rename


def test_a_planted_link_is_not_followed(tmp_path):
    """The old save wrote through ``<name>.partial``; a link planted
    there overwrote another file."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "m.pt.partial").symlink_to(victim)
    save_checkpoint(tmp_path / "m.pt", tiny_model(9, 7, **SIZES))
    assert victim.read_text() == "precious"
    assert (tmp_path / "m.pt.partial").is_symlink()
    assert sorted(os.listdir(tmp_path)) == [
        "m.pt",
        "m.pt.partial",
        "victim.txt",
    ]
    load_checkpoint(tmp_path / "m.pt")


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "m.pt").symlink_to(victim)
    save_checkpoint(tmp_path / "m.pt", tiny_model(9, 7, **SIZES))
    assert victim.read_text() == "precious"
    assert not (tmp_path / "m.pt").is_symlink()


def test_the_data_is_flushed_to_disk_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd)
    )
    save_checkpoint(tmp_path / "m.pt", tiny_model(9, 7, **SIZES))
    assert len(synced) >= 1  # the file (and, where possible, the folder)
    mode = (tmp_path / "m.pt").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_a_failed_save_keeps_the_old_file_and_leaves_nothing(
    tmp_path, monkeypatch
):
    save_checkpoint(tmp_path / "m.pt", tiny_model(9, 7, seed=0, **SIZES))
    old = (tmp_path / "m.pt").read_bytes()

    def failing_save(obj, file):
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "m.pt", tiny_model(9, 7, seed=1, **SIZES))
    assert os.listdir(tmp_path) == ["m.pt"]
    assert (tmp_path / "m.pt").read_bytes() == old


def test_saving_to_a_directory_is_refused(tmp_path):
    (tmp_path / "m.pt").mkdir()
    with pytest.raises(ValueError, match="directory"):
        save_checkpoint(tmp_path / "m.pt", tiny_model(9, 7, **SIZES))
    assert os.listdir(tmp_path) == ["m.pt"]
