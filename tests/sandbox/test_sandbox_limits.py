"""Guarantee 3: wall time, memory, process count, file size and the workspace's disk use are bounded.

The adversarial tests (`box`) run each backend as the user running the tests and, when that is root, as
the unprivileged uid 65534 too: a fork bomb, a memory hog and a disk filler are stopped in every case.
"""

from __future__ import annotations

import os

import pytest

from flywheel.protocols import Limits
from flywheel.sandbox.disk import tree_bytes
from flywheel.sandbox.supervise import DISK_EXIT

MB = 1024 * 1024
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
# Every process forks 4 children, down 4 levels: 340 processes if nothing stops it (so a failing test
# cannot take the host down), each alive for a second; a refused fork is reported and ends that branch.
BOMB = """
import os, time
def spawn(depth):
    for _ in range(4):
        try:
            pid = os.fork()
        except OSError:
            print("refused", flush=True)
            return
        if pid == 0:
            if depth < 4:
                spawn(depth + 1)
            time.sleep(1)
            os._exit(0)
spawn(1)
time.sleep(1)
print("bomb done", flush=True)
"""
WRITE = "import sys; open('big.bin', 'wb').write(b'x' * int(sys.argv[1])); print('wrote')"
# Writes 1 MiB files until stopped, at most int(argv[1]) of them, into the directory argv[2].
FILL = """
import os, sys
os.makedirs(sys.argv[2], exist_ok=True)
for i in range(int(sys.argv[1])):
    with open(os.path.join(sys.argv[2], f"f{i}"), "wb") as f:
        f.write(b"x" * (1 << 20))
print("filled", flush=True)
"""


def _skip_unless_process_count_enforced(box):
    if (why := box.enforced["processes"]).startswith("not enforced"):
        pytest.skip(f"process count {why} here (enforced_limits())")


def test_wall_time(sandbox, ws):
    result = sandbox.run(ws, ["sleep", "100"], limits=Limits(timeout_s=1))
    assert result.timed_out
    assert result.exit_code == 124
    assert result.wall_s < 30


def test_quick_command_is_not_timed_out(sandbox, ws):
    result = sandbox.run(ws, ["sh", "-c", "exit 7"], limits=Limits(timeout_s=10))
    assert (result.exit_code, result.timed_out) == (7, False)


def test_memory_hog_is_refused_or_killed(box):
    limits = Limits(memory_mb=128, timeout_s=30)
    small = box.run(box.ws, box.py(ALLOC, "16"), limits=limits)
    assert small.exit_code == 0, small.output  # the limit leaves room for an ordinary interpreter
    big = box.run(box.ws, box.py(ALLOC, "256"), limits=limits)
    assert "allocated" not in big.output
    assert big.exit_code != 0
    assert "MemoryError" in big.output or big.exit_code == 128 + 9  # refused, or killed by the OOM killer


def test_memory_without_cgroups(sandbox, ws, py):
    plain = type(sandbox)(use_cgroups=False)  # the rlimit path, as on a host without writable cgroups
    limits = Limits(memory_mb=128, timeout_s=30)
    assert plain.run(ws, py(ALLOC, "16"), limits=limits).exit_code == 0
    big = plain.run(ws, py(ALLOC, "256"), limits=limits)
    assert big.exit_code != 0
    assert "MemoryError" in big.output, big.output


def test_process_count(box):
    _skip_unless_process_count_enforced(box)
    result = box.run(box.ws, box.py(FORKS, "60"), limits=Limits(max_procs=8, timeout_s=30))
    assert result.exit_code == 0, result.output
    forked = int(result.output.split()[-1])
    assert 1 <= forked <= 8


def test_fork_bomb_is_bounded(box):
    _skip_unless_process_count_enforced(box)
    result = box.run(box.ws, box.py(BOMB), limits=Limits(max_procs=16, timeout_s=30))
    assert not result.timed_out
    assert result.wall_s < 10  # ended by itself, far from the timeout
    assert "refused" in result.output  # forks were refused long before the bomb's own 340
    after = box.run(box.ws, ["echo", "still here"])  # the host and the sandbox still work
    assert after.output == "still here\n"


def test_endless_fork_bomb_is_contained(sandbox, ws, py, cgroups):
    if "pids" not in cgroups and os.geteuid() == 0:
        pytest.skip("running as root without a writable pids cgroup: RLIMIT_NPROC does not bind root")
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.run(ws, py(bomb), limits=Limits(max_procs=16, timeout_s=1))
    assert result.timed_out
    after = sandbox.run(ws, ["echo", "still here"])
    assert after.output == "still here\n"


def test_file_size(sandbox, ws, py):
    limits = Limits(max_file_mb=1)
    ok = sandbox.run(ws, py(WRITE, str(512 * 1024)), limits=limits)
    assert ok.exit_code == 0, ok.output
    big = sandbox.run(ws, py(WRITE, str(3 * 1024 * 1024)), limits=limits)
    assert big.exit_code != 0
    assert "wrote" not in big.output
    assert (ws / "big.bin").stat().st_size <= 1024 * 1024


def test_disk_filler_is_stopped_at_the_budget(box):
    limits = Limits(disk_mb=32, max_file_mb=2, timeout_s=30)
    ok = box.run(box.ws, box.py(FILL, "8", "small"), limits=limits)
    assert ok.exit_code == 0, ok.output  # 8 MiB: within the budget
    result = box.run(box.ws, box.py(FILL, "256", "fill"), limits=limits)
    assert (result.exit_code, result.timed_out) == (DISK_EXIT, False), result.output
    assert "filled" not in result.output
    assert "disk budget of 32 MiB" in result.output
    written = len(os.listdir(box.ws / "fill"))
    assert written < 160, written  # stopped long before the filler's own 256 MiB (host not filled)
    assert tree_bytes([box.ws]) < 200 * MB


def test_unreadable_directory_still_counts(box):
    # 24 MiB in a directory the command then makes unreadable, with a budget of 16 MiB
    hide = "mkdir d && head -c 25165824 /dev/zero > d/blob && chmod 000 d && echo hidden"
    result = box.run(box.ws, ["sh", "-c", hide], limits=Limits(disk_mb=16, max_file_mb=32))
    assert result.exit_code == DISK_EXIT, result.output
    os.chmod(box.ws / "d", 0o700)


def test_over_budget_workspace_fails_even_a_quick_command(sandbox, ws):
    (ws / "blob").write_bytes(b"x" * (3 * MB))
    result = sandbox.run(ws, ["true"], limits=Limits(disk_mb=2))
    assert result.exit_code == DISK_EXIT
    assert "disk budget of 2 MiB" in result.output
