"""The entry points: `import_tasks` reads another system's tasks into a suite of ours, `export_tasks`
writes ours the other system's way. Either builds its whole output in a temporary sibling of `out` and
renames it into place at the end, so `out` is absent or complete, never half-written."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from flywheel.errors import FlywheelError, TaskError
from flywheel.files import building
from flywheel.tasks.format import Task, load_task
from flywheel.tasks.interop.draft import _write
from flywheel.tasks.interop.harbor import _harbor_drafts, write_harbor
from flywheel.tasks.interop.swebench import _swebench_drafts, write_swebench

FORMATS = ("harbor", "swebench")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise FlywheelError(f"unknown format '{fmt}' (formats: {', '.join(FORMATS)})")


def import_tasks(
    fmt: str,
    src: Path,
    out: Path,
    repos: Path | None = None,
    environment: Path | None = None,
    check_python: Callable[[str], object] | None = None,
) -> list[Task]:
    """Read `src` in format `fmt` and write its tasks as a suite directory `out`; the tasks, loaded.
    SWE-bench: `repos` holds the checkouts, `environment` the requirements (`read_environment_file`).
    Harbor: `check_python(version)` raises FlywheelError when this host lacks a base image's Python."""
    check_format(fmt)
    src, out = Path(src), Path(out)
    if not src.exists():
        raise FlywheelError(f"{src}: no such file or directory")
    if fmt == "harbor" and repos is not None:
        raise FlywheelError("--repos is for --format swebench")
    if fmt == "harbor" and environment is not None:
        raise FlywheelError("--environment is for --format swebench (a Harbor task's Dockerfile says it)")
    seen: set[str] = set()
    with _staged(out) as tmp, tempfile.TemporaryDirectory(prefix="flywheel-import-") as scratch:
        drafts = (
            _harbor_drafts(src, check_python)
            if fmt == "harbor"
            else _swebench_drafts(src, repos, Path(scratch), environment)
        )
        for label, draft in drafts:
            if draft.id in seen:
                raise FlywheelError(f"{label}: a second task named {draft.id}")
            seen.add(draft.id)
            try:
                _write(draft, tmp / draft.id)
            except FlywheelError as e:
                raise type(e)(f"{label}: {e}") from None
    return [load_task(out / task_id) for task_id in sorted(seen)]


def export_tasks(fmt: str, tasks: Sequence[Task], out: Path) -> None:
    """Write `tasks` in format `fmt` into the directory `out`."""
    check_format(fmt)
    if not tasks:
        raise FlywheelError("no tasks to export")
    with _staged(Path(out)) as tmp:
        if fmt == "harbor":
            for task in tasks:
                write_harbor(task, tmp / task.id)
        else:
            write_swebench(tasks, tmp)


@contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """A temporary sibling of `out` to build in, renamed to `out` when the block ends without an error."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FlywheelError(f"{out}: exists and is not empty; choose another --out")
    with building(out) as tmp:
        tmp.chmod(0o755)
        try:
            yield tmp
        except TaskError as e:  # a written task that does not load: name it under `out`, not the staging path
            raise TaskError(str(e).replace(str(tmp), str(out))) from None
