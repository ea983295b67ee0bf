"""`review`: the tests before and after the change, the checks, and (with a model) the review agent, in
one `Review` whose decision is "approve" or "request changes".

The decision requests changes when a check that requests changes fired (`flywheel.review.checks`), when
a test that passed before does not pass after, or when the review agent asked for changes; else it
approves. A reviewer that gave no verdict leaves the decision to the rest. The review's trees, its test
runs and the reviewer's copy live in a temporary directory removed at the end.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.harness import HarnessConfig
from flywheel.protocols import Environment, Model, Sandbox
from flywheel.review.agent import APPROVE, CHANGES, ReviewerVerdict, review_prompt, run_reviewer
from flywheel.review.change import Change, load_change
from flywheel.review.checks import Finding, check_change
from flywheel.review.tests import TestDelta, TestRun, compare, run_tests
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.envs import ensure
from flywheel.sandbox.workspaces import temporary_workspace
from flywheel.tasks.declared import declared_requirements

SKIPPED = ("__pycache__", ".pytest_cache", "*.pyc")


@dataclass
class Review:
    """One review of one change."""

    source: str
    instruction: str | None
    files: list[str]
    before: TestRun
    after: TestRun
    delta: TestDelta
    findings: list[Finding]
    reviewer: ReviewerVerdict | None
    decision: str = APPROVE
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        r = self.reviewer
        return {
            "decision": self.decision,
            "reasons": self.reasons,
            "source": self.source,
            "instruction": self.instruction,
            "files": self.files,
            "tests": {
                "command": self.after.command,
                "before": _run_json(self.before),
                "after": _run_json(self.after),
                **self.delta.to_json(),
            },
            "findings": [f.to_json() for f in self.findings],
            "reviewer": None if r is None else {**r.__dict__, "comments": [c.__dict__ for c in r.comments]},
        }


def _run_json(run: TestRun) -> dict[str, Any]:
    return {"passed": run.passed, "outcomes": run.outcomes, "error": run.error}


def decide(
    delta: TestDelta, findings: list[Finding], reviewer: ReviewerVerdict | None
) -> tuple[str, list[str]]:
    """The decision and why: blocking findings, broken tests, the reviewer's request."""
    reasons = [f"{f.kind} at {f.where()}" for f in findings if f.blocking]
    reasons += [f"broken: {t}" for t in delta.broken]
    if reviewer is not None and reviewer.decision == CHANGES:
        reasons.append(f"the reviewer ({reviewer.model}) requested changes")
    return (CHANGES if reasons else APPROVE), reasons


def review_environment(tree: Path, use_env: bool = True) -> Environment:
    """What the repository declares for its tests (`flywheel.tasks.declared`); none with `use_env` False."""
    return Environment(requirements=tuple(declared_requirements(tree))) if use_env else Environment()


def review(
    repo: Path,
    *,
    diff_file: Path | None = None,
    branch: str | None = None,
    model: Model | None = None,
    cfg: HarnessConfig | None = None,
    instruction: str | None = None,
    test_command: str | None = None,
    use_env: bool = True,
    sandbox: Sandbox | None = None,
    effort: str = "medium",
    timeout_s: float = 600.0,
    log: Callable[[str], None] = lambda line: None,
) -> Review:
    """Review the change to `repo` given by `diff_file` or `branch` (see `load_change`)."""
    sandbox = sandbox or get_sandbox()
    with temporary_workspace("review-") as work:
        change = load_change(Path(repo), work, diff_file, branch)
        environment = review_environment(change.before, use_env)
        ensure(environment, label=str(repo), on_build=lambda message: log(f"review: {message}"))
        log(f"review: {change.source}: tests before and after the change")
        before, after = (
            _tests_of(t, work, test_command, sandbox, environment, timeout_s) for t in ("repo", "after")
        )
        delta = compare(before, after)
        findings = check_change(change.before, change.after)
        verdict = None
        if model is not None:
            log(f"review: {model.name} reviews the change")
            prompt = review_prompt(
                change.diff,
                instruction,
                _tests_text(after, delta),
                _lines(findings),
                _blocks(findings, delta),
            )
            verdict = run_reviewer(
                model, change.after, work, prompt, test_command or "python -m pytest -q",
                cfg=cfg, sandbox=sandbox, effort=effort, environment=environment,
            )  # fmt: skip
        decision, reasons = decide(delta, findings, verdict)
        return Review(
            change.source,
            instruction,
            _files(change),
            before,
            after,
            delta,
            findings,
            verdict,
            decision,
            reasons,
        )


def _tests_of(
    name: str, work: Path, command: str | None, sandbox: Sandbox, environment: Environment, timeout_s: float
) -> TestRun:
    copy = work / f"tests-{name}" / "repo"
    shutil.copytree(work / name, copy, symlinks=True, ignore=shutil.ignore_patterns(*SKIPPED))
    try:
        return run_tests(copy, command, sandbox=sandbox, environment=environment, timeout_s=timeout_s)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)


def _files(change: Change) -> list[str]:
    out = []
    for line in change.diff.splitlines():
        if line.startswith(("+++ b/", "--- a/")) and line[6:] not in out:
            out.append(line[6:].split("\t")[0])
    return out


def _lines(findings: list[Finding]) -> list[str]:
    return [f"{f.where()} {f.kind}: {f.message}" for f in findings]


def _blocks(findings: list[Finding], delta: TestDelta) -> bool:
    return any(f.blocking for f in findings) or bool(delta.broken)


def _tests_text(after: TestRun, delta: TestDelta) -> str:
    rows = [f"command: {after.command}", f"passing after the change: {delta.passing}"]
    for label, items in (("fixed", delta.fixed), ("broken", delta.broken), ("still failing", delta.still_failing),
                         ("skipped now", delta.skipped), ("added", delta.added), ("removed", delta.removed)):  # fmt: skip
        if items:
            rows.append(f"{label}: {', '.join(items[:20])}")
    return "\n".join(rows)
