"""The built-in `toybugs` suite: one planted bug per task in small, realistic Python modules.

Fifteen modules ship with the package (`modules/<name>/<name>.py.txt` with a pytest suite beside it, kept
as data so nothing imports or collects them). For each module, the AST mutation operators of
`flywheel.tasks.mutate` propose single-site bugs; each candidate is run against the module's full test
suite in a worker process (in-process calls of the test functions, with a time limit, so hundreds of
candidates take seconds), and kept only when at least one test fails (fail_to_pass) and at least one
still passes (pass_to_pass). The task's repository holds the buggy module and a visible test file with
the failing tests and a few passing ones, so `run_tests` reproduces the failure; the hidden tests are the
full suite. The instruction is a bug report built from the first failing test — the call, what it
returned and what was expected — never the line or the fix.

Splits are by source module: `HELDOUT_MODULES` never appear in `train`. Everything is deterministic in
the seed.
"""

from __future__ import annotations

import ast
import random
from collections import defaultdict
from importlib import resources
from multiprocessing import get_context
from pathlib import Path

from flywheel.seeding import stable_seed
from flywheel.tasks.format import task_toml, write_task
from flywheel.tasks.mutate import KINDS, Mutant, mutants
from flywheel.tasks.patch import make_patch
from flywheel.tasks.suites import Builtin
from flywheel.tasks.toy.evaluate import evaluate

VERSION = "2"
HELDOUT_MODULES = ("ledger", "pqueue", "versions", "wordfreq")
PER_MODULE = 40  # tasks kept per module at most, balanced over mutation kinds
TEST_COMMAND = "python -m pytest -q tests"

_TEMPLATES = (
    "`{call}` returns {actual} but it should return {expected}.",
    "Bug: calling `{call}` gives {actual} instead of {expected}.",
    "I expected `{call}` to be {expected}, but I get {actual}.",
    "`{call}` is wrong: expected {expected}, got {actual}.",
)
_RAISE_TEMPLATES = (
    "`{call}` should raise {expected} but it does not.",
    "Calling `{call}` is supposed to fail with {expected}; it silently succeeds.",
)
_ERROR_TEMPLATES = (
    "`{call}` crashes with {actual}.",
    "Running `{call}` raises {actual}, which it should not.",
)


def module_names() -> list[str]:
    root = resources.files(__package__) / "modules"
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def read_module(name: str) -> tuple[str, str]:
    """(module source, test source) of a shipped module."""
    root = resources.files(__package__) / "modules" / name
    return (root / f"{name}.py.txt").read_text(), (root / f"test_{name}.py.txt").read_text()


def test_names(test_source: str) -> list[str]:
    tree = ast.parse(test_source)
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def visible_tests(test_source: str, keep: set[str]) -> str:
    """The test file with only the test functions in `keep` (helpers and imports stay)."""
    tree = ast.parse(test_source)
    lines = test_source.splitlines(keepends=True)
    drop = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_") and n.name not in keep
    ]
    for node in reversed(drop):
        start, end = node.lineno - 1, node.end_lineno or node.lineno
        while end < len(lines) and not lines[end].strip():
            end += 1
        del lines[start:end]
    return "".join(lines).rstrip() + "\n"


def instruction(name: str, failure: dict, rng: random.Random) -> str:
    kind = failure["kind"]
    if kind == "compare":
        text = rng.choice(_TEMPLATES).format(
            call=failure["call"], actual=failure["actual"], expected=failure["expected"]
        )
    elif kind == "no_raise":
        text = rng.choice(_RAISE_TEMPLATES).format(call=failure["call"], expected=failure["expected"])
    else:
        text = rng.choice(_ERROR_TEMPLATES).format(call=failure["call"], actual=failure["actual"])
    where = rng.choice((f"This is in `{name}.py`.", f"The code is in `{name}.py`.", f"Module: `{name}.py`."))
    return f"{text} {where} The failing case is reproduced by the tests in `tests/test_{name}.py`."


def _select(kept: list[tuple[Mutant, dict]], rng: random.Random) -> list[tuple[Mutant, dict]]:
    """At most PER_MODULE candidates, round-robin over mutation kinds (each kind's order shuffled)."""
    by_kind: dict[str, list] = defaultdict(list)
    for item in kept:
        by_kind[item[0].kind].append(item)
    for kind in sorted(by_kind):
        rng.shuffle(by_kind[kind])
    chosen: list = []
    while len(chosen) < PER_MODULE and any(by_kind.values()):
        for kind in KINDS:
            if by_kind.get(kind) and len(chosen) < PER_MODULE:
                chosen.append(by_kind[kind].pop())
    return sorted(chosen, key=lambda item: (item[0].line, item[0].kind, item[0].source))


def candidates(name: str, pool=None) -> list[tuple[Mutant, dict]]:
    """Mutants of module `name` that break some tests and keep others, with their test outcomes."""
    source, tests = read_module(name)
    found = mutants(source)
    jobs = [(name, m.source, tests) for m in found]
    results = pool.map(evaluate, jobs, chunksize=8) if pool else [evaluate(j) for j in jobs]
    return [(m, r) for m, r in zip(found, results, strict=True) if r["failed"] and r["passed"]]


def build(out: Path, seed: int, modules: list[str] | None = None) -> None:
    """Write every toybugs task into `out` (one directory per task)."""
    names = modules or module_names()
    with get_context("spawn").Pool(2) as pool:
        for name in names:
            _build_module(out, name, seed, candidates(name, pool))


BUILTIN = Builtin(VERSION, build)


def _build_module(out: Path, name: str, seed: int, kept: list[tuple[Mutant, dict]]) -> None:
    source, tests = read_module(name)
    rng = random.Random(stable_seed("toybugs", seed, name))
    split = "heldout" if name in HELDOUT_MODULES else "train"
    order = test_names(tests)
    for i, (mutant, result) in enumerate(_select(kept, rng)):
        failed = [t for t in order if t in result["failed"]]
        passed = [t for t in order if t in result["passed"]]
        shown = set(failed[:2]) | set(rng.sample(passed, min(2, len(passed))))
        task_id = f"toybugs-{name}-{i:04d}"
        node = f"tests/test_{name}.py::"
        write_task(
            out / task_id,
            toml=task_toml(
                id=task_id,
                instruction=instruction(name, result["failures"][failed[0]], rng),
                test_command=TEST_COMMAND,
                fail_to_pass=[node + t for t in failed],
                pass_to_pass=[node + t for t in passed],
                timeout_s=60,
                meta={
                    "split": split,
                    "module": name,
                    "mutation": mutant.kind,
                    "function": mutant.function,
                    "suite": "toybugs",
                },
            ),
            repo={f"{name}.py": mutant.source, f"tests/test_{name}.py": visible_tests(tests, shown)},
            hidden_tests={f"tests/test_{name}.py": tests},
            solution_patch=make_patch({f"{name}.py": mutant.source}, {f"{name}.py": source}),
        )
