"""Suites by name or by directory: the built-in suites' table, their cache, and `load_suite`.

A suite is either a built-in name (`toybugs`, `toybugs-long`, `humaneval`, `pypibugs`) or a directory of
task directories. `SUITES` names each built-in's `Builtin` as a "module:attribute" string, resolved by
`flywheel.registry` only when the suite is asked for, so listing the names imports no generator. Built-in
suites are generated deterministically and materialised once under the cache directory
(`$FLYWHEEL_CACHE`, else `$XDG_CACHE_HOME/flywheel`, else `~/.cache/flywheel`); later calls reuse them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flywheel.errors import FlywheelError, TaskError
from flywheel.files import building, cache_dir
from flywheel.registry import load
from flywheel.tasks.format import Task, load_task

SUITES = {
    "toybugs": "flywheel.tasks.toy.suite:BUILTIN",
    "toybugs-long": "flywheel.tasks.toy.long:BUILTIN",
    "humaneval": "flywheel.tasks.humaneval:BUILTIN",
    "pypibugs": "flywheel.tasks.pypibugs:BUILTIN",
}
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Builtin:
    """A built-in suite's generator: `build(out, seed)` writes its task directories into `out`."""

    version: str  # names what `build` writes: a new version is a new cache directory
    build: Callable[[Path, int], None]


def builtin_suites() -> list[str]:
    return sorted(SUITES)


def materialise(name: str, seed: int = DEFAULT_SEED) -> Path:
    """Directory holding built-in suite `name`, generating it on first use."""
    if name not in SUITES:
        raise FlywheelError(
            f"unknown suite '{name}' (built-in: {', '.join(builtin_suites())}, or a directory)"
        )
    suite: Builtin = load(SUITES[name], "suite")
    dest = cache_dir() / "suites" / f"{name}-{suite.version}-seed{seed}"
    if (dest / ".complete").exists():
        return dest
    with building(dest) as tmp:
        suite.build(tmp, seed)
        (tmp / ".complete").write_text("ok\n")
    return dest


def load_suite(suite: str | Path, split: str | None = None, seed: int = DEFAULT_SEED) -> list[Task]:
    """Tasks of a built-in suite or a directory (a task directory or a folder of them), sorted by id."""
    root = Path(suite)
    if str(suite) in SUITES and not root.exists():
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
