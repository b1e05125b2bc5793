"""Data-parallel training (chapter 7): two processes on the CPU (gloo)
take the same step as one process on the whole global batch; ``shard``
splits a ``Batch`` or ``Examples`` by rows."""

import datetime
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from transformer_lite import make_model
from transformer_lite.training import (
    Batch,
    Examples,
    LabelSmoothingLoss,
    TrainOptions,
    seq2seq_loss,
)
from transformer_lite.training.distributed import (
    init_distributed,
    shard,
    world,
)
from transformer_lite.training.step import train_step

V, PAD = 11, 0
LENGTHS = [(3, 9), (7, 2), (5, 5), (2, 8), (6, 3)]  # (S, T) of each row


def global_batches() -> list[Batch]:
    """Two global batches of 5 rows; the shares of 3 and 2 rows hold
    different numbers of target tokens, so normalising the loss per
    process (rather than over the global batch) would show."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2):
        src = torch.zeros(5, 8, dtype=torch.long)
        tgt = torch.zeros(5, 10, dtype=torch.long)
        for row, (s, t) in enumerate(LENGTHS):
            src[row, :s] = torch.randint(1, V, (s,), generator=g)
            tgt[row, :t] = torch.randint(1, V, (t,), generator=g)
        batches.append(Batch(src, tgt, PAD))
    return batches


def setup() -> tuple[nn.Module, torch.optim.Optimizer, nn.Module]:
    torch.manual_seed(0)
    model = make_model(
        V, V, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0
    ).double()
    # Plain SGD: the step is the gradient itself. (Adam would turn the
    # round-off in gradients that are exactly zero in theory, such as
    # those of the key biases, into steps of size lr.)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    objective = seq2seq_loss(LabelSmoothingLoss(V, PAD, 0.1, reduction="sum"))
    return model, optimizer, objective


def worker(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),  # a stalled peer: fail
    )
    try:
        model, optimizer, objective = setup()
        replica = nn.parallel.DistributedDataParallel(model)
        losses = [
            train_step(replica, batch, objective, optimizer)
            for batch in global_batches()
        ]
        assert world() == (rank, world_size)
        torch.save(
            {"state": model.state_dict(), "losses": losses},
            os.path.join(out, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_step_like_one(tmp_path):
    mp.spawn(worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    ranks = [
        torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        for r in range(2)
    ]
    model, optimizer, objective = setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = [
        train_step(model, batch, objective, optimizer)
        for batch in global_batches()
    ]
    moved = [
        not torch.equal(v, before[k]) for k, v in model.state_dict().items()
    ]
    assert sum(moved) > len(moved) / 2  # the steps did change the model
    for name, value in model.state_dict().items():
        for rank in ranks:
            torch.testing.assert_close(
                rank["state"][name],
                value,
                rtol=1e-10,
                atol=1e-12,
                msg=f"{name} differs from one process",
            )
    for rank in ranks:
        assert rank["losses"] == pytest.approx(losses, rel=1e-12)


def test_shards_split_the_rows():
    batch = global_batches()[0]
    shares = [shard(batch, r, 2) for r in range(2)]
    assert [s.src.size(0) for s in shares] == [3, 2]
    assert torch.equal(torch.cat([s.src for s in shares]), batch.src)
    assert sum(s.n_tokens for s in shares) == batch.n_tokens
    with pytest.raises(ValueError, match="rank 2 of 2"):
        shard(batch, 2, 2)
    with pytest.raises(ValueError, match="batch of 5 rows"):
        shard(batch, 0, 6)


def test_shards_of_examples_split_every_input_and_the_targets():
    images = torch.arange(5 * 3.0).reshape(5, 3)  # (B, 3)
    words = torch.arange(10).reshape(5, 2)  # (B, 2)
    targets = torch.tensor([[1, 2], [3, PAD], [PAD, PAD], [4, 5], [6, 7]])
    examples = Examples((images, words), targets, PAD, starts_stream=True)
    shares = [shard(examples, r, 2) for r in range(2)]
    assert all(isinstance(s, Examples) for s in shares)
    assert [s.targets.size(0) for s in shares] == [3, 2]
    for i, whole in enumerate((images, words)):
        assert torch.equal(torch.cat([s.inputs[i] for s in shares]), whole)
    assert torch.equal(torch.cat([s.targets for s in shares]), targets)
    assert [s.n_tokens for s in shares] == [3, 4]  # PAD is ignored
    assert all(s.ignore_index == PAD and s.starts_stream for s in shares)
    plain = shard(Examples(images, targets[:, 0]), 1, 2)
    assert plain.ignore_index is None and not plain.starts_stream
    with pytest.raises(ValueError, match="batch of 5 rows"):
        shard(examples, 0, 6)


def test_one_process_step_is_a_plain_step():
    """Without a process group, train_step is the usual mean-loss step."""
    model, optimizer, objective = setup()
    batch = global_batches()[0]
    reference, ref_opt, _ = setup()
    loss = train_step(
        model, batch, objective, optimizer,
        options=TrainOptions(clip_norm=None),
    )  # fmt: skip
    mean_loss = LabelSmoothingLoss(V, PAD, 0.1)
    logits = reference(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    expected = mean_loss(logits, batch.tgt_out)
    expected.backward()
    expected = float(expected.detach())
    ref_opt.step()
    assert loss == pytest.approx(expected, rel=1e-12)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.fixture
def one_gpu(monkeypatch):
    """A machine with one CUDA device, as torch sees it, and a process
    group that records its backend instead of starting; returns the
    record."""
    joined = {"set_device": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", joined["set_device"].append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist,
        "init_process_group",
        lambda backend, **options: joined.update(b=backend),
    )
    return joined


def torchrun_env(monkeypatch, rank: int, nproc: int) -> None:
    """What ``torchrun --nproc_per_node=nproc`` sets for one process."""
    for name, value in (
        ("RANK", rank),
        ("LOCAL_RANK", rank),
        ("WORLD_SIZE", nproc),
        ("LOCAL_WORLD_SIZE", nproc),
    ):
        monkeypatch.setenv(name, str(value))


def test_more_processes_than_gpus_train_on_the_cpu(one_gpu, monkeypatch):
    """``torchrun --nproc_per_node=2`` on a one-GPU machine: no
    'invalid device ordinal', no two NCCL processes on one GPU."""
    torchrun_env(monkeypatch, rank=0, nproc=2)
    with pytest.warns(RuntimeWarning, match="1 CUDA device"):
        assert init_distributed() == torch.device("cpu")
    torchrun_env(monkeypatch, rank=1, nproc=2)
    assert init_distributed() == torch.device("cpu")
    assert one_gpu == {"set_device": [], "b": "gloo"}


def test_nccl_with_too_few_gpus_is_refused(one_gpu, monkeypatch):
    torchrun_env(monkeypatch, rank=1, nproc=2)
    with pytest.raises(ValueError, match="--nproc_per_node=1"):
        init_distributed("nccl")


def test_one_process_per_gpu_uses_its_gpu(one_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    torchrun_env(monkeypatch, rank=1, nproc=2)
    assert init_distributed() == torch.device("cuda:1")
    assert one_gpu == {"set_device": [torch.device("cuda:1")], "b": "nccl"}


JOIN_ALONE = """
from transformer_lite.training.distributed import init_distributed
init_distributed("gloo", timeout=2)
"""


@pytest.mark.timeout(120)
def test_a_missing_peer_fails_after_the_timeout():
    """Rank 0 of 2, and rank 1 never comes: with ``timeout=2`` joining
    fails within seconds instead of blocking for 30 minutes."""
    env = os.environ | dict(
        WORLD_SIZE="2",
        RANK="0",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", JOIN_ALONE],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode != 0
    assert "Timed out" in done.stderr, done.stderr[-500:]
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("timeout", [0, -1, True, "60"])
def test_timeout_must_be_positive_seconds(timeout):
    with pytest.raises(ValueError, match="timeout"):
        init_distributed("gloo", timeout=timeout)
