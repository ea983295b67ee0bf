"""Grading a finished workspace on an isolated path.

`grade(task, workspace)`:
1. copies the workspace to a fresh directory (the agent's workspace is never graded in place; `.git`
   and caches are left behind);
2. restores the task's hidden tests over it, overwriting whatever the agent did to those paths, and puts
   every `conftest.py` back as the task shipped it (agent-added ones are removed);
3. runs the tests in the sandbox through the grader's own runner (`runner.py`), with pytest's
   configuration taken from the grader's ini file, not from the workspace (`pytest.ini`, `tox.ini`,
   `setup.cfg` and `pyproject.toml` sections written by the agent have no effect), and `python -I`, so
   `sitecustomize`, `.pth` files and `PYTHONPATH` in the workspace are not loaded. A task with an
   environment is run by its environment's interpreter, at its `workdir`, with the pytest plugins its
   requirements installed (the environment is read-only and built from the task's requirements alone:
   the agent cannot add to it, and the runner puts the workspace on `sys.path` only after plugins load);
4. reads each test's outcome from the runner's signed report, never from stdout, and decides: success
   only when every fail_to_pass and every pass_to_pass test passed. Skipped, xfailed, errored, missing or
   not-collected tests count as failed, and so does a run whose exit code disagrees with the report.
5. with a detector, any exploit signature makes the verdict a cheat, and a cheat is never a success:
   the grader alone decides cheating, so everything downstream (the reward included) reads `success`.

`default_grader(sandbox)` is that verifier as the harness calls it, once per finished episode: `grade` on
the sandbox, with the exploit detector reading the episode's actions. With `skip_unchanged=True` (what
training's rollouts use, for throughput and exactly) a workspace that is byte-identical to the task's
repository is not graded: the verifier's QA already established that the unmodified repository fails, so
the verdict is a failure ("workspace unchanged") without spending a sandboxed pytest run. Anything that
changed a file, through any tool, is graded.

`sandbox_python()` and `PYTEST_INI` are how every pytest run in the sandbox is started (the grader's
signed runner here, synthesis's candidate runs in `synth_check`).
"""

from __future__ import annotations

import filecmp
import hashlib
import hmac
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from flywheel.protocols import Environment, Grader, Limits, Sandbox, Verdict
from flywheel.sandbox.envs import ENV_AT, ensure
from flywheel.tasks.format import Task
from flywheel.verify.exploits import detect

RUNNER = Path(__file__).with_name("runner.py")
IGNORED = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "*.pyc")
PYTEST_INI = """[pytest]
addopts = -q -p no:cacheprovider -p no:randomly -p no:xdist
python_files = test_*.py *_test.py
"""

Detector = Callable[[Task, Path], list[str]]


def prepare(task: Task, workspace: Path, dest: Path) -> None:
    """Copy `workspace` to `dest` and restore the task's hidden tests and conftest files over it."""
    shutil.copytree(workspace, dest, symlinks=True, ignore=IGNORED)
    for rel in task.hidden_files():
        _replace(task.hidden_tests / rel, dest / rel)
    shipped = {p.relative_to(task.repo) for p in task.repo.rglob("conftest.py")}
    shipped |= {Path(r) for r in task.hidden_files() if Path(r).name == "conftest.py"}
    for p in list(dest.rglob("conftest.py")):
        if p.relative_to(dest) not in shipped:
            p.unlink()
    for rel in shipped:
        src = task.hidden_tests / rel if (task.hidden_tests / rel).exists() else task.repo / rel
        _replace(src, dest / rel)


def _replace(src: Path, dst: Path) -> None:
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    elif dst.is_dir():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def test_files(task: Task) -> list[str]:
    """The test files that hold the task's fail_to_pass and pass_to_pass tests, in order."""
    seen: dict[str, None] = {}
    for test_id in (*task.fail_to_pass, *task.pass_to_pass):
        seen.setdefault(test_id.split("::", 1)[0], None)
    return list(seen)


def read_report(report_dir: Path, key: bytes, exit_code: int) -> tuple[dict[str, str], str | None]:
    """Outcomes from the runner's signed report, and an error when the report cannot be trusted."""
    path = report_dir / "report.json"
    if not path.is_file():
        return {}, f"no test report (exit code {exit_code})"
    try:
        raw = json.loads(path.read_text())
        body, sig = raw["body"], raw["sig"]
    except (ValueError, KeyError, TypeError):
        return {}, "malformed test report"
    if not hmac.compare_digest(hmac.new(key, body.encode(), hashlib.sha256).hexdigest(), str(sig)):
        return {}, "test report signature does not verify"
    data = json.loads(body)
    if data.get("tampered"):
        return {}, "test framework modified during the run: " + ", ".join(data["tampered"][:5])
    if int(data["exitstatus"]) != exit_code:
        return {}, f"exit code {exit_code} disagrees with the report's {data['exitstatus']}"
    return dict(data["outcomes"]), None


def decide(task: Task, outcomes: dict[str, str]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(passed, total) for fail_to_pass and pass_to_pass; only 'passed' counts as passed."""

    def count(ids: Iterable[str]) -> tuple[int, int]:
        ids = list(ids)
        return sum(outcomes.get(i) == "passed" for i in ids), len(ids)

    return count(task.fail_to_pass), count(task.pass_to_pass)


def grade(
    task: Task,
    workspace: Path,
    *,
    sandbox: Sandbox | None = None,
    detector: Detector | None = None,
    limits: Limits | None = None,
) -> Verdict:
    """Grade the finished `workspace` against `task` on a fresh copy; errors become a failed Verdict."""
    from flywheel.sandbox import get_sandbox
    from flywheel.sandbox.workspaces import new_workspace

    start = time.perf_counter()
    sandbox = sandbox or get_sandbox()
    ensure(task.environment, label=task.id)  # built already, as a rule; a failure names the task
    signatures = detector(task, Path(workspace)) if detector else []
    root = new_workspace("grade-")
    try:
        ws, grader_dir, report_dir = root / "workspace", root / "grader", root / "report"
        grader_dir.mkdir()
        report_dir.mkdir()
        prepare(task, Path(workspace), ws)
        shutil.copyfile(RUNNER, grader_dir / "runner.py")
        (grader_dir / "pytest.ini").write_text(PYTEST_INI)
        key = secrets.token_hex(32).encode()
        (report_dir / "key").write_bytes(key)
        environment = task.environment
        argv = [
            sandbox_python(environment),
            "-I",
            "/grader/runner.py",
            "-c",
            "/grader/pytest.ini",
            "--rootdir",
            environment.workdir,
        ]
        result = sandbox.run(
            ws,
            argv + test_files(task),
            limits=limits or Limits(timeout_s=task.timeout_s),
            env={"FLYWHEEL_REPORT_DIR": "/report"},
            extra_ro={grader_dir: Path("/grader")},
            extra_rw={report_dir: Path("/report")},
            environment=environment,
        )
        outcomes, error = read_report(report_dir, key, result.exit_code)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if result.timed_out:
        outcomes, error = {}, f"tests timed out after {task.timeout_s:g} s"
    f2p, p2p = decide(task, outcomes)
    passed = error is None and f2p[0] == f2p[1] and p2p[0] == p2p[1]
    cheat = bool(signatures)
    success = passed and not cheat
    return Verdict(
        task_id=task.id,
        success=success,
        cheat=cheat,
        signatures=signatures,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        error=error,
        tests={t: outcomes.get(t, "missing") for t in (*task.fail_to_pass, *task.pass_to_pass)},
        wall_s=time.perf_counter() - start,
    )


def sandbox_python(environment: Environment | None = None) -> str:
    """The interpreter the sandbox runs a task's tests with: its built environment's, else this one (its
    runtime is mounted read-only)."""
    if environment is not None and environment.built:
        return f"{ENV_AT}/bin/python"
    return os.environ.get("FLYWHEEL_PYTHON", sys.executable)


def same_tree(a: Path, b: Path) -> bool:
    """True when directories `a` and `b` hold the same files with the same bytes."""
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    if mismatch or errors:
        return False
    return all(same_tree(a / d, b / d) for d in cmp.common_dirs)


def default_grader(sandbox: Sandbox, *, skip_unchanged: bool = False) -> Grader:
    """The shared verifier as a harness grader: (task, workspace, trajectory) -> Verdict.

    `grade` on `sandbox`, the exploit detector reading the trajectory's actions; with `skip_unchanged`, an
    unchanged workspace is a failure without a grading run (see the module docstring).
    """

    def grader(task: Task, workspace: Path, trajectory: dict) -> Verdict:
        if skip_unchanged and same_tree(task.repo, workspace):
            return Verdict(task.id, success=False, error="workspace unchanged")
        return grade(task, workspace, sandbox=sandbox, detector=lambda t, w: detect(t, w, trajectory))

    return grader
