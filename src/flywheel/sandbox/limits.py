"""Resource limits for one run: a per-run cgroup where the host allows it, rlimits otherwise.

Process count and memory are enforced by cgroup v1 controllers when their hierarchies are mounted and
writable (`/sys/fs/cgroup/pids`, `/sys/fs/cgroup/memory`): each run gets its own child cgroup below the
cgroup this process is in, with `pids.max` and `memory.limit_in_bytes` (plus `memory.memsw.limit_in_bytes`
where swap accounting exists). A cgroup binds root too, which matters: RLIMIT_NPROC never binds uid 0.
The cgroup also names every process of the run, so `kill_all` finds daemons that left the process
group, and is removed after the run.

Where a controller is missing, rlimits stand in: RLIMIT_AS = memory_mb (virtual memory, so a Python
interpreter with pytest needs ~200 MB of it; the default 2 GiB is ample) and, for a non-root user,
RLIMIT_NPROC = the user's current process count + max_procs. RLIMIT_FSIZE (max_file_mb) and RLIMIT_CORE
(0) are always set. With a memory cgroup RLIMIT_AS is not set at all: it counts address space, not
memory, and would refuse thread stacks and allocator arenas that use no memory.

The limits are applied without running Python code between fork and exec (unsafe in a threaded
process): the command is started through `/bin/sh -c` that joins the cgroups (`echo 0 > cgroup.procs`
moves the writer), sets the rlimits with `ulimit` and `exec`s the command, so no extra process remains.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import select
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.protocols import Limits

MB = 1024 * 1024
_counter = itertools.count()


@functools.cache
def controller_roots() -> dict[str, Path]:
    """Writable cgroup v1 directories this process may create children in, by controller name."""
    mounts: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            _dev, mount_point, fstype, opts, *_ = line.split()
            for name in ("pids", "memory"):
                if fstype == "cgroup" and name in opts.split(","):
                    mounts.setdefault(name, Path(mount_point))
    own = _own_cgroups()
    roots = {}
    for name, mount_point in mounts.items():
        here = mount_point / own.get(name, "/").lstrip("/")
        if os.access(here, os.W_OK):
            roots[name] = here
    return roots


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _hid, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(","):
                paths[name] = path
    return paths


@dataclass
class RunCgroup:
    """The per-run cgroups that could be created (possibly none) and the files that enrol a process."""

    dirs: dict[str, Path] = field(default_factory=dict)

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def pids(self) -> list[int]:
        """Every process in the run's cgroup (read from one controller: all hold the same processes)."""
        for d in self.dirs.values():
            with contextlib.suppress(OSError):
                return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        return []

    def kill_all(self, leader: int | None = None, wait_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until none is left; False if some outlived `wait_s`.

        `leader`, the caller's own unreaped child, is not waited for (it stays listed until reaped).
        Waiting is on pidfds, so it ends the moment the last process has exited.
        """
        deadline = time.monotonic() + wait_s
        while pids := [p for p in self.pids() if p != leader]:
            if not _kill_and_wait(pids, deadline):
                return False
        return True

    def remove(self) -> None:
        for d in self.dirs.values():
            for _ in range(50):  # the kernel may still be tearing down the last exited task
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)


def _kill_and_wait(pids: list[int], deadline: float) -> bool:
    """SIGKILL each pid through a pidfd (no pid-reuse race) and wait until all have exited."""
    poller, fds = select.poll(), []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        fds.append(fd)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        poller.register(fd, select.POLLIN)
    try:
        pending = len(fds)
        while pending:
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0:
                return False
            for fd, _ in poller.poll(remaining_ms):
                poller.unregister(fd)
                pending -= 1
        return True
    finally:
        for fd in fds:
            os.close(fd)


def create_cgroup(limits: Limits, overhead_procs: int, enabled: bool = True) -> RunCgroup:
    """A fresh child cgroup per available controller, limits written; controllers that fail are skipped.

    `enabled=False` gives none, so that the rlimit path runs (hosts without cgroups, and its tests).
    """
    roots = controller_roots() if enabled else {}
    name = f"flywheel-{os.getpid()}-{next(_counter)}"
    settings = {
        "pids": [("pids.max", limits.max_procs + overhead_procs)],
        "memory": [
            ("memory.limit_in_bytes", limits.memory_mb * MB),
            ("memory.memsw.limit_in_bytes", limits.memory_mb * MB),
        ],
    }
    cg = RunCgroup()
    for controller, root in roots.items():
        d = root / name
        try:
            d.mkdir()
            for fname, value in settings[controller]:
                _write_setting(d / fname, value, required=fname != "memory.memsw.limit_in_bytes")
        except OSError:
            with contextlib.suppress(OSError):
                d.rmdir()
            continue
        cg.dirs[controller] = d
    return cg


def _write_setting(path: Path, value: int, required: bool) -> None:
    try:
        path.write_text(str(value))
    except OSError:
        if required:
            raise


def rlimits(limits: Limits, cgroup: RunCgroup) -> dict[str, int]:
    """`ulimit` flag -> value (dash units: -f in 512-byte blocks, -v in KiB) for the run."""
    values = {"c": 0, "f": limits.max_file_mb * 2048}
    if "memory" not in cgroup.dirs:
        values["v"] = limits.memory_mb * 1024
    if "pids" not in cgroup.dirs and os.geteuid() != 0:
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
