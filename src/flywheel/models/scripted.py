"""Scripted oracles: models that solve a task through the tools using its reference solution.

`scripted` acts in a realistic order — run the tests, view the code around the bug, edit, run the tests
again, submit. `scripted-noisy` adds seeded detours (listing files, grepping, viewing other code,
redundant test runs) and occasional mistakes (an edit whose old text does not match, a malformed action),
so its trajectories vary in length and cost; they are the imitation data for the tiny base model. Both
read the task's reference solution (an oracle's privilege), so they are for tests, demos and data, never
reported as model results.

`scripted-search` teaches a strategy that needs no oracle, so that what a model learns from it carries
over to code it has never seen: show the module (`cat -n *.py`), then try repairs one shell command at a
time — each the inverse of one mutation operator on one line of the function that the bug report calls
(`sed -i`), kept if the tests pass (the command prints `fixed`), otherwise undone by copying back the
module it copied aside first — and submit once one is kept. Every command names the module by the glob
`*.py` (a toybugs repository has one module beside its tests), so the only things to read off the context
are a line number and the text on that line: a tiny model does not copy a name it has never seen
(`docs/experiments.md`). The text replaced starts with the space before it (` <`, ` and`), as the code
spells it. The oracle only chooses where in its random order of candidates the right one falls, within the effort
level's number of tries; when no candidate is the fix, it tries its quota of wrong ones and submits, as a
searcher without it would.

`scripted-sweep` needs no oracle at all and reads nothing: after a look or two at random (the listing,
the tests), it sweeps the module for the inverse of one mutation operator per command — every line that
holds ` < ` gets ` <= ` in turn, the first that makes the tests pass is kept — in a random order of the
23 inverses, as many as the effort level allows, then submits. Each command is the same text in every
task, so a model that imitates it has nothing to copy or look up; which sweeps to run first, and when to
stop, is what RL can teach it.

Each call is stateless: the plan is recomputed from the task and a seed, and the step is the number of
assistant turns so far. The oracle answers in whichever format the request asks for: native tool calls
when tools are offered (a tool it needs but the client lacks is called through the client's shell tool,
as `toolcalls.action_call` maps it: a bash-only client such as mini-swe-agent gets `cat -n`, a Python
edit script and its `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`), a fenced shell block whose language is
`Request.meta["fence"]` when the client parses those (mini-swe-agent's text-based configuration:
`mswea_bash_command`), the tagged text format otherwise.

Asked for a summary of its working state (the harness's compaction: `Request.meta["summary"]`), every
oracle writes a short plain one from what it knows — the task, the files of its plan, what it has done and
what it will do next — ending with `Steps done: N.`, which is how it finds its place in its plan when the
conversation restarts from that summary.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from flywheel.actions import Action, render_tagged
from flywheel.models.toolcalls import action_call, offered_tools, shell_command
from flywheel.protocols import Completion, Request
from flywheel.seeding import stable_seed
from flywheel.tasks.format import load_task
from flywheel.tasks.patch import apply_patch, parse_patch


def count_tokens(text: str) -> int:
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
        Action("shell", {"command": f'grep -n "def " {rng.choice(files)}'}),
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


# ------------------------------------------------------------------------------------- the searcher

SEARCH_TRIES = {"medium": 4, "high": 8, "max": 12}  # repairs tried per effort level (turns: tries + 2)
SEARCH_CONTEXT = 20  # lines searched from the `def` line of the called function on
SEARCH_SHOW = "cat -n *.py"
SEARCH_FILES = "*.py"
SEARCH_TIMEOUT_S = 5  # a wrong repair can loop forever; the tests of a small module take well under 1 s
_NAME = re.compile(r"([A-Za-z_]\w*)\(")


def searched_function(instruction: str, source: str) -> str | None:
    """The first name called in the bug report's first `code` span that the module defines."""
    span = re.search(r"`([^`]*)`", instruction)
    defined = set(re.findall(r"^\s*(?:def|class) (\w+)", source, re.M))
    for name in _NAME.findall(span.group(1) if span else ""):
        if name in defined:
            return name
    return None


def function_lines(name: str, source: str) -> set[int]:
    """1-based lines from each `def name` (or `class name`) line to SEARCH_CONTEXT lines after it."""
    lines = source.splitlines()
    kind = "class" if re.search(rf"^\s*class {name}\b", source, re.M) else "def"
    shown: set[int] = set()
    for i, line in enumerate(lines, 1):
        if f"{kind} {name}" in line:
            shown.update(range(i, min(i + SEARCH_CONTEXT, len(lines)) + 1))
    return shown


def _token_span(a: str, b: str) -> tuple[int, int, int] | None:
    """(start, end in a, end in b) of the one differing region, widened to whitespace on both sides and
    starting with the space before it, if any."""
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1
    ea, eb = len(a) - s, len(b) - s
    while p > 0 and a[p - 1] != " ":
        p -= 1
    while ea < len(a) and a[ea] != " ":
        ea, eb = ea + 1, eb + 1
    if p > 0:  # the space before the differing token: ` <` is how the code spells it
        p -= 1
    return (p, ea, eb) if p < ea else None


def repair_candidates(source: str, lines: set[int]) -> list[tuple[int, str, str]]:
    """(line, old, new): one-line repairs on `lines` of `source`, each the inverse of one mutation operator
    (the operators are their own inverses, plus `if not c` → `if c`) such that replacing the first `old`
    on the line with `new` makes the repair and the same on `new` undoes it."""
    from flywheel.tasks.mutate import mutants

    text = source.splitlines()
    out: dict[tuple[int, str, str], None] = {}
    edited = [m.source.splitlines() for m in mutants(source)]
    for i, line in enumerate(text):
        if i + 1 in lines and re.search(r"\bnot ", line):
            edited.append(text[:i] + [re.sub(r"\bnot ", "", line, count=1)] + text[i + 1 :])
    for new_text in edited:
        if len(new_text) != len(text):
            continue
        diff = [i for i, (x, y) in enumerate(zip(text, new_text, strict=True)) if x != y]
        if len(diff) != 1 or diff[0] + 1 not in lines:
            continue
        i = diff[0]
        before, after = text[i], new_text[i]
        span = _token_span(before, after)
        if span is None:
            continue
        p, ea, eb = span
        old, new = before[p:ea], after[p:eb]
        if "'" in old + new or before.replace(old, new, 1) != after or after.replace(new, old, 1) != before:
            continue
        out[(i + 1, old, new)] = None
    return list(out)


def _sed(address: int | str, old: str, new: str) -> str:
    pattern = re.sub(r"([\\/.*\[\]^$])", r"\\\1", old)
    replacement = re.sub(r"([\\/&])", r"\\\1", new)
    return f"{address}s/{pattern}/{replacement}/"


def try_command(path: str, line: int, old: str, new: str, test_command: str) -> str:
    """Apply one repair to `path` (a file or a glob in the repository's root); keep it and print `fixed`
    when the tests pass (within the time limit), else copy back the files copied aside before it. The undo
    is the same text for every try, so a wrong try never becomes a wrong undo."""
    return (
        f"cp {path} /tmp; sed -i '{_sed(line, old, new)}' {path}; timeout {SEARCH_TIMEOUT_S} {test_command} "
        f"> /dev/null && echo fixed || cp /tmp/{path} ."
    )


@lru_cache(maxsize=4096)
def search_plan(task_dir: str, effort: str, seed: int) -> list[Action]:
    """The searcher's actions: show the module, try repairs in the called function in a seeded order, submit."""
    task = load_task(task_dir)
    tries = SEARCH_TRIES.get(effort, SEARCH_TRIES["medium"])
    files = [fp for fp in parse_patch(task.solution_patch) if fp.old_path and fp.new_path]
    if len(files) != 1:
        return [Action("submit")]
    path = files[0].old_path
    source = (task.repo / path).read_text()
    name = searched_function(task.instruction, source)
    if name is None:
        return [Action("submit")]
    candidates = repair_candidates(source, function_lines(name, source))
    solved = apply_patch({path: source}, task.solution_patch)[path]  # the oracle's one privilege
    right = [c for c in candidates if _applies(source, c) == solved]
    wrong = [c for c in candidates if c not in right]
    rng = random.Random(seed)
    rng.shuffle(wrong)
    order = wrong[:tries]
    if right:
        order = wrong[: rng.randrange(min(tries, len(candidates)))] + right[:1]
    return [
        Action("shell", {"command": SEARCH_SHOW}),
        *(Action("shell", {"command": try_command(SEARCH_FILES, *c, task.test_command)}) for c in order),
        Action("submit"),
    ]


# ------------------------------------------------------------------------------------- the sweeper

# The inverse of each text-level mutation operator (flywheel.tasks.mutate), spelled with the spaces
# around it as `ast.unparse` writes it: (what the bug may have written, what the fix writes back).
SWEEP_PAIRS = (
    (" <= ", " < "),
    (" < ", " <= "),
    (" >= ", " > "),
    (" > ", " >= "),
    (" == ", " != "),
    (" != ", " == "),
    (" not in ", " in "),
    (" in ", " not in "),
    (" is not ", " is "),
    (" is ", " is not "),
    (" not ", " "),
    (" - ", " + "),
    (" + ", " - "),
    (" // ", " * "),
    (" / ", " // "),
    (" * ", " / "),
    (" // ", " % "),
    (" -= ", " += "),
    (" += ", " -= "),
    (" or ", " and "),
    (" and ", " or "),
    (" - 1)", ")"),
    (" + 1]", "]"),
)
SWEEP_TRIES = {"medium": 4, "high": 8, "max": 16}  # sweeps per effort level
SWEEP_LOOKS = (Action("shell", {"command": SEARCH_SHOW}), Action("run_tests"))  # looks it may take first


def sweep_command(old: str, new: str, test_command: str) -> str:
    """One shell command that tries `old` -> `new` on each line of the module where `old` occurs (its first
    occurrence on the line), one line at a time: the first change that makes the tests pass is kept
    (printing `fixed`) and every other is undone. The pair is written once, as one sed substitution; `sed
    -n "$e;T;="` lists the lines it would change (`T` skips the rest when nothing was substituted). The
    text names no line and no identifier, so what to sweep for is the only choice in it."""
    return (
        f"e='{_sed('', old, new)}'; for n in $(sed -n \"$e;T;=\" {SEARCH_FILES}); do cp {SEARCH_FILES} /tmp; "
        f'sed -i "$n$e" {SEARCH_FILES}; timeout {SEARCH_TIMEOUT_S} {test_command} > /dev/null && echo fixed '
        f"&& exit; cp /tmp/{SEARCH_FILES} .; done"
    )


@lru_cache(maxsize=4096)
def sweep_plan(task_dir: str, effort: str, seed: int) -> list[Action]:
    """The sweeper's actions, with no oracle at all: maybe a look or two, then sweeps for the inverse
    operators in a seeded random order, the effort level's number of them, then submit."""
    task = load_task(task_dir)
    rng = random.Random(seed)
    looks = [a for a in SWEEP_LOOKS if rng.random() < 0.5]
    pairs = rng.sample(SWEEP_PAIRS, SWEEP_TRIES.get(effort, SWEEP_TRIES["medium"]))
    return [
        *looks,
        *(Action("shell", {"command": sweep_command(o, n, task.test_command)}) for o, n in pairs),
        Action("submit"),
    ]


def _applies(source: str, candidate: tuple[int, str, str]) -> str:
    line, old, new = candidate
    lines = source.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    return "".join(lines)


_DONE = re.compile(r"Steps done: (\d+)\.")


def steps_done(messages: Sequence[dict[str, Any]]) -> int:
    """The steps a restarted conversation's summary says were done before it (0 without one)."""
    for m in reversed(messages):
        found = m["role"] == "user" and _DONE.search(str(m.get("content") or ""))
        if found:
            return int(found.group(1))
    return 0


def _describe(step: Action | str) -> str:
    if isinstance(step, str):
        return "a turn without an action"
    what = step.args.get("path") or step.args.get("command") or ""
    what = what if len(what) <= 60 else what[:57] + "..."
    return f"{step.name} {what}".strip()


def summary_text(task_id: str, steps: Sequence[Action | str], done: int) -> str:
    """The oracle's summary of its working state after `done` steps of its plan `steps`."""
    files = sorted({str(a.args["path"]) for a in steps if isinstance(a, Action) and "path" in a.args})
    did = "; ".join(_describe(a) for a in steps[:done]) or "nothing yet"
    nxt = _describe(steps[min(done, len(steps) - 1)])
    return (
        f"Task: {task_id}. Files involved: {', '.join(files) or 'the module under test'}. "
        f"Done so far: {did}. Next: {nxt}. Steps done: {done}."
    )


def load_scripted(spec: str, seed: int = 0, **opts: Any) -> ScriptedModel:
    """`scripted`, `scripted-noisy`, `scripted-search` or `scripted-sweep` (other options are ignored)."""
    kind = spec.removeprefix("scripted").lstrip("-")
    return ScriptedModel(
        noisy=kind == "noisy", search=kind == "search", sweep=kind == "sweep", seed=int(seed)
    )


class ScriptedModel:
    """The oracle as a `Model`: one turn of its plan per request."""

    native_tools = False  # speaks the tagged format unless the request offers tools

    def __init__(self, noisy: bool = False, seed: int = 0, search: bool = False, sweep: bool = False):
        self.noisy, self.seed, self.search, self.sweep = noisy, seed, search, sweep
        self.name = (
            "scripted-sweep"
            if sweep
            else "scripted-search"
            if search
            else "scripted-noisy"
            if noisy
            else "scripted"
        )

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return [self._one(r) for r in requests]

    def _one(self, r: Request) -> Completion:
        task_dir = r.meta.get("task_dir")
        if not task_dir:
            return Completion(
                "", finish_reason="error", error="scripted model needs the task (Request.meta['task_dir'])"
            )
        episode = r.meta.get("episode", "")
        summary = bool(r.meta.get("summary"))
        step = steps_done(r.messages) + sum(m["role"] == "assistant" for m in r.messages)
        last = r.messages[-2 if summary and len(r.messages) > 1 else -1]
        if self.search or self.sweep:
            effort = re.search(r"Effort: (\w+)\.", str(r.messages[0].get("content") or ""))
            make = sweep_plan if self.sweep else search_plan
            steps: list[Action | str] = list(
                make(task_dir, effort.group(1) if effort else "medium", stable_seed(self.seed, episode))
            )
            if step and "\nfixed" in str(last.get("content") or ""):  # the last repair was kept
                steps[step:] = [Action("submit")]
        else:
            steps = plan(task_dir, self.noisy, stable_seed(self.seed, episode))
        prompt_tokens = sum(count_tokens(str(m.get("content") or "")) for m in r.messages)
        if summary:
            text = summary_text(load_task(task_dir).id, steps, step)
            return Completion(text, prompt_tokens=prompt_tokens, completion_tokens=count_tokens(text))
        action = steps[min(step, len(steps) - 1)]
        if isinstance(action, str):
            return Completion(action, prompt_tokens=prompt_tokens, completion_tokens=count_tokens(action))
        call = action_call(action, offered_tools(r.tools)) if r.tools else None
        if call:
            return Completion(
                "",
                prompt_tokens=prompt_tokens,
                completion_tokens=count_tokens(str(call["arguments"])) + 4,
                tool_calls=[{"id": f"call_{step}", **call}],
            )
        text = _text(action, r.meta.get("fence"))
        return Completion(text, prompt_tokens=prompt_tokens, completion_tokens=count_tokens(text))


def _text(action: Action, fence: str | None) -> str:
    """`action` as text: a shell block fenced as ```FENCE when the client asked for one, else tagged."""
    command = shell_command(action) if fence else None
    return f"```{fence}\n{command}\n```" if command else render_tagged(action)
