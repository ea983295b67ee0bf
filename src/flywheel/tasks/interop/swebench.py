"""SWE-bench instances, in and out: `read_instance` turns one (with a checkout of its repository) into
a draft of ours, `write_swebench` writes ours as `instances.jsonl` with each repository beside it.

An imported instance's environment (task.toml's `[environment]`) runs its repository at `/testbed`,
where SWE-bench's images keep it, with the requirements of `--environment FILE` (`read_environment_file`:
one requirements file for every instance, or a TOML/JSON mapping from `OWNER__NAME` to one, relative to
FILE) or, for an instance FILE does not cover, what its repository declares at `base_commit`
(`flywheel.tasks.declared`). Its Python is left unset (the project's own version): SWE-bench's `version`
is the package's version, not Python's, and the table that maps one to the other is SWE-bench's own. An
exported task carries its environment whole in the `flywheel` field, which an import reads first.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError, PatchError
from flywheel.protocols import Environment
from flywheel.tasks.declared import declared_requirements, read_requirements
from flywheel.tasks.format import Task, parse_environment
from flywheel.tasks.interop.draft import (
    _SKIP,
    DEFAULT_TEST_COMMAND,
    Draft,
    _files,
    _labelled,
    _parse,
    _plain,
    _strings,
    _table,
    _text,
    _timeout,
    tree_digest,
)
from flywheel.tasks.patch import apply_patch, make_patch

INSTANCES = "instances.jsonl"
WORKDIR = "/testbed"  # where SWE-bench's images hold the repository

_SWEBENCH_TESTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
SWEBENCH_FIELDS = (
    "instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS",
    "PASS_TO_PASS",
)  # fmt: skip


def read_instances(path: Path) -> list[Any]:
    """SWE-bench instances from a JSONL file or a JSON list."""
    text = _text(path)
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as e:
            raise FlywheelError(f"{path}: not valid JSON ({e})") from None
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except ValueError:
                    raise FlywheelError(f"{path} line {n}: not valid JSON") from None
    if not items:
        raise FlywheelError(f"{path}: no instances")
    return items


@dataclass(frozen=True)
class EnvironmentFile:
    """`--environment FILE`: the requirements of every instance, or of each repository it names."""

    path: Path
    every: tuple[str, ...] | None = None  # one requirements file for all instances
    by_repo: dict[str, tuple[str, ...]] = field(default_factory=dict)  # OWNER__NAME -> its requirements

    def requirements(self, repo_dir: str) -> tuple[str, ...] | None:
        """The requirements FILE gives the repository `repo_dir` (OWNER__NAME); None: FILE does not say."""
        return self.every if self.every is not None else self.by_repo.get(repo_dir)

    def check_repos(self, known: set[str]) -> None:
        """Refuse a key of the mapping that names none of the instances' repositories."""
        for key in self.by_repo:
            if key not in known:
                have = ", ".join(sorted(known)) or "none"
                raise FlywheelError(
                    f"--environment {self.path}: {key} names no repository of the instances ({have})"
                )


def read_environment_file(path: Path) -> EnvironmentFile:
    """A requirements file (any name but *.toml and *.json), or a TOML/JSON mapping from OWNER__NAME to a
    requirements file (relative to FILE's directory). One `FlywheelError` line for anything wrong."""
    path = Path(path)
    where = f"--environment {path}"
    if not path.is_file():
        raise FlywheelError(f"{where}: no such file")
    try:
        if path.suffix not in (".toml", ".json"):
            return EnvironmentFile(path, every=tuple(read_requirements(path)))
        mapping = _load_mapping(path, where)
        by_repo = {}
        for key, rel in mapping.items():
            if not isinstance(rel, str) or not rel.strip():
                raise FlywheelError(f"{where}: {key} must name a requirements file")
            if not (path.parent / rel).is_file():
                raise FlywheelError(f"{where}: {key}: {rel} is not a file (relative to {path.parent})")
            by_repo[key] = tuple(read_requirements(path.parent / rel))
    except FlywheelError as e:
        raise FlywheelError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
    return EnvironmentFile(path, by_repo=by_repo)


def _load_mapping(path: Path, where: str) -> dict[str, Any]:
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError, UnicodeDecodeError) as e:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise FlywheelError(f"{where}: not valid {kind} ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise FlywheelError(f"{where}: must map OWNER__NAME to a requirements file")
    return data


def _swebench_drafts(
    src: Path, repos: Path | None, scratch: Path, environment: Path | None = None
) -> Iterator[tuple[str, Draft]]:
    path = src
    if src.is_dir():
        path = next((src / n for n in (INSTANCES, "instances.json") if (src / n).is_file()), src / INSTANCES)
    repos = Path(repos) if repos is not None else path.parent / "repos"
    if not repos.is_dir():
        raise FlywheelError(f"{repos}: no repository checkouts here; pass --repos DIR (DIR/OWNER__NAME)")
    env_file = read_environment_file(environment) if environment is not None else None
    instances = read_instances(path)
    if env_file is not None:
        env_file.check_repos(
            {
                _repo_dir(i["repo"])
                for i in instances
                if isinstance(i, dict) and isinstance(i.get("repo"), str)
            }
        )
    for n, inst in enumerate(instances, 1):
        iid = inst.get("instance_id") if isinstance(inst, dict) else None
        label = f"instance {iid}" if isinstance(iid, str) and iid else f"instance #{n}"
        at = scratch / str(n)
        yield _labelled(label, partial(read_instance, inst, repos, at, env_file), _SWEBENCH_TESTS)
        shutil.rmtree(at, ignore_errors=True)


def _repo_dir(repo: str) -> str:
    """The directory name of a repository's checkout: OWNER__NAME."""
    return repo.replace("/", "__")


def read_instance(inst: Any, repos: Path, scratch: Path, env_file: EnvironmentFile | None = None) -> Draft:
    """One SWE-bench instance as a draft of ours; `scratch` is an empty directory for a git checkout;
    `env_file` gives the requirements of the repositories it names (else what each declares)."""
    if not isinstance(inst, dict):
        raise FlywheelError("not a JSON object")
    for key in SWEBENCH_FIELDS:
        if key not in inst:
            raise FlywheelError(f"missing field '{key}'")
    for key in SWEBENCH_FIELDS[:6]:
        if not isinstance(inst[key], str) or not (inst[key].strip() or key in ("patch", "test_patch")):
            raise FlywheelError(f"field '{key}' must be a non-empty string")
    f2p, p2p = (_test_list(inst, key) for key in ("FAIL_TO_PASS", "PASS_TO_PASS"))
    ours = inst.get("flywheel", {})
    if not isinstance(ours, dict):
        raise FlywheelError("field 'flywheel' must be an object")
    root = _checkout(repos / _repo_dir(inst["repo"]), inst["repo"], inst["base_commit"], scratch)
    repo = _files(root)
    hidden = _test_patch_files(inst["test_patch"], root)
    for rel in _strings(ours, "hidden_files", "field 'flywheel':"):  # hidden files test_patch leaves alone
        if rel not in hidden and rel in repo:
            hidden[rel] = repo[rel].read_bytes()
    meta = {"source": "swebench", "repo": inst["repo"], "base_commit": inst["base_commit"]}
    meta |= {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
    meta |= {k: v for k, v in inst.items() if k not in SWEBENCH_FIELDS and k != "flywheel" and _plain(v)}
    return Draft(
        id=inst["instance_id"],
        instruction=inst["problem_statement"],
        test_command=str(ours.get("test_command", DEFAULT_TEST_COMMAND)),
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        timeout_s=_timeout(ours, "timeout_s"),
        meta=_table(ours, "meta", "field 'flywheel':") if "meta" in ours else meta,
        repo=repo,
        hidden=hidden,
        patch=inst["patch"],
        environment=_environment(inst, ours, root, env_file),
    )


def _environment(
    inst: Mapping[str, Any], ours: Mapping[str, Any], root: Path, env_file: EnvironmentFile | None
) -> Environment:
    """The instance's environment: ours carried whole when it was exported by us, else /testbed; its
    requirements from `env_file` when that names them, else carried, else what the repository declares."""
    carried = "environment" in ours
    base = (
        parse_environment(ours["environment"], "field 'flywheel': environment")
        if carried
        else Environment(workdir=WORKDIR)
    )
    given = env_file.requirements(_repo_dir(inst["repo"])) if env_file is not None else None
    if given is not None:
        return replace(base, requirements=given)
    if carried:
        return base
    try:
        declared = declared_requirements(root)
    except FlywheelError as e:
        raise FlywheelError(f"{inst['repo']} at base_commit: {e}") from None
    return replace(base, requirements=tuple(declared))


def _test_list(inst: Mapping[str, Any], key: str) -> list[str]:
    value = inst[key]
    if isinstance(value, str):  # SWE-bench's datasets hold these as JSON-encoded strings
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FlywheelError(f"field '{key}' must be a list of test ids (or a JSON string of one)")
    return value


def _checkout(path: Path, repo: str, commit: str, scratch: Path) -> Path:
    """The repository's files at `commit`: a git checkout's commit (via git archive), or a plain copy."""
    if not path.is_dir():
        raise FlywheelError(f"{path} is missing: a checkout of {repo} at base_commit {commit}")
    if not (path / ".git").exists():
        return path
    run = subprocess.run(
        ["git", "-C", str(path), "archive", "--format=tar", commit], capture_output=True, check=False
    )
    if run.returncode != 0:
        err = run.stderr.decode(errors="replace").strip().splitlines()
        raise FlywheelError(f"{path}: no base_commit {commit} ({err[-1] if err else 'git archive failed'})")
    scratch.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(run.stdout)) as tar:
        tar.extractall(scratch, filter="data")
    return scratch


def _test_patch_files(test_patch: str, root: Path) -> dict[str, bytes]:
    """The files test_patch creates or changes, as they are after it."""
    files = _parse(test_patch, "test_patch")
    touched = {p for fp in files for p in (fp.old_path, fp.new_path) if p}
    try:
        before = {p: (root / p).read_text() for p in touched if (root / p).is_file()}
        after = apply_patch(before, test_patch)
    except (PatchError, UnicodeDecodeError) as e:
        raise FlywheelError(f"test_patch does not apply: {e}") from None
    gone = sorted(set(before) - set(after))
    if gone:
        raise FlywheelError(f"test_patch deletes {gone[0]}: hidden tests can only add or replace files")
    return {fp.new_path: after[fp.new_path].encode() for fp in files if fp.new_path}


def write_swebench(tasks: Sequence[Task], out: Path) -> None:
    """Write `tasks` as `out/instances.jsonl` with each repository under `out/repos/flywheel__<id>`."""
    lines = []
    for task in tasks:
        shutil.copytree(
            task.repo, out / "repos" / f"flywheel__{task.id}", ignore=shutil.ignore_patterns(*_SKIP)
        )
        try:
            hidden = {rel: (task.hidden_tests / rel).read_text() for rel in task.hidden_files()}
            before = {rel: (task.repo / rel).read_text() for rel in hidden if (task.repo / rel).is_file()}
        except UnicodeDecodeError as e:
            raise FlywheelError(
                f"{task.id}: a hidden test file is not text, and test_patch is ({e})"
            ) from None
        instance = {
            "instance_id": task.id,
            "repo": f"flywheel/{task.id}",
            "base_commit": tree_digest(task.repo),
            "patch": task.solution_patch,
            "test_patch": make_patch(before, hidden),
            "problem_statement": task.instruction,
            "FAIL_TO_PASS": list(task.fail_to_pass),
            "PASS_TO_PASS": list(task.pass_to_pass),
            "flywheel": {
                "test_command": task.test_command,
                "timeout_s": task.timeout_s,
                "meta": dict(task.meta),
                "hidden_files": task.hidden_files(),
                "environment": _environment_json(task.environment),
            },
        }
        lines.append(json.dumps(instance, ensure_ascii=False) + "\n")
    (out / INSTANCES).write_text("".join(lines))


def _environment_json(environment: Environment) -> dict[str, Any]:
    """An environment as task.toml's `[environment]` table holds it (what `parse_environment` reads)."""
    python = {"python": environment.python} if environment.python is not None else {}
    return {
        "requirements": list(environment.requirements),
        "env": dict(environment.env),
        "workdir": environment.workdir,
        **python,
    }
