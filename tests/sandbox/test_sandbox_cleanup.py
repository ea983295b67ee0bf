"""Guarantee 5: when run() returns, every process the command started is gone."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest


def _with_marker(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (zombies have none and do not count)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _script(tag: str) -> str:
    # a background child, and a daemon that left the session and process group (setsid, double fork)
    return f"sleep 1000.{tag} & setsid sh -c 'sleep 1001.{tag} &' & sleep 0.3; echo started"


def test_the_probe_sees_leftover_processes_on_the_host(tmp_path):
    tag = str(secrets.randbelow(10**9))
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.Popen(["sh", "-c", _script(tag)], cwd=tmp_path, start_new_session=True, **quiet).wait(
        timeout=30
    )
    deadline = time.monotonic() + 5
    while len(_with_marker(f".{tag}")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = _with_marker(f".{tag}")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert len(pids) == 2  # without a sandbox both outlive their parent


def test_background_and_daemon_processes_are_gone(sandbox, ws, cgroups):
    if sandbox.name == "fallback" and "pids" not in cgroups and "memory" not in cgroups:
        pytest.skip("the fallback backend without cgroups cannot find a daemon that called setsid()")
    tag = str(secrets.randbelow(10**9))
    result = sandbox.run(ws, ["sh", "-c", _script(tag)])
    assert result.output.strip() == "started"
    assert _with_marker(f".{tag}") == []


def test_timed_out_command_leaves_nothing(sandbox, ws):
    tag = str(secrets.randbelow(10**9))
    from flywheel.protocols import Limits

    result = sandbox.run(
        ws, ["sh", "-c", f"sleep 1000.{tag} & sleep 1002.{tag}"], limits=Limits(timeout_s=0.5)
    )
    assert result.timed_out
    assert _with_marker(f".{tag}") == []
