"""The repository's tests before and after the change, in the sandbox, and what the change did to them.

A pytest command (the default, `python -m pytest ...` or `pytest ...`) runs through
`flywheel.verify.synth_check.run_suite`, which reports each test's outcome, with the grader's pytest
configuration (the repository's own pytest settings do not apply: a change cannot turn tests off through
them); its path arguments are kept, its options are not. Any other command is judged by its exit status.
`compare` says which tests the change fixed (not passing before, passing after), which it broke (passing
before, not after: skipped counts), which failing ones it skipped, which it added and which it removed.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flywheel.protocols import Environment, Limits, Sandbox
from flywheel.verify.synth_check import run_suite

OUTPUT_CHARS = 2000  # of a run's output, kept in the report


@dataclass
class TestRun:
    """One run of the tests: per-test outcomes (pytest), or the command's exit status alone."""

    __test__ = False  # not a pytest test class

    command: str
    passed: bool  # every test passed (pytest), or the command exited 0
    outcomes: dict[str, str] | None = (
        None  # node id -> passed | failed | error | skipped | ...; None: not pytest
    )
    error: str | None = None  # the run left no trustworthy result (a timeout, no report)
    output: str = ""


@dataclass
class TestDelta:
    """What the change did to the tests."""

    __test__ = False

    fixed: list[str] = field(default_factory=list)  # not passing before, passing after
    broken: list[str] = field(default_factory=list)  # passing before, not passing after
    still_failing: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # not passing before, skipped or xfailed after
    added: list[str] = field(default_factory=list)  # only after, with any outcome
    removed: list[str] = field(default_factory=list)  # only before
    passing: int = 0  # tests passing after

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pytest_paths(command: str | None) -> list[str] | None:
    """The path arguments of a pytest command (None: not a pytest command; [] for the whole suite)."""
    if command is None:
        return []
    words = shlex.split(command)
    if words[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        words = words[3:]
    elif words[:1] == ["pytest"]:
        words = words[1:]
    else:
        return None
    return [w for w in words if not w.startswith("-")]


def run_tests(
    tree: Path, command: str | None, *, sandbox: Sandbox, environment: Environment, timeout_s: float
) -> TestRun:
    """Run the tests of the directory `tree` in the sandbox (it is run in place: give it a copy)."""
    paths = pytest_paths(command)
    shown = command or "python -m pytest"
    if paths is not None:
        run = run_suite(tree, paths, sandbox=sandbox, timeout_s=timeout_s, environment=environment)
        error = "timed out" if run.timed_out else run.error
        outcomes = dict(run.outcomes) | {f"{c} (collection)": "error" for c in run.collect_errors}
        ok = error is None and all(v in ("passed", "skipped", "xfailed") for v in outcomes.values())
        return TestRun(shown, ok and bool(outcomes), outcomes, error, _tail(run.output))
    r = sandbox.run(tree, ["bash", "-c", shown], limits=Limits(timeout_s=timeout_s), environment=environment)
    ok = r.exit_code == 0 and not r.timed_out
    return TestRun(shown, ok, None, "timed out" if r.timed_out else None, _tail(r.output))


def compare(before: TestRun, after: TestRun) -> TestDelta:
    """What the change did to the tests; with exit statuses alone, the command's name stands for them."""
    if before.outcomes is None or after.outcomes is None:
        b, a = {before.command: _status(before)}, {after.command: _status(after)}
    else:
        b, a = before.outcomes, after.outcomes
    delta = TestDelta(passing=sum(v == "passed" for v in a.values()))
    for test in sorted(set(b) | set(a)):
        was, now = b.get(test), a.get(test)
        if was is None:
            delta.added.append(f"{test} ({now})")
        elif now is None:
            delta.removed.append(test)
        elif now == "passed" and was != "passed":
            delta.fixed.append(test)
        elif was == "passed" and now != "passed":
            delta.broken.append(f"{test} ({now})")
        elif now in ("failed", "error"):
            delta.still_failing.append(f"{test} ({now})")
        elif now != was:
            delta.skipped.append(f"{test} ({now})")
    return delta


def _status(run: TestRun) -> str:
    return "passed" if run.passed else "failed"


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_CHARS else f"[...]\n{text[-OUTPUT_CHARS:]}"
