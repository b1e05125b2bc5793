"""The package's shape: tiers whose imports run one way, checked by
import-linter, and a wheel that stands alone with the core's two
dependencies (chapter 0's promise of a small, separable core)."""

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def lint_imports(
    root: Path, package_parent: Path
) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(package_parent), "PATH": str(BIN)}
    return subprocess.run(
        [str(BIN / "lint-imports"), "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )


def test_import_contracts_are_kept():
    done = lint_imports(ROOT, ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "module, imports",
    [
        ("masks.py", "import transformer_lite.training.loop"),
        ("model.py", "from transformer_lite.tasks import corpus"),
        ("training/step.py", "import transformer_lite.tasks.numbers"),
        ("tasks/numbers.py", "import transformer_lite.bench.report"),
        ("layers.py", "import transformer_lite.vision.vit"),
        ("vision/vit.py", "import transformer_lite.tasks.digits"),
        ("vision/patches.py", "import transformer_lite.training.loop"),
        ("layers.py", "import transformer_lite.domains.series"),
        ("domains/tabular.py", "import transformer_lite.tasks.tables"),
        ("domains/series.py", "import transformer_lite.vision.vit"),
    ],
)
def test_a_core_or_tier_module_importing_upwards_breaks_a_contract(
    tmp_path, module, imports
):
    """Plant one upward import in a copy of the package: the contracts
    must catch it (so the test above can fail)."""
    copy = tmp_path / "transformer_lite"
    shutil.copytree(
        ROOT / "transformer_lite",
        copy,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = copy / module
    path.write_text(path.read_text() + f"\n{imports}  # planted\n")
    done = lint_imports(tmp_path, tmp_path)
    assert done.returncode != 0
    assert "BROKEN" in done.stdout


@pytest.mark.slow
def test_the_wheel_installs_and_runs_with_the_core_dependencies(tmp_path):
    """Build the wheel, install it with only torch and tqdm into a fresh
    virtual environment, run the core there, and check that a tier whose
    extra is missing says which extra to install."""
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = dist.glob("transformer_lite-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    import torch
    import tqdm

    pins = [
        f"torch=={torch.__version__.split('+')[0]}",
        f"tqdm=={tqdm.__version__}",
    ]
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *pins, str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    script = """
import torch
import transformer_lite as tl
from transformer_lite.decoding import greedy_decode
model = tl.make_model(7, 7, n_layers=1, d_model=8, d_ff=16, n_heads=2)
out = greedy_decode(model, torch.tensor([[1, 3, 4, 2]]), max_len=5, bos_id=1)
assert out.shape[0] == 1 and out.shape[1] <= 5
import transformer_lite.training
import transformer_lite.tasks.copy_task
try:
    import transformer_lite.tasks.tokenizer
except ImportError as err:
    print("refused:", err)
try:
    import transformer_lite.adapt.gpt2
except ImportError as err:
    print("refused:", err)
print("core ok")
"""
    run = subprocess.run(
        [str(python), "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "core ok" in run.stdout
    assert "transformer-lite[translate]" in run.stdout
    assert "transformer-lite[hf]" in run.stdout
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
    ).stdout
    extras = ("tokenizers", "sacrebleu", "num2words", "altair", "transformers")
    for extra in extras:
        assert extra not in listed.lower()


def test_every_test_the_guarantees_name_exists():
    """The README's Guarantees are pinned by tests: every test and test
    file they name is here (a renamed test would unpin a line)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    guarantees = readme.split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`(test_\w+)`", guarantees))
    files = set(re.findall(r"`(tests/test_\w+\.py)`", guarantees))
    assert len(names) >= 15 and len(files) >= 4
    sources = "\n".join(
        p.read_text(encoding="utf-8") for p in (root / "tests").glob("*.py")
    )
    defined = set(re.findall(r"^def (test_\w+)", sources, re.MULTILINE))
    assert names <= defined, sorted(names - defined)
    assert all((root / f).is_file() for f in files), files
