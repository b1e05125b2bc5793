"""Record every assert of a chapter, with its values, instead of raising.

``tools/seed_sweep.py`` runs each chapter with one extra first cell::

    import sweep_claims; sweep_claims.install("run.json")

which registers an IPython AST transformer. From then on every ``assert``
at the top level of a cell (including those inside loops and ``with``
blocks, but not inside functions or classes, whose asserts are code, not
claims) is rewritten so that it records the values it compared and goes
on: one run of a chapter measures every claim in it, even after one fails.

A comparison ``assert a >= b`` records both operands (numbers when they
are numbers or one-element tensors) and the operator; a conjunction of
comparisons (``assert a > x and b < y``) records each as its own claim,
so that neither hides its margin; any other test records its truth.
``finish()`` adds the CPU capability ATen chose and writes the records
to the JSON file.
"""

import ast
import json
from pathlib import Path

OPS = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
HOLDS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "is": lambda a, b: a is b,
    "is not": lambda a, b: a is not b,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}
RECORDER = "__sweep_claims__"

_records: list[dict] = []
_path: Path | None = None
_occurrence: dict[tuple, int] = {}


def number(value) -> float | None:
    """A float for numbers and one-element tensors or arrays, else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    try:
        count = numel() if callable(numel) else numel
        if count == 1:
            return float(value.item())
    except Exception:  # noqa: BLE001 - anything not a number is no number
        return None
    return None


def _truth(value) -> bool:
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 - e.g. an ambiguous tensor
        return False


def _record(text: str, **fields) -> None:
    from IPython import get_ipython

    shell = get_ipython()
    cell = shell.execution_count if shell is not None else 0
    key = (cell, text)
    _occurrence[key] = _occurrence.get(key, -1) + 1
    _records.append(
        {"cell": cell, "text": text, "n": _occurrence[key], **fields}
    )


def compare(text: str, operands: list, ops: list[str]) -> None:
    """Record ``operands[0] ops[0] operands[1] ...`` and whether it held."""
    passed = True
    for left, op, right in zip(operands, ops, operands[1:], strict=False):
        try:
            passed = passed and _truth(HOLDS[op](left, right))
        except Exception:  # noqa: BLE001 - a comparison that cannot be made
            passed = False
    _record(
        text,
        ops=ops,
        values=[number(v) for v in operands],
        passed=passed,
    )


def truth(text: str, value) -> None:
    """Record an assert that is not a comparison."""
    _record(text, ops=[], values=[], passed=_truth(value))


class RecordAsserts(ast.NodeTransformer):
    """Rewrite top-level asserts into calls of ``compare`` / ``truth``."""

    def visit_FunctionDef(self, node):  # noqa: N802 - ast's naming
        return node  # an assert in a function is code: leave it

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815
    visit_ClassDef = visit_FunctionDef  # noqa: N815
    visit_Lambda = visit_FunctionDef  # noqa: N815

    def visit_Assert(self, node: ast.Assert):  # noqa: N802
        test = node.test
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            if all(_comparison(part) for part in test.values):
                # ``a < x and b > y``: two claims, each with its values
                return [self._record(part, node) for part in test.values]
        return self._record(test, node)

    def _record(self, test: ast.expr, node: ast.Assert) -> ast.Expr:
        text = ast.unparse(test)
        recorder = ast.Name(RECORDER, ast.Load())
        if _comparison(test):
            call = ast.Call(
                ast.Attribute(recorder, "compare", ast.Load()),
                [
                    ast.Constant(text),
                    ast.List([test.left, *test.comparators], ast.Load()),
                    ast.List(
                        [ast.Constant(OPS[type(op)]) for op in test.ops],
                        ast.Load(),
                    ),
                ],
                [],
            )
        else:
            call = ast.Call(
                ast.Attribute(recorder, "truth", ast.Load()),
                [ast.Constant(text), test],
                [],
            )
        return ast.fix_missing_locations(
            ast.copy_location(ast.Expr(call), node)
        )


def _comparison(test: ast.expr) -> bool:
    """A comparison whose operators the recorder knows."""
    return isinstance(test, ast.Compare) and all(
        type(op) in OPS for op in test.ops
    )


def install(path: str) -> None:
    """Start recording this kernel's asserts into ``path``."""
    global _path
    import sys

    from IPython import get_ipython

    _path = Path(path)
    shell = get_ipython()
    shell.user_ns[RECORDER] = sys.modules[__name__]
    shell.ast_transformers.append(RecordAsserts())


def finish() -> None:
    """Write the records, with the kernels and threads used, to the file."""
    import torch

    info = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads_at_end": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    assert _path is not None, "install() first"
    _path.write_text(json.dumps({"info": info, "claims": _records}))
