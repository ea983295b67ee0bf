"""Grading on an isolated path, and verifier QA.

`grade(task, workspace) -> Verdict` is the one verifier training and evaluation share.
"""

from flywheel.verify.exploits import default_detector, detect
from flywheel.verify.grader import grade
from flywheel.verify.qa import TaskQA, grade_patch, validate_task

__all__ = ["grade", "grade_patch", "validate_task", "TaskQA", "detect", "default_detector"]
