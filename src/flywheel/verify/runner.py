"""The grader's pytest runner, executed inside the sandbox as `python -I /grader/runner.py`.

It is a standalone script (it never imports flywheel, which the sandbox hides). It reads a one-time key
from `/report/key` and deletes that file before any code under test is imported, runs pytest with a results plugin, and writes
`/report/report.json`: every test's outcome plus pytest's exit status, signed with HMAC-SHA256 under that
key. The grader accepts only a report whose signature verifies and whose exit status agrees with the
process's exit code, so printing "passed" to stdout, exiting early, or writing a fake report file does
not pass a test.

The workspace joins `sys.path` only after pytest has loaded its installed plugins, so a `*.dist-info`
in the workspace cannot register a `pytest11` plugin. pytest's and pluggy's modules, the functions and
classes in them, their classes' methods and the builtins are fingerprinted when the session starts
(after pytest's own set-up, before any test module is imported) and checked again at every test report
and at the end; code under test that patches them (or swaps `sys.modules["pytest"]`) voids the report.
This raises the bar, no more: code imported by the task's own conftest files runs before the
fingerprint, and code that patches and restores within one call is not seen; both are left to the
exploit detector.
"""

import hashlib
import hmac
import json
import os
import sys
import types

_WATCHED = ("pytest", "_pytest", "pluggy")


def _fingerprint() -> dict:
    """Everything in pytest's and pluggy's modules and classes, and the builtins, kept by reference."""
    import builtins

    prints: dict = {("builtins", k): v for k, v in vars(builtins).items() if k != "_"}
    classes: dict = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in _WATCHED:
            continue
        prints["sys.modules", name] = module
        for attr, value in list(vars(module).items()):
            if name == "pytest" or isinstance(value, (type, types.FunctionType, types.ModuleType)):
                prints[name, attr] = value
            if isinstance(value, type) and value.__module__.split(".")[0] in _WATCHED:
                classes[id(value)] = value
    for cls in classes.values():
        for meth, fn in list(vars(cls).items()):
            if isinstance(fn, (types.FunctionType, classmethod, staticmethod, property)):
                prints[f"{cls.__module__}.{cls.__qualname__}", meth] = fn
    return prints


def _tampered(before: dict) -> list:
    after = _fingerprint()
    return sorted(".".join(k) for k, v in before.items() if after.get(k) is not v)


def _make_plugin(key: bytes, report_path: str, workspace: str):
    outcomes: dict[str, str] = {}
    state: dict = {"prints": None, "tampered": []}

    def check():
        if state["prints"] is not None and not state["tampered"]:
            state["tampered"] = _tampered(state["prints"])

    class ResultsPlugin:
        def pytest_load_initial_conftests(self, early_config):
            sys.path.insert(0, workspace)  # after installed plugins, before the task's conftest files

        def pytest_sessionstart(self, session):
            state["prints"] = _fingerprint()

        def pytest_runtest_logreport(self, report):
            check()
            nodeid = report.nodeid
            if report.when == "call":
                if hasattr(report, "wasxfail"):
                    outcome = "xpassed" if report.passed else "xfailed"
                else:
                    outcome = report.outcome  # passed | failed | skipped
                if outcomes.get(nodeid) in (None, "passed"):
                    outcomes[nodeid] = outcome
            elif report.failed:
                outcomes[nodeid] = "error"
            elif report.skipped and report.when == "setup":
                outcomes[nodeid] = "xfailed" if hasattr(report, "wasxfail") else "skipped"

        def pytest_collectreport(self, report):
            if report.failed:
                outcomes[f"<collect>{report.nodeid}"] = "error"

        def pytest_sessionfinish(self, session, exitstatus):
            check()
            data = {"outcomes": outcomes, "exitstatus": int(exitstatus)}
            if state["tampered"]:
                data = {"outcomes": {}, "exitstatus": int(exitstatus), "tampered": state["tampered"][:20]}
            body = json.dumps(data, sort_keys=True)
            sig = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
            with open(report_path, "w") as f:
                json.dump({"body": body, "sig": sig}, f)

    return ResultsPlugin()


def main(args: list) -> int:
    report_dir = os.environ.get("FLYWHEEL_REPORT_DIR", "/report")
    key_path, report_path = os.path.join(report_dir, "key"), os.path.join(report_dir, "report.json")
    with open(key_path, "rb") as f:
        key = f.read().strip()
    os.unlink(key_path)
    sys.argv = ["pytest"]
    import pytest  # before the workspace is on sys.path, so a workspace `pytest.py` cannot stand in

    # the repository root joins sys.path (as `python -m pytest` would) from the plugin, once pytest's
    # installed plugins are loaded
    return int(pytest.main(args, plugins=[_make_plugin(key, report_path, os.getcwd())]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
