"""Every chapter takes all of its seeds from one knob, ``BOOK_SEED``.

A claim checked on one seed is a fact about that seed. So each chapter
reads ``SEED = book_seed()`` once, in its first code cell, prints it, and
derives every other seed from it (``SEED + k``). ``make seed-sweep`` then
runs the chapters with other values. This test scans the chapter sources:
a seed written as a number, passed or left to a default, ties a chapter
to one random path that the knob does not move.
"""

import ast
import importlib
import inspect
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))

# Calls whose first argument is a seed, whoever defines them.
SEEDING_CALLS = {"seed_everything", "manual_seed", "manual_seed_all", "seed"}

# Package functions whose seed default is the method, not an accident.
FIXED_BY_DESIGN = {
    # The held-out copy-task set is the yardstick every run is measured
    # against; it is drawn from its own seed, HELD_OUT_SEED, so that it
    # stays the same set whichever seed trains the model.
    "copy_task_held_out",
}


def is_seed_name(name: str) -> bool:
    return "seed" in name.lower()


def is_literal(node: ast.expr) -> bool:
    """A value written out: numbers and operators, no name at all."""
    return not any(
        isinstance(n, (ast.Name, ast.Attribute, ast.Call))
        for n in ast.walk(node)
    )


def callee_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


DERIVED = "a default computed from names, such as SEED"


def own_signature(args: ast.arguments) -> inspect.Signature:
    """The signature of a function the chapter defines; a default that is
    not a literal becomes DERIVED."""

    def default(node: ast.expr | None):
        if node is None:
            return inspect.Parameter.empty
        return ast.unparse(node) if is_literal(node) else DERIVED

    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults))
    params = [
        inspect.Parameter(
            a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default(d)
        )
        for a, d in zip(positional, [*defaults, *args.defaults], strict=True)
    ] + [
        inspect.Parameter(
            a.arg, inspect.Parameter.KEYWORD_ONLY, default=default(d)
        )
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return inspect.Signature(params)


class Chapter:
    """A chapter's syntax tree, its package imports and its own functions."""

    def __init__(self, source: str):
        self.tree = ast.parse(source)
        self.imported: dict[str, tuple[str, str]] = {}  # name: module, attr
        self.defined: dict[str, inspect.Signature] = {}  # own functions
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] == "transformer_lite":
                    for alias in node.names:
                        name = alias.asname or alias.name
                        self.imported[name] = (node.module, alias.name)
            elif isinstance(node, ast.FunctionDef):
                self.defined[node.name] = own_signature(node.args)

    def signature(self, name: str) -> inspect.Signature | None:
        """The signature of a chapter function or of a package import."""
        if name in self.defined:
            return self.defined[name]
        if name in self.imported:
            module, attr = self.imported[name]
            obj = getattr(importlib.import_module(module), attr)
            if callable(obj) and not inspect.ismodule(obj):
                try:
                    return inspect.signature(obj)
                except (TypeError, ValueError):
                    return None
        return None

    def problems(self) -> list[str]:
        found = []
        for call in ast.walk(self.tree):
            if not isinstance(call, ast.Call):
                continue
            name = callee_name(call)
            where = f"line {call.lineno}: {ast.unparse(call)[:70]}"
            if name in SEEDING_CALLS and call.args:
                if is_literal(call.args[0]):
                    found.append(f"{where} (a literal seed)")
                continue
            for keyword in call.keywords:
                if (
                    keyword.arg
                    and is_seed_name(keyword.arg)
                    and is_literal(keyword.value)
                ):
                    found.append(f"{where} ({keyword.arg}= a literal)")
            signature = self.signature(name) if name else None
            if signature is None:
                continue
            positional = [
                p
                for p in signature.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            given = {k.arg for k in call.keywords}
            for param, arg in zip(positional, call.args, strict=False):
                given.add(param.name)
                if is_seed_name(param.name) and is_literal(arg):
                    found.append(f"{where} ({param.name} a literal)")
            for param in signature.parameters.values():
                if (
                    is_seed_name(param.name)
                    and param.name not in given
                    and param.default not in (param.empty, DERIVED)
                    and name not in FIXED_BY_DESIGN
                    and not any(k.arg is None for k in call.keywords)
                ):
                    found.append(
                        f"{where} ({param.name} left to its default "
                        f"{param.default!r})"
                    )
        return sorted(found, key=lambda p: int(p.split(":")[0].split()[1]))


GRADED = "# %% [markdown]\n# ## Graded exercises\n"


def before_the_graded_exercises(source: str) -> str:
    """The chapter without its graded exercises. Their inputs are fixed
    by design, as the held-out copy task is: every student is graded on
    the same inputs, and a check compares an answer with a reference on
    them; it makes no claim about a random path."""
    return source.split(GRADED)[0]


def first_code_cell(source: str) -> str:
    """The first code cell of a percent file (the header cell excluded),
    after the chapter's card (objectives and times, no randomness)."""
    cells = source.split("\n# %%")[1:]
    for cell in cells:
        marker, _, body = cell.partition("\n")
        if "[markdown]" not in marker and "chapter_card(" not in body:
            return body
    return ""


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_seeds_come_from_the_book_seed(path):
    problems = Chapter(
        before_the_graded_exercises(path.read_text())
    ).problems()
    assert not problems, (
        f"{path.name} seeds with numbers the BOOK_SEED knob does not "
        "move; derive them from SEED = book_seed() (SEED + k):\n  "
        + "\n  ".join(problems)
    )


def calls(source: str) -> list[str]:
    """The names of the functions a source calls, once per call."""
    return [
        name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and (name := callee_name(node))
    ]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_a_chapter_that_seeds_reads_the_knob_first(path):
    source = before_the_graded_exercises(path.read_text())
    if not set(calls(source)) & (SEEDING_CALLS | {"book_seed"}):
        pytest.skip(f"{path.name} draws nothing at random")
    first = first_code_cell(source)
    assert "SEED = book_seed()" in first, (
        f"{path.name}: its first code cell must read SEED = book_seed()"
    )
    printed = [
        node
        for node in ast.walk(ast.parse(first))
        if isinstance(node, ast.Call)
        and callee_name(node) == "print"
        and any(
            isinstance(n, ast.Name) and n.id == "SEED" for n in ast.walk(node)
        )
    ]
    assert printed, f"{path.name}: its first code cell must print SEED"
    reads = calls(source).count("book_seed")
    assert reads == 1, f"{path.name} reads book_seed() {reads} times"


SCANNED = """
from transformer_lite.device import seed_everything as reseed
import torch

def model(seed, width=3):
    return seed

def config(size=2, seed=0, other_seed=SEED):
    return seed

seed_everything(4)
g = torch.Generator().manual_seed(2 ** 3)
reseed(7)
model(6)
model(seed=SEED + 6)
config()
config(seed=1)
config(3, SEED + 1)
seed_everything(SEED)
"""


def test_the_scan_finds_each_kind_of_literal_seed():
    problems = Chapter(SCANNED).problems()
    lines = [int(p.split(":")[0].split()[1]) for p in problems]
    assert lines == [11, 12, 13, 14, 16, 17], problems
