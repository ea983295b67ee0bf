"""Repository tasks: the directory format, built-in suites, and suite resolution.

A suite is either a built-in name (`toybugs`, `toybugs-long`, `humaneval`) or a directory of task
directories. Built-in suites are generated deterministically and materialised once under the cache
directory (`$FLYWHEEL_CACHE`, else `$XDG_CACHE_HOME/flywheel`, else `~/.cache/flywheel`); later calls
reuse them.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from pathlib import Path

from flywheel.errors import FlywheelError, TaskError
from flywheel.tasks.format import Task, load_task, task_toml, write_task

__all__ = ["Task", "load_task", "task_toml", "write_task", "load_suite", "builtin_suites", "cache_dir"]

# Built-in suites by name -> module exposing VERSION: str and build(out: Path, seed: int) -> None.
_BUILTIN = {
    "toybugs": "flywheel.tasks.toy",
    "toybugs-long": "flywheel.tasks.toy.long",
    "humaneval": "flywheel.tasks.humaneval",
}
DEFAULT_SEED = 0


def builtin_suites() -> list[str]:
    return sorted(_BUILTIN)


def cache_dir() -> Path:
    if os.environ.get("FLYWHEEL_CACHE"):
        return Path(os.environ["FLYWHEEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flywheel"


def materialise(name: str, seed: int = DEFAULT_SEED) -> Path:
    """Directory holding built-in suite `name`, generating it on first use."""
    if name not in _BUILTIN:
        raise FlywheelError(
            f"unknown suite '{name}' (built-in: {', '.join(builtin_suites())}, or a directory)"
        )
    module = importlib.import_module(_BUILTIN[name])
    dest = cache_dir() / "suites" / f"{name}-{module.VERSION}-seed{seed}"
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        module.build(tmp, seed)
        (tmp / ".complete").write_text("ok\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def load_suite(suite: str | Path, split: str | None = None, seed: int = DEFAULT_SEED) -> list[Task]:
    """Tasks of a built-in suite or a directory (a task directory or a folder of them), sorted by id."""
    root = Path(suite)
    if str(suite) in _BUILTIN and not root.exists():
        root = materialise(str(suite), seed)
    elif not root.exists():
        raise FlywheelError(
            f"unknown suite '{suite}': not a built-in ({', '.join(builtin_suites())}) nor a directory"
        )
    if (root / "task.toml").exists():
        tasks = [load_task(root)]
    else:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not dirs:
            raise TaskError(f"{root}: no task directories")
        tasks = [load_task(d) for d in dirs]
    if split is not None:
        splits = sorted({str(t.meta.get("split")) for t in tasks})
        tasks = [t for t in tasks if t.meta.get("split") == split]
        if not tasks:
            raise FlywheelError(f"suite '{suite}' has no split '{split}' (splits: {', '.join(splits)})")
    return sorted(tasks, key=lambda t: t.id)
