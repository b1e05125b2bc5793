"""``make gpu-check``: does transformer-lite run on this machine's GPU as
it runs on a CPU? One script, under ten minutes, one compact report.

Without a CUDA device it prints one line and exits with status 0.
With one, it runs these sections in turn and prints a line or a small
table for each (full logs in ``_build/gpu-check/``):

1. the device, its versions and the TF32 flags;
2. which kernel of ``F.scaled_dot_product_attention`` each attention path
   reaches (from the profiler), forward and backward;
3. host syncs per training step and per decoded token
   (``torch.cuda.set_sync_debug_mode``);
4. the test suite's CUDA cases;
5. chapters 5-8 under nbval;
6. a 2-process ``torchrun`` of the translator's command line;
7. the benchmark at its GPU sizes: tokens/s and TFLOP/s against the
   device's peak.

The exit status is 0 when every section passed. ``--cpu`` runs sections
1-3 on the CPU instead (a smoke test of this script; the counts of host
syncs need CUDA and are left out).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "_build" / "gpu-check"
BUDGET_S = 570  # the whole run, in seconds: under ten minutes
CHAPTERS = (
    "05_encoder_decoder",
    "06_training",
    "07_translation",
    "08_making_it_fast",
)
TINY = [  # a translator trained for a few steps: the plumbing, not quality
    "--n-train", "400", "--n-valid", "20", "--n-test", "20",
    "--steps", "6", "--save-every", "2", "--keep-last", "2",
    "--d-model", "32", "--d-ff", "64", "--n-layers", "1", "--n-heads", "2",
    "--batch-size", "32", "--max-len", "40", "--quiet",
]  # fmt: skip
OVERRIDE = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"
KERNELS = (  # substring of the aten op -> short name; the first match wins
    ("flash_attention_for_cpu", "cpu-fused"),
    ("flash", "flash"),
    ("efficient", "efficient"),
    ("cudnn", "cudnn"),
    ("math", "math"),
    ("overrideable", "other-fused"),
)


class Report:
    """Lines printed as they come and kept for report.md."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed: list[str] = []
        self.start = time.perf_counter()

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def fail(self, section: str) -> None:
        self.failed.append(section)

    def left(self) -> float:
        return BUDGET_S - (time.perf_counter() - self.start)


# --- 1. device and flags ----------------------------------------------------


def device_section(out: Report, device: torch.device) -> None:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"
        memory = torch.cuda.get_device_properties(device).total_memory
        name += f", {memory / 2**30:.0f} GiB, {torch.cuda.device_count()} GPU"
    else:
        name = "CPU (--cpu: a smoke test of this script)"
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    out(f"device: {name}")
    out(
        f"versions: torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"cuDNN {cudnn}, python {sys.version.split()[0]}"
    )
    out(
        "TF32: cuBLAS matmul "
        f"{torch.backends.cuda.matmul.allow_tf32}, cuDNN conv "
        f"{torch.backends.cudnn.allow_tf32}; float32 matmul precision "
        f"{torch.get_float32_matmul_precision()!r}; {OVERRIDE}="
        f"{os.environ.get(OVERRIDE, '(unset)')}"
    )


# --- 2. which attention kernel each path reaches ----------------------------


def kernels(fn) -> str:
    """Short names of the SDPA kernels ``fn`` ran (forward and backward),
    from the profiler's aten ops; 'none' if it ran none."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    found = []
    for event in prof.key_averages():
        op = event.key
        if "scaled_dot_product" not in op or op.endswith(
            "::scaled_dot_product_attention"
        ):
            continue
        short = next((s for key, s in KERNELS if key in op), op)
        short += " (backward)" if "backward" in op else ""
        if short not in found:
            found.append(short)
    return ", ".join(sorted(found)) or "none (no SDPA call)"


def attention_cases(device: torch.device) -> dict:
    """Each attention path of the package, as a function to profile."""
    from transformer_lite import MultiHeadAttention, causal_mask

    cases = {}
    torch.manual_seed(0)
    L, C = (256, 256) if device.type == "cuda" else (32, 32)  # --cpu: small
    keep = torch.arange(L, device=device) < torch.tensor(
        [[L], [L // 2]], device=device
    )  # (B, L): the second row padded
    padding = keep[:, None, :]  # (B, 1, L)
    decoder = causal_mask(L, device) & padding  # (B, L, L)
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        x = torch.randn(2, L, C, device=device, dtype=dtype)
        for fused, mask, causal, what in (
            (False, padding, False, "hand-written, padding mask"),
            (True, None, False, "fused, no mask"),
            (True, None, True, "fused, is_causal=True"),
            (True, padding, False, "fused, padding mask"),
            (True, decoder, False, "fused, causal & padding mask"),
        ):
            module = MultiHeadAttention(
                C, 8, dropout=0.1, kernel="fused" if fused else "plain"
            )
            module.to(device, dtype)

            def run(module=module, x=x, mask=mask, causal=causal):
                xx = x.detach().requires_grad_()
                module(xx, xx, xx, mask, is_causal=causal).sum().backward()

            cases[f"{what}, {name}"] = run
    return cases


def model_setup(device: torch.device):
    """A training step and a decoding of a small model with fused
    attention, as the chapters and the benchmark run them."""
    from transformer_lite import make_model, set_attention_kernel
    from transformer_lite.bench.fixtures import QUICK, Sizes, random_batch
    from transformer_lite.tokens import PAD_ID
    from transformer_lite.training import (
        Batch,
        LabelSmoothingLoss,
        TrainOptions,
        seq2seq_loss,
        train_step,
    )

    torch.manual_seed(0)
    sizes = Sizes() if device.type == "cuda" else QUICK  # --cpu: tiny
    model = make_model(
        sizes.vocab,
        sizes.vocab,
        n_layers=sizes.n_layers,
        d_model=sizes.d_model,
        d_ff=sizes.d_ff,
        n_heads=sizes.n_heads,
        dropout=sizes.dropout,
    ).to(device)
    set_attention_kernel(model, "fused")
    src, tgt = random_batch(sizes, sizes.batch, torch.device("cpu"))
    batch = Batch(src, tgt, PAD_ID)  # on the CPU, as a data loader gives it
    loss_fn = LabelSmoothingLoss(sizes.vocab, PAD_ID, 0.1, reduction="sum")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    amp = torch.bfloat16 if device.type == "cuda" else None
    options = TrainOptions(amp_dtype=amp)

    def step():
        return train_step(model, batch, seq2seq_loss(loss_fn), optimizer,
                          options=options)  # fmt: skip

    return model, src[:8], step  # src: (8, S), to decode


def kernel_section(out: Report, device: torch.device) -> None:
    out(
        "\nSDPA kernel reached by each attention path (training mode, "
        "dropout 0.1;\nforward and backward):"
    )
    cases = attention_cases(device)
    _, _, step = model_setup(device)
    cases["model, fused, train_step (bf16 autocast on CUDA)"] = step
    width = max(map(len, cases))
    for what, fn in cases.items():
        fn()  # warm up, outside the profiler
        out(f"  {what:{width}}  {kernels(fn)}")


# --- 3. host syncs ----------------------------------------------------------


@contextlib.contextmanager
def counting_syncs(counts: list):
    """Count the synchronizing CUDA operations inside the block (each
    one a warning in sync debug mode)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    counts.append(
        sum("synchronizing CUDA operation" in str(w.message) for w in seen)
    )


def sync_section(out: Report, device: torch.device) -> None:
    from transformer_lite.decoding import beam_search, greedy_decode
    from transformer_lite.tokens import BOS_ID, EOS_ID

    out("\nhost syncs (torch.cuda.set_sync_debug_mode):")
    if device.type != "cuda":
        out("  n/a: sync debug mode needs CUDA")
        return
    model, src, step = model_setup(device)
    for _ in range(2):
        step()  # warm up: optimizer state, allocator, kernels chosen
    counts: list[int] = []
    for _ in range(3):
        with counting_syncs(counts):
            step()
    out(f"  train_step (bf16 autocast): {counts} per step")
    model.eval()
    n = 32
    for name, decode in (
        ("greedy_decode, cached", greedy_decode),
        ("beam_search, beam 4", beam_search),
    ):
        options = dict(max_len=n + 1, bos_id=BOS_ID, eos_id=EOS_ID)
        if decode is greedy_decode:
            options["use_cache"] = True
        else:
            options["beam_size"] = 4
        decode(model, src, **options)  # warm up
        counts = []
        with counting_syncs(counts):
            ys = decode(model, src, **options)
        tokens = ys.size(1) - 1
        out(
            f"  {name}: {counts[0]} for {tokens} tokens "
            f"({counts[0] / max(tokens, 1):.2f} per token)"
        )


# --- 4-7. the test suite, the chapters, torchrun, the benchmark ------------


def run(out: Report, section: str, command: list, cap_s: float, **kw):
    """Run ``command`` with its output in a log file; returns
    (returncode or None if it timed out or was skipped, seconds, log)."""
    limit = min(cap_s, out.left())
    log = LOGS / f"{section}.log"
    if limit < 20:
        out(f"  {section}: skipped, the time budget is spent")
        out.fail(section)
        return None, 0.0, ""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=limit,
            **kw,
        )
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code = None
        text = f"TIMED OUT after {limit:.0f} s\n{err.stdout or ''}"
    seconds = time.perf_counter() - start
    log.write_text(" ".join(map(str, command)) + "\n\n" + text)
    if code != 0:
        out.fail(section)
    return code, seconds, text


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "(no output)"


def clean_env() -> dict:
    """The environment for the chapters: float32 means float32 there too
    (the chapters compare at float32 tolerances)."""
    env = dict(os.environ)
    env.pop(OVERRIDE, None)
    return env


def tests_section(out: Report) -> None:
    out("\nCUDA test cases (pytest -k cuda):")
    command = [sys.executable, "-m", "pytest", "tests", "-q"]
    command += ["-p", "no:cacheprovider", "-m", "not browser", "-k", "cuda"]
    # A GPU machine's image may lack the book's own tools (Chromium's
    # driver, the catalogue readers): the CUDA cases need none of them.
    command += ["--ignore=tests/browser", "--continue-on-collection-errors"]
    code, seconds, text = run(out, "cuda-tests", command, 180)
    out(f"  {last_line(text)} ({seconds:.0f} s)")


def chapters_section(out: Report) -> None:
    out("\nchapters under nbval:")
    for chapter in CHAPTERS:
        source = ROOT / "notebooks" / f"{chapter}.py"
        notebook = source.with_suffix(".ipynb")
        subprocess.run(
            [sys.executable, "-m", "jupytext", "--quiet", "--to", "ipynb"]
            + [str(source), "-o", str(notebook)],
            check=True,
            cwd=ROOT,
        )
        command = [sys.executable, "-m", "pytest", "-q", "-p"]
        command += ["no:cacheprovider", "--nbval", "--nbval-current-env"]
        command += ["--nbval-sanitize-with", "notebooks/sanitize.cfg"]
        command += [str(notebook.relative_to(ROOT))]
        code, seconds, text = run(
            out, f"nbval-{chapter}", command, 240, env=clean_env()
        )
        out(f"  {chapter}: {last_line(text)} ({seconds:.0f} s)")


def torchrun_section(out: Report) -> None:
    gpus = torch.cuda.device_count()
    out(f"\ntorchrun --nproc_per_node=2, the translator's CLI ({gpus} GPU):")
    with tempfile.TemporaryDirectory() as models:
        command = [sys.executable, "-m", "torch.distributed.run"]
        command += ["--standalone", "--nproc_per_node=2", "-m"]
        command += ["transformer_lite.tasks.translate", "train"]
        command += ["--model-dir", models, *TINY]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        code, seconds, text = run(out, "torchrun", command, 180, env=env)
        saved = (Path(models) / "de-en.pt").is_file()
    where = "on the CPU with gloo" if "trains on the CPU" in text else "nccl"
    state = "ok" if code == 0 and saved else f"FAILED (exit {code})"
    if code == 0 and not saved:
        out.fail("torchrun")
    out(f"  {state}, {where}, model saved: {saved} ({seconds:.0f} s)")


def bench_section(out: Report) -> None:
    out("\nbenchmark, GPU sizes (--no-compile, 5 rounds):")
    path = LOGS / "bench.json"
    command = [sys.executable, "-m", "transformer_lite.bench", "--json"]
    command += [str(path), "--no-compile", "--repeats", "5"]
    code, seconds, text = run(out, "bench", command, 300)
    if code != 0 or not path.is_file():
        out(f"  FAILED: {last_line(text)}")
        return
    results = json.loads(path.read_text())
    out(f"  {bench_summary(results)}\n  ({seconds:.0f} s)")


def bench_summary(results: dict) -> str:
    """A few lines from the benchmark's JSON."""
    t, peak = results["training"], results["peak"]
    sheet = results["machine"]["peak_tflops"]
    lines = [
        f"sizes {results['sizes_name']}, {t['parameters']:,} parameters, "
        f"{t['dtype']}; matmul peak measured {peak['tflops']:.0f} TFLOP/s"
        + (f" (data sheet {sheet:.0f})" if sheet else "")
    ]
    for name in t["contenders"]:
        e = t[name]
        share = f"{100 * e['tflops'] / peak['tflops']:.0f}% of measured"
        if sheet:
            share += f", {100 * e['tflops'] / sheet:.0f}% of data sheet"
        lines.append(
            f"{name}: {e['tokens_per_s']:,.0f} tokens/s, "
            f"{e['tflops']:.1f} TFLOP/s ({share}), ratio "
            f"{e['paired_ratio']:.2f}"
        )
    for row in results["decoding"]:
        lines.append(
            f"decoding {row['new_tokens']} tokens x {row['batch']}: cache "
            f"{row['speedup']:.1f}x, same tokens {row['same_tokens']}"
        )
    last = results["attention"][-1]
    lines.append(
        f"attention L={last['length']} ({last['dtype']}): plain / chunked "
        f"memory {last['plain_over_chunked_memory']:.0f}x; fused "
        f"{last['fused']['median_s'] * 1e3:.1f} ms, plain "
        f"{last['plain']['median_s'] * 1e3:.1f} ms"
    )
    return "\n  ".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run sections 1-3 on the CPU (a smoke test of this script)",
    )
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: gpu-check skipped")
        return 0
    device = torch.device("cpu" if args.cpu else "cuda")
    LOGS.mkdir(parents=True, exist_ok=True)
    out = Report()
    out("# gpu-check\n")
    device_section(out, device)
    kernel_section(out, device)
    sync_section(out, device)
    if device.type == "cuda":
        tests_section(out)
        chapters_section(out)
        torchrun_section(out)
        bench_section(out)
    minutes = (time.perf_counter() - out.start) / 60
    verdict = "all passed" if not out.failed else "FAILED: "
    out(f"\n{verdict}{', '.join(out.failed)} in {minutes:.1f} min")
    (LOGS / "report.md").write_text("\n".join(out.lines) + "\n")
    return 1 if out.failed else 0


if __name__ == "__main__":
    sys.exit(main())
