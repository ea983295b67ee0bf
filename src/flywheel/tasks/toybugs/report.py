"""Bug reports written the way a user would: what was called, what came back, what was expected.

`bug_report` turns one failing test (its source and the `Failure` the evaluator captured) into an
instruction. A one-statement test becomes a one-sentence report naming the call and both values; a
longer test is quoted as a reproduction snippet. The phrasing is picked from a few templates by the
caller's seeded RNG. Reports never mention the module's source, line numbers or how the bug was made;
the generator additionally rejects a report that happens to contain a line of the fix.
"""

from __future__ import annotations

import ast
import random
import textwrap

from flywheel.tasks.toybugs.evaluate import Failure

_ONE_LINE_MISMATCH = (
    "`{left}` returns `{actual}`, but it should return `{expected}`.",
    "Calling `{left}` gives `{actual}`; I expected `{expected}`.",
    "Wrong result: `{left}` evaluates to `{actual}` instead of `{expected}`.",
    "I'm getting `{actual}` from `{left}`. The correct answer is `{expected}`.",
)
_SNIPPET_MISMATCH = (
    "Here is a reproduction:\n\n```python\n{snippet}\n```\n\nAt the end `{left}` is `{actual}`, but it should be `{expected}`.",
    "This sequence of calls misbehaves:\n\n```python\n{snippet}\n```\n\n`{left}` comes out as `{actual}`; expected `{expected}`.",
    "After running\n\n```python\n{snippet}\n```\n\n`{left}` is `{actual}`. It should be `{expected}`.",
)
_ASSERT = (
    "This check fails, but it should pass:\n\n```python\n{snippet}\n```",
    "After running the code below, `{expr}` is false, although it should hold.\n\n```python\n{snippet}\n```",
)
_ONE_LINE_RAISE = (
    "Calling `{expr}` crashes with `{error}`.{should}",
    "`{expr}` raises `{error}` instead of working.{should}",
)
_SNIPPET_RAISE = (
    "This raises `{error}`:\n\n```python\n{snippet}\n```\n\nIt should not raise.{should}",
    "I get `{error}` when I run:\n\n```python\n{snippet}\n```{should}",
)
_NO_RAISE = (
    "`{expr}` should raise `{exc}`, but it does not.",
    "I expected `{expr}` to be rejected with `{exc}`; instead it goes through without an error.",
    "Invalid input is accepted: `{expr}` does not raise `{exc}`.",
)
_CLOSERS = (
    "",
    "",
    " Could you fix this?",
    " Everything else in the module seems to work.",
    " The failing case is `{test}` in `{test_file}`.",
    " See `{test}` in `{test_file}`.",
)


def bug_report(tests_source: str, test_name: str, failure: Failure, test_file: str, rng: random.Random) -> str:
    """An instruction describing how test `test_name` of `tests_source` fails."""
    fn = _test_function(tests_source, test_name)
    stmt = _failing_statement(fn, failure.line)
    snippet = _snippet(tests_source, fn, stmt)
    one_line = stmt is fn.body[0]
    if failure.kind == "mismatch":
        pool = _ONE_LINE_MISMATCH if one_line else _SNIPPET_MISMATCH
        body = rng.choice(pool).format(
            left=failure.left, actual=failure.actual, expected=failure.expected, snippet=snippet
        )
    elif failure.kind == "assert":
        expr = ast.unparse(stmt.test) if isinstance(stmt, ast.Assert) else _source(tests_source, stmt)
        body = rng.choice(_ASSERT).format(expr=expr, snippet=snippet)
    elif failure.kind == "no_raise":
        expr, exc = _raises_parts(tests_source, stmt)
        body = rng.choice(_NO_RAISE).format(expr=expr, exc=exc)
    else:
        expr, expected = _call_and_expected(tests_source, stmt)
        should = f" The expected result is `{expected}`." if expected else ""
        pool = _ONE_LINE_RAISE if one_line else _SNIPPET_RAISE
        body = rng.choice(pool).format(expr=expr, error=failure.error, snippet=snippet, should=should)
    closer = rng.choice(_CLOSERS).format(test=test_name, test_file=test_file)
    return body + closer


def _test_function(source: str, name: str) -> ast.FunctionDef:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ValueError(f"no test function {name!r}")


def _failing_statement(fn: ast.FunctionDef, line: int) -> ast.stmt:
    for stmt in fn.body:
        if stmt.lineno <= line <= stmt.end_lineno:
            return stmt
    return fn.body[-1]


def _source(source: str, node: ast.AST) -> str:
    return ast.get_source_segment(source, node) or ast.unparse(node)


def _snippet(source: str, fn: ast.FunctionDef, upto: ast.stmt) -> str:
    lines = source.splitlines()[fn.body[0].lineno - 1 : upto.end_lineno]
    return textwrap.dedent("\n".join(lines)).strip("\n")


def _raises_parts(source: str, stmt: ast.stmt) -> tuple[str, str]:
    """For `with pytest.raises(E): body`, the first body statement and E."""
    if isinstance(stmt, ast.With) and stmt.items and isinstance(stmt.items[0].context_expr, ast.Call):
        call = stmt.items[0].context_expr
        exc = _source(source, call.args[0]) if call.args else "an error"
        inner = stmt.body[0]
        expr = inner.value if isinstance(inner, ast.Expr) else inner
        return _source(source, expr), exc
    return _source(source, stmt), "an error"


def _call_and_expected(source: str, stmt: ast.stmt) -> tuple[str, str]:
    """The expression a crashing statement evaluates, and the expected value if it states one."""
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1:
        if isinstance(stmt.test.ops[0], ast.Eq):
            return _source(source, stmt.test.left), _source(source, stmt.test.comparators[0])
    if isinstance(stmt, ast.Assert):
        return _source(source, stmt.test), ""
    if isinstance(stmt, ast.Expr):
        return _source(source, stmt.value), ""
    return _source(source, stmt), ""
