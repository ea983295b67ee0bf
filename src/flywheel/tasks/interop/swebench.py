"""SWE-bench instances, in and out: `read_instance` turns one (with a checkout of its repository) into
a draft of ours, `write_swebench` writes ours as `instances.jsonl` with each repository beside it."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError, PatchError
from flywheel.tasks.format import Task
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


def _swebench_drafts(src: Path, repos: Path | None, scratch: Path) -> Iterator[tuple[str, Draft]]:
    path = src
    if src.is_dir():
        path = next((src / n for n in (INSTANCES, "instances.json") if (src / n).is_file()), src / INSTANCES)
    repos = Path(repos) if repos is not None else path.parent / "repos"
    if not repos.is_dir():
        raise FlywheelError(f"{repos}: no repository checkouts here; pass --repos DIR (DIR/OWNER__NAME)")
    for n, inst in enumerate(read_instances(path), 1):
        iid = inst.get("instance_id") if isinstance(inst, dict) else None
        label = f"instance {iid}" if isinstance(iid, str) and iid else f"instance #{n}"
        at = scratch / str(n)
        yield _labelled(label, lambda inst=inst, at=at: read_instance(inst, repos, at), _SWEBENCH_TESTS)
        shutil.rmtree(at, ignore_errors=True)


def read_instance(inst: Any, repos: Path, scratch: Path) -> Draft:
    """One SWE-bench instance as a draft of ours; `scratch` is an empty directory for a git checkout."""
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
    root = _checkout(repos / inst["repo"].replace("/", "__"), inst["repo"], inst["base_commit"], scratch)
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
    )


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
            },
        }
        lines.append(json.dumps(instance, ensure_ascii=False) + "\n")
    (out / INSTANCES).write_text("".join(lines))
