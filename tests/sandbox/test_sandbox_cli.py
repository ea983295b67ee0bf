"""`flywheel sandbox run` as a user meets it: a real subprocess, output, exit codes, one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.sandbox import enforced_limits, unenforced_warning
from flywheel.sandbox.cgroups import parse_mounts


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


def test_disk_budget_exits_153(ws):
    fill = "head -c 3145728 /dev/zero > a; head -c 3145728 /dev/zero > b; echo wrote"
    r = flywheel("sandbox", "run", str(ws), "--disk-mb", "4", "--", "sh", "-c", fill)
    assert r.returncode == 153
    assert "disk budget of 4 MiB" in r.stdout


def test_check_names_what_enforces_each_limit():
    r = flywheel("sandbox", "check")
    table = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert set(table) == {"backend", "wall_time", "memory", "processes", "file_size", "disk"}
    assert r.returncode == (1 if unenforced_warning(enforced_limits()) else 0)


def test_no_warning_where_every_limit_holds(ws):
    r = flywheel("sandbox", "run", str(ws), "--", "true")
    expected = unenforced_warning(enforced_limits())
    assert r.stderr == (f"{expected}\n" if expected else "")


def test_warns_once_when_the_pids_cgroup_is_not_writable(ws):
    # root, with the v1 pids hierarchy read-only in a private mount namespace: no pids cgroup to be had
    pids = "/sys/fs/cgroup/pids"
    if os.geteuid() != 0 or not os.access(pids, os.W_OK) or shutil.which("unshare") is None:
        pytest.skip("needs root and a writable v1 pids hierarchy to take away")
    hide = f'mount --bind {pids} {pids} && mount -o remount,bind,ro {pids} || exit 99; exec "$@"'
    cmd = [sys.executable, "-m", "flywheel", "sandbox", "run", str(ws), "--", "sh", "-c", "echo hi; echo hi"]
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", hide, "sh", *cmd],
        capture_output=True,
        text=True,
    )
    if r.returncode == 99:
        pytest.skip(f"cannot remount {pids} read-only here: {r.stderr.strip()}")
    assert (r.returncode, r.stdout) == (0, "hi\nhi\n")
    _, v2 = parse_mounts(Path("/proc/self/mounts").read_text())
    if v2 is None or "pids" not in (v2 / "cgroup.controllers").read_text().split():  # no v2 stand-in
        assert r.stderr == "sandbox: process count not enforced (root without a pids cgroup)\n"
