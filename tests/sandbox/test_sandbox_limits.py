"""Guarantee 3: wall time, memory, process count and file size are bounded."""

from __future__ import annotations

import os

import pytest

from flywheel.protocols import Limits

ALLOC = "import sys; b = b'x' * (int(sys.argv[1]) * 1024 * 1024); print('allocated', len(b) >> 20)"
FORKS = """
import os, sys, time
n = 0
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print("forked", n, flush=True)
"""
WRITE = "import sys; open('big.bin', 'wb').write(b'x' * int(sys.argv[1])); print('wrote')"


def test_wall_time(sandbox, ws):
    result = sandbox.run(ws, ["sleep", "100"], limits=Limits(timeout_s=1))
    assert result.timed_out
    assert result.exit_code == 124
    assert result.wall_s < 30


def test_quick_command_is_not_timed_out(sandbox, ws):
    result = sandbox.run(ws, ["sh", "-c", "exit 7"], limits=Limits(timeout_s=10))
    assert (result.exit_code, result.timed_out) == (7, False)


@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroup-when-available", "rlimit-only"])
def test_memory(sandbox, ws, py, use_cgroups):
    box = type(sandbox)(use_cgroups=use_cgroups)
    limits = Limits(memory_mb=128, timeout_s=30)
    small = box.run(ws, py(ALLOC, "16"), limits=limits)
    assert small.exit_code == 0, small.output  # the limit leaves room for an ordinary interpreter
    big = box.run(ws, py(ALLOC, "256"), limits=limits)
    assert "allocated" not in big.output
    assert big.exit_code != 0
    assert "MemoryError" in big.output or big.exit_code == 128 + 9  # refused, or killed by the OOM killer


def test_process_count(sandbox, ws, py, cgroups):
    if "pids" not in cgroups and os.geteuid() == 0:
        pytest.skip("running as root without a writable pids cgroup: RLIMIT_NPROC does not bind root")
    result = sandbox.run(ws, py(FORKS, "60"), limits=Limits(max_procs=8, timeout_s=30))
    assert result.exit_code == 0, result.output
    forked = int(result.output.split()[-1])
    assert 1 <= forked <= 8


def test_fork_bomb_is_contained(sandbox, ws, py, cgroups):
    if "pids" not in cgroups and os.geteuid() == 0:
        pytest.skip("running as root without a writable pids cgroup: RLIMIT_NPROC does not bind root")
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.run(ws, py(bomb), limits=Limits(max_procs=16, timeout_s=1))
    assert result.timed_out
    after = sandbox.run(ws, ["echo", "still here"])  # the host and the sandbox still work
    assert after.output == "still here\n"


def test_file_size(sandbox, ws, py):
    limits = Limits(max_file_mb=1)
    ok = sandbox.run(ws, py(WRITE, str(512 * 1024)), limits=limits)
    assert ok.exit_code == 0, ok.output
    big = sandbox.run(ws, py(WRITE, str(3 * 1024 * 1024)), limits=limits)
    assert big.exit_code != 0
    assert "wrote" not in big.output
    assert (ws / "big.bin").stat().st_size <= 1024 * 1024
