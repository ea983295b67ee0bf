"""Run a module's test functions against a candidate source, in-process, with a time limit.

Used in worker processes by the toybugs generator: faster than a pytest subprocess per candidate by two
orders of magnitude. Each test is a plain function call; a test passes when it returns. A candidate that
loops is interrupted by an interval timer; one that allocates wildly hits the worker's memory limit.
For a failing test, the failure is described for the bug report: for `assert CALL == EXPECTED`, the
value CALL actually returned; for `pytest.raises`, that nothing was raised; otherwise the exception.
"""

from __future__ import annotations

import ast
import resource
import signal
import sys
import traceback
import types

TEST_TIMEOUT_S = 1.0


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _limit_memory() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))


def evaluate(job: tuple[str, str, str]) -> dict:
    """{'passed': [...], 'failed': [...], 'failures': {test: description}} for one candidate."""
    name, source, tests = job
    _limit_memory()
    signal.signal(signal.SIGALRM, _alarm)
    result: dict = {"passed": [], "failed": [], "failures": {}}
    try:
        module = types.ModuleType(name)
        _with_timeout(lambda: exec(compile(source, f"{name}.py", "exec"), module.__dict__))
        sys.modules[name] = module
        test_mod = types.ModuleType(f"test_{name}")
        exec(compile(tests, f"test_{name}.py", "exec"), test_mod.__dict__)
    except BaseException:  # a candidate that does not import fails every test: useless, dropped
        sys.modules.pop(name, None)
        return result
    for test, fn in [(k, v) for k, v in vars(test_mod).items() if k.startswith("test_") and callable(v)]:
        try:
            _with_timeout(fn)
            result["passed"].append(test)
        except _Timeout:
            return {"passed": [], "failed": [], "failures": {}}  # loops: dropped
        except BaseException as e:  # noqa: BLE001 - a failing test is data here
            result["failed"].append(test)
            result["failures"][test] = describe(e, tests)
    sys.modules.pop(name, None)
    return result


def _with_timeout(fn) -> None:
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    try:
        fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(error: BaseException, tests: str) -> dict:
    """A bug-report description of a failing test from its exception and the failing statement."""
    frames = [
        f for f, _ in traceback.walk_tb(error.__traceback__) if f.f_code.co_filename.startswith("test_")
    ]
    frame = frames[-1] if frames else None
    stmt = _statement(tests, frame.f_lineno) if frame else None
    if type(error).__name__ == "Failed" and "DID NOT RAISE" in str(error):
        call, expected = _raises_call(tests, frame.f_lineno if frame else 0)
        return {"kind": "no_raise", "call": call or "the call", "expected": expected or "an error"}
    if isinstance(error, AssertionError) and isinstance(stmt, ast.Assert) and frame is not None:
        test = stmt.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            call, expected = ast.unparse(test.left), ast.unparse(test.comparators[0])
            try:
                actual = eval(compile(call, "<call>", "eval"), frame.f_globals, frame.f_locals)
                return {"kind": "compare", "call": call, "actual": _short(actual), "expected": expected}
            except BaseException as e:  # noqa: BLE001
                return {"kind": "error", "call": call, "actual": f"{type(e).__name__}: {e}"[:100]}
        return {"kind": "compare", "call": ast.unparse(test), "actual": "False", "expected": "True"}
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare):
        call = ast.unparse(stmt.test.left)
    else:
        call = ast.unparse(stmt) if stmt is not None else "the test"
    return {"kind": "error", "call": call[:100], "actual": f"{type(error).__name__}: {error}"[:100]}


def _statement(source: str, line: int) -> ast.stmt | None:
    best = None
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.stmt)
            and not isinstance(node, (ast.FunctionDef, ast.With))
            and node.lineno <= line <= (node.end_lineno or node.lineno)
        ):
            best = node
    return best


def _raises_call(source: str, line: int) -> tuple[str | None, str | None]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.With) and node.lineno <= line <= (node.end_lineno or node.lineno):
            ctx = node.items[0].context_expr
            expected = ast.unparse(ctx.args[0]) if isinstance(ctx, ast.Call) and ctx.args else None
            body = node.body[-1]
            call = ast.unparse(body.value if isinstance(body, ast.Expr) else body)
            return call, expected
    return None, None
