"""Verifier QA: does a task's grader say yes to the fix and no to the broken repository?

`validate_task` grades the reference solution (k times: a task whose reference passes only sometimes is
flaky) and the unmodified repository, and checks that every fail_to_pass test fails before the fix.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flywheel.errors import PatchError
from flywheel.protocols import Sandbox, Verdict
from flywheel.tasks.format import Task
from flywheel.tasks.patch import apply_patch_to_dir
from flywheel.verify.grader import grade


@dataclass
class TaskQA:
    task_id: str
    ok: bool
    reference_passes: int  # of k runs
    k: int
    unmodified_fails: bool
    fail_to_pass_fail_before: bool
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def workspace_with_patch(task: Task, patch: str | None, dest: Path) -> Path:
    """A copy of the task's repository at `dest`, with `patch` applied when given."""
    shutil.copytree(task.repo, dest, symlinks=True)
    if patch:
        apply_patch_to_dir(dest, patch)
    return dest


def grade_patch(task: Task, patch: str | None, sandbox: Sandbox | None = None) -> Verdict:
    """Grade the task's repository with `patch` applied (None: the repository as shipped)."""
    with tempfile.TemporaryDirectory(prefix="flywheel-qa-") as tmp:
        ws = workspace_with_patch(task, patch, Path(tmp) / "repo")
        return grade(task, ws, sandbox=sandbox)


def validate_task(task: Task, k: int = 1, sandbox: Sandbox | None = None) -> TaskQA:
    reasons: list[str] = []
    passes = 0
    try:
        for _ in range(k):
            verdict = grade_patch(task, task.solution_patch, sandbox)
            passes += verdict.success
            if not verdict.success and verdict.error and f"reference: {verdict.error}" not in reasons:
                reasons.append(f"reference: {verdict.error}")
    except PatchError as e:
        reasons.append(f"reference patch does not apply: {e}")
    before = grade_patch(task, None, sandbox)
    f2p_fail = all(before.tests.get(t) != "passed" for t in task.fail_to_pass)
    if passes < k:
        reasons.append("reference fails" if passes == 0 else f"flaky: reference passed {passes} of {k}")
    if before.success:
        reasons.append("unmodified repository passes")
    if not f2p_fail:
        reasons.append("a fail_to_pass test passes before the fix")
    return TaskQA(
        task_id=task.id,
        ok=not reasons,
        reference_passes=passes,
        k=k,
        unmodified_fails=not before.success,
        fail_to_pass_fail_before=f2p_fail,
        reasons=reasons,
    )
