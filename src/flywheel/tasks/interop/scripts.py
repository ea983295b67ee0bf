"""Harbor's shell scripts, read without running them: the one pytest run of a `tests/test.sh` and the
tests it collects, and the diff a `solution/solve.sh` applies.

A rough shell reader (`shell_commands`, `read_script`), enough for the scripts tasks ship: simple commands
split at `;`, `&&`, `||` and `|`, continuations joined, here-documents read."""

from __future__ import annotations

import ast
import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from flywheel.errors import FlywheelError


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
