"""The grader's pytest runner, executed inside the sandbox as `python -I /grader/runner.py`.

It is a standalone script (it never imports flywheel, which the sandbox hides). It reads a one-time key
from `/report/key` and deletes that file before any code under test is imported, runs pytest with a results plugin, and writes
`/report/report.json`: every test's outcome plus pytest's exit status, signed with HMAC-SHA256 under that
key. The grader accepts only a report whose signature verifies and whose exit status agrees with the
process's exit code, so printing "passed" to stdout, exiting early, or writing a fake report file does
not pass a test.
"""

import hashlib
import hmac
import json
import os
import sys


def _make_plugin(key: bytes, report_path: str):
    outcomes: dict[str, str] = {}

    class ResultsPlugin:
        def pytest_runtest_logreport(self, report):
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
            body = json.dumps({"outcomes": outcomes, "exitstatus": int(exitstatus)}, sort_keys=True)
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

    sys.path.insert(0, os.getcwd())  # the repository root, as `python -m pytest` would

    return int(pytest.main(args, plugins=[_make_plugin(key, report_path)]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
