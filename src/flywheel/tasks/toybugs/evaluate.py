"""Run a module's test functions against many candidate versions of it, quickly and safely.

A pytest subprocess per candidate costs a few hundred milliseconds; suite generation evaluates about a
thousand candidates. So each candidate is run in-process in a long-lived worker: the candidate text is
executed into a fresh module object registered under the module's import name, the test module into
another, and every `test_*` function is called in file order (as pytest would, one module instance per
session). A test passes when it returns without raising. The test module is compiled once per worker
with each `assert left == right` rewritten to record both values when they differ, so a failure can be
reported as "`f(x)` returned A, expected B".

Guards, because candidates are deliberately broken code:
- CPU time: a profiling timer (`ITIMER_PROF`, 1 s of CPU per candidate by default) interrupts endless
  loops in Python code. CPU time rather than wall time, so a busy machine does not change which
  candidates survive; typical candidates need a few milliseconds, so the margin is large.
- wall time: the parent kills and replaces a worker that does not answer within `wall_seconds` (C code
  that ignores signals, a hard crash), dropping that candidate.
- memory: the worker's address space is capped (`RLIMIT_AS`), so a runaway allocation raises
  MemoryError in the worker instead of exhausting the machine.
- candidates that hit any guard, recurse without end, or fail to import are dropped (status != "ok").
Workers start with `PYTHONHASHSEED=0` so set ordering is the same in every run.

Not covered: the workers are not a sandbox. Candidates are mutants of the shipped modules, which do no
I/O; this is a speed harness for trusted-but-buggy code, not for code from elsewhere.
"""

from __future__ import annotations

import ast
import contextlib
import multiprocessing
import os
import resource
import signal
import sys
import time
import types
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

_RECORD = "__toybugs_eq__"


@dataclass(frozen=True)
class Job:
    module: str  # import name of the module under test, e.g. "roman"
    source: str  # the candidate module text
    tests: str  # the test module text
    test_module: str = "test_module"  # its name (the file name in tracebacks is `<name>.py`)


@dataclass(frozen=True)
class Failure:
    """Why one test failed, in terms a bug report can use."""

    kind: str  # "mismatch" (assert a == b), "assert" (another assert), "raise", "no_raise"
    line: int  # line in the test module of the test's statement that failed
    left: str = ""  # mismatch: source of the left-hand side
    actual: str = ""  # mismatch: repr of the left-hand value
    expected: str = ""  # mismatch: repr of the right-hand value
    error: str = ""  # raise / no_raise: "TypeError: message"


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok", or why the candidate was dropped: timeout, memory, recursion, load, crash
    results: tuple[tuple[str, bool], ...] = ()  # (test function, passed), in file order
    failures: dict[str, Failure] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [name for name, ok in self.results if not ok]

    @property
    def passed(self) -> list[str]:
        return [name for name, ok in self.results if ok]


# ----------------------------------------------------------------------------------- the parent


class Evaluator:
    """A few worker processes that evaluate jobs; use as a context manager."""

    def __init__(
        self, workers: int = 2, cpu_seconds: float = 1.0, wall_seconds: float = 10.0, memory_mb: int = 2048
    ) -> None:
        self.size = max(1, workers)
        self.cpu_seconds, self.wall_seconds, self.memory_mb = cpu_seconds, wall_seconds, memory_mb
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []

    def __enter__(self) -> Evaluator:
        self._workers = [self._start() for _ in range(self.size)]
        return self

    def __exit__(self, *exc) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []

    def run(self, jobs: list[Job]) -> list[Outcome]:
        """Outcomes of `jobs`, in order (independent of which worker ran what)."""
        results: list[Outcome | None] = [None] * len(jobs)
        pending = deque(range(len(jobs)))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (job index, start time)
        while pending or busy:
            for slot in range(len(self._workers)):
                if slot not in busy and pending:
                    i = pending.popleft()
                    self._workers[slot].conn.send(jobs[i])
                    busy[slot] = (i, time.monotonic())
            ready = set(wait([self._workers[s].conn for s in busy], timeout=0.5))
            for slot, (i, started) in list(busy.items()):
                worker = self._workers[slot]
                if worker.conn in ready:
                    try:
                        results[i] = worker.conn.recv()
                    except (EOFError, OSError):
                        results[i] = Outcome("crash")
                        self._replace(slot)
                    del busy[slot]
                elif time.monotonic() - started > self.wall_seconds:
                    results[i] = Outcome("timeout")
                    self._replace(slot)
                    del busy[slot]
        return [r if r is not None else Outcome("crash") for r in results]

    def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        saved = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = "0"
        try:
            proc = self._ctx.Process(
                target=worker_main, args=(child, self.cpu_seconds, self.memory_mb), daemon=True
            )
            proc.start()
        finally:
            if saved is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = saved
        child.close()
        return _Worker(proc, parent)

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = self._start()


@dataclass
class _Worker:
    proc: multiprocessing.process.BaseProcess
    conn: Connection

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(None)
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.kill()
        self.conn.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


# ----------------------------------------------------------------------------------- the worker


class _Timeout(BaseException):
    """Raised by the CPU timer; a BaseException so `except Exception` in candidate code cannot eat it."""


def _on_timer(signum, frame) -> None:
    raise _Timeout


def worker_main(conn: Connection, cpu_seconds: float, memory_mb: int) -> None:
    """Serve jobs from `conn` until it sends None."""
    limit = memory_mb * 1024 * 1024
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGPROF, _on_timer)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker
    sys.setrecursionlimit(400)
    import pytest  # noqa: F401 - test modules import it; load it once, outside the timed part

    compiled: dict[str, types.CodeType] = {}
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(evaluate(job, cpu_seconds, compiled))


def evaluate(job: Job, cpu_seconds: float = 1.0, cache: dict | None = None) -> Outcome:
    """Run `job` here, under the CPU timer (call it in a worker, not in a process you care about)."""
    cache = {} if cache is None else cache
    if job.tests not in cache:
        cache.clear()
        cache[job.tests] = compile_tests(job.tests, job.test_module)
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
    try:
        return _run(job, cache[job.tests])
    except _Timeout:
        return Outcome("timeout")
    except MemoryError:
        return Outcome("memory")
    except RecursionError:
        return Outcome("recursion")
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def compile_tests(tests: str, name: str) -> types.CodeType:
    """The test module with each `assert a == b` recording a and b when they differ."""
    tree = _RecordCompares().visit(ast.parse(tests))
    return compile(ast.fix_missing_locations(tree), f"{name}.py", "exec")


class _RecordCompares(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
            call = ast.Call(ast.Name(_RECORD, ast.Load()), [t.left, t.comparators[0], ast.Constant(ast.unparse(t.left))], [])
            node.test = ast.copy_location(call, t)
        return node


def _run(job: Job, code: types.CodeType) -> Outcome:
    saved = sys.modules.get(job.module)
    module = types.ModuleType(job.module)
    module.__file__ = f"{job.module}.py"
    sys.modules[job.module] = module
    try:
        try:
            exec(compile(job.source, module.__file__, "exec"), module.__dict__)
        except (_Timeout, MemoryError, RecursionError):
            raise
        except BaseException:
            return Outcome("load")
        recorded: dict[str, tuple[str, str, str]] = {}
        tests = types.ModuleType(job.test_module)
        tests.__dict__[_RECORD] = _recorder(recorded)
        exec(code, tests.__dict__)
        return _call_tests(tests, recorded, f"{job.test_module}.py")
    finally:
        if saved is None:
            sys.modules.pop(job.module, None)
        else:
            sys.modules[job.module] = saved


def _recorder(recorded: dict):
    def check(left, right, left_src: str) -> bool:
        equal = left == right
        if not equal:
            recorded["last"] = (left_src, _repr(left), _repr(right))
        return equal

    return check


def _call_tests(tests: types.ModuleType, recorded: dict, filename: str) -> Outcome:
    functions = [
        f
        for name, f in vars(tests).items()
        if name.startswith("test_") and isinstance(f, types.FunctionType) and f.__code__.co_filename == filename
    ]
    functions.sort(key=lambda f: f.__code__.co_firstlineno)
    results, failures = [], {}
    for fn in functions:
        recorded.clear()
        try:
            fn()
        except (_Timeout, MemoryError, RecursionError):
            raise
        except BaseException as exc:  # pytest.raises failures are BaseExceptions
            results.append((fn.__name__, False))
            failures[fn.__name__] = _failure(exc, fn, filename, recorded)
        else:
            results.append((fn.__name__, True))
    return Outcome("ok", tuple(results), failures)


def _failure(exc: BaseException, fn: types.FunctionType, filename: str, recorded: dict) -> Failure:
    line = fn.__code__.co_firstlineno
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == filename and code.co_name == fn.__name__:
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(exc, AssertionError) and "last" in recorded:
        left, actual, expected = recorded["last"]
        return Failure("mismatch", line, left=left, actual=actual, expected=expected)
    if isinstance(exc, AssertionError):
        return Failure("assert", line)
    message = _first_line(exc)
    if type(exc).__name__ == "Failed" and "DID NOT RAISE" in message:
        return Failure("no_raise", line, error=message)
    return Failure("raise", line, error=f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


def _first_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ in candidate code
        return ""
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def _repr(value, limit: int = 200) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
