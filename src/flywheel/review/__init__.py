"""Review a change to a repository: its tests before and after, the verifier's checks, and a review agent.

`review(repo, diff_file=... | branch=..., model=None, ...)` writes the repository before and after the
change out of git (`change`: a diff against HEAD, or a branch against its merge base, the user's checkout
only read), runs the repository's tests on each in the sandbox (`tests`: per-test outcomes for pytest,
the exit status otherwise; what the change fixed, broke, added and removed), applies the verifier's
exploit checks to the change with the repository's own tests as the tests they protect (`checks`: a task
view as `flywheel solve` builds one, no hidden tests), and, with a model, runs a review agent in the
harness on a read-only copy of the changed tree that ends in a verdict with comments tied to `file:line`
(`agent`; `ScriptedReviewer` is its fake for tests and demos). `run.decide` turns all of it into approve
or request changes; `report.markdown` and `Review.to_json` write it.

Modules: `change`, `tests`, `checks`, `agent`, `run` (`review`, `Review`, `decide`), `report`.
`flywheel review` is the command line over them; Fusion's lead reviews its sidekick's changes with
`checks`, `tests` and `run.decide` (`flywheel.fusion.review`).
"""

from flywheel.review.agent import (
    APPROVE,
    CHANGES,
    SCRIPTED_REVIEWER,
    Comment,
    ReviewerVerdict,
    ScriptedReviewer,
    parse_verdict,
)
from flywheel.review.change import Change, load_change
from flywheel.review.checks import Finding, check_change
from flywheel.review.report import markdown
from flywheel.review.run import Review, decide, review
from flywheel.review.tests import TestDelta, TestRun, compare, run_tests

__all__ = [
    "APPROVE",
    "CHANGES",
    "SCRIPTED_REVIEWER",
    "Change",
    "Comment",
    "Finding",
    "Review",
    "ReviewerVerdict",
    "ScriptedReviewer",
    "TestDelta",
    "TestRun",
    "check_change",
    "compare",
    "decide",
    "load_change",
    "markdown",
    "parse_verdict",
    "review",
    "run_tests",
]
