"""What a run left behind once its processes have ended: the list to check after a crash, a kill or a test.

`find_leftovers(run_dir, tmp_dir=..., env_cache=..., pids=...)` returns one `Leftover` per thing that
should not outlive the run, of these kinds:

- `process`: a live process whose command line or environment names the run directory or the temp
  directory the run was given (a sandbox's `bwrap` binds its workspace from there; every process the run
  started inherits its `TMPDIR`). A process inside a sandbox is not named, but its namespace's pid 1 is a
  `bwrap` that is, and the namespace dies with it.
- `cgroup`: a per-run cgroup (`flywheel-<pid>-<n>`, `flywheel.sandbox.cgroups`) of one of `pids` (the
  run's processes) still present.
- `temp`: anything flywheel made in the temp directory (`flywheel-*`: a process's workspace directory,
  which holds its episodes' workspaces, warm-pytest directories and /etc copy), and the directories of
  `multiprocessing` (`pymp-*`: the `local` backend's forkserver socket).
- `record`: a JSONL file of the run directory with a line that does not parse or a last line without its
  newline (a torn write), or a temporary file (`*.tmp-*`) of a file written whole.
- `checkpoint`: a checkpoint directory, local (`checkpoints/`) or on a local peer (`peer/checkpoints/`),
  that is not complete (`flywheel.loop.checkpoint.verify`), or a checkpoint being built (`.v*.tmp-*`).
- `store`: a half-written object of a local weight store (`weights/`, `peer/`: `*.tmp-*`).
- `environment`: in the task-environment cache, a build directory (`.build-*`), an environment without its
  record (`flywheel.sandbox.envs.RECORD`), or a temporary of a file or directory written whole.

What is not covered: stores on S3 (an object appears whole or not at all there, so no partial object can
be left); processes in another pid namespace; cgroups of processes not named in `pids`; temporary
directories other programs make (torch's compile cache, `torchinductor_<user>`, is reused by every run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from flywheel.loop.checkpoint import PEER_PREFIX, verify
from flywheel.sandbox.cgroups import cgroup_host
from flywheel.sandbox.envs import RECORD

TEMP_PREFIXES = ("flywheel-", "pymp-")  # flywheel's own temporary directories, multiprocessing's
TMP_MARK = ".tmp-"  # `flywheel.files` and the local store's temporaries of a file written whole
ENV_KEPT = ("uv-cache",)  # the environment cache's shared directories (wheels-* are written whole)


@dataclass(frozen=True)
class Leftover:
    """One thing a run left behind: its kind (see the module docstring) and what it is."""

    kind: str
    what: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.what}"


def find_leftovers(
    run_dir: Path,
    *,
    tmp_dir: Path | None = None,
    env_cache: Path | None = None,
    pids: Iterable[int] = (),
) -> list[Leftover]:
    """Everything the run in `run_dir` left behind (see the module docstring); call it once the run's
    processes have ended. `tmp_dir`: the temp directory the run was given (its TMPDIR); `env_cache`: its
    task-environment cache; `pids`: its processes, for their cgroups."""
    run_dir = Path(run_dir)
    roots = [run_dir, *([tmp_dir] if tmp_dir else [])]
    found = [*processes(roots), *cgroups(pids), *records(run_dir), *checkpoints(run_dir)]
    found += [*stores([run_dir / "weights", run_dir / "peer"])]
    found += [*temp_entries(Path(tmp_dir))] if tmp_dir else []
    found += [*environments(Path(env_cache))] if env_cache else []
    return found


# ------------------------------------------------------------------------------------------- processes


def processes(roots: Iterable[Path]) -> Iterator[Leftover]:
    """Live processes (this one and its ancestors aside) whose command line or environment names a path
    under one of `roots`."""
    marks = {os.fsencode(f(r)) for r in roots for f in (os.path.abspath, os.path.realpath)}
    mine = set(ancestors(os.getpid()))
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        cmdline = _read(f"/proc/{entry.name}/cmdline")
        seen = cmdline + b"\0" + _read(f"/proc/{entry.name}/environ")
        if any(m in seen for m in marks):
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:300]
            yield Leftover("process", f"pid {entry.name}: {shown or '(no command line)'}")


def ancestors(pid: int) -> list[int]:
    """`pid` and its parents up to pid 1."""
    out = []
    while pid > 0 and pid not in out:
        out.append(pid)
        fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()
        pid = int(fields[1]) if len(fields) > 1 else 0
    return out


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def cgroups(pids: Iterable[int]) -> Iterator[Leftover]:
    """The per-run cgroups of `pids` still present, in the hierarchies this process makes its own in."""
    host = cgroup_host()
    parents = [*host.v1.values(), *([host.v2] if host.v2 else [])]
    for pid in sorted(set(pids)):
        for parent in parents:
            for d in sorted(parent.glob(f"flywheel-{pid}-*")):
                yield Leftover("cgroup", str(d))


# ----------------------------------------------------------------------------------------------- files


def temp_entries(tmp_dir: Path) -> Iterator[Leftover]:
    """What flywheel made in `tmp_dir` (`flywheel-*`, `pymp-*`), with what is inside it."""
    if not tmp_dir.is_dir():
        return
    for p in sorted(tmp_dir.iterdir()):
        if p.name.startswith(TEMP_PREFIXES):
            inside = sorted(c.name for c in p.iterdir()) if p.is_dir() else []
            yield Leftover("temp", f"{p}" + (f" (holding {', '.join(inside[:6])})" if inside else ""))


def records(run_dir: Path) -> Iterator[Leftover]:
    """Torn or unparseable lines of the run's JSONL files, and temporaries of files written whole."""
    for path in sorted(run_dir.glob("*.jsonl")):
        data = path.read_bytes()
        rows = data.splitlines()
        if data and not data.endswith(b"\n"):
            yield Leftover("record", f"{path}: the last line is torn")
            rows = rows[:-1]
        for n, line in enumerate(rows, 1):
            try:
                json.loads(line)
            except ValueError:
                yield Leftover("record", f"{path}:{n}: not JSON ({line[:60]!r})")
    for path in sorted(run_dir.glob(f"*{TMP_MARK}*")):
        yield Leftover("record", f"{path}: a temporary of a file written whole")


def checkpoints(run_dir: Path) -> Iterator[Leftover]:
    """Incomplete checkpoints, local and on a local peer, and checkpoints being built."""
    for root in (run_dir / "checkpoints", run_dir / "peer" / PEER_PREFIX):
        if not root.is_dir():
            continue
        for d in sorted(root.iterdir()):
            if d.name.startswith(".") and TMP_MARK in d.name:
                yield Leftover("checkpoint", f"{d}: a checkpoint being built")
            elif d.is_dir() and d.name.startswith("v") and verify(d) is None:
                yield Leftover(
                    "checkpoint", f"{d}: incomplete (no manifest, or a file that does not match it)"
                )


def stores(roots: Iterable[Path]) -> Iterator[Leftover]:
    """Half-written objects of local weight stores."""
    for root in roots:
        if root.is_dir():
            for p in sorted(root.rglob(f"*{TMP_MARK}*")):
                if p.is_file():
                    yield Leftover("store", f"{p}: a half-written object")


def environments(env_cache: Path) -> Iterator[Leftover]:
    """Half-built task environments: build directories, environments without their record, temporaries."""
    if not env_cache.is_dir():
        return
    for p in sorted(env_cache.iterdir()):
        if p.name.startswith(".build-"):
            yield Leftover("environment", f"{p}: a build that did not finish")
        elif p.name.startswith(".") and TMP_MARK in p.name:
            yield Leftover("environment", f"{p}: a temporary of a directory written whole")
        elif p.is_dir() and not kept(p.name) and not (p / RECORD).is_file():
            yield Leftover("environment", f"{p}: an environment without its record ({RECORD})")


def kept(name: str) -> bool:
    """The environment cache's shared directories: uv's download cache, the host's wheels."""
    return name in ENV_KEPT or name.startswith("wheels-")
