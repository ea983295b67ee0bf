"""Scripted oracles: models that solve a task through the tools using its reference solution.

`scripted` acts in a realistic order — run the tests, view the code around the bug, edit, run the tests
again, submit. `scripted-noisy` adds seeded detours (listing files, grepping, viewing other code,
redundant test runs) and occasional mistakes (an edit whose old text does not match, a malformed action),
so its trajectories vary in length and cost; they are the imitation data for the tiny base model. Both
read the task's reference solution (an oracle's privilege), so they are for tests, demos and data, never
reported as model results.

Each call is stateless: the plan is recomputed from the task and a seed, and the step is the number of
assistant turns so far. The oracle answers in whichever format the request asks for: native tool calls
when tools are offered, the tagged text format otherwise.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

from flywheel.harness.actions import Action, render_tagged
from flywheel.protocols import Completion, Request
from flywheel.seeding import stable_seed
from flywheel.tasks.format import load_task
from flywheel.tasks.patch import parse_patch


def _count_tokens(text: str) -> int:
    return len(text) // 4 + 1  # a tokenizer-free estimate, about 4 characters a token


@lru_cache(maxsize=4096)
def fix_actions(task_dir: str) -> tuple[list[Action], list[Action]]:
    """(views, edits) that apply the task's reference solution through the `view` and `edit` tools.

    Each changed file is viewed whole (what an engineer without the oracle's privilege would do too), and
    each hunk becomes the smallest edit: its changed lines only, widened until `old` is unique.
    """
    task = load_task(task_dir)
    views: list[Action] = []
    edits: list[Action] = []
    for fp in parse_patch(task.solution_patch):
        if fp.old_path is None:
            new = "".join(ln[1:] for _, body in fp.hunks for ln in body if ln[0] == "+")
            edits.append(Action("edit", {"path": fp.new_path, "old": "", "new": new}))
            continue
        if fp.new_path is None:
            edits.append(Action("shell", {"command": f"rm {fp.old_path}"}))
            continue
        source = (task.repo / fp.old_path).read_text()
        views.append(Action("view", {"path": fp.old_path}))
        for start, body in fp.hunks:
            old, new = _unique(source, *_changed_lines(start, body))
            edits.append(Action("edit", {"path": fp.old_path, "old": old, "new": new}))
    return views, edits


def _changed_lines(start: int, body: list[str]) -> tuple[int, str, str]:
    """(first old line, old, new) of a hunk from its first to its last changed line: the smallest edit.

    `start` is the hunk's first old line (1-based); a pure insertion is anchored on the line above it.
    """
    changed = [i for i, ln in enumerate(body) if ln[0] in "+-"]
    lo, hi = (changed[0], changed[-1] + 1) if changed else (0, len(body))
    if not any(ln[0] == "-" for ln in body[lo:hi]) and lo > 0:
        lo -= 1
    line = start + sum(ln[0] != "+" for ln in body[:lo])
    old = "".join(ln[1:] for ln in body[lo:hi] if ln[0] != "+")
    new = "".join(ln[1:] for ln in body[lo:hi] if ln[0] != "-")
    return line, old, new


def _unique(source: str, line: int, old: str, new: str) -> tuple[str, str]:
    """Widen `old` (and `new` alike) with the source lines after it (before it, at the end of the file)
    until `old` occurs once; `old` starts at 1-based `line` of `source`."""
    lines = source.splitlines(keepends=True)
    lo, hi = line - 1, line - 1 + len(old.splitlines())
    while source.count(old) > 1 and (lo > 0 or hi < len(lines)):
        if hi < len(lines):
            old, new, hi = old + lines[hi], new + lines[hi], hi + 1
        else:
            lo -= 1
            old, new = lines[lo] + old, lines[lo] + new
    return old, new


def plan(task_dir: str, noisy: bool, seed: int) -> list[Action | str]:
    """The oracle's actions for one episode; a `str` entry is a deliberately malformed turn."""
    views, edits = fix_actions(task_dir)
    steps: list[Action | str] = [Action("run_tests"), *views, *edits, Action("run_tests"), Action("submit")]
    if not noisy:
        return steps
    rng = random.Random(seed)
    task = load_task(task_dir)
    files = sorted(p.relative_to(task.repo).as_posix() for p in task.repo.rglob("*.py"))
    detours: list[Action | str] = [
        Action("shell", {"command": "ls"}),
        Action("shell", {"command": f"grep -n \"def \" {rng.choice(files)}"}),
        Action("view", {"path": rng.choice(files)}),
        Action("run_tests"),
        Action("shell", {"command": f"sed -n 1,20p {rng.choice(files)}"}),
        "I will look at the failing test first.",  # no action: a format error
    ]
    for _ in range(rng.choice([0, 1, 1, 2, 3, 4])):
        steps.insert(rng.randint(1, len(steps) - 2), rng.choice(detours))
    if edits and rng.random() < 0.25:  # a mistaken edit whose old text does not match, then the real one
        wrong = dict(edits[0].args, old=edits[0].args["old"].replace(" ", "  ", 1) + "#")
        steps.insert(steps.index(edits[0]), Action("edit", wrong))
    if rng.random() < 0.2:  # sometimes submits without re-running the tests
        steps.remove(steps[-2])
    return steps


class ScriptedModel:
    """The oracle as a `Model`: one turn of its plan per request."""

    native_tools = False  # speaks the tagged format unless the request offers tools

    def __init__(self, noisy: bool = False, seed: int = 0):
        self.noisy, self.seed = noisy, seed
        self.name = "scripted-noisy" if noisy else "scripted"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return [self._one(r) for r in requests]

    def _one(self, r: Request) -> Completion:
        task_dir = r.meta.get("task_dir")
        if not task_dir:
            return Completion("", finish_reason="error", error="scripted model needs the task (Request.meta['task_dir'])")
        episode = r.meta.get("episode", "")
        steps = plan(task_dir, self.noisy, stable_seed(self.seed, episode))
        step = sum(m["role"] == "assistant" for m in r.messages)
        action = steps[min(step, len(steps) - 1)]
        prompt_tokens = sum(_count_tokens(str(m.get("content") or "")) for m in r.messages)
        if isinstance(action, str):
            return Completion(action, prompt_tokens=prompt_tokens, completion_tokens=_count_tokens(action))
        if r.tools:
            call = {"id": f"call_{step}", "name": action.name, "arguments": dict(action.args)}
            return Completion("", prompt_tokens=prompt_tokens, completion_tokens=_count_tokens(str(action.args)) + 4, tool_calls=[call])
        text = render_tagged(action)
        return Completion(text, prompt_tokens=prompt_tokens, completion_tokens=_count_tokens(text))
