"""Bug synthesis in a real project: tasks from an unpacked sdist or a checkout with its pytest suite.

`synthesize(src, out, run_suite=...)` works as SWE-smith does, on one project:

1. **Baseline.** The project's whole suite runs twice through the checker `synthesize` is given (the
   sandboxed pytest run of `flywheel.verify.synth_check`, with the grader's pytest configuration and a
   small driver that records each test's outcome and failure message). A test counts as passing only
   when it passed both times, so a flaky test never becomes a fail_to_pass test.
2. **Candidates.** The AST mutation operators of `flywheel.tasks.mutate` (all eight kinds) propose
   single-site bugs in every function and method of the project's non-test modules. Candidates are
   ordered round-robin over functions (each function's mutants shuffled by the seed), so the first N
   evaluations spread over N different functions instead of exhausting the first file.
3. **Evaluation.** Each candidate gets a fresh copy of the project with the mutated module and the suite
   run by the checker with a time limit. It is kept only when at least one baseline-passing test fails
   (fail_to_pass) and at least one baseline-passing test still passes. Candidates that time out, break
   collection of a test file (an import-time error) or crash the run are dropped and counted by reason;
   so are mutants no test notices (`no_failure`) and mutants that fail every test (`all_failed`).
4. **Task.** The repository is the mutated project (test files included, so the agent can reproduce the
   failure); the failing tests' files become the hidden tests (restored over the workspace at grading);
   pass_to_pass is every baseline-passing test in those files that still passes; the reference fix
   (`solution.patch`) is the inverse diff. The instruction is a bug report built from the failing tests'
   names and their exception messages (pytest's assertion explanations; never traceback source lines,
   and never a line that contains the mutated or the original statement), so it describes the behaviour
   and not the fix.

**Environment and split.** A project whose tests need more than pytest and the standard library runs in
an `Environment` (`flywheel.protocols`): the caller builds the checker for it
(`suite_runner(sandbox, environment)`) and passes the same environment to `synthesize`, which writes it
into every task's `[environment]` table, so the agent's commands and the grader run in it too. Each task's
`meta.split` is the caller's `split` ("train" unless told): a suite split by project synthesises each
project with its own.

What it assumes: the project's tests import it from the repository root (a flat layout, as most sdists
ship); tests that fail or error at baseline are ignored. The run is deterministic in the seed up to the
suite's own flakiness.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TypeVar

from flywheel.errors import FlywheelError
from flywheel.protocols import Environment
from flywheel.seeding import stable_seed
from flywheel.tasks.format import task_toml, write_task
from flywheel.tasks.mutate import KINDS, Mutant, mutants
from flywheel.tasks.patch import make_patch

T = TypeVar("T")
DROP_REASONS = ("timeout", "collection", "crash", "no_failure", "all_failed")
_SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".tox",
    ".nox",
    ".eggs",
    "build",
    "dist",
    "docs",
    "doc",
    ".venv",
    "venv",
    "node_modules",
    ".mypy_cache",
    ".ruff_cache",
}
_SKIP_FILES = {"setup.py", "conftest.py", "versioneer.py", "_version.py", "noxfile.py", "fabfile.py"}
_ID_SAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


# ----------------------------------------------------------------------------------------- pure parts


def is_test_file(rel: str) -> bool:
    """A pytest test module or helper: `test_*.py`, `*_test.py`, `conftest.py`, or under `tests/`/`test/`."""
    p = PurePosixPath(rel)
    return (
        p.name.startswith("test_")
        or p.name.endswith("_test.py")
        or p.name == "conftest.py"
        or any(part in ("tests", "test", "testing") for part in p.parts[:-1])
    )


def source_files(files: Mapping[str, str]) -> list[str]:
    """The project's Python modules that bugs may be planted in (no tests, no build or version scripts)."""
    return sorted(
        rel
        for rel in files
        if rel.endswith(".py") and not is_test_file(rel) and PurePosixPath(rel).name not in _SKIP_FILES
    )


def project_files(root: Path) -> dict[str, str]:
    """Every text file of the project (binary files, VCS data, caches and build output are left out)."""
    files: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or p.is_symlink() or any(part in _SKIP_DIRS for part in rel.parts[:-1]):
            continue
        if rel.parts[0].endswith(".egg-info") or p.suffix in (".pyc", ".pyo", ".so"):
            continue
        try:
            files[rel.as_posix()] = p.read_text()
        except (UnicodeDecodeError, OSError):
            continue
    return files


def candidate_order(found: Mapping[str, Sequence[Mutant]], seed: int) -> list[tuple[str, Mutant]]:
    """(path, mutant) pairs round-robin over functions: one mutant of each function, then the next round."""
    rng = random.Random(stable_seed("synth", seed))
    groups: dict[tuple[str, str], list[Mutant]] = defaultdict(list)
    for path in sorted(found):
        for m in found[path]:
            groups[path, m.function].append(m)
    keys = sorted(groups)
    rng.shuffle(keys)
    for key in keys:
        rng.shuffle(groups[key])
    order: list[tuple[str, Mutant]] = []
    depth = 0
    while any(len(groups[k]) > depth for k in keys):
        order += [(k[0], groups[k][depth]) for k in keys if len(groups[k]) > depth]
        depth += 1
    return order


@dataclass(frozen=True)
class SuiteRun:
    """Per-test outcomes of one run of (part of) the suite."""

    outcomes: dict[str, str]  # pytest node id -> passed | failed | error | skipped | ...
    collect_errors: list[str]  # test files (node ids) whose collection failed
    timed_out: bool
    error: str | None  # set when the run produced no trustworthy report
    output: str
    wall_s: float
    messages: dict[str, str] = field(default_factory=dict)  # node id -> the exception message of a failure


# (workspace, test paths (empty: the whole suite), seconds allowed) -> the run's outcomes; the sandboxed
# one is `flywheel.verify.synth_check.suite_runner(sandbox, environment)`
SuiteRunner = Callable[[Path, Sequence[str], float], SuiteRun]


def classify(
    passing: set[str], run: SuiteRun, baseline_collect_errors: Iterable[str] = ()
) -> tuple[str, list[str], list[str]]:
    """(verdict, fail_to_pass, still_passing) of a candidate run against the baseline's passing tests.

    The verdict is "kept" or one of `DROP_REASONS`.
    """
    if run.timed_out:
        return "timeout", [], []
    if set(run.collect_errors) - set(baseline_collect_errors):
        return "collection", [], []
    if run.error is not None:
        return "crash", [], []
    failing = sorted(t for t in passing if run.outcomes.get(t) != "passed")
    still = sorted(t for t in passing if run.outcomes.get(t) == "passed")
    if not failing:
        return "no_failure", [], still
    if not still:
        return "all_failed", failing, []
    return "kept", failing, still


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bug_report(
    project: str,
    fail_to_pass: Sequence[str],
    messages: Mapping[str, str],
    rng: random.Random,
    forbidden: Iterable[str] = (),
) -> str:
    """The task's instruction: which tests fail and how, without saying where the bug is or how to fix it."""
    banned = [f.strip() for f in forbidden if len(f.strip()) >= 6]
    shown = list(fail_to_pass[:3])
    opening = rng.choice(
        (
            f"Some behaviour of `{project}` regressed: {len(fail_to_pass)} test(s) that used to pass now fail.",
            f"Bug report for `{project}`: {len(fail_to_pass)} test(s) started failing.",
            f"After a recent change, `{project}` fails {len(fail_to_pass)} of its tests.",
        )
    )
    parts = [opening]
    for test in shown:
        lines = [ln.strip() for ln in messages.get(test, "").splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("?") and not any(b in ln for b in banned)]
        detail = "; ".join(_short(ln) for ln in lines[:3])
        parts.append(f"- `{test}`" + (f" fails with: {detail}" if detail else " fails."))
    if len(fail_to_pass) > len(shown):
        parts.append(f"- and {len(fail_to_pass) - len(shown)} more in the same test files.")
    parts.append(
        rng.choice(
            (
                "Please find the cause in the library code and fix it; the tests are correct.",
                "Fix the code so these tests pass again, without changing the tests.",
                "The tests describe the intended behaviour; fix the implementation.",
            )
        )
    )
    return "\n".join(parts)


def _changed_lines(before: str, after: str) -> list[str]:
    a, b = before.splitlines(), after.splitlines()
    return [ln for ln in a if ln not in b] + [ln for ln in b if ln not in a]


def safe_id(name: str) -> str:
    cleaned = _ID_SAFE.sub("-", name).strip("-.") or "project"
    return cleaned if cleaned[0].isalnum() else "p" + cleaned


def _write_tree(dest: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


# ------------------------------------------------------------------------------------------ the shell


@dataclass
class SynthReport:
    """What one synthesis run did: counts by outcome and the tasks written."""

    project: str
    source: str
    baseline_tests: int
    baseline_passing: int
    candidates: int  # mutants proposed
    evaluated: int  # mutants whose test run was looked at
    kept: int
    dropped: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)  # kept tasks by mutation kind
    tasks: list[str] = field(default_factory=list)
    baseline_s: float = 0.0
    wall_s: float = 0.0
    timeout_s: float = 0.0

    @property
    def yield_(self) -> float:
        return self.kept / self.evaluated if self.evaluated else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "yield": self.yield_}


def synthesize(
    src: Path,
    out: Path,
    *,
    run_suite: SuiteRunner,
    max_tasks: int = 50,
    seed: int = 0,
    timeout_s: float | None = None,
    name: str | None = None,
    jobs: int = 2,
    on_candidate: Callable[[str, int], None] | None = None,
    environment: Environment = Environment(),
    split: str = "train",
) -> SynthReport:
    """Plant bugs in the project at `src` and write up to `max_tasks` task directories into `out`.

    `run_suite` is the checker that runs (part of) the suite on a copy of the project
    (`flywheel.verify.synth_check.suite_runner(sandbox, environment)`); `timeout_s` bounds each
    candidate's test run (default: 3 × the baseline's time + 5 s). Every task written carries
    `environment` (the one `run_suite` runs in) and `split` (its `meta.split`).
    `on_candidate(verdict, kept_so_far)` is called after each evaluated candidate (progress bars).
    """
    start = time.perf_counter()
    src = Path(src)
    if not src.is_dir():
        raise FlywheelError(f"{src}: not a directory")
    project = safe_id(name or src.resolve().name)
    files = project_files(src)
    modules = source_files(files)
    if not modules:
        raise FlywheelError(f"{src}: no Python modules outside the tests to plant bugs in")
    with tempfile.TemporaryDirectory(prefix="flywheel-synth-") as tmp:
        pristine = Path(tmp) / "pristine"
        _write_tree(pristine, files)
        total, passing, collect_errors, baseline = _baseline(pristine, run_suite, src)
        limit = timeout_s or 3 * baseline + 5
        test_paths = sorted({t.split("::", 1)[0] for t in passing})
        found = {path: _mutants_of(files[path]) for path in modules}
        order = candidate_order(found, seed)
        report = SynthReport(
            project, str(src), total, len(passing), len(order), 0, 0, baseline_s=baseline, timeout_s=limit
        )
        drops: Counter[str] = Counter()

        def evaluate(item: tuple[str, Mutant], i: int) -> SuiteRun:
            path, mutant = item
            ws = Path(tmp) / f"cand-{i}"
            # without the baseline's bytecode: a .pyc is trusted when its source keeps its size and its mtime
            # in whole seconds, so a same-size mutant written within a second would run the original code
            shutil.copytree(pristine, ws, ignore=shutil.ignore_patterns("__pycache__"))
            (ws / path).write_text(mutant.source)
            try:
                return run_suite(ws, test_paths, limit)
            finally:
                shutil.rmtree(ws, ignore_errors=True)

        for (path, mutant), run in _in_order(order, evaluate, max(1, jobs)):
            if report.kept >= max_tasks:
                break
            verdict, f2p, still = classify(passing, run, collect_errors)
            report.evaluated += 1
            if verdict == "kept":
                task_id = f"{project}-{report.kept:04d}"
                kept = _Kept(path, mutant, f2p, still, run)
                _write_synth_task(
                    out / task_id, task_id, project, files, kept, baseline, seed, environment, split
                )
                report.kept += 1
                report.tasks.append(task_id)
                report.kinds[mutant.kind] = report.kinds.get(mutant.kind, 0) + 1
            else:
                drops[verdict] += 1
            if on_candidate:
                on_candidate(verdict, report.kept)
    report.dropped = {r: drops.get(r, 0) for r in DROP_REASONS}
    report.wall_s = time.perf_counter() - start
    return report


def _in_order(
    items: Sequence[T], fn: Callable[[T, int], SuiteRun], jobs: int
) -> Iterator[tuple[T, SuiteRun]]:
    """(item, fn(item, index)) in the items' order, `jobs` evaluated at a time; lazy, so a consumer that
    stops early leaves the rest unevaluated."""
    with ThreadPoolExecutor(jobs) as pool:
        for at in range(0, len(items), jobs):
            batch = items[at : at + jobs]
            yield from zip(batch, pool.map(fn, batch, range(at, at + len(batch))), strict=True)


def _mutants_of(source: str) -> list[Mutant]:
    try:
        return mutants(source, KINDS)
    except SyntaxError:
        return []


def _baseline(pristine: Path, run_suite: SuiteRunner, src: Path) -> tuple[int, set[str], list[str], float]:
    """Tests seen, those that passed in both of two whole-suite runs, files that failed to collect, and the
    slower run's time."""
    runs = [run_suite(pristine, [], 600) for _ in range(2)]
    for run in runs:
        if run.timed_out or run.error is not None:
            tail = run.output.strip().splitlines()[-1:] or [""]
            raise FlywheelError(
                f"{src}: the project's test suite did not run ({run.error or 'timed out'}): {tail[0][:120]}"
            )
    passing = {
        t for t, o in runs[0].outcomes.items() if o == "passed" and runs[1].outcomes.get(t) == "passed"
    }
    if not passing:
        raise FlywheelError(f"{src}: no test of the project's suite passes, nothing to break")
    return len(runs[0].outcomes), passing, runs[0].collect_errors, max(r.wall_s for r in runs)


@dataclass(frozen=True)
class _Kept:
    """A kept candidate: the mutated module, the mutant, the tests it breaks and keeps, and its run."""

    path: str
    mutant: Mutant
    fail_to_pass: list[str]
    still_passing: list[str]
    run: SuiteRun


def _write_synth_task(
    dest: Path,
    task_id: str,
    project: str,
    files: Mapping[str, str],
    kept: _Kept,
    baseline_s: float,
    seed: int,
    environment: Environment,
    split: str,
) -> None:
    path, mutant, f2p, still, run = kept.path, kept.mutant, kept.fail_to_pass, kept.still_passing, kept.run
    hidden = sorted({t.split("::", 1)[0] for t in f2p})
    p2p = [t for t in still if t.split("::", 1)[0] in hidden]
    rng = random.Random(stable_seed("synth-report", seed, task_id))
    forbidden = _changed_lines(files[path], mutant.source)
    write_task(
        dest,
        toml=task_toml(
            id=task_id,
            instruction=bug_report(project, f2p, run.messages, rng, forbidden),
            test_command="python -m pytest -q " + " ".join(hidden),
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            timeout_s=round(
                max(120.0, 30 * baseline_s), 1
            ),  # the grader's signed runner is several times slower
            meta={
                "suite": "synth",
                "split": split,
                "project": project,
                "module": path,
                "function": mutant.function,
                "mutation": mutant.kind,
                "line": mutant.line,
            },
            environment=environment,
        ),
        repo={**files, path: mutant.source},
        hidden_tests={rel: files[rel] for rel in hidden},
        solution_patch=make_patch({path: mutant.source}, {path: files[path]}),
    )


def write_report(report: SynthReport, out: Path) -> Path:
    """`out/synth.json`: the run's counts, yield and task ids."""
    out.mkdir(parents=True, exist_ok=True)
    dest = out / "synth.json"
    dest.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return dest
