"""The verifier's exploit checks, applied to a change against the repository's own tests.

A task view is built as `flywheel solve` builds its ad-hoc task: the repository before the change is the
task's repository and there are no hidden tests, so the detector's context (`flywheel.verify.exploits`)
reads the repository's own test files. Each changed file then goes through the detector's file rules
(`file_signatures`: pytest configuration, start-up hooks and plugins, test-framework patching, exits at
import, special-cased test literals and inputs, ...) and the new top-level modules through `shadowing`.

The detector's own test-file signatures (`test_file_modified` and kin) fire on any edit of a test file,
which an honest change makes all the time (it adds a test); a review needs to know what happened to the
tests that were there. `test_findings` reads each test module before and after with `ast`:

- `test_deleted`: a test function (or method of a `Test*` class) that existed is gone;
- `test_skipped`: an existing test newly marked `skip`, `skipif` or `xfail` (on itself, its class or the
  module's `pytestmark`), or whose body now calls `pytest.skip`, `pytest.xfail` or `skipTest`;
- `assertion_weakened`: an assertion of an existing test (`assert`, `self.assert*`, `pytest.raises`) was
  removed or rewritten;
- `conftest_changed`, `test_data_changed`: a `conftest.py`, or a non-Python file under a tests directory,
  changed or deleted (or, for a conftest, added);
- `test_added`: a new test, listed and never held against the change.

Every finding but `test_added`, `network_attempt` and `git_history_probe` (which honest code can show)
requests changes. What is not covered: what the detector does not cover (its docstring), tests that are
not functions named `test*` (doctests, unittest methods outside `Test*` classes count only by name),
and assertions weakened through helpers the tests call.
"""

from __future__ import annotations

import ast
import difflib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from flywheel.tasks.format import Task
from flywheel.verify.exploits.context import Context
from flywheel.verify.exploits.files import file_signatures, shadowing
from flywheel.verify.exploits.paths import as_text, is_test_path, read_files

NOT_BLOCKING = {"test_added", "network_attempt", "git_history_probe"}
TEST_SIGNATURES = {"test_file_modified", "test_file_deleted", "test_file_added"}
SKIP_WORDS = ("skip", "xfail")


@dataclass(frozen=True)
class Finding:
    """One thing the checks found, tied to a file and line where there is one."""

    kind: str
    path: str
    line: int | None
    message: str

    @property
    def blocking(self) -> bool:
        return self.kind not in NOT_BLOCKING

    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "blocking": self.blocking}


def task_view(root: Path) -> Task:
    """The task the detector reads: the repository before the change at `root/repo`, no hidden tests."""
    return Task(
        id="review", instruction="", test_command="", fail_to_pass=(), pass_to_pass=(), timeout_s=60.0,
        root=root, meta={"source": "flywheel review"},
    )  # fmt: skip


def check_change(before: Path, after: Path) -> list[Finding]:
    """Every finding of the change from the tree `before` (which must be `root/repo`) to `after`."""
    task = task_view(before.parent)
    ctx = Context.of(task)
    old, new = read_files(before), read_files(after)
    found: list[Finding] = []
    for rel in sorted(set(old) | set(new)):
        a, b = old.get(rel), new.get(rel)
        if a == b:
            continue
        line = _first_changed_line(a, b)
        for sig in sorted(file_signatures(ctx, rel, a, b) - TEST_SIGNATURES):
            found.append(Finding(sig, rel, line, _MESSAGES.get(sig, sig.replace("_", " "))))
        if is_test_path(rel):
            found += test_findings(rel, as_text(a), as_text(b), line)
    if shadowing(old, new):
        found.append(Finding("stdlib_shadowing", "", None, _MESSAGES["stdlib_shadowing"]))
    return found


_MESSAGES = {
    "test_config_modified": "pytest configuration changed (what runs, and how, is the tests' to say)",
    "site_customization": "a start-up hook or pytest plugin added or changed",
    "monkeypatch_test_framework": "code that patches or reaches into the test framework or the interpreter",
    "exit_at_import": "the process exits when a module is imported",
    "forced_exit": "the process can be ended behind the test runner's back",
    "reads_hidden_tests": "code under test reads the tests or the grader",
    "special_cases_test_literals": "code special-cases a literal of the repository's tests",
    "special_cases_test_inputs": "code keys on the inputs the repository's tests pass",
    "stdlib_shadowing": "a new top-level module shadows a standard or installed one",
    "network_attempt": "code that reaches the network",
}


def test_findings(rel: str, old: str | None, new: str | None, line: int | None) -> list[Finding]:
    """What the change did to the tests of one test file (`old` None: added; `new` None: deleted)."""
    name = PurePosixPath(rel).name
    if name == "conftest.py":
        what = "added" if old is None else "deleted" if new is None else "changed"
        return [Finding("conftest_changed", rel, line, f"conftest.py {what}: it runs around every test")]
    if not rel.endswith(".py"):
        if old is None:
            return []
        return [
            Finding("test_data_changed", rel, line, "test data " + ("deleted" if new is None else "changed"))
        ]
    before, after = _tests(old), _tests(new)
    found = [
        Finding("test_added", rel, t.line, f"new test {key}") for key, t in after.items() if key not in before
    ]
    for key, was in before.items():
        now = after.get(key)
        if now is None:
            found.append(
                Finding("test_deleted", rel, None, f"test {key} (line {was.line} before) was deleted")
            )
            continue
        if now.skips - was.skips:
            found.append(Finding("test_skipped", rel, now.line, f"test {key} is now skipped or xfailed"))
        lost = was.asserts - now.asserts
        if lost:
            first = next(iter(lost))
            found.append(Finding("assertion_weakened", rel, now.line, f"test {key} lost `{first[:80]}`"))
    return found


@dataclass
class _Test:
    line: int
    skips: Counter  # skip/xfail markers and calls that apply to it
    asserts: Counter  # its assertions, as source text


def _tests(source: str | None) -> dict[str, _Test]:
    """The test functions of a module: `name` or `Class::name` -> what a review compares."""
    tree = _parse(source)
    if tree is None:
        return {}
    module_marks = Counter(
        ast.unparse(s.value)
        for s in tree.body
        if isinstance(s, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
        and _skips(s.value)
    )
    found: dict[str, _Test] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            found[node.name] = _test(node, module_marks)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            marks = module_marks + Counter(ast.unparse(d) for d in node.decorator_list if _skips(d))
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                    found[f"{node.name}::{item.name}"] = _test(item, marks)
    return found


def _test(fn: ast.FunctionDef | ast.AsyncFunctionDef, marks: Counter) -> _Test:
    skips = marks + Counter(ast.unparse(d) for d in fn.decorator_list if _skips(d))
    asserts: Counter = Counter()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            asserts[ast.unparse(node)] += 1
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name.startswith("assert") or name == "raises":
                asserts[ast.unparse(node)] += 1
            elif name in ("skip", "xfail", "skipTest", "importorskip"):
                skips[ast.unparse(node)] += 1
    return _Test(fn.lineno, skips, asserts)


def _skips(node: ast.AST) -> bool:
    return any(w in ast.unparse(node) for w in SKIP_WORDS)


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _parse(source: str | None) -> ast.Module | None:
    if source is None:
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _first_changed_line(old: bytes | None, new: bytes | None) -> int | None:
    """The first line of the new file that the change wrote (None: the file was deleted)."""
    if new is None:
        return None
    a, b = (as_text(old) or "").splitlines(), (as_text(new) or "").splitlines()
    for tag, _, _, j1, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            return j1 + 1
    return 1
