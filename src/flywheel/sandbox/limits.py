"""Resource limits for one run: a per-run cgroup where the host allows it, rlimits otherwise.

Process count and memory are enforced by a per-run cgroup (v1 or v2, see `cgroups.py`) where this
process may make one. A cgroup binds root too, which matters: RLIMIT_NPROC never binds uid 0.

Where a controller is missing, rlimits stand in: RLIMIT_AS = memory_mb (virtual memory, so a Python
interpreter with pytest needs ~200 MB of it; the default 2 GiB is ample) and, for a non-root user,
RLIMIT_NPROC = the user's current process count + max_procs. Root without a pids cgroup has no bound on
its process count but the wall-clock limit: `enforced_limits()` says so, and `flywheel sandbox run` warns.
RLIMIT_FSIZE (max_file_mb) and RLIMIT_CORE (0) are always set. With a memory cgroup RLIMIT_AS is not set
at all: it counts address space, not memory, and would refuse thread stacks and allocator arenas that use
no memory. The workspace's total size is the supervisor's to bound (`disk.py`).

The limits are applied without running Python code between fork and exec (unsafe in a threaded
process): the command is started through `/bin/sh -c` that joins the cgroups (`echo 0 > cgroup.procs`
moves the writer), sets the rlimits with `ulimit` and `exec`s the command, so no extra process remains.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys

from flywheel.protocols import Limits
from flywheel.sandbox.cgroups import RunCgroup, create_cgroup
from flywheel.sandbox.disk import MECHANISM as DISK_MECHANISM

NOT_ENFORCED = "not enforced"
LABELS = {
    "wall_time": "wall time",
    "memory": "memory",
    "processes": "process count",
    "file_size": "file size",
    "disk": "workspace disk use",
}


def rlimits(limits: Limits, cgroup: RunCgroup) -> dict[str, int]:
    """`ulimit` flag -> value (dash units: -f in 512-byte blocks, -v in KiB) for the run."""
    values = {"c": 0, "f": limits.max_file_mb * 2048}
    if "memory" not in cgroup.mechanisms:
        values["v"] = limits.memory_mb * 1024
    if "pids" not in cgroup.mechanisms and os.geteuid() != 0:
        values["p"] = _user_processes(os.geteuid()) + limits.max_procs
    return values


def _user_processes(uid: int) -> int:
    """How many processes `uid` has now (RLIMIT_NPROC counts them all, not only the run's)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += entry.stat().st_uid == uid
    return count


def launcher(argv: list[str], cgroup: RunCgroup, ulimits: dict[str, int]) -> list[str]:
    """`argv` prefixed by a /bin/sh that joins the cgroups, sets the rlimits and execs it (fails closed)."""
    steps = [f"echo 0 > {shlex.quote(str(f))}" for f in cgroup.procs_files]
    steps += [f"ulimit -{flag} {value}" for flag, value in ulimits.items()]
    script = " && ".join(steps) + ' || exit 125; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *argv]


def mechanisms(cgroup: RunCgroup, as_root: bool) -> dict[str, str]:
    """What enforces each limit for a run with this cgroup (pure: the caller says who runs it)."""
    if "pids" in cgroup.mechanisms:
        procs = cgroup.mechanisms["pids"]
    else:
        procs = f"{NOT_ENFORCED} (root without a pids cgroup)" if as_root else "RLIMIT_NPROC"
    return {
        "wall_time": "supervisor (SIGKILL at timeout_s)",
        "memory": cgroup.mechanisms.get("memory", "RLIMIT_AS"),
        "processes": procs,
        "file_size": "RLIMIT_FSIZE",
        "disk": DISK_MECHANISM,
    }


@functools.cache
def enforced_limits(use_cgroups: bool = True) -> dict[str, str]:
    """Limit -> what enforces it on this host for this user, e.g. {"processes": "cgroup v1 pids.max"}.

    A limit the host cannot enforce maps to "not enforced (why)". Probed once per process by making a run
    cgroup and removing it at once."""
    cgroup = create_cgroup(Limits(), 0, use_cgroups)
    try:
        return mechanisms(cgroup, os.geteuid() == 0)
    finally:
        cgroup.remove()


def unenforced_warning(enforced: dict[str, str]) -> str | None:
    """One line naming the limits that are not enforced, or None when all are."""
    missing = [f"{LABELS.get(k, k)} {v}" for k, v in enforced.items() if v.startswith(NOT_ENFORCED)]
    return f"sandbox: {'; '.join(missing)}" if missing else None


@functools.cache
def warn_unenforced() -> None:
    """Print `unenforced_warning` for this host to stderr, at most once per process."""
    if line := unenforced_warning(enforced_limits()):
        print(line, file=sys.stderr)
