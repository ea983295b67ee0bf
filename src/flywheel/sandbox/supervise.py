"""Start a command, capture its output, enforce the wall-clock limit, and leave nothing behind.

One thread does it all: an epoll loop waits on the output pipe and on a pidfd of the started process
(no polling, no sleeps), so a run costs one fork/exec plus what the command itself takes. When the
process exits, or the deadline passes, everything the run started is killed: the process group (the
command is a session leader), then every process still in the run's cgroup, and only then is the last
output drained and the process reaped. A process outside both (possible only without cgroups) that
holds the output pipe is waited for at most `DRAIN_S` seconds.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from flywheel.protocols import Limits, RunResult
from flywheel.sandbox.limits import RunCgroup
from flywheel.sandbox.output import OutputBuffer

DRAIN_S = 2.0
TIMEOUT_EXIT = 124


def run_supervised(
    argv: list[str], *, cwd: Path | str, env: Mapping[str, str], limits: Limits, cgroup: RunCgroup
) -> RunResult:
    """Run `argv` to completion or timeout; the returned result's processes are all gone."""
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
        out_open, exited = _pump(fd, proc.pid, buf, start + limits.timeout_s)
        _kill_everything(proc, cgroup)
        if out_open:
            _pump(fd, None, buf, time.perf_counter() + DRAIN_S)
        code = proc.wait()
    finally:
        proc.stdout.close()
        if proc.returncode is None:
            _kill_everything(proc, cgroup)
            proc.wait()
    output, truncated = buf.render()
    return RunResult(
        exit_code=_exit_code(code) if exited else TIMEOUT_EXIT,
        output=output,
        timed_out=not exited,
        truncated=truncated,
        wall_s=time.perf_counter() - start,
    )


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pump(fd: int, pid: int | None, buf: OutputBuffer, deadline: float) -> tuple[bool, bool]:
    """Feed output from `fd` into `buf` until process `pid` exits (no pid: until EOF) or `deadline`.

    Returns (output still open, process exited).
    """
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ, "out")
    pidfd = os.pidfd_open(pid) if pid is not None else None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    out_open, exited = True, False
    try:
        while (out_open or pidfd is not None) and not exited:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            for key, _ in sel.select(remaining):
                if key.data == "exit":
                    exited = True
                elif chunk := os.read(fd, 1 << 16):
                    buf.feed(chunk)
                else:
                    out_open = False
                    sel.unregister(fd)
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
    return out_open, exited


def _kill_everything(proc: subprocess.Popen, cgroup: RunCgroup) -> None:
    """SIGKILL the command's process group and every process of the run's cgroup."""
    # The unreaped leader keeps its pid and group id reserved, so the group cannot be someone else's.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    cgroup.kill_all(leader=proc.pid)
