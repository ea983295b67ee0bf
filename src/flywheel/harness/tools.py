"""The tools an agent acts through, executed against one workspace.

`view` and `edit` work on the workspace's files directly (paths are resolved inside the workspace; a
path or symlink that leads outside it is refused). `shell` and `run_tests` run in the sandbox. Hidden
tests never reach the workspace: `run_tests` runs the task's visible test command on the repository as
the agent has it, and the grader restores the hidden tests only in its own copy. Its output leaves out
pytest's wall time (`2 passed in 0.08s` reads `2 passed`): it tells the agent nothing about the bug, and
with it the same episode would read differently on every run, so imitation data and deterministic runs
could not repeat.

A sandbox that fails (`sandbox.run` raises: it could not start the command, or broke running it) is not
the command's doing: the call comes back with `sandbox_error` set, and the harness ends the episode on it
as an infrastructure failure instead of showing the model the exception as if the command had printed
it. A command that fails (a non-zero exit, a timeout's 124) is an ordinary observation.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from flywheel.actions import Action
from flywheel.protocols import Environment, Limits, Sandbox
from flywheel.sandbox.warm import EpisodeSandbox
from flywheel.tasks.format import Task

VIEW_LINES = 120  # lines shown by a `view` without a range
OBSERVATION_BYTES = 4000  # tool output kept per observation (head and tail)
_DURATION = re.compile(
    r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?(?=(?: =+)?$)", re.M
)  # pytest's summary: ` in 0.08s`
_CACHES = {"__pycache__", ".pytest_cache"}  # what running the tests writes


@dataclass
class ToolResult:
    text: str
    ok: bool = True  # False for a refused call (bad path, non-unique `old`, …)
    edited: bool = False  # the workspace changed
    submitted: bool = False
    seconds: float = 0.0  # time spent in the sandbox
    sandbox_error: str | None = None  # the sandbox itself failed (it raised): the call has no result


class Tools:
    def __init__(
        self,
        task: Task,
        workspace: Path,
        sandbox: Sandbox,
        command_timeout_s: float = 30.0,
        warm_pytest: bool = False,
    ):
        self.task, self.workspace, self.sandbox = task, workspace.resolve(), sandbox
        self.limits = Limits(timeout_s=command_timeout_s, output_bytes=OBSERVATION_BYTES)
        self.warm_pytest = warm_pytest
        self.episode: EpisodeSandbox | None = None

    def close(self) -> None:
        """End the episode's warm pytest, if any (idempotent)."""
        if self.episode is not None:
            self.episode.close()
            self.episode = None
        self.warm_pytest = False

    def execute(self, action: Action) -> ToolResult:
        """Run one action. A call no file system or process can take (a NUL byte in an argument, a path
        through a file) is refused with an error observation, as a bad path is: models write such things."""
        handler = getattr(self, f"_{action.name}")
        if any(isinstance(v, str) and "\0" in v for v in action.args.values()):
            return ToolResult(f"error: the {action.name} call holds a NUL byte", ok=False)
        try:
            return handler(**action.args)
        except OSError as e:  # a path the model wrote that the file system refuses (a file as a directory)
            if action.name not in ("view", "edit"):
                raise  # the workspace unreadable around a command: not the model's doing, never hidden
            return ToolResult(f"error: {e.strerror or e}: {action.args.get('path')!r}"[:300], ok=False)

    # -- tools ----------------------------------------------------------------------------------------

    def _shell(self, command: str) -> ToolResult:
        before = self._stat()
        result = self._run(["bash", "-c", command])
        result.edited = self._stat() != before
        return result

    def _run_tests(self) -> ToolResult:
        result = self._run(["bash", "-c", self.task.test_command])
        result.text = _DURATION.sub("", result.text)
        return result

    def _submit(self) -> ToolResult:
        return ToolResult("submitted", submitted=True)

    def _view(self, path: str, start: int | None = None, end: int | None = None) -> ToolResult:
        target = self._resolve(path)
        if isinstance(target, ToolResult):
            return target
        if not target.is_file():
            return ToolResult(f"error: {path} is not a file", ok=False)
        lines = target.read_text(errors="replace").splitlines()
        lo = max(start or 1, 1)
        hi = min(end or lo + VIEW_LINES - 1, len(lines))
        if lo > max(len(lines), 1):
            return ToolResult(f"error: {path} has {len(lines)} lines", ok=False)
        body = "\n".join(f"{n:4d}| {lines[n - 1]}" for n in range(lo, hi + 1))
        more = f"\n[{len(lines) - hi} more lines]" if hi < len(lines) else ""
        return ToolResult(body + more)

    def _edit(self, path: str, old: str, new: str) -> ToolResult:
        target = self._resolve(path)
        if isinstance(target, ToolResult):
            return target
        if old == "":
            if target.exists():
                return ToolResult(f"error: {path} exists; give the text to replace in `old`", ok=False)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(new)
            return ToolResult(f"created {path}", edited=True)
        if not target.is_file():
            return ToolResult(f"error: {path} is not a file", ok=False)
        text = target.read_text(errors="replace")
        count = text.count(old)
        if count == 1:
            target.write_text(text.replace(old, new, 1))
            line = text[: text.index(old)].count("\n") + 1
            return ToolResult(f"edited {path} at line {line}", edited=True)
        loose = reindented_edit(text, old, new) if count == 0 else None
        if loose is None:
            what = "not found" if count == 0 else f"found {count} times; make it unique"
            return ToolResult(f"error: the old text was {what} in {path}", ok=False)
        edited, line = loose
        target.write_text(edited)
        return ToolResult(
            f"edited {path} at line {line} (the old text matched with other indentation)", edited=True
        )

    # -- helpers --------------------------------------------------------------------------------------

    def _stat(self) -> dict[str, tuple[int, int]]:
        """(mtime, size) of each file but caches: a shell command that writes one has edited the workspace."""
        out = {}
        for p in self.workspace.rglob("*"):
            if not _CACHES.intersection(p.relative_to(self.workspace).parts) and p.is_file():
                st = p.stat()
                out[p.as_posix()] = (st.st_mtime_ns, st.st_size)
        return out

    def _run(self, argv: list[str]) -> ToolResult:
        try:
            if self.warm_pytest and self.episode is None:  # the first command opens the episode's sandbox
                # the warm parent runs the project's own Python: a task with an environment runs cold
                own = self.task.environment == Environment()
                self.episode = EpisodeSandbox.open(self.sandbox, self.workspace) if own else None
                self.warm_pytest = self.episode is not None
            if self.episode is not None:
                r = self.episode.run(argv, limits=self.limits)
            else:
                r = self.sandbox.run(
                    self.workspace, argv, limits=self.limits, environment=self.task.environment
                )
        except Exception as e:  # the sandbox's own failure, not the command's: never shown as its output
            return ToolResult("error: the sandbox failed", ok=False, sandbox_error=f"{type(e).__name__}: {e}")
        status = "timed out" if r.timed_out else f"exit code {r.exit_code}"
        return ToolResult(f"{status}\n{r.output}".rstrip(), seconds=r.wall_s)

    def _resolve(self, path: str) -> Path | ToolResult:
        p = Path(path)
        if any(len(part.encode()) > 255 for part in p.parts):
            return ToolResult(f"error: a name in {path[:80]!r}... is longer than 255 bytes", ok=False)
        if p.is_absolute():  # the repository's path inside the sandbox, as the agent sees it there
            workdir = Path(self.task.environment.workdir)
            p = p.relative_to(workdir) if p == workdir or workdir in p.parents else p
        target = (self.workspace / p).resolve()
        if target != self.workspace and self.workspace not in target.parents:
            return ToolResult(f"error: {shlex.quote(path)} is outside the repository", ok=False)
        return target


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def reindented_edit(text: str, old: str, new: str) -> tuple[str, int] | None:
    """(edited text, first line) when `old` matches one run of `text`'s lines up to a uniform indentation
    shift (and trailing spaces); `new` is shifted alike. None when no run, or more than one, matches.

    Small models copy code with the wrong indentation more often than any other slip; the edit is still
    exact in everything but the shift, which must be the same on every non-blank line.
    """
    want = old.splitlines()
    while want and not want[0].strip():
        want.pop(0)
    while want and not want[-1].strip():
        want.pop()
    lines = text.splitlines(keepends=True)
    if not want or any("\t" in w for w in want):
        return None
    key = [w.strip() for w in want]
    starts = [
        i for i in range(len(lines) - len(want) + 1) if [ln.strip() for ln in lines[i : i + len(want)]] == key
    ]
    if len(starts) != 1:
        return None
    i = starts[0]
    shifts = {_indent(lines[i + j]) - _indent(w) for j, w in enumerate(want) if w.strip()}
    if len(shifts) != 1:
        return None
    shift = shifts.pop()
    out = []
    for ln in new.splitlines():
        if not ln.strip():
            out.append(ln)
        elif shift >= 0:
            out.append(" " * shift + ln)
        else:
            out.append(ln[min(-shift, _indent(ln)) :])
    region_end = "\n" if lines[i + len(want) - 1].endswith("\n") else ""
    body = "\n".join(out) + (region_end if out else "")
    return "".join(lines[:i]) + body + "".join(lines[i + len(want) :]), i + 1
