"""Start a command, capture its output, enforce the wall-clock limit and the disk budget, leave nothing behind.

One thread does it all: an epoll loop waits on the output pipe and on a pidfd of the started process
(no polling of the process), so a run costs one fork/exec plus what the command itself takes. The loop
wakes as well when the disk budget's next measurement is due (`disk.py`). When the process exits, the
deadline passes or the workspace is over its budget, everything the run started is killed: the process
group (the command is a session leader), then every process still in the run's cgroup, and only then is
the last output drained and the process reaped. A process outside both (possible only without cgroups)
that holds the output pipe is waited for at most `DRAIN_S` seconds.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from flywheel.protocols import Limits, RunResult
from flywheel.sandbox.cgroups import RunCgroup
from flywheel.sandbox.disk import DiskBudget
from flywheel.sandbox.output import OutputBuffer

DRAIN_S = 2.0
TIMEOUT_EXIT = 124
DISK_EXIT = 128 + signal.SIGXFSZ


def run_supervised(
    argv: list[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    limits: Limits,
    cgroup: RunCgroup,
    disk: DiskBudget | None = None,
    also_kill: Callable[[], None] | None = None,
) -> RunResult:
    """Run `argv` to completion, timeout or disk overrun; the returned result's processes are all gone.

    `also_kill` ends what the command started outside its own process tree (an episode's warm runs),
    with the rest, before the last output is drained."""
    start = time.perf_counter()
    buf = OutputBuffer(limits.output_bytes)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        bufsize=0,
    )
    assert proc.stdout is not None
    try:
        fd = proc.stdout.fileno()
        out_open, ended = _pump(fd, proc.pid, buf, start + limits.timeout_s, disk)
        _kill_everything(proc, cgroup)
        if also_kill is not None:
            also_kill()
        if out_open:
            _pump(fd, None, buf, time.perf_counter() + DRAIN_S)
        code = proc.wait()
    finally:
        proc.stdout.close()
        if proc.returncode is None:
            _kill_everything(proc, cgroup)
            proc.wait()
    over = disk is not None and (ended == "disk" or (ended == "exit" and disk.exceeded()))
    output, truncated = buf.render()
    return RunResult(
        exit_code=DISK_EXIT if over else TIMEOUT_EXIT if ended == "timeout" else _exit_code(code),
        output=output + disk.note() if over else output,
        timed_out=ended == "timeout",
        truncated=truncated,
        wall_s=time.perf_counter() - start,
    )


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pump(
    fd: int, pid: int | None, buf: OutputBuffer, deadline: float, disk: DiskBudget | None = None
) -> tuple[bool, str]:
    """Feed output from `fd` into `buf` until process `pid` exits (no pid: until EOF), `deadline`, or the
    disk budget is exceeded.

    Returns (output still open, why it stopped: "exit", "timeout", "disk" or "eof").
    """
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ, "out")
    pidfd = os.pidfd_open(pid) if pid is not None else None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    out_open = True
    try:
        while out_open or pidfd is not None:
            now = time.perf_counter()
            if now >= deadline:
                return out_open, "timeout"
            if disk is not None and now >= disk.next_at and disk.exceeded():
                return out_open, "disk"
            wake = deadline if disk is None else min(deadline, disk.next_at)
            for key, _ in sel.select(max(0.0, wake - now)):
                if key.data == "exit":
                    return out_open, "exit"
                if chunk := os.read(fd, 1 << 16):
                    buf.feed(chunk)
                else:
                    out_open = False
                    sel.unregister(fd)
        return out_open, "eof"
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)


def _kill_everything(proc: subprocess.Popen, cgroup: RunCgroup) -> None:
    """SIGKILL the command's process group and every process of the run's cgroup."""
    # The unreaped leader keeps its pid and group id reserved, so the group cannot be someone else's.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    cgroup.kill_all(leader=proc.pid)
