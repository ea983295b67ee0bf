"""The attempt of `solve`: one harness episode on the snapshot (`solve`), its diff, and where the tests
stood and stand (`test_grader` runs the test command on a copy of the snapshot before the agent starts and
on a copy of the final workspace after; it judges nothing), and the agent's last words (`last_message`).
The repository's environment is built (or found built) before the agent starts, and the agent's commands
and the test runs use it.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flywheel.eval import Runner, summarize
from flywheel.eval.run import rollout
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort
from flywheel.protocols import Environment, Grader, Limits, Model, Sandbox, Verdict
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.envs import ensure
from flywheel.sandbox.workspaces import temporary_workspace
from flywheel.solve.git import Base, checkout_base
from flywheel.solve.inputs import SKIP, check_inputs, find_test_command, snapshot, solve_task
from flywheel.tasks.format import Task
from flywheel.tasks.patch import make_patch, read_tree

REPORT_CHARS = 2000  # of the last test output, in the result


@dataclass
class SolveResult:
    """One `solve` attempt: its diff, where the tests stand, and its record."""

    patch: str  # a unified diff against the repository (empty: nothing changed)
    record: Trajectory
    test_command: str | None  # None: no test command was found or given
    # first_run (before the agent), last_run (the final run), agent_runs, agent_last
    tests: dict[str, Any] = field(default_factory=dict)
    environment: Environment = Environment()  # what the agent's commands and the test runs ran in

    def summary(self) -> dict[str, Any]:
        """What summary.json holds: the attempt, its tests, its cost and the files it changed."""
        r = self.record
        return {
            "model": r.model,
            "effort": r.effort,
            "ending": r.ending,
            "error": r.error,
            "turns": r.n_turns,
            "tokens": {"prompt": r.prompt_tokens, "completion": r.completion_tokens},
            "cost": r.cost,
            "wall_s": r.wall_s,
            "files_changed": changed_files(self.patch),
            "test_command": self.test_command,
            "tests": self.tests,
            "environment": {
                "requirements": list(self.environment.requirements),
                "python": self.environment.python,
            },
            **({"fusion": r.fusion} if r.fusion else {}),
            "eval": summarize([r]),
        }


def test_grader(
    sandbox: Sandbox, test_command: str | None, timeout_s: float, environment: Environment | None = None
) -> Grader:
    """A grader that judges nothing: it runs the test command once, in `environment`, on a copy of the
    final workspace and reports its result (`Verdict.success`: the command exited 0; `tests`: the command
    -> passed/failed, `error`: the output's tail). Without a test command, an unsuccessful verdict that
    says so."""

    def grader(task: Task, workspace: Path, trajectory: dict[str, Any]) -> Verdict:
        if test_command is None:
            return Verdict(task.id, success=False, error="no test command")
        t0 = time.perf_counter()
        with temporary_workspace("solve-grade-") as tmp:
            copy = tmp / "repo"
            shutil.copytree(workspace, copy, symlinks=True, ignore=shutil.ignore_patterns(*SKIP))
            r = sandbox.run(
                copy,
                ["bash", "-c", test_command],
                limits=Limits(timeout_s=timeout_s),
                environment=environment,
            )
        ok = r.exit_code == 0 and not r.timed_out
        return Verdict(
            task.id,
            success=ok,
            tests={test_command: "passed" if ok else ("timed out" if r.timed_out else "failed")},
            error=_tail(r.output, REPORT_CHARS),
            wall_s=time.perf_counter() - t0,
        )

    return grader


def solve(
    repo: Path,
    instruction: str,
    model: Model,
    *,
    effort: str = "medium",
    test_command: str | None = None,
    cfg: HarnessConfig | None = None,
    sandbox: Sandbox | None = None,
    runner: Runner | None = None,
    environment: Environment = Environment(),
    base: Base | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> SolveResult:
    """One attempt by `model` (or, with `runner`, e.g. Fusion's lead) at `instruction` on a snapshot of
    `repo` (its working tree; with `base`, that git tree: see `flywheel.solve.git`); `repo` is not
    touched. `test_command` None: `find_test_command`'s guess. `environment` (see `repo_environment`;
    default: the project's own Python) is built first if it is not, with a line to `log`; a build that
    fails is an `EnvironmentBuildError` before the agent starts. The test command runs on the snapshot
    before the agent starts, and once more on its final workspace."""
    repo = Path(repo)
    check_inputs(repo, instruction, None)
    level = get_effort(effort)
    sandbox = sandbox or get_sandbox()
    test_command = test_command or find_test_command(repo)
    cfg = replace(cfg or HarnessConfig(), keep_workspaces=True)
    ensure(environment, label=str(repo), on_build=lambda message: log(f"solve: {message}"))
    with temporary_workspace("solve-") as tmp:
        if base is None:
            snapshot(repo, tmp / "repo")
        else:
            checkout_base(base, tmp / "repo")
        timeout_s = max(cfg.command_timeout_s, 60.0)
        task = solve_task(tmp, instruction, test_command, timeout_s=timeout_s, environment=environment)
        log(f"solve: {len(read_tree(task.repo))} files copied; tests: {test_command or 'none'}")
        log(f"solve: environment: {_describe(environment)}")
        log(f"solve: {model.name} at effort {effort}")
        grader = test_grader(sandbox, test_command, task.timeout_s, environment)
        first = grader(task, task.repo, {}) if test_command is not None else None
        run = runner or rollout
        [record] = run(model, [EpisodeSpec(task, level)], cfg, concurrency=1, sandbox=sandbox, grader=grader)
        patch = _diff(task.repo, record.workspace)
    record.workspace = None  # deleted with the snapshot
    tests = _test_report(record, test_command, first)
    return SolveResult(patch, record, test_command, tests, environment)


def _describe(environment: Environment) -> str:
    if not environment.built:
        return "the project's own Python"
    python = f"python {environment.python}" if environment.python else ""
    return ", ".join(filter(None, [python, *environment.requirements]))


def _diff(before: Path, workspace: str | None) -> str:
    """The diff from the snapshot to the kept workspace (caches left out); the workspace is deleted."""
    if workspace is None:
        return ""
    ws = Path(workspace)
    try:
        return make_patch(_text_tree(before), _text_tree(ws))
    finally:
        shutil.rmtree(ws.parent, ignore_errors=True)


def _text_tree(root: Path) -> dict[str, str]:
    skip = {s for s in SKIP if "*" not in s}
    return {
        p: text
        for p, text in read_tree(root).items()
        if not skip & set(p.split("/")) and not p.endswith(".pyc") and ".egg-info/" not in p
    }


def _test_report(record: Trajectory, test_command: str | None, first: Verdict | None) -> dict[str, Any]:
    """The run before the agent started, the agent's own test runs (how many, the last output) and the
    final run's result."""
    runs = [t for t in record.turns if t["role"] == "tool" and t.get("name") == "run_tests"]
    v = record.verdict
    last = None
    if v is not None and test_command is not None:
        last = {"passed": v.success, "output": v.error}
    return {
        "first_run": None if first is None else {"passed": first.success, "output": first.error},
        "agent_runs": len(runs),
        "agent_last": _tail(runs[-1]["text"], REPORT_CHARS) if runs else None,
        "last_run": last,
    }


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"[...]\n{text[-limit:]}"


ACTION = re.compile(r"<(?:shell|edit|view|run_tests|submit|delegate)\b", re.S)


def last_message(record: Trajectory) -> str:
    """The agent's last words: the text of its last turn that says something besides its action (a
    tagged action and what follows it left out; summaries of its working state skipped); "" if none."""
    for turn in reversed(record.turns):
        if turn["role"] != "assistant" or turn.get("summary"):
            continue
        text = ACTION.split(turn.get("text") or "", maxsplit=1)[0].strip()
        if text:
            return text
    return ""


def changed_files(patch: str) -> list[str]:
    """The paths a diff from `make_patch` touches, in order."""
    out = []
    for line in patch.splitlines():
        if line.startswith("+++ ") or line.startswith("--- "):
            path = line[4:].split("\t")[0]
            if path != "/dev/null":
                path = path[2:] if path.startswith(("a/", "b/")) else path
                if path not in out:
                    out.append(path)
    return out
