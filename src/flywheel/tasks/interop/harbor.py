"""Harbor task directories, in and out: `read_harbor` turns one into a draft of ours (its Dockerfile,
test.sh and solve.sh read without running them; the Dockerfile's image becomes the task's environment),
`write_harbor` writes one of ours as a Harbor task that carries every field of ours, its environment
included, in `[metadata.flywheel]`, with a Dockerfile that builds that environment for Harbor's tools."""

from __future__ import annotations

import functools
import json
import posixpath
import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flywheel.errors import FlywheelError
from flywheel.protocols import WORKSPACE, Environment
from flywheel.tasks.format import Task, _toml_value, environment_toml, parse_environment
from flywheel.tasks.interop.dockerfile import _needs_docker, build_context, copied_files, docker_plan
from flywheel.tasks.interop.draft import (
    _SKIP,
    DEFAULT_TEST_COMMAND,
    Draft,
    _files,
    _labelled,
    _plain,
    _strings,
    _table,
    _text,
    _timeout,
)
from flywheel.tasks.interop.scripts import _is_test_module, collect_test_ids, pytest_targets, solve_patch

WORKDIR = "/app"  # where an exported Harbor image holds the repository of a task at the default workdir
_COMPOSE = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
AGENT_TIMEOUT_S = 600.0  # an exported Harbor task's [agent] timeout_sec: ours has no per-task agent limit


def _safe_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", name).lstrip("-._") or "task"


def _harbor_drafts(
    src: Path, check_python: Callable[[str], object] | None = None
) -> Iterator[tuple[str, Draft]]:
    if (src / "task.toml").is_file():
        dirs = [src]
    else:
        dirs = sorted(p for p in src.iterdir() if (p / "task.toml").is_file()) if src.is_dir() else []
    if not dirs:
        raise FlywheelError(f"{src}: no Harbor task (a directory with task.toml, or a folder of them)")
    for d in dirs:
        read = functools.partial(read_harbor, d, check_python)
        yield _labelled(f"harbor task {d.name}", read, ("fail_to_pass", "pass_to_pass"))


def read_harbor(root: Path, check_python: Callable[[str], object] | None = None) -> Draft:
    """One Harbor task directory as a draft of ours; FlywheelError names what cannot be carried.
    `check_python(version)` raises FlywheelError when this host lacks the base image's Python."""
    config = _toml(root / "task.toml")
    instruction = _text(root / "instruction.md")
    env = root / "environment"
    _one_container(root, config)
    ours = (config.get("metadata") or {}).get("flywheel")
    ours = ours if isinstance(ours, dict) else None
    context = build_context(env) if env.is_dir() else {}
    plan = docker_plan(_text(env / "Dockerfile"), context, None if ours else check_python)
    repo = copied_files(plan, context)
    hidden = {rel: p.read_bytes() for rel, p in _files(root / "tests").items() if rel != "test.sh"}
    targets = pytest_targets(_text(root / "tests" / "test.sh"), plan.workdir)
    _no_uploaded_paths(hidden, plan.workdir)
    solution = root / "solution"
    solution_files = {rel: p.read_text(errors="replace") for rel, p in _files(solution).items()}
    patch = solve_patch(_text(solution / "solve.sh"), solution_files)
    if patch is None:
        raise FlywheelError(
            "solution/solve.sh applies no diff (a here-document or a patch file given to patch or git apply)"
        )
    if ours is not None:  # a task we exported: every field of ours travelled in [metadata.flywheel]
        return Draft(
            id=str(ours.get("id", "")),
            instruction=instruction,
            test_command=str(ours.get("test_command", DEFAULT_TEST_COMMAND)),
            fail_to_pass=_strings(ours, "fail_to_pass", "[metadata.flywheel]"),
            pass_to_pass=_strings(ours, "pass_to_pass", "[metadata.flywheel]"),
            timeout_s=_timeout(ours, "timeout_s"),
            meta=_table(ours, "meta", "[metadata.flywheel]"),
            repo=repo,
            hidden=hidden,
            patch=patch,
            environment=parse_environment(ours.get("environment", {}), "[metadata.flywheel.environment]"),
        )

    def read(rel: str) -> bytes:
        return hidden[rel] if rel in hidden else repo[rel].read_bytes()

    return Draft(
        id=_safe_id(root.name),
        instruction=instruction,
        test_command=DEFAULT_TEST_COMMAND,
        fail_to_pass=_test_ids(targets, set(repo) | set(hidden), read),
        pass_to_pass=[],
        timeout_s=_timeout(config.get("verifier")),
        meta=_harbor_meta(config),
        repo=repo,
        hidden=hidden,
        patch=patch,
        environment=plan.environment,
    )


def _one_container(root: Path, config: Mapping[str, Any]) -> None:
    """Refuse a task that needs more than one container, or a prebuilt one."""
    for where in (root / "environment", root):
        for name in _COMPOSE:
            if (where / name).exists():
                rel = (where / name).relative_to(root).as_posix()
                raise _needs_docker(f"{rel}: several containers")
    table = config.get("environment")
    if isinstance(table, dict) and table.get("docker_image"):
        raise _needs_docker(f"the prebuilt image {table['docker_image']}")
    if isinstance(table, dict) and table.get("mcp_servers"):
        raise _needs_docker("task.toml [[environment.mcp_servers]]: services beside the task's container")


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(_text(path))
    except tomllib.TOMLDecodeError as e:
        raise FlywheelError(f"{path.name} is not valid TOML ({e})") from None


def _test_ids(targets: list[str], files: set[str], read: Callable[[str], bytes]) -> list[str]:
    """Node ids of the tests pytest runs for `targets` (files, folders, node ids) among `files`."""
    ids: dict[str, None] = {}
    for target in targets:
        path, sep, _ = target.partition("::")
        if sep:
            ids.setdefault(target)
            continue
        if path in files:
            modules = [path]
        else:
            prefix = "" if path == "." else path + "/"
            modules = sorted(p for p in files if p.startswith(prefix) and _is_test_module(p))
        if not modules:
            raise FlywheelError(f"tests/test.sh runs pytest on {target}, which holds no test module")
        for module in modules:
            found = collect_test_ids(module, read(module).decode(errors="replace"))
            if not found and module == path:
                raise FlywheelError(f"tests/test.sh runs {module}, which holds no test function")
            ids.update(dict.fromkeys(found))
    return list(ids)


def _no_uploaded_paths(hidden: Mapping[str, bytes], workdir: str) -> None:
    """Refuse tests that read /tests/…, where Harbor uploads them: the grader lays them over WORKDIR
    instead. (Paths under WORKDIR are fine: the sandbox binds the repository there.)"""
    if _under(workdir, "/tests"):
        return
    used = re.compile(r"['\"]/tests(?:/|['\"])")
    for rel, data in hidden.items():
        if rel.endswith(".py") and used.search(data.decode(errors="replace")):
            raise FlywheelError(
                f"tests/{rel} reads /tests, where Harbor uploads the tests: the grader lays them over "
                f"WORKDIR {workdir} instead"
            )


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _harbor_meta(config: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"source": "harbor"}
    for table in ("task", "metadata"):
        if isinstance(config.get(table), dict):
            meta.update({k: v for k, v in config[table].items() if _plain(v) and k not in meta})
    if isinstance(config.get("agent"), dict) and "timeout_sec" in config["agent"]:
        meta["agent_timeout_s"] = _timeout(config["agent"])
    return meta


def write_harbor(task: Task, dest: Path) -> None:
    """Write one task as a Harbor task directory at `dest`."""
    if (task.hidden_tests / "test.sh").exists():
        raise FlywheelError(
            f"{task.id}: a hidden file named test.sh would take the place of Harbor's test.sh"
        )
    nested = any((task.repo / name).exists() for name in ("Dockerfile", ".dockerignore"))
    env = dest / "environment"
    workdir = _workdir(task.environment)
    ignore = shutil.ignore_patterns(*_SKIP, "*.pyc")
    shutil.copytree(task.repo, env / "repo" if nested else env, ignore=ignore)
    (env / "Dockerfile").write_text(_dockerfile("repo/" if nested else ".", task.environment))
    if not nested:
        (env / ".dockerignore").write_text("Dockerfile\n.dockerignore\n")
    shutil.copytree(task.hidden_tests, dest / "tests", ignore=ignore)
    _script(dest / "tests" / "test.sh", _test_sh(task, workdir))
    (dest / "solution").mkdir()
    _script(dest / "solution" / "solve.sh", _solve_sh(task.solution_patch, workdir))
    (dest / "instruction.md").write_text(task.instruction)
    (dest / "task.toml").write_text(_harbor_toml(task))


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _workdir(environment: Environment) -> str:
    """Where the exported image holds the repository: the task's workdir, or /app (Harbor's usual place)
    for a task at the default /workspace."""
    return environment.workdir if environment.workdir != WORKSPACE else WORKDIR


def _dockerfile(source: str, environment: Environment) -> str:
    """The image of the task's environment: its Python (else the running one), this pytest unless the
    requirements name one, the requirements, the variables, the repository in WORKDIR."""
    python = environment.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    image = f"python:{python}-slim" if environment.python else f"python:{python}"
    names = {canonicalize_name(Requirement(r).name) for r in environment.requirements}
    workdir = _workdir(environment)
    lines = [
        "# Written by `flywheel tasks export --format harbor`: the task's repository in WORKDIR, on the Python",
        "# and the pytest the task was validated with.",
        f"FROM {image}",
    ]
    if "pytest" not in names:
        lines.append(f"RUN pip install --no-cache-dir pytest=={metadata.version('pytest')}")
    if environment.requirements:
        lines.append(f"RUN pip install --no-cache-dir {shlex.join(environment.requirements)}")
    lines += [f"ENV {name}={_docker_quote(value)}" for name, value in environment.env]
    lines += [f"WORKDIR {workdir}", f"COPY {source} {workdir}/"]
    return "\n".join(lines) + "\n"


def _docker_quote(value: str) -> str:
    """A value for a Dockerfile's ENV: double-quoted, with `\\`, `"` and `$` escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _test_sh(task: Task, workdir: str) -> str:
    restore = []
    for rel in task.hidden_files():
        parent = posixpath.dirname(rel)
        copy = f"cp {shlex.quote('/tests/' + rel)} {shlex.quote(rel)}"
        restore.append(f"mkdir -p {shlex.quote(parent)} && {copy}" if parent else copy)
    ids = " ".join(shlex.quote(t) for t in (*task.fail_to_pass, *task.pass_to_pass))
    return "\n".join(
        [
            "#!/bin/bash",
            "# Written by `flywheel tasks export --format harbor`: lays the hidden tests over the repository,",
            "# runs the task's tests with pytest and writes the reward (1: every one passed, else 0).",
            "mkdir -p /logs/verifier",
            f"cd {shlex.quote(workdir)}",
            *restore,
            f"python -m pytest -q -p no:cacheprovider {ids}",
            "if [ $? -eq 0 ]; then",
            "  echo 1 > /logs/verifier/reward.txt",
            "else",
            "  echo 0 > /logs/verifier/reward.txt",
            "fi",
            "",
        ]
    )


def _solve_sh(patch: str, workdir: str) -> str:
    delim = "FLYWHEEL_PATCH"
    while delim in patch.splitlines():
        delim += "_"
    body = patch if patch.endswith("\n") else patch + "\n"
    return (
        "#!/bin/bash\n"
        "# Written by `flywheel tasks export --format harbor`: applies the task's reference fix.\n"
        "set -euo pipefail\n"
        f"cd {shlex.quote(workdir)}\n"
        f"patch -p1 --no-backup-if-mismatch <<'{delim}'\n{body}{delim}\n"
    )


def _harbor_toml(task: Task) -> str:
    ours = {
        "id": task.id,
        "test_command": task.test_command,
        "fail_to_pass": list(task.fail_to_pass),
        "pass_to_pass": list(task.pass_to_pass),
        "timeout_s": float(task.timeout_s),
    }
    try:
        lines = ['version = "1.0"', "", "[metadata]", 'source = "flywheel"', "", "[metadata.flywheel]"]
        lines += [f"{_key(k)} = {_toml_value(v)}" for k, v in ours.items()]
        if task.meta:
            lines += ["", "[metadata.flywheel.meta]"]
            lines += [f"{_key(k)} = {_toml_value(v)}" for k, v in task.meta.items()]
        env_table = environment_toml(task.environment, table="metadata.flywheel.environment")
        if env_table:
            lines += ["", env_table.rstrip("\n")]
    except TypeError as e:
        raise FlywheelError(f"{task.id}: meta cannot be written to task.toml ({e})") from None
    lines += ["", "[verifier]", f"timeout_sec = {float(task.timeout_s)!r}"]
    lines += ["", "[agent]", f"timeout_sec = {AGENT_TIMEOUT_S!r}", ""]
    return "\n".join(lines)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
