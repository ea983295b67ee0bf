"""The workspace's disk budget (`Limits.disk_mb`): the supervisor measures it while the command runs.

RLIMIT_FSIZE bounds each file; nothing in the kernel bounds the total of a directory that is a bind mount
of a host directory (project quotas depend on the file system, a loop-mounted image needs root). A
size-limited tmpfs would (bwrap's `--size`), but the workspace must live on after the command, so it would
be copied in and out on every command, and its pages would count against the run's memory. So the
supervisor walks the workspace and the caller's read-write mounts: first `FIRST_S` after the start, then
again after a pause of `GAP_FACTOR` times the last walk (at least `FIRST_S`, so the walks take at most a
tenth of a core), and once more when the command has ended (a walk of a 150-file tree takes about 1 ms). Past the budget the run is killed (exit code
153, 128 + SIGXFSZ, the signal of RLIMIT_FSIZE) and the output says why. This works alike for both
backends, as root and as any other user.

What is covered: each file, directory, symlink and special file counts the larger of its apparent size and
its allocated blocks, rounded up to whole 4 KiB blocks and at least one (so neither sparse files nor a
million empty ones escape); hard links count once. A directory the supervisor cannot read counts as over
budget, so `chmod 000` hides nothing.

What is not covered: between two walks a command can write past the budget (at page-cache speed, about
1.8 GB/s on the development host, some 45 MB in the first 25 ms; the pause grows with the tree). The files
stay: the next command in that workspace is killed at its first walk. /tmp inside bwrap is a tmpfs bounded
by memory_mb; the fallback backend's HOME and TMPDIR, and anything else it may write on the host, are not
measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

BLOCK = 4096
FIRST_S = 0.025
GAP_FACTOR = 10
MECHANISM = "workspace size measured by the supervisor (killed past disk_mb)"


def entry_bytes(st: os.stat_result) -> int:
    """What one directory entry counts: max(apparent size, allocated bytes) in whole blocks, at least one."""
    size = max(st.st_size, st.st_blocks * 512, 1)
    return -(-size // BLOCK) * BLOCK


def tree_bytes(roots: Iterable[Path], stop_above: int | None = None) -> int | None:
    """Bytes the trees under `roots` count (see `entry_bytes`); None if a directory cannot be read.

    Stops early once the total passes `stop_above`. Entries that vanish during the walk are skipped."""
    total, seen, stack = 0, set(), [os.fspath(r) for r in roots]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    total += _count(entry, seen, stack)
        except PermissionError:
            return None
        except OSError:  # removed, or replaced by a file, while we walked
            continue
        if stop_above is not None and total > stop_above:
            break
    return total


def _count(entry: os.DirEntry, seen: set[tuple[int, int]], stack: list[str]) -> int:
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if entry.is_dir(follow_symlinks=False):
        stack.append(entry.path)
    elif st.st_nlink > 1:
        if (st.st_dev, st.st_ino) in seen:
            return 0
        seen.add((st.st_dev, st.st_ino))
    return entry_bytes(st)


class DiskBudget:
    """The run's disk budget: which trees, how many bytes, and when to measure them next."""

    def __init__(self, roots: Iterable[Path], limit_bytes: int) -> None:
        self.roots = list(roots)
        self.limit_bytes = limit_bytes
        self.next_at = time.perf_counter() + FIRST_S

    def exceeded(self) -> bool:
        """Measure now: whether the trees are over budget (or cannot be read); schedules the next walk."""
        start = time.perf_counter()
        used = tree_bytes(self.roots, self.limit_bytes)
        now = time.perf_counter()
        self.next_at = now + max(FIRST_S, GAP_FACTOR * (now - start))
        return used is None or used > self.limit_bytes

    def note(self) -> str:
        mb = self.limit_bytes // (1024 * 1024)
        return f"\n[sandbox: the workspace is over its disk budget of {mb} MiB (disk_mb); the run failed]\n"
