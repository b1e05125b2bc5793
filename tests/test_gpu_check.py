"""``make gpu-check`` (tools/gpu_check.py): on a machine without a GPU it
says so in one line and succeeds; its in-process sections run on the CPU
with ``--cpu``. What it checks on a GPU is in its docstring."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu_check.py"
NO_GPU = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # hide any GPU


def test_without_a_gpu_it_says_so_and_succeeds():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no CUDA device: gpu-check skipped\n"


def test_its_in_process_sections_run_on_the_cpu():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu"],
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("# gpu-check") and "all passed" in out
    assert "TF32: cuBLAS matmul" in out
    assert "fused, is_causal=True, bfloat16" in out
    assert "hand-written, padding mask, float32" in out
    assert "none (no SDPA call)" in out  # the hand-written path
    assert "n/a: sync debug mode needs CUDA" in out


def test_make_has_the_target():
    makefile = SCRIPT.parent.parent / "Makefile"
    assert "\ngpu-check: install" in makefile.read_text()
