"""A small mutation run over the decisions that must never silently change: the guards, ownership,
the classification of nodes out of service, the pause gate and the once-only logic of the
destructive steps.

Why a script of our own and not mutmut: mutmut is not installed here, and its runner rewrites
whole packages and replays the whole suite per mutant. These targets are a few functions whose
deciding tests are known, so each mutant runs only those tests (``-x``, unit + engine, no
processes), which keeps a full run to minutes on a shared two-core machine.

Each target names a file, the functions in it to mutate and the tests that must catch a
change. A mutation is one small edit of the syntax tree: a comparison flipped (``<`` ↔ ``<=``,
``>`` ↔ ``>=``, ``==`` ↔ ``!=``, ``is`` ↔ ``is not``, ``in`` ↔ ``not in``), ``and`` ↔ ``or``,
a ``not`` dropped, ``True`` ↔ ``False``, an integer ± 1, an ``if`` whose test is forced
``False`` (its branch never taken). The run works in a copy of the checkout (a temporary
directory, removed at the end), never in the checkout itself: the mutated file is written
there (bytecode caching off), the tests run there, and the original is put back before the
next mutant. A mutant the tests do not catch survives; survivors are printed with their line
and edit.

    python scripts/mutate.py [--target guards] [--list] [--timeout 120]
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    name: str
    path: str
    functions: tuple[str, ...]
    tests: tuple[str, ...]


TARGETS = (
    Target(
        "guards",
        "bot/domain/guards.py",
        (
            "evaluate",
            "_paused",
            "_opt_out",
            "_acted_within",
            "_attempts",
            "_cooldown",
            "_stale",
            "_breaker",
            "share_limit",
            "choose_fleet",
        ),
        (
            "tests/unit/test_guards.py",
            "tests/unit/test_fleet.py",
            "tests/unit/test_planner.py",
            "tests/engine/test_guards.py",
        ),
    ),
    Target(
        "outages",
        "bot/domain/outages.py",
        ("slurm_outage", "kubernetes_outage", "of", "besides", "already_out", "out_words"),
        ("tests/unit/test_guards.py", "tests/engine/test_guards.py"),
    ),
    Target(
        "ownership",
        "bot/domain/ownership.py",
        (
            "slurm_reason_owner",
            "is_pitcrew_reason",
            "owns_slurm_reason",
            "node_owner",
            "owns_node",
            "prior_unschedulable",
            "is_own_taint",
            "replacement_owner",
            "slinky_reason_is_ours",
        ),
        ("tests/unit/test_ownership.py", "tests/engine/test_rollback.py", "tests/engine/test_guards.py"),
    ),
    Target(
        "once-only",
        "bot/engine/steps/repair.py",
        ("_issue_once", "replace_node"),
        (
            "tests/engine/test_once_only.py",
            "tests/engine/test_executor.py",
            "tests/engine/test_replace_and_ready.py",
        ),
    ),
    Target(
        "pause",
        "bot/engine/pause.py",
        ("paused_by", "__getattr__", "gated"),
        ("tests/engine/test_guards.py",),
    ),
)

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


@dataclass(frozen=True)
class Mutant:
    line: int
    edit: str
    tree: ast.Module


def _sites(tree: ast.Module, functions: tuple[str, ...]) -> Iterator[tuple[ast.AST, str]]:
    """Every mutable node inside the named functions, with what the mutation does."""
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name not in functions:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare):
                for i, op in enumerate(node.ops):
                    if type(op) in _FLIP:
                        yield node, f"cmp{i}:{type(op).__name__}->{_FLIP[type(op)].__name__}"
            elif isinstance(node, ast.BoolOp):
                yield (
                    node,
                    f"boolop:{type(node.op).__name__}->{'Or' if isinstance(node.op, ast.And) else 'And'}",
                )
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                yield node, "drop not"
            elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
                yield node, f"{node.value}->{not node.value}"
            elif isinstance(node, ast.Constant) and type(node.value) is int:
                yield node, f"{node.value}->{node.value + 1}"
                yield node, f"{node.value}->{node.value - 1}"
            elif isinstance(node, ast.If):
                yield node, "if-test->False"


def _apply(node: ast.AST, edit: str) -> ast.AST:
    if edit.startswith("cmp"):
        assert isinstance(node, ast.Compare)
        index = int(edit[3 : edit.index(":")])
        node.ops[index] = _FLIP[type(node.ops[index])]()
    elif edit.startswith("boolop"):
        assert isinstance(node, ast.BoolOp)
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif edit == "drop not":
        assert isinstance(node, ast.UnaryOp)
        return node.operand
    elif edit in {"True->False", "False->True"}:
        assert isinstance(node, ast.Constant)
        node.value = not node.value
    elif edit == "if-test->False":
        assert isinstance(node, ast.If)
        node.test = ast.Constant(False)
    else:
        assert isinstance(node, ast.Constant)
        node.value = int(edit.split("->")[1])
    return node


def mutants(work: Path, target: Target) -> list[Mutant]:
    source = (work / target.path).read_text()
    found = []
    for index, (site, edit) in enumerate(_sites(ast.parse(source), target.functions)):
        tree = ast.parse(source)
        here = [s for s, _ in _sites(tree, target.functions)][index]
        replacement = _apply(here, edit)
        if replacement is not here:  # the node itself is replaced (``not x`` → ``x``)
            _replace(tree, here, replacement)
        found.append(Mutant(getattr(site, "lineno", 0), edit, ast.fix_missing_locations(tree)))
    return found


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new


def run(work: Path, target: Target, mutant: Mutant, timeout: float) -> str:
    """``killed``, ``survived`` or ``timeout`` (counted as killed: the tests noticed something)."""
    path = work / target.path
    original = path.read_text()
    try:
        path.write_text(ast.unparse(copy.deepcopy(mutant.tree)) + "\n")
        # The copy has no __pycache__ and none is written there: every run compiles the checkout's
        # modules from their source, so a mutant never meets a stale cache (installed packages
        # keep theirs).
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "CI": "true"}
        env["PYTHONPATH"] = f"{work}{os.pathsep}{env.get('PYTHONPATH', '')}"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *target.tests],
                cwd=work,
                env=env,
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "timeout"
        return "survived" if done.returncode == 0 else "killed"
    finally:
        path.write_text(original)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", action="append", choices=[t.name for t in TARGETS])
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the copy is removed on kill too
    chosen = [t for t in TARGETS if not args.target or t.name in args.target]
    survivors: list[str] = []
    began = time.monotonic()
    total = 0
    work = Path(tempfile.mkdtemp(prefix="pitcrew-mutate-"))
    try:
        shutil.copytree(
            REPO,
            work,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(
                ".git", ".venv*", "__pycache__", "*.db", ".mypy_cache", ".ruff_cache"
            ),
        )
        total = _run_all(work, chosen, args, survivors)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not args.list:
        print(
            f"\n{total} mutants, {total - len(survivors)} killed, {len(survivors)} survived "
            f"in {time.monotonic() - began:.0f}s"
        )
        for line in survivors:
            print(f"  survivor: {line}")
    return 1 if survivors else 0


def _run_all(work: Path, chosen: list[Target], args: argparse.Namespace, survivors: list[str]) -> int:
    total = 0
    for target in chosen:
        found = mutants(work, target)
        total += len(found)
        print(f"{target.name}: {len(found)} mutants in {target.path} ({', '.join(target.tests)})", flush=True)
        for mutant in found:
            if args.list:
                print(f"  {target.path}:{mutant.line} {mutant.edit}")
                continue
            outcome = run(work, target, mutant, args.timeout)
            print(f"  {target.path}:{mutant.line:<4} {mutant.edit:<28} {outcome}", flush=True)
            if outcome == "survived":
                survivors.append(f"{target.path}:{mutant.line} {mutant.edit}")
    return total


if __name__ == "__main__":
    sys.exit(main())
