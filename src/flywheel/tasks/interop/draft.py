"""A task read from another system, before it is written: `Draft`, the checks it must pass, and what
both formats' readers share (the source's files and fields, read with refusals that name them)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError, PatchError
from flywheel.protocols import Environment
from flywheel.tasks.format import _ID, Task, load_task, task_toml
from flywheel.tasks.patch import apply_patch, parse_patch

DEFAULT_TIMEOUT_S = 600.0  # grading time limit when the source names none (Harbor's verifier default)
DEFAULT_TEST_COMMAND = "python -m pytest -q"
_SKIP = {".git", "__pycache__", ".pytest_cache"}


@dataclass
class Draft:
    """A task before it is written: the fields of task.toml and where its files come from."""

    id: str
    instruction: str
    test_command: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    timeout_s: float
    meta: dict[str, Any]
    repo: dict[str, Path]  # repository path -> the file to copy
    hidden: dict[str, bytes]  # workspace path -> content
    patch: str
    environment: Environment = Environment()  # task.toml's [environment]


def _check(draft: Draft, labels: tuple[str, str]) -> None:
    """The checks load_task makes, with messages that name the source's fields, and the reference applies."""
    if not _ID.match(draft.id):
        raise FlywheelError(f"id {draft.id!r} must be letters, digits, '_', '-', '.'")
    if not draft.instruction.strip():
        raise FlywheelError("empty instruction")
    if not draft.hidden:
        raise FlywheelError("no hidden test files")
    if not draft.fail_to_pass:
        raise FlywheelError(f"{labels[0]} names no test")
    files = set(draft.repo) | set(draft.hidden)
    for label, ids in zip(labels, (draft.fail_to_pass, draft.pass_to_pass), strict=True):
        for test_id in ids:
            path, sep, name = test_id.partition("::")
            if not sep or not name or path.startswith("/"):
                raise FlywheelError(f"{label} has {test_id!r}, not a pytest node id 'path.py::name'")
            if path not in files:
                raise FlywheelError(
                    f"{label} names {test_id}, but {path} is in neither the tests nor the repository"
                )
    touched = {p for fp in _parse(draft.patch, "reference patch") for p in (fp.old_path, fp.new_path) if p}
    try:
        apply_patch({p: draft.repo[p].read_text() for p in touched if p in draft.repo}, draft.patch)
    except (PatchError, UnicodeDecodeError) as e:
        raise FlywheelError(f"reference patch does not apply: {e}") from None


def _parse(patch: str, what: str) -> list[Any]:
    try:
        files = parse_patch(patch)
    except PatchError as e:
        raise FlywheelError(f"{what}: {e}") from None
    if not files:
        raise FlywheelError(f"{what} is empty")
    return files


def _labelled(label: str, read: Callable[[], Draft], tests: tuple[str, str]) -> tuple[str, Draft]:
    """`read()`, checked, with any refusal prefixed by `label` (the task or instance it is about)."""
    try:
        draft = read()
        _check(draft, tests)
    except FlywheelError as e:
        raise FlywheelError(f"{label}: {e}") from None
    return label, draft


def _write(draft: Draft, dest: Path) -> Task:
    """Write `draft` as a task directory at `dest` (inside the staging directory) and load it back."""
    try:
        toml = task_toml(
            id=draft.id,
            instruction=draft.instruction,
            test_command=draft.test_command,
            fail_to_pass=draft.fail_to_pass,
            pass_to_pass=draft.pass_to_pass,
            timeout_s=draft.timeout_s,
            meta=draft.meta,
            environment=draft.environment,
        )
    except TypeError as e:
        raise FlywheelError(f"meta cannot be written to task.toml ({e})") from None
    for sub in ("repo", "tests"):
        (dest / sub).mkdir(parents=True)
    (dest / "task.toml").write_text(toml)
    (dest / "solution.patch").write_text(draft.patch)
    for rel, src in draft.repo.items():
        (dest / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / "repo" / rel)
    for rel, data in draft.hidden.items():
        (dest / "tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / "tests" / rel).write_bytes(data)
    return load_task(dest)


def _files(root: Path) -> dict[str, Path]:
    """Every file under `root` by posix path, without version control and caches."""
    return {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and not _SKIP & set(p.relative_to(root).parts) and p.suffix != ".pyc"
    }


def tree_digest(root: Path) -> str:
    """SHA-1 over a directory's paths and contents: an exported task's synthetic `base_commit`."""
    h = hashlib.sha1()
    for rel, p in _files(root).items():
        h.update(rel.encode() + b"\0" + hashlib.sha1(p.read_bytes()).digest())
    return h.hexdigest()


def _plain(value: Any) -> bool:
    """A value task.toml's meta can hold: a scalar or a list of scalars."""
    scalar = (str, int, float, bool)
    return isinstance(value, scalar) or (
        isinstance(value, list) and all(isinstance(v, scalar) for v in value)
    )


def _text(path: Path) -> str:
    if not path.is_file():
        raise FlywheelError(f"{path.parent.name}/{path.name} is missing")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise FlywheelError(f"{path.name} is not text") from None


def _strings(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FlywheelError(f"{where} field '{key}' must be a list of strings")
    return value


def _table(table: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise FlywheelError(f"{where} field '{key}' must be a table")
    return dict(value)


def _timeout(table: Any, key: str = "timeout_sec") -> float:
    value = table.get(key) if isinstance(table, dict) else None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else DEFAULT_TIMEOUT_S
