"""Per-run cgroups: a child of a writable cgroup v1 controller, or a leaf of a writable cgroup v2 subtree.

Process count and memory are bounded by a cgroup wherever the host lets this process make one, for root
and for other users alike (`limits.py` falls back to rlimits for a controller that has none). Each of the
two controllers, `pids` and `memory`, is looked for in this order:

- cgroup v1, where the controller is mounted as a hierarchy of its own (`/sys/fs/cgroup/pids`) and this
  process's cgroup in it is writable: the run's cgroup is a child of this process's own, with `pids.max`,
  `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap accounting exists).
- cgroup v2, where the unified hierarchy offers the controller. v2 lets processes live only in leaves (the
  "no internal processes" rule: a cgroup other than the root that holds processes cannot enable
  controllers for its children), so the run cannot be a child of this process's own cgroup. The parent
  is `$FLYWHEEL_CGROUP_PARENT` if set (a cgroup delegated by systemd's `Delegate=yes` or prepared by an
  administrator), else the nearest ancestor of this process's cgroup that offers the controllers and
  that this process may write (its own cgroup only when that is the hierarchy's root). Below it, a shared
  `flywheel` cgroup with the controllers enabled in its `cgroup.subtree_control`, and below that one leaf
  per run with `pids.max`, `memory.max`, `memory.swap.max` = 0 and `memory.oom.group` = 1. An ancestor
  that holds processes itself refuses to enable controllers (EBUSY); the next one up is tried.

The cgroup also names every process of the run, so `kill_all` finds daemons that left the process group
(on v2 it writes `cgroup.kill` first), and it is removed after the run. A process killed during a run
cannot remove it, nor end the run: a command started just as its supervisor was killed (before bwrap's
`--die-with-parent` took hold) runs on, with no time limit. So every process, at its first run and as it
ends cleanly, sweeps the run cgroups (`flywheel-<pid>-<n>`) of processes that are gone (`sweep_dead`): the
processes still in one are killed if they are orphans (every one whose parent is outside the run was
reparented to pid 1), and the cgroup is removed.

The parsing of `/proc/self/mounts` and `/proc/self/cgroup` and the choice of v2 candidates are pure
functions; `cgroup_host()` applies them to this process once and prepares the v2 parent if one is needed.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing.util
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.protocols import Limits

MB = 1024 * 1024
CONTROLLERS = ("pids", "memory")
V2_PARENT = "flywheel"
_counter = itertools.count()


# --- what the host offers ------------------------------------------------------------------------------


def parse_mounts(text: str) -> tuple[dict[str, Path], Path | None]:
    """(v1 mount point per controller, the cgroup2 mount point or None) from /proc/self/mounts."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mount_point, fstype, opts = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for name in CONTROLLERS:
                if name in opts:
                    v1.setdefault(name, mount_point)
    return v1, v2


def parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """(this process's v1 cgroup per controller, its v2 cgroup or None) from /proc/self/cgroup."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        for name in filter(None, controllers.split(",")):
            v1[name] = path
    return v1, v2


def v2_candidates(mount: Path, own: str) -> list[Path]:
    """Where a v2 run cgroup may hang, nearest first: the strict ancestors of `own` up to the mount's root,
    and `own` itself only when it is that root (a cgroup outside this namespace's view has none)."""
    if not own.startswith("/") or "/.." in own:
        return []
    parts = [p for p in own.split("/") if p]
    return [mount.joinpath(*parts[:n]) for n in range(len(parts) - 1, -1, -1)] if parts else [mount]


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


def v1_parents(mounts: dict[str, Path], own: dict[str, str]) -> dict[str, Path]:
    """The writable v1 cgroup per controller that the run's child cgroup is made in."""
    found = {}
    for name, mount_point in mounts.items():
        here = mount_point / own.get(name, "/").lstrip("/")
        if os.access(here, os.W_OK):
            found[name] = here
    return found


def _enabled(cgroup: Path) -> set[str]:
    return {word.lstrip("+") for word in _read(cgroup / "cgroup.subtree_control").split()}


def _enable(cgroup: Path, names: Iterable[str]) -> None:
    """Enable `names` for the children of `cgroup` (OSError if the kernel refuses, e.g. EBUSY)."""
    missing = [n for n in names if n not in _enabled(cgroup)]
    if missing:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{n}" for n in missing))


def prepare_v2(
    candidates: list[Path], wanted: set[str], name: str = V2_PARENT
) -> tuple[Path, set[str]] | None:
    """The first candidate that works, prepared: (its child `name` with the controllers it offers of
    `wanted` enabled for its children, those controllers), or None."""
    for parent in candidates:
        offered = wanted & set(_read(parent / "cgroup.controllers").split())
        if wanted and not offered:
            continue
        if not all(os.access(p, os.W_OK) for p in (parent, parent / "cgroup.procs")):
            continue
        try:
            _enable(parent, sorted(offered))
            (parent / name).mkdir(exist_ok=True)
            _enable(parent / name, sorted(offered))
        except OSError:
            continue
        return parent / name, offered
    return None


@dataclass(frozen=True)
class CgroupHost:
    """Where this process makes per-run cgroups: a v1 parent per controller, and a prepared v2 parent."""

    v1: dict[str, Path] = field(default_factory=dict)
    v2: Path | None = None
    v2_controllers: frozenset[str] = frozenset()


@functools.cache
def cgroup_host() -> CgroupHost:
    """What this host offers this process (probed once; prepares the v2 parent when v1 lacks a controller)."""
    mounts_v1, mount_v2 = parse_mounts(_read(Path("/proc/self/mounts")))
    own_v1, own_v2 = parse_proc_cgroup(_read(Path("/proc/self/cgroup")))
    v1 = v1_parents(mounts_v1, own_v1)
    wanted = set(CONTROLLERS) - set(v1)
    host = CgroupHost(v1)
    if wanted and mount_v2 is not None and own_v2 is not None:
        chosen = os.environ.get("FLYWHEEL_CGROUP_PARENT")
        prepared = prepare_v2([Path(chosen)] if chosen else v2_candidates(mount_v2, own_v2), wanted)
        if prepared is not None:
            host = CgroupHost(v1, prepared[0], frozenset(prepared[1]))
    parents = [*host.v1.values(), *([host.v2] if host.v2 else [])]
    sweep_dead(parents)
    multiprocessing.util.Finalize(None, sweep_dead, args=(parents,), exitpriority=0)  # and at a clean end
    return host


def sweep_dead(parents: Iterable[Path] | None = None) -> None:
    """Under `parents` (default: where this process makes its run cgroups), end the runs whose supervisor is
    gone (no /proc/<pid> for the pid in the name): kill their processes if they are orphans, then remove
    their cgroups. Never raises.

    Not covered: a pid of another pid namespace sharing the parent looks gone here; its runs' processes are
    not orphans (their leader's parent shows as 0), so they are left alone, but an empty cgroup of it, in
    the moment between its creation and its run joining it, is removed (the run fails closed: exit 125)."""
    if parents is None:
        host = cgroup_host()
        parents = [*host.v1.values(), *([host.v2] if host.v2 else [])]
    runs: dict[str, list[Path]] = {}
    for parent in parents:
        with contextlib.suppress(OSError), os.scandir(parent) as entries:
            for entry in entries:
                parts = entry.name.split("-")
                if len(parts) == 3 and parts[0] == "flywheel" and parts[1].isdigit() and parts[2].isdigit():
                    runs.setdefault(entry.name, []).append(Path(entry.path))
    for name, dirs in runs.items():
        if os.path.exists(f"/proc/{name.split('-')[1]}"):
            continue
        run = RunCgroup(dirs)
        pids = run.pids()
        if not pids or (_orphans(pids) and run.kill_all()):
            run.remove()


def _orphans(pids: list[int]) -> bool:
    """Whether every one of `pids` whose parent is not among them has pid 1 as its parent."""
    members = set(pids)
    for pid in pids:
        fields = _read(Path(f"/proc/{pid}/stat")).rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) not in members and int(fields[1]) != 1:
            return False
    return True


# --- one run's cgroup ----------------------------------------------------------------------------------


def settings(version: int, limits: Limits, overhead_procs: int) -> dict[str, list[tuple[str, int, bool]]]:
    """Per controller, the (file, value, required) the run's cgroup gets for `limits` on cgroup v1 or v2."""
    procs, memory = limits.max_procs + overhead_procs, limits.memory_mb * MB
    if version == 1:
        mem = [("memory.limit_in_bytes", memory, True), ("memory.memsw.limit_in_bytes", memory, False)]
    else:
        mem = [("memory.max", memory, True), ("memory.swap.max", 0, False), ("memory.oom.group", 1, False)]
    return {"pids": [("pids.max", procs, True)], "memory": mem}


@dataclass
class RunCgroup:
    """The per-run cgroups that could be created (possibly none), and which limit each controller holds."""

    dirs: list[Path] = field(default_factory=list)  # the run's cgroup directories, one per hierarchy
    mechanisms: dict[str, str] = field(default_factory=dict)  # controller -> e.g. "cgroup v2 pids.max"

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def pids(self) -> list[int]:
        """Every process in the run's cgroup (read from one directory: all hold the same processes)."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        return []

    def kill_all(self, leader: int | None = None, wait_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until none is left; False if some outlived `wait_s`.

        `leader`, the caller's own unreaped child, is not waited for (it stays listed until reaped).
        Waiting is on pidfds, so it ends the moment the last process has exited.
        """
        for d in self.dirs:  # v2 (5.14+): the kernel kills the whole cgroup, forking or not
            if (d / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (d / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + wait_s
        while pids := [p for p in self.pids() if p != leader]:
            if not _kill_and_wait(pids, deadline):
                return False
        return True

    def remove(self) -> None:
        for d in self.dirs:
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


def make_cgroup(d: Path, version: int, entries: dict[str, list[tuple[str, int, bool]]]) -> dict[str, str]:
    """Create cgroup `d` and write each controller's (file, value, required) entries; controller ->
    mechanism for those whose limits hold ({} and `d` removed if none does)."""
    try:
        d.mkdir()
    except OSError:
        return {}
    held = {c: f"cgroup v{version} {e[0][0]}" for c, e in entries.items() if _write_all(d, e)}
    if not held:
        with contextlib.suppress(OSError):
            d.rmdir()
    return held


def _write_all(d: Path, entries: list[tuple[str, int, bool]]) -> bool:
    """Write each (file, value, required) into `d`; False if a required one fails."""
    for fname, value, required in entries:
        try:
            (d / fname).write_text(str(value))
        except OSError:
            if required:
                return False
    return True


def create_cgroup(
    limits: Limits, overhead_procs: int, enabled: bool = True, host: CgroupHost | None = None
) -> RunCgroup:
    """A fresh cgroup per hierarchy that offers a controller, limits written; what fails is skipped.

    `enabled=False` gives none, so that the rlimit path runs (hosts without cgroups, and its tests).
    """
    host = (host or cgroup_host()) if enabled else CgroupHost()
    name = f"flywheel-{os.getpid()}-{next(_counter)}"
    v1, v2 = settings(1, limits, overhead_procs), settings(2, limits, overhead_procs)
    planned = [(parent / name, 1, {c: v1[c]}) for c, parent in host.v1.items()]
    rest = {c: v2[c] for c in CONTROLLERS if c in host.v2_controllers and c not in host.v1}
    if host.v2 is not None and rest:
        planned.append((host.v2 / name, 2, rest))
    cg = RunCgroup()
    for d, version, entries in planned:
        if held := make_cgroup(d, version, entries):
            cg.dirs.append(d)
            cg.mechanisms.update(held)
    return cg
