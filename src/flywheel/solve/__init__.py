"""Put the model to work on any local repository: one attempt at an instruction, its result a diff.

`solve(repo, instruction, model, ...)` snapshots the repository's working tree into a temporary task
directory (`snapshot`: without `.git` and without caches and environments, `SKIP`), builds an ad-hoc
`Task` on it (no hidden tests and no reference fix: `fail_to_pass` and `pass_to_pass` are empty) in the
repository's environment (`repo_environment`: what it declares, `flywheel.tasks.declared`, plus a
requirements file; built once by `flywheel.sandbox.envs` and reused), runs one harness episode in a kept
workspace, and diffs that workspace against the snapshot. The grader does not judge the attempt (there is
nothing to judge it against): `test_grader` only runs the test command, in the same environment, on a
copy of the snapshot before the agent starts and on a copy of the final workspace after, so the report
says where the tests stood and stand. The record is the
harness's (`flywheel.record.Trajectory`), written with a `summary.json` by `save_run`, which builds the run
directory beside its destination and renames it into place.

The repository itself is never touched by `solve`; `apply_to_repo` applies the diff afterwards, only when
the whole patch applies: `git apply --check` first when the repository is a git checkout (its top level),
else the project's strict applier (`flywheel.tasks.patch`), which computes every file before writing one.

`find_test_command` guesses the test command from the usual pytest markers.

What is not covered: binary files the agent changed are left out of the diff (`read_tree` reads text
only); the snapshot holds the repository as it was when the run began, so a repository edited meanwhile
may refuse the patch (`apply_to_repo` then changes nothing); a test command that needs packages the
repository does not declare (nor `--requirements` adds) fails as it would for the agent; the repository
itself is not installed in its environment (its tests import it from the working directory, as pytest
run at the top does).

On a git repository, `--branch` makes the attempt a pull request's worth of work: the agent starts from
HEAD's tree (or, with `--include-uncommitted`, the working tree as `git add -A` would stage it), and the
diff is committed afterwards, outside the sandbox, on a new branch from HEAD through a temporary index, so
the user's HEAD, index and working tree are never written (`flywheel.solve.git`). The test command runs
before the agent starts and after it ends; the run directory's `PR.md` says both (`pull_request`).

Modules: `inputs` (the snapshot, the test command, the environment, the ad-hoc task, and the checks of
bad input), `attempt` (`solve`, `SolveResult`, `test_grader`), `git` (the base of a `--branch` run and its
commit), `output` (the run directory and PR.md, the lines that close a run, `apply_to_repo`).
`flywheel solve` is the command line over them.
"""

from flywheel.solve.attempt import SolveResult, changed_files, last_message, solve, test_grader
from flywheel.solve.git import Base, branch_plan, commit_branch, git_base
from flywheel.solve.inputs import (
    NO_TESTS,
    SKIP,
    check_inputs,
    find_test_command,
    refuse_scripted,
    repo_environment,
    snapshot,
    solve_task,
)
from flywheel.solve.output import (
    apply_to_repo,
    closing_lines,
    deliver,
    diff_stat,
    pull_request,
    save_run,
    write_outputs,
)

__all__ = [
    "NO_TESTS",
    "SKIP",
    "Base",
    "SolveResult",
    "apply_to_repo",
    "branch_plan",
    "changed_files",
    "check_inputs",
    "closing_lines",
    "commit_branch",
    "deliver",
    "diff_stat",
    "git_base",
    "last_message",
    "pull_request",
    "find_test_command",
    "refuse_scripted",
    "repo_environment",
    "save_run",
    "snapshot",
    "solve",
    "solve_task",
    "test_grader",
    "write_outputs",
]
