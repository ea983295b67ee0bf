"""The built-in `toybugs` suite: one planted bug per task in small, realistic Python modules.

The modules ship as data (`modules/<name>/<name>.py.txt`, with `modules/<name>/tests/test_<name>.py.txt`
beside them), so nothing imports them and pytest never collects them. Generation, all deterministic in
the seed:

1. `mutate.mutants` proposes every single-site bug of every module (eight operator kinds).
2. `evaluate.Evaluator` runs each candidate against the module's full test suite in worker processes
   (test functions called in-process, under CPU, wall-clock and memory guards). A candidate is kept
   when at least one test fails (fail_to_pass) and at least one still passes (pass_to_pass).
3. Per module at most `PER_MODULE` candidates are chosen, round-robin over operator kinds so each
   module's tasks mix kinds; the seeded RNG decides which ones within a kind.
4. Each task's repository holds the buggy module at its root and `tests/test_<name>.py` with the failing
   test the report describes and a few passing tests, so `run_tests` shows the failure; the hidden tests
   (the full suite, same path) replace it at grading. The instruction is a user's bug report built from
   the failing test (`report.bug_report`); `solution.patch` is the inverse diff, a line or two.

Splits are by source module: the `HELDOUT_MODULES` never appear in `train`, so held-out success measures
fixing bugs in code the policy has not seen.
"""

from __future__ import annotations

import ast
import os
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from flywheel.seeding import stable_seed
from flywheel.tasks.format import task_toml, write_task
from flywheel.tasks.patch import make_patch
from flywheel.tasks.toybugs.evaluate import Evaluator, Failure, Job, Outcome
from flywheel.tasks.toybugs.mutate import KINDS, Mutant, mutants
from flywheel.tasks.toybugs.report import bug_report

__all__ = ["VERSION", "HELDOUT_MODULES", "PER_MODULE", "module_names", "load_module", "build", "plan"]

VERSION = "2"
HELDOUT_MODULES = ("inventory", "pqueue", "versions", "wordfreq")
PER_MODULE = 32  # tasks per module at most
TEST_COMMAND = "python -m pytest -q tests"
TIMEOUT_S = 60.0
VISIBLE_PASSING = 3  # passing tests shown beside the failing one
_FAILURE_PREFERENCE = {"mismatch": 0, "raise": 1, "no_raise": 2, "assert": 3}


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    tests: str

    @property
    def test_path(self) -> str:
        return f"tests/test_{self.name}.py"


@dataclass(frozen=True)
class Planned:
    """One task, ready to write."""

    id: str
    toml: str
    repo: dict[str, str]
    hidden_tests: dict[str, str]
    solution_patch: str


def module_names() -> list[str]:
    """Names of the shipped modules, sorted."""
    root = resources.files(__name__) / "modules"
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def split_of(name: str) -> str:
    return "heldout" if name in HELDOUT_MODULES else "train"


def load_module(name: str) -> Module:
    """The module's source and its full test suite."""
    root = resources.files(__name__) / "modules" / name
    return Module(name, (root / f"{name}.py.txt").read_text(), (root / "tests" / f"test_{name}.py.txt").read_text())


def build(out: Path, seed: int, modules: Sequence[str] | None = None, per_module: int = PER_MODULE) -> None:
    """Write the suite's task directories into `out` (the `load_suite` entry point)."""
    for task in plan(seed, modules, per_module):
        write_task(
            Path(out) / task.id,
            toml=task.toml,
            repo=task.repo,
            hidden_tests=task.hidden_tests,
            solution_patch=task.solution_patch,
        )


def plan(seed: int, modules: Sequence[str] | None = None, per_module: int = PER_MODULE) -> list[Planned]:
    """Every task of the suite (or of `modules`), in id order."""
    chosen = [load_module(n) for n in (modules if modules is not None else module_names())]
    candidates = [(m, mu) for m in chosen for mu in mutants(m.source)]
    jobs = [Job(m.name, m.source, m.tests, f"test_{m.name}") for m in chosen]
    jobs += [Job(m.name, mu.source, m.tests, f"test_{m.name}") for m, mu in candidates]
    with Evaluator(workers=_workers()) as evaluator:
        outcomes = evaluator.run(jobs)
    for m, outcome in zip(chosen, outcomes, strict=False):
        _check_reference(m, outcome)
    kept: dict[str, list[tuple[Mutant, Outcome]]] = defaultdict(list)
    for (m, mu), outcome in zip(candidates, outcomes[len(chosen) :], strict=True):
        if is_bug(outcome):
            kept[m.name].append((mu, outcome))
    tasks = []
    for m in chosen:
        rng = random.Random(stable_seed("toybugs", seed, m.name))
        picked = select(kept[m.name], per_module, rng)
        tasks += [t for t in (_plan_task(m, i, mu, oc, seed) for i, (mu, oc) in enumerate(picked)) if t]
    return sorted(tasks, key=lambda t: t.id)


def _workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def _check_reference(m: Module, outcome: Outcome) -> None:
    if outcome.status != "ok" or outcome.failed or len(outcome.results) < 10:
        raise RuntimeError(f"toybugs module {m.name}: reference fails its own tests ({outcome.status}, {outcome.failed})")


def is_bug(outcome: Outcome) -> bool:
    """A usable planted bug: it ran cleanly, some test fails and some test still passes."""
    return outcome.status == "ok" and bool(outcome.failed) and bool(outcome.passed)


def select(kept: list[tuple[Mutant, Outcome]], cap: int, rng: random.Random) -> list[tuple[Mutant, Outcome]]:
    """Up to `cap` candidates, round-robin over operator kinds; returned in candidate order."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, (mu, _) in enumerate(kept):
        by_kind[mu.kind].append(i)
    for indices in by_kind.values():
        rng.shuffle(indices)
    chosen: list[int] = []
    while len(chosen) < cap and any(by_kind.values()):
        for kind in KINDS:
            if by_kind.get(kind) and len(chosen) < cap:
                chosen.append(by_kind[kind].pop())
    return [kept[i] for i in sorted(chosen)]


def _plan_task(m: Module, index: int, mu: Mutant, outcome: Outcome, seed: int) -> Planned | None:
    task_id = f"toybugs-{m.name}-{index:04d}"
    rng = random.Random(stable_seed("toybugs", seed, task_id))
    patch = make_patch({f"{m.name}.py": mu.source}, {f"{m.name}.py": m.source})
    fix_lines = {ln[1:].strip() for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")}
    report = None
    for name in sorted(outcome.failed, key=lambda n: _FAILURE_PREFERENCE[outcome.failures[n].kind]):
        text = bug_report(m.tests, name, outcome.failures[name], m.test_path, rng)
        if not any(line and line in text for line in fix_lines):
            report = (name, text)
            break
    if report is None:
        return None
    shown, instruction = report
    passing = sorted(rng.sample(outcome.passed, min(VISIBLE_PASSING, len(outcome.passed))))
    visible = visible_tests(m.tests, {shown, *passing})
    node = lambda n: f"{m.test_path}::{n}"  # noqa: E731
    toml = task_toml(
        id=task_id,
        instruction=instruction,
        test_command=TEST_COMMAND,
        fail_to_pass=[node(n) for n in outcome.failed],
        pass_to_pass=[node(n) for n in outcome.passed],
        timeout_s=TIMEOUT_S,
        meta={
            "split": split_of(m.name),
            "module": m.name,
            "mutation": mu.kind,
            "function": mu.function,
            "line": mu.line,
            "description": mu.description,
            "reported_test": node(shown),
        },
    )
    return Planned(
        task_id,
        toml,
        repo={f"{m.name}.py": mu.source, m.test_path: visible},
        hidden_tests={m.test_path: m.tests},
        solution_patch=patch,
    )


def visible_tests(tests: str, keep: set[str]) -> str:
    """The test module with only the test functions in `keep` (imports and helpers stay)."""
    lines = tests.splitlines(keepends=True)
    tree = ast.parse(tests)
    out, cursor = [], 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and node.name not in keep:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            out.append("".join(lines[cursor:start]))
            cursor = node.end_lineno
            while cursor < len(lines) and not lines[cursor].strip():
                cursor += 1
    out.append("".join(lines[cursor:]))
    return "".join(out).rstrip("\n") + "\n"


def describe(failure: Failure) -> str:
    """A one-line summary of a captured failure (for logs and debugging)."""
    if failure.kind == "mismatch":
        return f"{failure.left} -> {failure.actual}, expected {failure.expected}"
    return failure.error or failure.kind
