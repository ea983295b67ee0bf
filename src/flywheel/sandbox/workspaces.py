"""Workspaces that a killed process does not leave behind.

An episode's workspace is removed when the episode is graded, and the grader's copy when the grading run
ends; a process killed before then (SIGKILL of a pool worker, a user's Ctrl-C of a training run) would
leave them in the temp dir for good (and so would the scratch directories of `flywheel solve`, of `qa` and
of synth's test runs, which use `temporary_workspace`). So each process puts its workspaces in a directory of its own, `flywheel-episodes-<pid>-<random>/`, and holds an
exclusive `flock` on the `.lock` file inside for as long as it lives: the kernel drops the lock when the
process dies, however it dies. The next process to make its directory sweeps its siblings: one whose lock
it can take has no owner left, and is removed. This relies on `flock`, not on pids, so it holds across pid
namespaces (containers sharing a temp dir) and pid reuse.

A forked child inherits its parent's lock (and keeps it: it may work in a workspace its parent made) and
makes a directory of its own at its first workspace. Workspaces of older versions (`flywheel-ep-*`) carry
no lock; they are removed once they are `LEGACY_AGE_S` old.

A process that ends cleanly (a normal exit, or the end of a `multiprocessing` child, which skips `atexit`)
removes its own directory when nothing but its lock and its sandbox's /etc copy (`layout.py`) is left in
it, and sweeps its dead siblings on the way out, so the last process of a run leaves nothing behind either.
A supervisor that kills its workers calls `sweep_dead()` (their directories, and their run cgroups) rather
than leave them to the next process.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flywheel.sandbox.cgroups import sweep_dead as sweep_dead_runs

PREFIX = "flywheel-episodes-"
LOCK = ".lock"
HALF_MADE_AGE_S = 10 * 60  # a directory with no lock yet, older than this, is a dead process's half-made one
LEGACY_PREFIX = "flywheel-ep-"
LEGACY_AGE_S = 24 * 3600  # a legacy workspace older than this is removed: no running version makes them
ETC_PREFIX = "etc-"  # the process's sandbox /etc copy (`layout.host_layout`), removed with its directory


@dataclass(frozen=True)
class _Owned:
    pid: int
    path: Path
    fd: int  # the locked `.lock`, open for the process's life


_guard = threading.Lock()
_owned: _Owned | None = None


def new_workspace(prefix: str = "ep-") -> Path:
    """A fresh empty directory (for an episode, or a grading run: `prefix`) inside this process's own
    directory; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_process_dir()))


@contextlib.contextmanager
def temporary_workspace(prefix: str) -> Iterator[Path]:
    """`new_workspace(prefix)`, removed when the block ends: a `tempfile.TemporaryDirectory` that a killed
    process does not leave behind."""
    path = new_workspace(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_dead() -> None:
    """Remove now what dead processes left in the temp dir (their directories) and their run cgroups,
    killing a command still running in one (`cgroups.sweep_dead`). Never raises."""
    _sweep(Path(tempfile.gettempdir()))
    sweep_dead_runs()


def _process_dir() -> Path:
    """This process's directory, made (and its dead siblings swept) at the first call in each process."""
    global _owned
    with _guard:
        if _owned is None or _owned.pid != os.getpid():
            _owned = _claim(Path(tempfile.gettempdir()))
            _sweep(_owned.path.parent, keep=_owned.path)
        return _owned.path


def _claim(tmp: Path) -> _Owned:
    """A new directory under `tmp` whose `.lock` this process holds. The lock file is locked before it takes
    its name, so a sweep sees either no `.lock` (a young directory: left alone) or a held one."""
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=tmp))
    fd = os.open(path / f"{LOCK}.new", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(path / f"{LOCK}.new", path / LOCK)
    owned = _Owned(os.getpid(), path, fd)
    # run at a normal exit and at a multiprocessing child's end alike; ignored in a forked child
    multiprocessing.util.Finalize(None, _release, args=(owned,), exitpriority=0)
    return owned


def _release(owned: _Owned) -> None:
    """At a clean exit: remove the process's directory if only its lock and /etc copy are left in it (a
    workspace still there may be a forked child's: the sweep takes it once that child is gone), then sweep
    the dead siblings."""
    with contextlib.suppress(OSError):
        if all(n == LOCK or n.startswith(ETC_PREFIX) for n in os.listdir(owned.path)):
            shutil.rmtree(owned.path, ignore_errors=True)
    _sweep(owned.path.parent, keep=owned.path)


def _sweep(tmp: Path, keep: Path | None = None) -> None:
    """Remove the directories under `tmp` that no living process owns: those whose lock is free, those
    never locked and older than `HALF_MADE_AGE_S`, and legacy workspaces older than `LEGACY_AGE_S`. One
    listing of `tmp`; never raises."""
    with contextlib.suppress(OSError), os.scandir(tmp) as entries:
        for entry in entries:
            if not entry.name.startswith((PREFIX, LEGACY_PREFIX)) or (keep and entry.name == keep.name):
                continue
            with contextlib.suppress(OSError):
                if not entry.is_dir(follow_symlinks=False):
                    continue
                age = time.time() - entry.stat(follow_symlinks=False).st_mtime
                if entry.name.startswith(PREFIX):
                    _sweep_one(Path(entry.path), age)
                elif age > LEGACY_AGE_S:
                    shutil.rmtree(entry.path, ignore_errors=True)


def _sweep_one(path: Path, age: float) -> None:
    """Remove `path` if its owner is dead: its lock is free, or it never got one and is old."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        if age > HALF_MADE_AGE_S:
            shutil.rmtree(path, ignore_errors=True)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while the owner lives
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)
