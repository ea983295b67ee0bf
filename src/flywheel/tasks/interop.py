"""Other systems' task formats, in and out: Harbor task directories and SWE-bench instances.

`import_tasks(fmt, src, out)` reads tasks another system wrote and writes them as a suite of our task
directories; `export_tasks(fmt, tasks, out)` writes our tasks in the other format. Either builds its whole
output in a temporary sibling of `out` and renames it into place at the end, so `out` is absent or complete,
never half-written. Input we cannot carry is refused with one `FlywheelError` naming the task (or instance)
and what is missing.

What maps to what:

| ours | Harbor | SWE-bench |
| --- | --- | --- |
| `id` | the task directory's name | `instance_id` |
| `instruction` | `instruction.md` | `problem_statement` |
| `repo/` | `environment/`: what the Dockerfile COPYs into WORKDIR | `DIR/OWNER__NAME` at `base_commit` |
| `tests/` (hidden) | `tests/` but `test.sh` (laid over WORKDIR) | the files `test_patch` adds or changes |
| `solution.patch` | `solution/solve.sh`: a diff it feeds to `patch` or `git apply` | `patch` |
| `fail_to_pass` | the tests `test.sh` runs with pytest, all of them | `FAIL_TO_PASS` (pytest node ids) |
| `pass_to_pass` | none | `PASS_TO_PASS` |
| `timeout_s` | `[verifier] timeout_sec` | 600 s |

An export also carries every field of ours (`[metadata.flywheel]` in Harbor's task.toml, an extra
`flywheel` field in each SWE-bench instance: test_command, timeout_s, meta, the split of the tests, and for
SWE-bench the hidden files `test_patch` leaves unchanged), so ours → Harbor → ours and ours → SWE-bench →
ours give the same task back. An imported SWE-bench instance keeps `FAIL_TO_PASS`/`PASS_TO_PASS` (as lists)
and its other plain fields in `meta`; a Harbor task keeps its `[metadata]` scalars.

What is not covered:
- a Harbor task that needs its own container: a base image other than python or a bare OS (ubuntu,
  debian, alpine: the tests then run on our Python), a RUN other than `pip install` of packages
  installed here (their versions are not compared), COPY from another stage, ENV other than Python's and
  pip's switches, docker-compose, a prebuilt image; tests that read the container's absolute paths; a
  test.sh that runs anything but one pytest run and its bookkeeping (installing pytest, writing the
  reward). We run no Docker, so these are refused.
- Harbor has no fail/pass split: every test test.sh runs is fail_to_pass, and `flywheel tasks validate`
  reports those that already pass before the fix. A parametrized test is refused unless test.sh names it
  by node id, since only pytest knows its ids.
- A solve.sh that edits files other than through a diff (`cat > file`, `sed -i`, a script) gives no
  reference patch; the task is refused.
- SWE-bench instances whose tests are not pytest node ids (Django's and sympy's runners) are refused.
  An exported `base_commit` is synthetic: the SHA-1 of the repository's files, not a git commit; the
  repository lies beside `instances.jsonl` as a plain copy, one per task (`repos/flywheel__<id>`).
- An exported Harbor test.sh is graded by pytest's exit status: a skipped test passes there (our grader
  counts it failed), and the grader's exploit checks do not travel.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import io
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from flywheel.errors import FlywheelError, PatchError, TaskError
from flywheel.tasks.format import Task, _toml_value, load_task, task_toml
from flywheel.tasks.patch import apply_patch, make_patch, parse_patch

__all__ = ["FORMATS", "check_format", "import_tasks", "export_tasks", "tree_digest"]

FORMATS = ("harbor", "swebench")
WORKDIR = "/app"  # where an exported Harbor image holds the repository
AGENT_TIMEOUT_S = 600.0  # an exported Harbor task's [agent] timeout_sec: ours has no per-task agent limit
DEFAULT_TIMEOUT_S = 600.0  # grading time limit when the source names none (Harbor's verifier default)
DEFAULT_TEST_COMMAND = "python -m pytest -q"
INSTANCES = "instances.jsonl"
_SKIP = {".git", "__pycache__", ".pytest_cache"}


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise FlywheelError(f"unknown format '{fmt}' (formats: {', '.join(FORMATS)})")


# ------------------------------------------------------------------------------------------- drafts


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


_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def _parse(patch: str, what: str) -> list[Any]:
    try:
        files = parse_patch(patch)
    except PatchError as e:
        raise FlywheelError(f"{what}: {e}") from None
    if not files:
        raise FlywheelError(f"{what} is empty")
    return files


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


@contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """A temporary sibling of `out` to build in, renamed to `out` when the block ends without an error."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FlywheelError(f"{out}: exists and is not empty; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)
        yield tmp
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except TaskError as e:  # a written task that does not load: name it under `out`, not the staging path
        shutil.rmtree(tmp, ignore_errors=True)
        raise TaskError(str(e).replace(str(tmp), str(out))) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


def _safe_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", name).lstrip("-._") or "task"


def _plain(value: Any) -> bool:
    """A value task.toml's meta can hold: a scalar or a list of scalars."""
    scalar = (str, int, float, bool)
    return isinstance(value, scalar) or (
        isinstance(value, list) and all(isinstance(v, scalar) for v in value)
    )


# ------------------------------------------------------------------------------------------- entry points


def import_tasks(fmt: str, src: Path, out: Path, repos: Path | None = None) -> list[Task]:
    """Read `src` in format `fmt` and write its tasks as a suite directory `out`; the tasks, loaded."""
    check_format(fmt)
    src, out = Path(src), Path(out)
    if not src.exists():
        raise FlywheelError(f"{src}: no such file or directory")
    if fmt == "harbor" and repos is not None:
        raise FlywheelError("--repos is for --format swebench")
    seen: set[str] = set()
    with _staged(out) as tmp, tempfile.TemporaryDirectory(prefix="flywheel-import-") as scratch:
        drafts = _harbor_drafts(src) if fmt == "harbor" else _swebench_drafts(src, repos, Path(scratch))
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


def _labelled(label: str, read: Callable[[], Draft], tests: tuple[str, str]) -> tuple[str, Draft]:
    """`read()`, checked, with any refusal prefixed by `label` (the task or instance it is about)."""
    try:
        draft = read()
        _check(draft, tests)
    except FlywheelError as e:
        raise FlywheelError(f"{label}: {e}") from None
    return label, draft


# ------------------------------------------------------------------------------------------- shell scripts


class Command(NamedTuple):
    """One simple command of a shell line: its words and its redirections (operator, target)."""

    words: list[str]
    redirects: list[tuple[str, str]]


_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "time"}
_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def shell_commands(line: str) -> list[Command]:
    """Split one shell line into simple commands (at `;`, `&&`, `||`, `|`), leading keywords and
    assignments dropped. A rough reader, enough for the scripts tasks ship; raises ValueError on
    unbalanced quotes."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    tokens = list(lex)
    commands: list[Command] = []
    words: list[str] = []
    redirects: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok and set(tok) <= set("();<>|&"):
            if "<" in tok or ">" in tok:
                if words and words[-1].isdigit():  # `2>&1`: the 2 is a descriptor, not a word
                    words.pop()
                redirects.append((tok, tokens[i + 1] if i + 1 < len(tokens) else ""))
                i += 1
            else:
                commands.append(Command(words, redirects))
                words, redirects = [], []
        else:
            words.append(tok)
        i += 1
    commands.append(Command(words, redirects))
    out = []
    for cmd in commands:
        ws = list(cmd.words)
        while ws and (ws[0] in _KEYWORDS or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", ws[0])):
            ws.pop(0)
        if ws or cmd.redirects:
            out.append(Command(ws, cmd.redirects))
    return out


def read_script(text: str) -> Iterator[tuple[int, list[Command], str | None]]:
    """(line number, commands, here-document body or None) for each logical line of a shell script."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        start, logical = i + 1, lines[i].rstrip("\n")
        while logical.endswith("\\") and i + 1 < len(lines):
            i += 1
            logical = logical[:-1] + " " + lines[i].rstrip("\n")
        i += 1
        try:
            commands = shell_commands(logical)
        except ValueError as e:
            raise FlywheelError(f"line {start} cannot be read as shell ({e})") from None
        body = None
        heredoc = _HEREDOC.search(logical)
        if heredoc:
            dash, delim = heredoc.group(1), heredoc.group(3)
            body_lines = []
            while i < len(lines) and (lines[i].lstrip("\t") if dash else lines[i]).rstrip("\n") != delim:
                body_lines.append(lines[i].lstrip("\t") if dash else lines[i])
                i += 1
            if i == len(lines):
                raise FlywheelError(f"line {start}: here-document '{delim}' is never closed")
            i += 1
            body = "".join(body_lines)
        yield start, commands, body


def _pytest_args(words: list[str]) -> list[str] | None:
    """The arguments of a pytest run (`pytest`, `python -m pytest`, `uvx … pytest`, `uv run … pytest`),
    or None when `words` is not one."""
    name = posixpath.basename(words[0])
    if name == "pytest":
        return words[1:]
    if re.fullmatch(r"python[0-9.]*", name) and words[1:3] == ["-m", "pytest"]:
        return words[3:]
    if name in ("uvx", "uv"):
        i = 2 if name == "uv" and words[1:2] == ["run"] else 1
        if name == "uv" and i == 1:
            return None
        while i < len(words) and words[i].startswith("-"):
            i += 1 + (words[i] in _UV_VALUED)
        return _pytest_args(words[i:]) if i < len(words) else None
    return None


_UV_VALUED = {"-p", "--python", "-w", "--with", "--from", "--with-requirements", "--with-editable"}
_PYTEST_VALUED = {
    "-p", "-k", "-m", "-o", "-c", "-W", "-n", "-r", "--ctrf", "--junitxml", "--junit-xml", "--rootdir",
    "--tb", "--deselect", "--ignore", "--ignore-glob", "--maxfail", "--timeout", "--durations",
    "--basetemp", "--confcutdir", "--log-level", "--json-report-file", "--override-ini", "--capture",
    "--import-mode",
}  # fmt: skip
_PYTEST_SELECTING = {"-k", "-m", "--deselect", "--ignore", "--ignore-glob", "--lf", "--last-failed", "--sw"}
_BOOKKEEPING = {
    "set", "cd", "mkdir", "echo", "printf", "exit", "cp", "true", "false", ":", "[", "[[", "test",
    "source", ".", "export", "apt-get", "apt", "curl", "wget", "pip", "pip3", "chmod", "tee",
}  # fmt: skip


def pytest_targets(script: str, workdir: str) -> list[str]:
    """What test.sh's one pytest run runs, as workspace paths (with `::name` for node ids; `.` is the root).

    `/tests/<p>` and `WORKDIR/<p>` are both workspace path `<p>` (Harbor uploads tests/ to /tests; we lay
    the hidden tests over the repository). Other commands may only be bookkeeping: installing pytest,
    copying the tests, writing the reward."""
    cwd, runs = workdir, []
    for n, commands, _ in read_script(script):
        for cmd in commands:
            if not cmd.words:
                continue
            args = _pytest_args(cmd.words)
            name = posixpath.basename(cmd.words[0])
            if args is not None:
                runs.append((n, cwd, args))
            elif name == "cd" and len(cmd.words) > 1:
                cwd = posixpath.normpath(posixpath.join(cwd, cmd.words[1]))
            elif not _bookkeeping(cmd.words):
                raise FlywheelError(
                    f"tests/test.sh line {n} runs `{' '.join(cmd.words)}`, not pytest: only a pytest run "
                    "is graded without Docker"
                )
    if len(runs) != 1:
        lines = ", ".join(str(n) for n, _, _ in runs)
        raise FlywheelError(
            "tests/test.sh runs no pytest"
            if not runs
            else f"tests/test.sh runs pytest {len(runs)} times (lines {lines})"
        )
    n, cwd, args = runs[0]
    targets, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            option = arg.split("=", 1)[0]
            if option in _PYTEST_SELECTING:
                raise FlywheelError(
                    f"tests/test.sh line {n}: pytest {option} selects tests, which the import cannot carry"
                )
            skip = "=" not in arg and option in _PYTEST_VALUED
            continue
        targets.append(_workspace_path(arg, cwd, workdir, n))
    return targets or [_workspace_path(".", cwd, workdir, n)]


def _bookkeeping(words: list[str]) -> bool:
    """A command a test.sh runs around its pytest run: setting up pytest, copying tests, the reward."""
    name = posixpath.basename(words[0])
    return (
        name in _BOOKKEEPING
        or (name == "uv" and words[1:2] in (["pip"], ["venv"]))
        or (re.fullmatch(r"python[0-9.]*", name) is not None and words[1:3] == ["-m", "pip"])
        or (name in ("sh", "bash") and all(w.startswith("-") for w in words[1:]))  # `curl … | sh`
    )


def _workspace_path(arg: str, cwd: str, workdir: str, line: int) -> str:
    path, sep, name = arg.partition("::")
    full = posixpath.normpath(posixpath.join(cwd, path))
    for root in ("/tests", workdir):
        if full == root or full.startswith(root.rstrip("/") + "/"):
            return posixpath.relpath(full, root) + sep + name
    raise FlywheelError(
        f"tests/test.sh line {line}: pytest runs {arg}, which is under neither /tests nor {workdir}"
    )


def _is_test_module(path: str) -> bool:
    name = posixpath.basename(path)
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def collect_test_ids(path: str, source: str) -> list[str]:
    """pytest node ids of the test functions in one module, read from its AST (pytest's default rules:
    `test*` functions, `Test*` classes without `__init__`, unittest `*TestCase` subclasses)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise FlywheelError(f"{path} is not valid Python ({e.msg}, line {e.lineno})") from None
    ids = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            _not_parametrized(path, node, node.name)
            ids.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef) and _test_class(node):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                    _not_parametrized(path, node, node.name)
                    _not_parametrized(path, item, f"{node.name}::{item.name}")
                    ids.append(f"{path}::{node.name}::{item.name}")
    return ids


def _test_class(node: ast.ClassDef) -> bool:
    unittest = any(ast.unparse(b).endswith("TestCase") for b in node.bases)
    has_init = any(isinstance(i, ast.FunctionDef) and i.name == "__init__" for i in node.body)
    return unittest or (node.name.startswith("Test") and not has_init)


def _not_parametrized(path: str, node: ast.AST, name: str) -> None:
    if any("parametrize" in ast.unparse(d) for d in getattr(node, "decorator_list", [])):
        raise FlywheelError(
            f"{path}::{name} is parametrized: only pytest knows its ids; name them in test.sh as node ids"
        )


def solve_patch(script: str, solution_files: Mapping[str, str]) -> str | None:
    """The diff a solve.sh applies, or None: here-documents fed to `patch`/`git apply` directly or through
    a file, and files of solution/ it hands them."""
    written: dict[str, str] = {}
    patches: list[str] = []
    for _, commands, body in read_script(script):
        applying = [c for c in commands if c.words and _applies_patch(c.words)]
        if body is not None:
            if applying:
                patches.append(body)
                continue
            for cmd in commands:
                targets = [t for op, t in cmd.redirects if op in (">", ">>")]
                if cmd.words and cmd.words[0] == "tee":
                    targets += [w for w in cmd.words[1:] if not w.startswith("-")]
                written.update(dict.fromkeys(targets, body))
            continue
        for cmd in applying:
            for name in [*cmd.words[1:], *(t for op, t in cmd.redirects if op == "<")]:
                rel = name[len("/solution/") :] if name.startswith("/solution/") else name
                text = written.get(name, solution_files.get(rel))
                if text is not None:
                    patches.append(text)
    return "".join(patches) or None


def _applies_patch(words: list[str]) -> bool:
    name = posixpath.basename(words[0])
    return name == "patch" or (name == "git" and "apply" in words[1:4])


# ------------------------------------------------------------------------------------------- Dockerfiles


class DockerPlan(NamedTuple):
    """What a Dockerfile we can run without Docker does: the repository's place and what it copies there."""

    workdir: str
    copies: list[tuple[list[str], str, bool]]  # (context sources, absolute destination, into a directory)


_HARMLESS = {
    "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "ARG", "MAINTAINER", "USER", "VOLUME", "STOPSIGNAL", "SHELL",
}  # fmt: skip
_HARMLESS_ENV = {
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_ROOT_USER_ACTION", "DEBIAN_FRONTEND", "LANG", "LC_ALL",
}  # fmt: skip


def dockerfile_instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) of a Dockerfile: continuations joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        word, *rest = (buf + stripped).split(None, 1)
        out.append((start, word.upper(), rest[0].strip() if rest else ""))
        buf = ""
    if buf:
        word, *rest = buf.split(None, 1)
        out.append((start, word.upper(), rest[0].strip() if rest else ""))
    return out


def docker_plan(text: str, context: Mapping[str, Path]) -> DockerPlan:
    """Read a Dockerfile whose image is a Python image plus files; raise FlywheelError naming the first
    instruction that needs its own Docker environment. `context` is the build context's files."""
    workdir: str | None = None
    base: str | None = None
    copies = []
    for n, instr, args in dockerfile_instructions(text):
        where = f"environment/Dockerfile line {n}"
        if instr == "FROM":
            image = args.split()[0] if args else ""
            if base is not None:
                raise _needs_docker(f"{where}: a multi-stage build")
            if not _python_image(image):
                raise _needs_docker(f"{where}: base image {image or '?'} is neither python nor a bare OS")
            base = image
        elif instr == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir or "/", _unquote(args)))
        elif instr in ("COPY", "ADD"):
            copies.append(_copy(where, instr, args, workdir or "/"))
        elif instr == "RUN":
            _check_run(where, args, context)
        elif instr == "ENV":
            _check_env(where, args)
        elif instr not in _HARMLESS:
            raise _needs_docker(f"{where}: {instr} {args}".strip())
    if base is None:
        raise FlywheelError("environment/Dockerfile has no FROM")
    if workdir is None:
        raise FlywheelError("environment/Dockerfile sets no WORKDIR, so the repository's place is unknown")
    return DockerPlan(workdir, copies)


def _needs_docker(what: str) -> FlywheelError:
    return FlywheelError(f"needs its own Docker environment ({what}); flywheel runs tasks without Docker")


def _unquote(text: str) -> str:
    words = shlex.split(text)
    return words[0] if words else ""


def _python_image(image: str) -> bool:
    """A python image, or a bare OS image a test.sh can install pytest on (Harbor's template uses ubuntu)."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return name in ("python", "ubuntu", "debian", "alpine") and "$" not in image


def _copy(where: str, instr: str, args: str, cwd: str) -> tuple[list[str], str, bool]:
    try:
        parts = json.loads(args) if args.startswith("[") else shlex.split(args)
    except ValueError:
        raise FlywheelError(f"{where}: cannot read {instr} {args}") from None
    flags = [p for p in parts if p.startswith("--")]
    parts = [p for p in parts if not p.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        raise _needs_docker(f"{where}: {instr} from another image or stage")
    if len(parts) < 2:
        raise FlywheelError(f"{where}: {instr} needs a source and a destination")
    *sources, dest = parts
    for s in sources:
        if instr == "ADD" and (re.match(r"^[a-z]+://|^git@", s) or re.search(r"\.(tar(\.\w+)?|tgz)$", s)):
            raise _needs_docker(f"{where}: ADD {s} (a download or an archive)")
    target = posixpath.normpath(posixpath.join(cwd, dest))
    return sources, target, dest.endswith("/") or len(sources) > 1 or target == cwd


def _check_run(where: str, args: str, context: Mapping[str, Path]) -> None:
    if args.startswith("["):
        try:
            args = shlex.join(json.loads(args))
        except (ValueError, TypeError):
            raise FlywheelError(f"{where}: cannot read RUN {args}") from None
    for part in re.split(r"\s*(?:&&|\|\||;)\s*", args):
        try:
            words = shlex.split(part)
        except ValueError:
            raise FlywheelError(f"{where}: cannot read RUN {args}") from None
        if not words or words[0] == "mkdir":
            continue
        requirements = _pip_install(words, context)
        if requirements is None:
            raise _needs_docker(f"{where}: RUN {part}")
        for req in requirements:
            name = re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*", req)
            if name is None or "://" in req:
                raise _needs_docker(f"{where}: pip installs {req}")
            try:
                metadata.distribution(name.group(0))
            except metadata.PackageNotFoundError:
                raise _needs_docker(f"{where}: pip installs {req}, which is not installed here") from None


def _pip_install(words: list[str], context: Mapping[str, Path]) -> list[str] | None:
    """The requirements a `pip install` command names (reading `-r` files from the build context), or None
    when `words` is not one."""
    for prefix in (["pip"], ["pip3"], ["uv", "pip"], ["python", "-m", "pip"], ["python3", "-m", "pip"]):
        if words[: len(prefix)] == prefix and words[len(prefix) : len(prefix) + 1] == ["install"]:
            rest = words[len(prefix) + 1 :]
            break
    else:
        return None
    reqs, i = [], 0
    while i < len(rest):
        word = rest[i]
        if word in ("-r", "--requirement"):
            src = context.get(posixpath.normpath(rest[i + 1] if i + 1 < len(rest) else ""))
            if src is None:
                raise FlywheelError(f"pip reads {rest[i + 1 : i + 2] or ['?']}, which is not in environment/")
            reqs += _requirements(src.read_text())
            i += 2
        elif word in ("-e", "--editable") or word.startswith((".", "/")):
            raise _needs_docker(f"pip installs a local project ({' '.join(words)})")
        elif word in ("-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f", "--find-links"):
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            reqs.append(word)
            i += 1
    return reqs


def _requirements(text: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def _check_env(where: str, args: str) -> None:
    words = shlex.split(args)
    names = [w.split("=", 1)[0] for w in words] if words and "=" in words[0] else words[:1]
    for name in names:
        if name not in _HARMLESS_ENV:
            raise _needs_docker(f"{where}: ENV {name}")


def _copied_files(env: Path, plan: DockerPlan) -> dict[str, Path]:
    """The repository the plan's COPYs build: workdir-relative path -> file in the build context."""
    ignore = _dockerignore(env)
    context = {rel: p for rel, p in _files(env).items() if not any(_ignored(rel, pat) for pat in ignore)}
    repo: dict[str, Path] = {}
    for sources, dest, into_dir in plan.copies:
        for source in sources:
            src = posixpath.normpath(source.lstrip("/") or ".")
            if src == ".":
                found = dict(context)
            elif src in context:
                found = {posixpath.basename(src) if into_dir else "": context[src]}
            else:
                found = {rel[len(src) + 1 :]: p for rel, p in context.items() if rel.startswith(src + "/")}
                if not found and any(c in src for c in "*?["):
                    found = {posixpath.basename(r): p for r, p in context.items() if _match(r, src)}
            if not found:
                raise FlywheelError(f"environment/Dockerfile copies {source}, which is not in environment/")
            for rel, p in found.items():
                target = posixpath.normpath(posixpath.join(dest, rel)) if rel else dest
                inside = posixpath.relpath(target, plan.workdir)
                if inside == "." or inside.startswith("../"):
                    raise FlywheelError(
                        f"environment/Dockerfile copies {source} to {target}, outside WORKDIR {plan.workdir}"
                    )
                repo[inside] = p
    return dict(sorted(repo.items()))


def _dockerignore(env: Path) -> list[str]:
    path = env / ".dockerignore"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line.strip("/") for line in lines if line and not line.startswith(("#", "!"))]


def _ignored(rel: str, pattern: str) -> bool:
    return _match(rel, pattern) or rel.startswith(pattern + "/")


def _match(rel: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(rel, pattern)


# ------------------------------------------------------------------------------------------- Harbor


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


def _text(path: Path) -> str:
    if not path.is_file():
        raise FlywheelError(f"{path.parent.name}/{path.name} is missing")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise FlywheelError(f"{path.name} is not text") from None


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


# ------------------------------------------------------------------------------------------- SWE-bench

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
