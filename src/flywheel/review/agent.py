"""The review agent: one harness episode on a read-only copy of the changed repository, ending in a verdict.

The reviewer works through the harness's own tools (`view`, `shell`, `run_tests`, `submit`) in a copy of
the tree after the change, thrown away afterwards, so nothing it does reaches the repository or the tests
the review ran. The copy is read-only three ways: `edit` is answered by the harness's `ExtraTools` hook
with a refusal (`NO_EDITS`), commands run with the copy mounted read-only over the sandbox's working
directory (`ReadOnlySandbox`: a write fails with "Read-only file system", for root too), and its files
and directories lose their write permission (`read_only_copy`). Its task message (`review_prompt`) holds the
diff, the tests before and after, and the checks' findings, and asks for the verdict in its last message:

    VERDICT: request changes
    calc.py:2: this special-cases the input the test uses

`parse_verdict` reads that (a pure function): the decision, and comments tied to `file:line`. An episode
that ends without a verdict leaves the decision to the checks and the tests.

`ScriptedReviewer` is a fake for tests and demos: it views the first changed hunk, runs the tests and
then repeats what the checks said, so it can never add a finding of its own; a review made with it says
so and is never a result.

What is not covered: the harness's system prompt and effort marker speak of fixing a bug (the task
message says the work is a review); a sandbox backend that does not enforce `extra_ro` mounts (the
fallback without bubblewrap) lets commands write to the copy, which is still thrown away.
"""

from __future__ import annotations

import re
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from flywheel.actions import Action
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes
from flywheel.harness.agent import Episode, ExtraTools
from flywheel.harness.tools import ToolResult
from flywheel.protocols import Completion, Environment, Limits, Model, Request, RunResult, Sandbox
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.format import Task

SCRIPTED_REVIEWER = "scripted-reviewer"
DIFF_CHARS = 12000  # of the diff, in the reviewer's task message
APPROVE, CHANGES = "approve", "request changes"
CHECKS_BLOCK = "The checks request changes."
CHECKS_PASS = "The checks found nothing that requests changes."
_VERDICT = re.compile(r"^\W*verdict\W*:?\s*(approve[ds]?|request(?:s|ed)? changes)\b", re.I | re.M)
_COMMENT = re.compile(r"^\s*(?:[-*]\s*)?`?([\w./-]+\.\w+):(\d+)`?\s*[:-]?\s*(.+?)\s*$", re.M)
_ACTION = re.compile(r"<(?:shell|edit|view|run_tests|submit)\b", re.S)


@dataclass
class Comment:
    path: str
    line: int
    text: str


@dataclass
class ReviewerVerdict:
    """What the review agent concluded, and what its episode took."""

    model: str
    scripted: bool
    decision: str | None  # APPROVE, CHANGES, or None: no verdict was given
    comments: list[Comment] = field(default_factory=list)
    text: str = ""  # its last message
    ending: str | None = None
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0


def parse_verdict(text: str) -> tuple[str | None, list[Comment]]:
    """The decision (the last `VERDICT:` line) and the `file:line: comment` lines of a message."""
    found = _VERDICT.findall(text)
    decision = None if not found else APPROVE if found[-1].lower().startswith("approve") else CHANGES
    comments = [Comment(p, int(n), t) for p, n, t in _COMMENT.findall(text)]
    return decision, comments


def review_prompt(
    diff: str, instruction: str | None, tests: str, findings: Sequence[str], blocking: bool
) -> str:
    """The reviewer's task message: the change, what it was for, its tests, the checks' findings, and the
    form of the verdict."""
    shown = (
        diff if len(diff) <= DIFF_CHARS else diff[:DIFF_CHARS] + "\n[... the rest of the diff is elided]\n"
    )
    parts = [
        "Review a change to this repository. Your workspace holds the repository with the change applied; "
        "it is read-only: read the code, run commands and the tests, but do not edit.",
        f"The change was meant to: {instruction.strip()}" if instruction else "",
        f"The diff:\n{shown}",
        f"The tests:\n{tests}",
        "The checks found:\n" + ("\n".join(f"- {f}" for f in findings) if findings else "- nothing"),
        CHECKS_BLOCK if blocking else CHECKS_PASS,
        "Look for wrong fixes that make the tests pass, missed cases, and tests weakened or removed. When you "
        "are done, write your verdict in one message, then submit in the same message:\n"
        "VERDICT: approve (or VERDICT: request changes)\n"
        "path/to/file.py:LINE: one comment per line, tied to a line of the changed code",
    ]
    return "\n\n".join(p for p in parts if p)


def read_only_copy(tree: Path, dest: Path) -> None:
    """Copy `tree` to `dest` and take write permission off every file and directory in it."""
    shutil.copytree(tree, dest, symlinks=True)
    for p in [*dest.rglob("*"), dest]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def writable_again(root: Path) -> None:
    """Give write permission back to the owner, so that `root` can be removed."""
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def _refuse_edit(episode: Episode, action: Action) -> ToolResult:
    return ToolResult("error: the repository is read-only in a review: edits are refused", ok=False)


NO_EDITS = ExtraTools(
    names=("edit",),
    schema=(),
    help="This is a review: the repository is read-only, and `edit` is refused.",
    stop=(),
    run=_refuse_edit,
)


class ReadOnlySandbox:
    """`inner`, with every command's workspace mounted read-only over the working directory."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner, self.name = inner, f"{inner.name} (read-only workspace)"

    def run(
        self,
        workspace: Path,
        argv: Sequence[str],
        *,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        extra_ro: Mapping[Path, Path] | None = None,
        extra_rw: Mapping[Path, Path] | None = None,
        environment: Environment | None = None,
    ) -> RunResult:
        workdir = Path((environment or Environment()).workdir)
        return self.inner.run(
            workspace, argv, limits=limits, env=env, extra_ro={**(extra_ro or {}), Path(workspace): workdir},
            extra_rw=extra_rw, environment=environment,
        )  # fmt: skip


def run_reviewer(
    model: Model,
    after: Path,
    work: Path,
    prompt: str,
    test_command: str,
    *,
    cfg: HarnessConfig | None = None,
    sandbox: Sandbox | None = None,
    effort: str = "medium",
    environment: Environment = Environment(),
) -> ReviewerVerdict:
    """One review episode by `model` on a read-only copy of `after` (made under `work`); its verdict."""
    ws = work / "reviewer" / "repo"
    read_only_copy(after, ws)
    task = Task(
        id="review", instruction=prompt, test_command=test_command, fail_to_pass=(), pass_to_pass=(),
        timeout_s=600.0, root=ws.parent, meta={"source": "flywheel review"}, environment=environment,
    )  # fmt: skip
    try:
        spec = EpisodeSpec(task, get_effort(effort), workspace=ws)
        cfg = replace(cfg or HarnessConfig(), warm_pytest=False)  # every command through the read-only mount
        box = ReadOnlySandbox(sandbox or get_sandbox())
        [record] = run_episodes([spec], model, cfg=cfg, sandbox=box, concurrency=1, extra_tools=NO_EDITS)
    finally:
        writable_again(ws.parent)
    return verdict_of(record, scripted=getattr(model, "scripted", False))


def verdict_of(record: Trajectory, scripted: bool = False) -> ReviewerVerdict:
    """The verdict in a review episode's record: the last assistant message that gives one."""
    text, decision, comments = "", None, []
    for turn in reversed(record.turns):
        if turn["role"] == "assistant" and not turn.get("summary"):
            said = _ACTION.split(turn.get("text") or "", maxsplit=1)[0].strip()
            decision, comments = parse_verdict(said)
            if decision is not None:
                text = said
                break
    return ReviewerVerdict(
        record.model, scripted, decision, comments, text, record.ending, record.n_turns,
        record.prompt_tokens, record.completion_tokens, record.cost,
    )  # fmt: skip


class ScriptedReviewer:
    """A fake reviewer for tests and demos: view the first changed hunk, run the tests, repeat the checks."""

    native_tools = False
    scripted = True

    def __init__(self, name: str = SCRIPTED_REVIEWER) -> None:
        self.name = name

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return [self._answer(r) for r in requests]

    def _answer(self, request: Request) -> Completion:
        prompt = str(request.messages[1]["content"]) if len(request.messages) > 1 else ""
        path, line = _first_hunk(prompt)
        plan = [
            f'<view path="{path}" start="{max(line - 3, 1)}" end="{line + 3}"/>'
            if path
            else "<shell>ls</shell>",
            "<run_tests/>",
            _scripted_verdict(prompt, path, line) + "\n<submit/>",
        ]
        text = plan[min(int(request.meta.get("turn", 0)), len(plan) - 1)]
        return Completion(text, prompt_tokens=len(prompt) // 4, completion_tokens=len(text) // 4)


def _first_hunk(prompt: str) -> tuple[str | None, int]:
    """The first changed file of the diff in the prompt, and the first line of its first hunk."""
    m = re.search(r"^\+\+\+ b/(\S+)\n@@ -\d+(?:,\d+)? \+(\d+)", prompt, re.M)
    return (m.group(1), int(m.group(2))) if m else (None, 1)


def _scripted_verdict(prompt: str, path: str | None, line: int) -> str:
    if CHECKS_BLOCK in prompt:
        flagged = re.findall(r"^- (\S+:\d+) .*?: (.+)$", prompt, re.M)
        comments = [f"{where}: {what}" for where, what in flagged] or [f"{path}:{line}: see the checks"]
        return "\n".join(["VERDICT: request changes", *comments])
    return f"VERDICT: approve\n{path or 'README'}:{line}: the change reads as the fix it says it is"
