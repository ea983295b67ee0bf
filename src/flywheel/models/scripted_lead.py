"""`scripted-lead`: an oracle-backed planner that stands in for a frontier model as Fusion's lead.

It is a backend like the teachers (`get_model("scripted-lead")`), not a learned model, and its results
are never reported as a model's: it localises the bug with the task's reference fix (an oracle's
privilege, as `flywheel.models.scripted`'s teachers have), for Fusion's tests and its CPU demonstration. What it does is what a lead should:

1. view each file the fix changes;
2. delegate a plan in words: which file, which function, what is wrong, what to change;
3. after each report, review it: when the report's review requests changes (`flywheel.fusion.review`: a
   test broken, a gamed test), go on as after failing tests; otherwise run the tests, and submit when
   they pass;
4. when they still fail after the first delegation, delegate a correction, once;
5. when they still fail after the second, take over: apply the reference edits itself, run the tests, and
   submit.

Offered no `delegate` (a plain agent's harness), it does the work itself: view, edit, run the tests,
submit. Like the teachers it is stateless: each turn is recomputed from the task and its own earlier
actions in the conversation, in whichever format the request asks for. It is priced at frontier rates,
`scripted-lead` in `flywheel.harness.cost.PRICES` (an assumption, stated there).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from flywheel.actions import LEAD_TOOL_NAMES, Action, FormatError, parse_tagged, render_tagged
from flywheel.models.scripted import count_tokens, fix_actions
from flywheel.protocols import Completion, Request
from flywheel.tasks.format import load_task

RUN, SUBMIT = Action("run_tests"), Action("submit")
REVIEW_CHANGES = "review: request changes"  # the last line of a report whose review asks for changes


def load_scripted_lead(spec: str = "scripted-lead", **opts: Any) -> ScriptedLead:
    """`scripted-lead` (options are ignored)."""
    return ScriptedLead()


class ScriptedLead:
    """The oracle-backed lead as a `Model`: one turn of its plan per request."""

    name = "scripted-lead"
    native_tools = False  # speaks the tagged format unless the request offers tools

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return [self._one(r) for r in requests]

    def _one(self, r: Request) -> Completion:
        task_dir = r.meta.get("task_dir")
        if not task_dir:
            return Completion("", finish_reason="error", error="scripted-lead needs Request.meta['task_dir']")
        can_delegate = any(t["function"]["name"] == "delegate" for t in r.tools or []) or "<delegate>" in str(
            r.messages[0].get("content") or ""
        )
        history = [name for m in r.messages if m["role"] == "assistant" for name in [action_name(m)]]
        observation = str(r.messages[-1].get("content") or "")
        action = lead_step(task_dir, history, observation, can_delegate)
        prompt_tokens = sum(count_tokens(str(m.get("content") or "")) for m in r.messages)
        if r.tools:
            call = {"id": f"call_{len(history)}", "name": action.name, "arguments": dict(action.args)}
            tokens = count_tokens(str(action.args)) + 4
            return Completion("", prompt_tokens=prompt_tokens, completion_tokens=tokens, tool_calls=[call])
        text = render_tagged(action)
        return Completion(text, prompt_tokens=prompt_tokens, completion_tokens=count_tokens(text))


def lead_step(task_dir: str, history: list[str], observation: str, can_delegate: bool) -> Action:
    """The lead's next action, given the names of its earlier actions and the last observation."""
    views, edits = fix_actions(task_dir)
    n = len(history)
    if n < len(views):
        return views[n]
    if not can_delegate:
        return _at([*edits, RUN, SUBMIT], n - len(views))
    last = history[-1] if history else None
    if last == "delegate" and REVIEW_CHANGES not in observation:
        return RUN
    if last == "run_tests" and observation.startswith("exit code 0"):
        return SUBMIT
    delegations = history.count("delegate")
    if delegations < 2:
        return Action("delegate", {"instruction": plan_text(task_dir, correction=delegations == 1)})
    second = [i for i, name in enumerate(history) if name == "delegate"][1]
    reviewed = history[second + 1 : second + 2] == ["run_tests"]  # the tests it ran on the second report
    return _at([*edits, RUN, SUBMIT], n - second - 1 - reviewed)  # taking over after the failing review


def plan_text(task_dir: str, correction: bool = False) -> str:
    """The plan in words: for each reference edit, the file, the function, what is wrong, what to write."""
    task = load_task(task_dir)
    parts = ["The tests still fail after your work; look again." if correction else ""]
    for a in fix_actions(task_dir)[1]:
        if a.name != "edit":
            parts.append(f"Run `{a.args['command']}`.")
            continue
        path, old, new = a.args["path"], a.args["old"], a.args["new"]
        if not old:
            parts.append(f"Create {path} with:\n{new}")
            continue
        source = (task.repo / path).read_text()
        line = source[: source.index(old)].count("\n") + 1
        function = _enclosing(source, line)
        where = f"in `{function}`, " if function else ""
        must = "must read exactly" if correction else "should be"
        parts.append(f"In {path}, {where}line {line} is wrong: `{old.strip()}` {must} `{new.strip()}`.")
    parts.append("Make only that change, run the tests, and submit.")
    return " ".join(p for p in parts if p)


def _enclosing(source: str, line: int) -> str | None:
    """The name of the innermost `def` or `class` at or above 1-based `line`."""
    for text in reversed(source.splitlines()[:line]):
        m = re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", text)
        if m:
            return m.group(1)
    return None


def action_name(message: dict[str, Any]) -> str:
    """The action an assistant message took ("" when it took none)."""
    calls = message.get("tool_calls") or []
    if calls:
        return str(calls[0].get("function", {}).get("name", ""))
    try:
        return parse_tagged(str(message.get("content") or ""), LEAD_TOOL_NAMES).name
    except FormatError:
        return ""


def _at(steps: list[Action], i: int) -> Action:
    return steps[min(max(i, 0), len(steps) - 1)]
