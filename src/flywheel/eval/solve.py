"""Put the model to work on any local repository: one attempt at an instruction, its result a diff.

`solve(repo, instruction, model, ...)` snapshots the repository's working tree into a temporary task
directory (`snapshot`: without `.git` and without caches and environments, `SKIP`), builds an ad-hoc
`Task` on it (no hidden tests and no reference fix: `fail_to_pass` and `pass_to_pass` are empty), runs one
harness episode in a kept workspace, and diffs that workspace against the snapshot. The grader does not
judge the attempt (there is nothing to judge it against): `test_grader` only runs the test command once
more on a copy of the final workspace, so the report says where the tests stand. The record is the
harness's (`flywheel.record.Trajectory`), written with a `summary.json` by `save_run`, which builds the run
directory beside its destination and renames it into place.

The repository itself is never touched by `solve`; `apply_to_repo` applies the diff afterwards, only when
the whole patch applies: `git apply --check` first when the repository is a git checkout (its top level),
else the project's strict applier (`flywheel.tasks.patch`), which computes every file before writing one.

`find_test_command` guesses the test command from the usual pytest markers.

What is not covered: binary files the agent changed are left out of the diff (`read_tree` reads text
only); the snapshot holds the repository as it was when the run began, so a repository edited meanwhile
may refuse the patch (`apply_to_repo` then changes nothing); a test command that needs packages outside
the sandbox's Python environment fails as it would for the agent.
"""

from __future__ import annotations

import configparser
import json
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError, PatchError
from flywheel.eval import summarize
from flywheel.eval.run import rollout
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort
from flywheel.protocols import Grader, Limits, Model, Sandbox, Verdict
from flywheel.record import Trajectory, write_trajectories
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.workspaces import temporary_workspace
from flywheel.tasks.format import Task
from flywheel.tasks.patch import apply_patch_to_dir, make_patch, read_tree

# what never reaches the sandbox: history, caches, environments, build output
SKIP = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    "node_modules",
    ".eggs",
    "*.egg-info",
    "*.pyc",
)
NO_TESTS = "echo 'no test command: none was found or given (flywheel solve --test-command)'; exit 1"
REPORT_CHARS = 2000  # of the last test output, in the result


@dataclass
class SolveResult:
    """One `solve` attempt: its diff, where the tests stand, and its record."""

    patch: str  # a unified diff against the repository (empty: nothing changed)
    record: Trajectory
    test_command: str | None  # None: no test command was found or given
    tests: dict[str, Any] = field(default_factory=dict)  # last_run (the final run), agent_runs, agent_last

    def summary(self) -> dict[str, Any]:
        """What summary.json holds: the attempt, its tests, its cost and the files it changed."""
        r = self.record
        return {
            "model": r.model,
            "effort": r.effort,
            "ending": r.ending,
            "error": r.error,
            "turns": r.n_turns,
            "cost": r.cost,
            "wall_s": r.wall_s,
            "files_changed": changed_files(self.patch),
            "test_command": self.test_command,
            "tests": self.tests,
            **({"fusion": r.fusion} if r.fusion else {}),
            "eval": summarize([r]),
        }


# ------------------------------------------------------------------------------------------- the input


def find_test_command(repo: Path) -> str | None:
    """pytest where the repository shows it uses pytest (a `tests/` directory, pytest.ini, a pytest
    section in pyproject.toml, setup.cfg or tox.ini); else None."""
    if (repo / "tests").is_dir() or (repo / "pytest.ini").is_file() or _pytest_configured(repo):
        return "python -m pytest -q"
    return None


def _pytest_configured(repo: Path) -> bool:
    pyproject = repo / "pyproject.toml"
    if pyproject.is_file():
        try:
            if "pytest" in tomllib.loads(pyproject.read_text()).get("tool", {}):
                return True
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            pass
    for name in ("setup.cfg", "tox.ini"):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(repo / name)
        except (configparser.Error, UnicodeDecodeError):
            continue
        if any(s in parser for s in ("pytest", "tool:pytest")):
            return True
    return False


def check_inputs(repo: Path, instruction: str, out: Path | None) -> None:
    """Refuse bad input before anything runs (FlywheelError, one line)."""
    if not repo.is_dir():
        raise FlywheelError(f"{repo}: not a directory")
    if not instruction.strip():
        raise FlywheelError("the instruction is empty: say what the agent should do")
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FlywheelError(f"{out} exists: choose another --out")


def snapshot(repo: Path, dest: Path) -> None:
    """Copy `repo`'s working tree to `dest`, without `SKIP` (history, caches, environments)."""
    shutil.copytree(repo, dest, symlinks=True, ignore=shutil.ignore_patterns(*SKIP))


def solve_task(root: Path, instruction: str, test_command: str | None, timeout_s: float = 600.0) -> Task:
    """The ad-hoc task on the snapshot at `root/repo`: no hidden tests, no reference fix."""
    return Task(
        id="solve",
        instruction=instruction,
        test_command=test_command or NO_TESTS,
        fail_to_pass=(),
        pass_to_pass=(),
        timeout_s=timeout_s,
        root=root,
        meta={"source": "flywheel solve"},
    )


# ----------------------------------------------------------------------------------------- the attempt


def test_grader(sandbox: Sandbox, test_command: str | None, timeout_s: float) -> Grader:
    """A grader that judges nothing: it runs the test command once on a copy of the final workspace and
    reports its result (`Verdict.success`: the command exited 0; `tests`: the command -> passed/failed,
    `error`: the output's tail). Without a test command, an unsuccessful verdict that says so."""

    def grader(task: Task, workspace: Path, trajectory: dict[str, Any]) -> Verdict:
        if test_command is None:
            return Verdict(task.id, success=False, error="no test command")
        t0 = time.perf_counter()
        with temporary_workspace("solve-grade-") as tmp:
            copy = tmp / "repo"
            shutil.copytree(workspace, copy, symlinks=True, ignore=shutil.ignore_patterns(*SKIP))
            r = sandbox.run(copy, ["bash", "-c", test_command], limits=Limits(timeout_s=timeout_s))
        ok = r.exit_code == 0 and not r.timed_out
        return Verdict(
            task.id,
            success=ok,
            tests={test_command: "passed" if ok else ("timed out" if r.timed_out else "failed")},
            error=_tail(r.output, REPORT_CHARS),
            wall_s=time.perf_counter() - t0,
        )

    return grader


Runner = Callable[..., list[Trajectory]]  # `flywheel.eval.run.rollout`'s signature (Fusion's `rollout`)


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
    log: Callable[[str], None] = lambda line: None,
) -> SolveResult:
    """One attempt by `model` (or, with `runner`, e.g. Fusion's lead) at `instruction` on a snapshot of
    `repo`; `repo` is not touched. `test_command` None: `find_test_command`'s guess."""
    repo = Path(repo)
    check_inputs(repo, instruction, None)
    level = get_effort(effort)
    sandbox = sandbox or get_sandbox()
    test_command = test_command or find_test_command(repo)
    cfg = replace(cfg or HarnessConfig(), keep_workspaces=True)
    with temporary_workspace("solve-") as tmp:
        snapshot(repo, tmp / "repo")
        task = solve_task(tmp, instruction, test_command, timeout_s=max(cfg.command_timeout_s, 60.0))
        log(f"solve: {len(read_tree(task.repo))} files copied; tests: {test_command or 'none'}")
        log(f"solve: {model.name} at effort {effort}")
        grader = test_grader(sandbox, test_command, task.timeout_s)
        run = runner or rollout
        [record] = run(model, [EpisodeSpec(task, level)], cfg, concurrency=1, sandbox=sandbox, grader=grader)
        patch = _diff(task.repo, record.workspace)
    record.workspace = None  # deleted with the snapshot
    return SolveResult(patch, record, test_command, _test_report(record, test_command))


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


def _test_report(record: Trajectory, test_command: str | None) -> dict[str, Any]:
    """The agent's own test runs (how many, the last output) and the final run's result."""
    runs = [t for t in record.turns if t["role"] == "tool" and t.get("name") == "run_tests"]
    v = record.verdict
    last = None
    if v is not None and test_command is not None:
        last = {"passed": v.success, "output": v.error}
    return {
        "agent_runs": len(runs),
        "agent_last": _tail(runs[-1]["text"], REPORT_CHARS) if runs else None,
        "last_run": last,
    }


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"[...]\n{text[-limit:]}"


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


# ------------------------------------------------------------------------------------------- the output


def save_run(out: Path, result: SolveResult, extra: dict[str, Any] | None = None) -> None:
    """Write `out/trajectories.jsonl`, `out/summary.json` and `out/patch.diff`, all or nothing: built in a
    sibling directory and renamed into place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_trajectories(tmp / "trajectories.jsonl", [result.record])
        (tmp / "summary.json").write_text(json.dumps({**(extra or {}), **result.summary()}, indent=1) + "\n")
        (tmp / "patch.diff").write_text(result.patch)
        if out.exists():  # an empty directory (check_inputs refuses any other)
            out.rmdir()
        tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def apply_to_repo(repo: Path, patch: str) -> None:
    """Apply `patch` to `repo` only if all of it applies; else PatchError and `repo` unchanged."""
    if not patch:
        return
    if (repo / ".git").exists() and shutil.which("git"):
        _git_apply(repo, patch)
    else:
        apply_patch_to_dir(repo, patch)  # computes every file before writing any


def _git_apply(repo: Path, patch: str) -> None:
    for args in (["--check"], []):  # git apply is atomic too; --check first says why it would not
        r = subprocess.run(
            ["git", "-C", str(repo), "apply", "--whitespace=nowarn", *args, "-"],
            input=patch,
            text=True,
            capture_output=True,
        )
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or ["git apply failed"])[0]
            raise PatchError(f"the patch does not apply to {repo}: {why.removeprefix('error: ')}")
