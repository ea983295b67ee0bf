"""`scripted-sweep-lead`: a delegating lead with no oracle, built on `scripted-sweep`.

`scripted-lead` localises the bug with the task's reference fix and fixes it in four turns, so a sidekick
can only add cost to it. This lead must search, as a frontier model without the answer would: it knows
no more than `scripted-sweep` does (the task's test command, a seed and the effort level), and its own
work, the sweep, is long and is priced at frontier rates (`scripted-sweep-lead` in
`flywheel.harness.cost.PRICES`, `scripted-lead`'s, an assumption stated there). It is a backend like the
teachers (`get_model("scripted-sweep-lead")`), not a learned model, and its results are never reported
as a model's: it exists to measure Fusion with a lead whose own work is expensive.

Offered no `delegate` (a plain agent's harness) it is `scripted-sweep` at the episode's effort level: the
same actions for the same seed, through the same code (`ScriptedModel`); only its name and price differ.
Offered `delegate`, it:

1. delegates the search in words (`DELEGATION`: the same words for every task, nothing of the fix);
2. after each report, reviews it: when the report's review requests changes (`flywheel.fusion.review`),
   it goes on as after failing tests; otherwise it runs the tests, and submits when they pass;
3. when they still fail after the first delegation, delegates once more with a correction (`CORRECTION`);
4. when they still fail after the second, takes over: runs `scripted-sweep`'s sweeps itself, in its
   seeded order within the effort level's quota (`takeover_plan`), and submits after the sweep that
   prints `fixed`, or after the last.

Like the teachers it is stateless: each turn is recomputed from the task, the seed, the effort level and
its own earlier actions with their results in the conversation (`trail`, `lead_action`), in whichever
format the request asks for (native tool calls when tools are offered, tagged text otherwise). Asked for
a summary (`Request.meta["summary"]`, the harness's compaction), it writes its trail into it (`Actions so
far: delegate; run_tests, failing; ...`), which is how it finds its place when the conversation restarts
from that summary; alone, `scripted-sweep`'s summary does the same.

What is not covered: on taking over it does not undo what the sidekick changed (it knows the module only
as it finds it), so a sidekick's wrong edit can stand in the way of its sweeps. A summary that the harness
later shortens (its fallback when a restarted conversation does not fit: old observations elided) loses
the trail, and the lead its place, as the teachers lose theirs. On the frontier prices its own sweeps are
dear: at medium effort a take-over after two reports costs about $0.04 of the level's $0.05.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from flywheel.actions import Action, render_tagged
from flywheel.models.scripted import SWEEP_LOOKS, ScriptedModel, count_tokens, sweep_plan
from flywheel.models.scripted_lead import REVIEW_CHANGES, action_name
from flywheel.models.toolcalls import action_call, offered_tools
from flywheel.protocols import Completion, Request
from flywheel.seeding import stable_seed
from flywheel.tasks.format import load_task

DELEGATION = (
    "The tests fail: find the bug in the module and fix it. Sweep the module for the inverse of one "
    "mutation operator at a time (a comparison, an arithmetic or boolean operator, an off-by-one), "
    "changing one line at a time and running the tests after each change; keep the first change that "
    "makes them pass, undo every other, and submit."
)
CORRECTION = (
    "The tests still fail after your work. Undo any change of yours that did not make them pass, then "
    "sweep again with the inverse operators you have not tried yet, one line at a time, running the tests "
    "after each; keep the first change that makes them pass, and submit."
)
RUN, SUBMIT = Action("run_tests"), Action("submit")
_TRAIL = re.compile(r"Actions so far: ([^.]*)\.")
Step = tuple[str, str]  # (an action's name, what its result says: "passing", "failing", "fixed" or "")


def load_sweep_lead(spec: str = "scripted-sweep-lead", seed: int = 0, **opts: Any) -> SweepLead:
    """`scripted-sweep-lead` (`seed` orders its sweeps as `scripted-sweep`'s; other options are ignored)."""
    return SweepLead(seed=int(seed))


class SweepLead:
    """The searching lead as a `Model`: one turn per request."""

    name = "scripted-sweep-lead"
    native_tools = False  # speaks the tagged format unless the request offers tools

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.alone = ScriptedModel(sweep=True, seed=seed)  # what it does without a sidekick

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return [self._one(r) for r in requests]

    def _one(self, r: Request) -> Completion:
        task_dir = r.meta.get("task_dir")
        if not task_dir:
            return Completion(
                "", finish_reason="error", error="scripted-sweep-lead needs Request.meta['task_dir']"
            )
        if not _can_delegate(r):
            return self.alone.generate([r])[0]
        summary = bool(r.meta.get("summary"))
        steps = trail(r.messages[:-1] if summary else r.messages)
        prompt_tokens = sum(count_tokens(str(m.get("content") or "")) for m in r.messages)
        if summary:
            text = summary_text(load_task(task_dir).id, steps)
            return Completion(text, prompt_tokens=prompt_tokens, completion_tokens=count_tokens(text))
        seed = stable_seed(self.seed, r.meta.get("episode", ""))
        action = lead_action(steps, takeover_plan(task_dir, _effort(r), seed))
        call = action_call(action, offered_tools(r.tools)) if r.tools else None
        if call:
            tokens = count_tokens(str(call["arguments"])) + 4
            call = {"id": f"call_{len(steps)}", **call}
            return Completion("", prompt_tokens=prompt_tokens, completion_tokens=tokens, tool_calls=[call])
        text = render_tagged(action)
        return Completion(text, prompt_tokens=prompt_tokens, completion_tokens=count_tokens(text))


def lead_action(steps: Sequence[Step], takeover: Sequence[Action]) -> Action:
    """The lead's next action after `steps` (its earlier actions with their results); `takeover` is what
    it runs itself after a second failing review (`takeover_plan`)."""
    names = [name for name, _ in steps]
    last, result = steps[-1] if steps else ("", "")
    if last == "delegate" and result != "changes":
        return RUN
    if result in ("passing", "fixed"):
        return SUBMIT
    delegations = names.count("delegate")
    if delegations < 2:
        return Action("delegate", {"instruction": CORRECTION if delegations else DELEGATION})
    second = [i for i, name in enumerate(names) if name == "delegate"][1]
    reviewed = names[second + 1 : second + 2] == ["run_tests"]  # the tests it ran on the second report
    done = len(steps) - second - 1 - reviewed  # its own turns since the second delegation's review
    return takeover[min(max(done, 0), len(takeover) - 1)]


def takeover_plan(task_dir: str, effort: str, seed: int) -> list[Action]:
    """`scripted-sweep`'s plan for this episode without its looks: its sweeps, in its order, then submit."""
    return [a for a in sweep_plan(task_dir, effort, seed) if a not in SWEEP_LOOKS]


def trail(messages: Sequence[dict[str, Any]]) -> list[Step]:
    """The lead's actions with their results: those a restarted conversation's summary lists, then each
    assistant message's action with what the message after it says."""
    steps: list[Step] = []
    for i, m in enumerate(messages):
        found = m["role"] == "user" and _TRAIL.search(str(m.get("content") or ""))
        if found:
            steps = [_parse_step(item) for item in found.group(1).split("; ") if item]
        if m["role"] != "assistant":
            continue
        name = action_name(m)
        after = str(messages[i + 1].get("content") or "") if i + 1 < len(messages) else ""
        steps.append((name, _result(name, after)))
    return steps


def summary_text(task_id: str, steps: Sequence[Step]) -> str:
    """The lead's summary of its working state: what it did, in a form `trail` reads back."""
    did = "; ".join(f"{name}, {result}" if result else name for name, result in steps)
    delegations = sum(name == "delegate" for name, _ in steps)
    return (
        f"Task: {task_id}. I delegated {delegations} time(s) and review by running the tests. "
        f"Actions so far: {did}. Steps done: {len(steps)}."
    )


def _result(name: str, observation: str) -> str:
    if name == "delegate":
        return "changes" if REVIEW_CHANGES in observation else ""
    if name == "run_tests":
        return "passing" if observation.startswith("exit code 0") else "failing"
    return "fixed" if name == "shell" and "\nfixed" in observation else ""


def _parse_step(item: str) -> Step:
    name, _, result = item.partition(", ")
    return name.strip(), result.strip()


def _effort(r: Request) -> str:
    found = re.search(r"Effort: (\w+)\.", str(r.messages[0].get("content") or ""))
    return found.group(1) if found else "medium"


def _can_delegate(r: Request) -> bool:
    """Whether the request offers `delegate`: as a tool, or in the system prompt's tagged help."""
    return "delegate" in offered_tools(r.tools) or "<delegate>" in str(r.messages[0].get("content") or "")
