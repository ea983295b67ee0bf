"""The task directory format, its loader and its writer.

```
<task>/task.toml      id, instruction, test_command, fail_to_pass, pass_to_pass, timeout_s, [meta]
<task>/repo/          the starting repository the agent sees (no .git)
<task>/tests/         hidden test files: tests/<path> is copied to <path> in the workspace at grading
<task>/solution.patch the reference fix, a unified diff against repo/
```

An optional `[environment]` table says what the repository needs in the sandbox (`Environment`):
`requirements` (pip requirement strings), `python` (a version this host has), `env` (variables) and
`workdir` (where the repository appears inside the sandbox, default /workspace).

The loader validates every field and refuses a broken task with one `TaskError` that names the file
and the field. The writer builds a task in a temporary sibling directory and renames it into place, so a
reader never sees half a task.
"""

from __future__ import annotations

import json
import posixpath
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from flywheel.errors import TaskError
from flywheel.files import building
from flywheel.protocols import WORKSPACE, Environment

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_FIELDS = {
    "id", "instruction", "test_command", "fail_to_pass", "pass_to_pass", "timeout_s", "meta", "environment",
}  # fmt: skip
_ENV_FIELDS = {"requirements", "python", "env", "workdir"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHON = re.compile(r"^3\.\d+(\.\d+)?$")
# where a workdir may not be: the host's system and runtime, and the sandbox's own mount points
_SYSTEM = ("/proc", "/sys", "/dev", "/tmp", "/usr", "/bin", "/sbin", "/etc", "/run", "/opt/flywheel")
_OURS = ("/grader", "/report", "/synth")


@dataclass(frozen=True)
class Task:
    """One repository task, backed by its directory."""

    id: str
    instruction: str
    test_command: str  # the visible test command the agent's `run_tests` runs, e.g. "python -m pytest -q"
    fail_to_pass: tuple[str, ...]  # pytest node ids that fail before the fix and must pass after
    pass_to_pass: tuple[str, ...]  # pytest node ids that pass before and must still pass
    timeout_s: float
    root: Path
    meta: Mapping[str, Any] = field(default_factory=dict)
    environment: Environment = Environment()  # what the repository needs in the sandbox

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def hidden_tests(self) -> Path:
        return self.root / "tests"

    @property
    def solution_patch(self) -> str:
        return (self.root / "solution.patch").read_text()

    def hidden_files(self) -> list[str]:
        """Workspace-relative paths of the hidden test files."""
        return sorted(
            p.relative_to(self.hidden_tests).as_posix()
            for p in self.hidden_tests.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )


def load_task(root: Path | str) -> Task:
    """Load and validate the task directory `root`."""
    root = Path(root)
    toml_path = root / "task.toml"
    if not root.is_dir():
        raise TaskError(f"{root}: not a task directory")
    if not toml_path.is_file():
        raise TaskError(f"{toml_path}: missing")
    try:
        data = tomllib.loads(toml_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"{toml_path}: not valid TOML ({e})") from None
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise TaskError(f"{toml_path}: unknown field '{unknown[0]}'")
    task = Task(
        id=_str(data, "id", toml_path),
        instruction=_str(data, "instruction", toml_path),
        test_command=_str(data, "test_command", toml_path),
        fail_to_pass=_ids(data, "fail_to_pass", toml_path, nonempty=True),
        pass_to_pass=_ids(data, "pass_to_pass", toml_path, nonempty=False),
        timeout_s=_positive(data, "timeout_s", toml_path),
        root=root,
        meta=_meta(data, toml_path),
        environment=parse_environment(data.get("environment", {}), f"{toml_path}: [environment]"),
    )
    if not _ID.match(task.id):
        raise TaskError(f"{toml_path}: field 'id' must be letters, digits, '_', '-', '.': {task.id!r}")
    for sub in ("repo", "tests"):
        if not (root / sub).is_dir():
            raise TaskError(f"{root / sub}: missing directory")
    if (root / "repo" / ".git").exists():
        raise TaskError(f"{root / 'repo' / '.git'}: a task repository must not carry git history")
    if not (root / "solution.patch").is_file():
        raise TaskError(f"{root / 'solution.patch'}: missing")
    if not task.hidden_files():
        raise TaskError(f"{root / 'tests'}: no hidden test files")
    for key in ("fail_to_pass", "pass_to_pass"):
        for test_id in getattr(task, key):
            path = test_id.split("::", 1)[0]
            if not (root / "tests" / path).is_file() and not (root / "repo" / path).is_file():
                raise TaskError(
                    f"{toml_path}: field '{key}' names {test_id}, but {path} is in neither tests/ nor repo/"
                )
    return task


def _str(data: Mapping[str, Any], key: str, path: Path) -> str:
    value = data.get(key)
    if value is None:
        raise TaskError(f"{path}: missing field '{key}'")
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{path}: field '{key}' must be a non-empty string")
    return value


def _ids(data: Mapping[str, Any], key: str, path: Path, nonempty: bool) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        raise TaskError(f"{path}: missing field '{key}'")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{path}: field '{key}' must be a list of pytest node ids")
    if nonempty and not value:
        raise TaskError(f"{path}: field '{key}' must name at least one test")
    for v in value:
        file_part = v.split("::", 1)[0]
        if "::" not in v or file_part.startswith("/") or ".." in Path(file_part).parts:
            raise TaskError(f"{path}: field '{key}' has {v!r}, not a relative pytest node id 'path.py::name'")
    return tuple(value)


def _positive(data: Mapping[str, Any], key: str, path: Path) -> float:
    value = data.get(key)
    if value is None:
        raise TaskError(f"{path}: missing field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskError(f"{path}: field '{key}' must be a positive number of seconds")
    return float(value)


def _meta(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    value = data.get("meta", {})
    if not isinstance(value, dict):
        raise TaskError(f"{path}: field 'meta' must be a table")
    return value


def parse_environment(value: Any, where: str) -> Environment:
    """An `[environment]` table as an `Environment`; `TaskError` naming `where` and the field otherwise."""
    if not isinstance(value, dict):
        raise TaskError(f"{where} must be a table")
    unknown = sorted(set(value) - _ENV_FIELDS)
    if unknown:
        raise TaskError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(_ENV_FIELDS))})")
    reqs = value.get("requirements", [])
    if not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs):
        raise TaskError(f"{where}: 'requirements' must be a list of pip requirement strings")
    for r in reqs:
        check_requirement(r, where)
    python = value.get("python")
    if python is not None and (not isinstance(python, str) or not _PYTHON.match(python)):
        raise TaskError(f"{where}: 'python' must be a version such as \"3.12\", not {python!r}")
    env = value.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise TaskError(f"{where}: 'env' must be a table of strings")
    for name in env:
        if not _ENV_NAME.match(name):
            raise TaskError(f"{where}: 'env' has {name!r}, not a variable name")
        if name == "PATH" or name.startswith("FLYWHEEL_"):
            raise TaskError(f"{where}: 'env' may not set {name} (the sandbox owns it)")
    workdir = value.get("workdir", WORKSPACE)
    if not isinstance(workdir, str):
        raise TaskError(f"{where}: 'workdir' must be an absolute path")
    check_workdir(workdir, where)
    return Environment(
        requirements=tuple(r.strip() for r in reqs),
        python=python,
        env=tuple(sorted(env.items())),
        workdir=workdir,
    )


def check_requirement(text: str, where: str) -> None:
    """Refuse a requirement string pip cannot parse, in one line naming it."""
    try:
        Requirement(text)
    except InvalidRequirement as e:
        reason = str(e).splitlines()[0]
        raise TaskError(f"{where}: requirement {text!r} cannot be parsed ({reason})") from None


def check_workdir(workdir: str, where: str) -> None:
    """Refuse a workdir that is relative, `/`, or on (or above) a path the sandbox needs for itself."""
    if not workdir.startswith("/") or posixpath.normpath(workdir) != workdir.rstrip("/") or workdir == "/":
        raise TaskError(f"{where}: 'workdir' must be an absolute, normalised path below /, not {workdir!r}")
    runtime = list(dict.fromkeys((sys.prefix, sys.base_prefix)))
    for reserved in (*_SYSTEM, *_OURS, *runtime):
        if _overlaps(workdir.rstrip("/"), reserved):
            raise TaskError(f"{where}: 'workdir' {workdir} overlaps {reserved}, which the sandbox needs")
    if re.match(r"^/lib[^/]*(/|$)", workdir):
        raise TaskError(f"{where}: 'workdir' {workdir} overlaps the system's /lib* directories")


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two absolute paths is the other or lies under it."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def environment_toml(environment: Environment, table: str = "environment") -> str:
    """`environment` as a TOML table named `table` ("" when it is the default)."""
    if environment == Environment():
        return ""
    lines = [f"[{table}]"]
    if environment.requirements:
        lines.append(f"requirements = {_toml_value(list(environment.requirements))}")
    if environment.python is not None:
        lines.append(f"python = {_toml_value(environment.python)}")
    if environment.workdir != WORKSPACE:
        lines.append(f"workdir = {_toml_value(environment.workdir)}")
    if environment.env:
        pairs = ", ".join(f"{name} = {_toml_value(value)}" for name, value in environment.env)
        lines.append(f"env = {{ {pairs} }}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- writing


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON strings are valid TOML basic strings
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to task.toml")


def task_toml(
    *,
    id: str,
    instruction: str,
    test_command: str,
    fail_to_pass: list[str] | tuple[str, ...],
    pass_to_pass: list[str] | tuple[str, ...],
    timeout_s: float,
    meta: Mapping[str, Any] | None = None,
    environment: Environment | None = None,
) -> str:
    """Render a task.toml (meta values must be scalars or lists of scalars)."""
    fields = {
        "id": id,
        "instruction": instruction,
        "test_command": test_command,
        "fail_to_pass": list(fail_to_pass),
        "pass_to_pass": list(pass_to_pass),
        "timeout_s": timeout_s,
    }
    lines = [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    if meta:
        lines += ["", "[meta]"] + [f"{k} = {_toml_value(v)}" for k, v in meta.items()]
    text = "\n".join(lines) + "\n"
    env_table = environment_toml(environment or Environment())
    return text + ("\n" + env_table if env_table else "")


def write_task(
    dest: Path,
    *,
    toml: str,
    repo: Mapping[str, str],
    hidden_tests: Mapping[str, str],
    solution_patch: str,
) -> Task:
    """Write a task directory atomically (build beside `dest`, then rename) and return it loaded."""
    dest = Path(dest)
    with building(dest) as tmp:
        (tmp / "task.toml").write_text(toml)
        (tmp / "solution.patch").write_text(solution_patch)
        for sub, files in (("repo", repo), ("tests", hidden_tests)):
            (tmp / sub).mkdir()
            for rel, text in files.items():
                p = tmp / sub / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
        load_task(tmp)  # a broken task is refused here, before it takes the place of `dest`
    return load_task(dest)
