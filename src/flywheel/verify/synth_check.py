"""Checking a synthesized bug: a project's test suite run in the sandbox, per-test outcomes out.

Bug synthesis (`flywheel.tasks.synth`) plants mutants and keeps those the project's tests catch; which
tests pass and fail is verification, so the run lives here. `run_suite(workspace, paths, sandbox=...,
timeout_s=...)` runs pytest on `paths` (empty: the whole project) through a small driver, with the
grader's pytest configuration (`PYTEST_INI`) and interpreter (`sandbox_python`), and returns a
`SuiteRun`: each test's outcome and failure message, the files whose collection failed, and whether the
run timed out or left no trustworthy report. `suite_runner(sandbox)` is that function bound to a
sandbox, the checker `synthesize` takes.

The driver is not the grader's signed runner (`_DRIVER` says why); every kept task is graded by the real
grader in `flywheel tasks validate`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from flywheel.protocols import Environment, Limits, Sandbox
from flywheel.sandbox.workspaces import temporary_workspace
from flywheel.tasks.synth import SuiteRun, SuiteRunner
from flywheel.verify.grader import PYTEST_INI, sandbox_python

# A small pytest driver for candidate runs: per-test outcomes and each failure's exception message, as
# JSON. It is not the grader's signed runner (`flywheel.verify.runner`), whose tamper checks cost about
# five times the suite's own time; here the code under test is our own mutant, not an adversary's, and
# every kept task is graded by the real grader in `flywheel tasks validate`.
_DRIVER = """
import json, os, sys
sys.path.insert(0, os.getcwd())
import pytest

outcomes, messages = {}, {}


class Recorder:
    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            outcome = ("xpassed" if report.passed else "xfailed") if hasattr(report, "wasxfail") else report.outcome
            if outcomes.get(report.nodeid) in (None, "passed"):
                outcomes[report.nodeid] = outcome
        elif report.failed:
            outcomes[report.nodeid] = "error"
        elif report.skipped and report.when == "setup":
            outcomes[report.nodeid] = "skipped"
        crash = getattr(report.longrepr, "reprcrash", None)
        if report.failed and crash is not None and report.nodeid not in messages:
            messages[report.nodeid] = str(crash.message)[:2000]

    def pytest_collectreport(self, report):
        if report.failed:
            outcomes["<collect>" + report.nodeid] = "error"


code = int(pytest.main(sys.argv[1:], plugins=[Recorder()]))
with open(os.path.join(os.environ["SYNTH_REPORT_DIR"], "report.json"), "w") as f:
    json.dump({"outcomes": outcomes, "messages": messages, "exitstatus": code}, f)
sys.exit(code)
"""


def run_suite(
    workspace: Path,
    paths: Sequence[str],
    *,
    sandbox: Sandbox,
    timeout_s: float,
    environment: Environment | None = None,
) -> SuiteRun:
    """Run pytest on `paths` (empty: the whole project) in the sandbox, in the project's `environment`
    (default: the project's own Python at /workspace); outcomes and failure messages."""
    environment = environment or Environment()
    with temporary_workspace("synth-run-") as tmp:
        driver_dir, report_dir = tmp / "driver", tmp / "report"
        driver_dir.mkdir()
        report_dir.mkdir()
        (driver_dir / "driver.py").write_text(_DRIVER)
        (driver_dir / "pytest.ini").write_text(PYTEST_INI)
        argv = [
            sandbox_python(environment),
            "-I",
            "/synth/driver.py",
            "-c",
            "/synth/pytest.ini",
            "--rootdir",
            environment.workdir,
            "--tb=no",
            "--continue-on-collection-errors",
            *paths,
        ]
        result = sandbox.run(
            workspace,
            argv,
            limits=Limits(timeout_s=timeout_s),
            env={"SYNTH_REPORT_DIR": "/report"},
            extra_ro={driver_dir: Path("/synth")},
            extra_rw={report_dir: Path("/report")},
            environment=environment,
        )
        data, error = _read_driver_report(report_dir / "report.json", result.exit_code)
    outcomes = data.get("outcomes", {})
    collect = sorted(k.removeprefix("<collect>") for k in outcomes if k.startswith("<collect>"))
    tests = {k: v for k, v in outcomes.items() if not k.startswith("<collect>")}
    return SuiteRun(
        tests, collect, result.timed_out, error, result.output, result.wall_s, dict(data.get("messages", {}))
    )


def _read_driver_report(path: Path, exit_code: int) -> tuple[dict, str | None]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, f"no test report (exit code {exit_code})"
    if data.get("exitstatus") != exit_code:
        return data, f"exit code {exit_code} disagrees with the report's {data.get('exitstatus')}"
    if exit_code in (2, 3, 4):  # interrupted, internal error, usage error
        return data, f"pytest exited {exit_code}"
    return data, None


def suite_runner(sandbox: Sandbox, environment: Environment | None = None) -> SuiteRunner:
    """`run_suite` on `sandbox` in `environment`, as `synthesize` calls it: (workspace, paths, timeout_s)
    -> SuiteRun."""

    def run(workspace: Path, paths: Sequence[str], timeout_s: float) -> SuiteRun:
        return run_suite(workspace, paths, sandbox=sandbox, timeout_s=timeout_s, environment=environment)

    return run
