"""`flywheel sandbox run` as a user meets it: a real subprocess, output, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import sys


def flywheel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flywheel", *args], capture_output=True, text=True)


def test_prints_output_and_exits_with_the_code(ws):
    r = flywheel("sandbox", "run", str(ws), "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert r.returncode == 3
    assert r.stdout == "out\nerr\n"


def test_timeout_exits_124(ws):
    r = flywheel("sandbox", "run", str(ws), "--timeout", "0.5", "--", "sleep", "100")
    assert r.returncode == 124
    assert "timed out" in r.stderr


def test_fallback_backend_by_name(ws):
    r = flywheel("sandbox", "run", str(ws), "--backend", "fallback", "--", "sh", "-c", "echo hi")
    assert (r.returncode, r.stdout) == (0, "hi\n")


def test_bad_input_is_one_line_and_exit_2(ws, tmp_path):
    for args in (
        [str(tmp_path / "missing"), "--", "true"],
        [str(ws)],
        [str(ws), "--backend", "nope", "--", "true"],
        [str(ws), "--timeout", "0", "--", "true"],
    ):
        r = flywheel("sandbox", "run", *args)
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr
