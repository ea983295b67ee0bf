"""Harbor task directories, in and out: `read_harbor` turns one into a draft of ours (its Dockerfile,
test.sh and solve.sh read without running them), `write_harbor` writes one of ours as a Harbor task
that carries every field of ours in `[metadata.flywheel]`."""

from __future__ import annotations

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

from flywheel.errors import FlywheelError
from flywheel.tasks.format import Task, _toml_value
from flywheel.tasks.interop.dockerfile import _copied_files, _needs_docker, docker_plan
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

WORKDIR = "/app"  # where an exported Harbor image holds the repository
AGENT_TIMEOUT_S = 600.0  # an exported Harbor task's [agent] timeout_sec: ours has no per-task agent limit


def _safe_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", name).lstrip("-._") or "task"


def _harbor_drafts(src: Path) -> Iterator[tuple[str, Draft]]:
    if (src / "task.toml").is_file():
        dirs = [src]
    else:
        dirs = sorted(p for p in src.iterdir() if (p / "task.toml").is_file()) if src.is_dir() else []
    if not dirs:
        raise FlywheelError(f"{src}: no Harbor task (a directory with task.toml, or a folder of them)")
    for d in dirs:
        yield _labelled(f"harbor task {d.name}", lambda d=d: read_harbor(d), ("fail_to_pass", "pass_to_pass"))


def read_harbor(root: Path) -> Draft:
    """One Harbor task directory as a draft of ours; FlywheelError names what cannot be carried."""
    config = _toml(root / "task.toml")
    instruction = _text(root / "instruction.md")
    env = root / "environment"
    if (env / "docker-compose.yaml").exists() or (env / "docker-compose.yml").exists():
        raise _needs_docker("environment/docker-compose.yaml: several containers")
    if isinstance(config.get("environment"), dict) and config["environment"].get("docker_image"):
        raise _needs_docker(f"the prebuilt image {config['environment']['docker_image']}")
    context = _files(env) if env.is_dir() else {}
    plan = docker_plan(_text(env / "Dockerfile"), context)
    repo = _copied_files(env, plan)
    hidden = {rel: p.read_bytes() for rel, p in _files(root / "tests").items() if rel != "test.sh"}
    targets = pytest_targets(_text(root / "tests" / "test.sh"), plan.workdir)
    _no_container_paths(hidden, plan.workdir)
    solution = root / "solution"
    solution_files = {rel: p.read_text(errors="replace") for rel, p in _files(solution).items()}
    patch = solve_patch(_text(solution / "solve.sh"), solution_files)
    if patch is None:
        raise FlywheelError(
            "solution/solve.sh applies no diff (a here-document or a patch file given to patch or git apply)"
        )
    ours = (config.get("metadata") or {}).get("flywheel")
    if isinstance(ours, dict):  # a task we exported: every field of ours travelled in [metadata.flywheel]
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
    )


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


def _no_container_paths(hidden: Mapping[str, bytes], workdir: str) -> None:
    if workdir == "/":
        return
    used = re.compile(rf"['\"]{re.escape(workdir)}(?:/|['\"])")
    for rel, data in hidden.items():
        if rel.endswith(".py") and used.search(data.decode(errors="replace")):
            raise FlywheelError(
                f"tests/{rel} reads the container path {workdir}: the grader runs the tests in a copy elsewhere"
            )


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
    ignore = shutil.ignore_patterns(*_SKIP, "*.pyc")
    shutil.copytree(task.repo, env / "repo" if nested else env, ignore=ignore)
    (env / "Dockerfile").write_text(_dockerfile("repo/" if nested else "."))
    if not nested:
        (env / ".dockerignore").write_text("Dockerfile\n.dockerignore\n")
    shutil.copytree(task.hidden_tests, dest / "tests", ignore=ignore)
    _script(dest / "tests" / "test.sh", _test_sh(task))
    (dest / "solution").mkdir()
    _script(dest / "solution" / "solve.sh", _solve_sh(task.solution_patch))
    (dest / "instruction.md").write_text(task.instruction)
    (dest / "task.toml").write_text(_harbor_toml(task))


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _dockerfile(source: str) -> str:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        "# Written by `flywheel tasks export --format harbor`: the task's repository in WORKDIR, on the Python\n"
        "# and the pytest the task was validated with.\n"
        f"FROM python:{python}\n"
        f"RUN pip install --no-cache-dir pytest=={metadata.version('pytest')}\n"
        f"WORKDIR {WORKDIR}\n"
        f"COPY {source} {WORKDIR}/\n"
    )


def _test_sh(task: Task) -> str:
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
            f"cd {WORKDIR}",
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


def _solve_sh(patch: str) -> str:
    delim = "FLYWHEEL_PATCH"
    while delim in patch.splitlines():
        delim += "_"
    body = patch if patch.endswith("\n") else patch + "\n"
    return (
        "#!/bin/bash\n"
        "# Written by `flywheel tasks export --format harbor`: applies the task's reference fix.\n"
        "set -euo pipefail\n"
        f"cd {WORKDIR}\n"
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
    except TypeError as e:
        raise FlywheelError(f"{task.id}: meta cannot be written to task.toml ({e})") from None
    lines += ["", "[verifier]", f"timeout_sec = {float(task.timeout_s)!r}"]
    lines += ["", "[agent]", f"timeout_sec = {AGENT_TIMEOUT_S!r}", ""]
    return "\n".join(lines)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
