"""Grading on an isolated path, and verifier QA.

`grade(task, workspace) -> Verdict` is the one verifier training and evaluation share;
`default_grader(sandbox)` is the same verifier as the harness calls it on every finished episode.
`synth_check` runs a project's suite in the sandbox for bug synthesis (`flywheel.tasks.synth`).
"""

from flywheel.verify.exploits import default_detector, detect
from flywheel.verify.grader import default_grader, grade, same_tree
from flywheel.verify.qa import TaskQA, grade_patch, validate_task

__all__ = [
    "TaskQA",
    "default_detector",
    "default_grader",
    "detect",
    "grade",
    "grade_patch",
    "same_tree",
    "validate_task",
]
