"""The lead's review of a sidekick's change, as `flywheel review` makes one, shown in the sidekick's report.

After each delegation the change so far (the workspace against the task's repository as the lead first saw
it) is reviewed with what a user's repository has: the visible tests, run before and after the change in
the sandbox (per-test outcomes), and the verifier's exploit checks with those tests as the tests they
protect (`flywheel.review.checks`: no hidden tests are read). `flywheel.review.decide` turns that into
approve or request changes (a blocking finding, or a test that passed before and does not now), and the
report's last lines say which and why, so the lead sees the findings before it submits. The run before the
change is the same for every attempt at a task and is kept per task.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from flywheel.protocols import Sandbox
from flywheel.review.checks import Finding, check_change
from flywheel.review.run import SKIPPED, decide
from flywheel.review.tests import TestDelta, TestRun, compare, run_tests
from flywheel.sandbox.workspaces import temporary_workspace
from flywheel.tasks.format import Task

HEADER = "review of the change so far (the visible tests before and after, and the exploit checks):"
MAX_ITEMS = 8  # of the findings and of each list of tests, in the text


class LeadReview:
    """Reviews of the changes in lead workspaces; the tests' run before any change is kept per task."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self._lock = threading.Lock()
        self._before: dict[str, TestRun] = {}

    def __call__(self, task: Task, workspace: Path) -> str:
        """The review's lines for the change from `task.repo` to `workspace`."""
        before = self.before(task)
        after = self.tests(task, workspace)
        delta = compare(before, after)
        findings = check_change(task.repo, workspace)
        decision, reasons = decide(delta, findings, None)
        return review_text(decision, reasons, delta, findings)

    def before(self, task: Task) -> TestRun:
        with self._lock:
            run = self._before.get(task.id)
        if run is None:
            run = self.tests(task, task.repo)
            with self._lock:
                self._before.setdefault(task.id, run)
        return run

    def tests(self, task: Task, tree: Path) -> TestRun:
        with temporary_workspace("lead-review-") as tmp:
            copy = tmp / "repo"
            shutil.copytree(tree, copy, symlinks=True, ignore=shutil.ignore_patterns(*SKIPPED))
            return run_tests(
                copy, task.test_command, sandbox=self.sandbox, environment=task.environment,
                timeout_s=task.timeout_s,
            )  # fmt: skip


def review_text(decision: str, reasons: list[str], delta: TestDelta, findings: list[Finding]) -> str:
    """The review as the lead reads it; its last line is `review: approve` or `review: request changes`."""
    counts = ", ".join(
        f"{label} {len(items)}"
        for label, items in (
            ("fixed", delta.fixed),
            ("broken", delta.broken),
            ("still failing", delta.still_failing),
        )
    )
    lines = [HEADER, f"tests: {counts}; passing after the change: {delta.passing}"]
    for label, items in (("broken", delta.broken), ("still failing", delta.still_failing)):
        if items:
            lines.append(f"{label}: {', '.join(items[:MAX_ITEMS])}")
    lines += [f"- {f.where()} {f.kind}: {f.message}" for f in findings[:MAX_ITEMS]]
    lines.append(f"review: {decision}" + (f" ({'; '.join(reasons[:MAX_ITEMS])})" if reasons else ""))
    return "\n".join(lines)
