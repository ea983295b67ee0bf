"""The agent loop: many episodes stepped together, one batched model call per step.

Each episode owns a workspace (a copy of the task's repository), a conversation and its budgets. At every
step the active episodes' requests go to the model in one `generate` call (the in-process engine batches
them on its KV cache; the HTTP backend sends them concurrently); each completion is parsed into an action
and executed, tools running in parallel threads. With `cohorts` > 1 the active episodes take turns in
fixed groups, so that the model generates for one group while another's tools run. An episode ends with a
typed ending (`ENDINGS`) and is graded by the shared verifier; its trajectory record
(`flywheel.record.Trajectory`) is complete even when the attempt failed or the model errored.

Every ending is the policy's or the infrastructure's. The policy's: it submitted, ran out of a budget
(turns, tokens, time, cost), wrote malformed actions, or outgrew its context. The infrastructure's
(`INFRA_ENDINGS`, recorded in the record's `infra_failure`): the model server erred (`model_error`), or
the sandbox failed (`sandbox_error`: a tool's sandbox run raised, or the workspace could not be copied);
a grader that crashes leaves the ending as it was and marks the record "grader". Such a record is kept
but trained on as nothing (`flywheel.rubric`). An attempt the sandbox failed is not graded:
the grader runs in the same sandbox, and the attempt was cut short by it, not by the policy.

Cost is counted per episode from its own usage: prompt and completion tokens, and its compute seconds —
the time its tools took plus its share of each batched generation call (by completion tokens), so that
the cost of an attempt does not depend on how many other episodes ran beside it. The effort's time limit
counts the same seconds, for the same reason; the record's `wall_s` is the elapsed time a user would have
waited.

Two hooks serve agents built on top of the harness (Fusion's lead, `flywheel.fusion`): `ExtraTools` adds
tools the harness does not own (their schema, help and stop strings, and a callable that runs them), and
`EpisodeSpec.workspace` runs an episode in a workspace that someone else owns: it is neither copied, nor
graded (its owner grades it), nor deleted at the end.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.actions import (
    STOP,
    TOOL_NAMES,
    TOOLS,
    Action,
    FormatError,
    parse_native,
    parse_tagged,
    restore_stop,
)
from flywheel.errors import FlywheelError
from flywheel.harness.cost import Pricing, pricing_for
from flywheel.harness.effort import Effort
from flywheel.harness.prompts import RESUME_HEAD, SUMMARY_PROMPT, resume_message, system_prompt, task_message
from flywheel.harness.tools import ToolResult, Tools
from flywheel.protocols import Completion, Grader, Model, Request, Sandbox, Verdict
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.envs import ensure_all
from flywheel.sandbox.workspaces import new_workspace
from flywheel.seeding import stable_seed
from flywheel.tasks.format import Task
from flywheel.verify import default_grader

ENDINGS = (
    "submitted",
    "turn_limit",
    "token_limit",
    "time_limit",
    "cost_limit",
    "context_exhausted",
    "format_errors",
    "model_error",
    "sandbox_error",
)
INFRA_ENDINGS = {"model_error": "model_server", "sandbox_error": "sandbox"}  # ending -> infra_failure


@dataclass
class HarnessConfig:
    """How episodes are run (effort budgets live in `Effort`)."""

    action_format: str = "auto"  # "tagged", "native", or "auto": native when the model says it supports it
    temperature: float = 1.0
    top_p: float = 1.0
    max_format_errors: int = 3  # consecutive malformed actions before the episode ends
    command_timeout_s: float = 30.0  # per shell / run_tests call
    keep_workspaces: bool = False
    policy_version: int = 0
    pricing: Pricing | None = None  # None: by model name (flywheel.harness.cost.PRICES)
    observation_chars: int = 4000  # longest observation kept in the conversation
    cohorts: int = 1  # groups of episodes that take turns, one generating while another's tools run
    compaction: str = "elide"  # near or past the context limit: "summary" (opt-in until a base learns it), "elide" or "none"
    compact_at: float = 0.8  # share of the model's `max_context` at which a summary is asked for
    summary_prompt: str = SUMMARY_PROMPT  # what asks the model to summarise its working state
    warm_pytest: bool = True  # `python -m pytest`/`pytest` forked from a warm parent (flywheel.sandbox.warm)

    def __post_init__(self) -> None:
        check_config(self)


COMPACTIONS = ("summary", "elide", "none")
ACTION_FORMATS = ("tagged", "native", "auto")


def check_config(cfg: HarnessConfig) -> None:
    """Refuse settings the loop cannot run with: a FlywheelError naming the field."""
    if cfg.action_format not in ACTION_FORMATS:
        raise FlywheelError(
            f"harness action_format: must be 'tagged', 'native' or 'auto', got '{cfg.action_format}'"
        )
    for name in ("observation_chars", "cohorts"):
        if int(getattr(cfg, name)) < 1:
            raise FlywheelError(f"harness {name}: must be at least 1, got {getattr(cfg, name)}")
    if cfg.compaction not in COMPACTIONS:
        raise FlywheelError(f"harness compaction: unknown value {cfg.compaction!r} (summary, elide or none)")
    if not 0 < cfg.compact_at <= 1:
        raise FlywheelError(f"harness compact_at: {cfg.compact_at} is not a share of the context in (0, 1]")
    if not cfg.summary_prompt.strip():
        raise FlywheelError("harness summary_prompt: empty; it must ask the model for a summary")


@dataclass
class EpisodeSpec:
    task: Task
    effort: Effort
    seed: int = 0
    index: int = 0  # sample number within its (task, effort) group
    variant: str = ""  # tells apart episodes that share everything else, e.g. the budgets of a ladder
    workspace: Path | None = None  # an existing workspace to work in: not copied, graded or deleted here

    @property
    def stream(self) -> str:
        """What seeds the sampler: the id without the variant, so variants draw the same random numbers."""
        return f"{self.task.id}/{self.effort.name}/s{self.seed}/{self.index}"

    @property
    def id(self) -> str:
        return f"{self.stream}/{self.variant}" if self.variant else self.stream


@dataclass
class Episode:
    spec: EpisodeSpec
    tools: Tools
    action_format: str
    messages: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    start: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_s: float = 0.0  # seconds in tool calls (sandbox setup and teardown included)
    gen_s: float = 0.0  # this episode's share of the batched generation calls
    format_errors: int = 0
    format_errors_in_row: int = 0
    n_turns: int = 0
    first_edit_step: int | None = None
    compactions: int = 0
    max_context: int | None = None  # the model's context in tokens, where the model says (`max_context`)
    max_context_tokens: int = 0  # the longest prompt + generation of any turn
    summarizing: str | None = None  # the next request asks for a summary, because of: "threshold", "overflow"
    elided_for_summary: bool = False  # old observations were elided to make room for that request
    summary_stuck: bool = False  # a summary failed and nothing was elided: no threshold summaries for now
    ending: str | None = None
    error: str | None = None
    infra_failure: str | None = None  # what broke (`flywheel.record.INFRA_CAUSES`); None: the policy's ending
    model_name: str = ""
    extra: ExtraTools | None = None


@dataclass(frozen=True)
class ExtraTools:
    """Tools beyond the harness's own, offered to one run's episodes (Fusion's lead and its `delegate`).

    The harness shows them (`schema` beside `TOOLS` for native calls, `help` after the tagged help), stops
    on `stop` as on its own, parses them by `names`, and calls `run(episode, action)` for them in place of
    `Tools.execute`. The episode's tool time counts only the result's `seconds`: the time `run` spends is
    its own to account for (a sidekick's episode has its own budgets and cost).
    """

    names: tuple[str, ...]
    schema: tuple[dict[str, Any], ...]
    help: str
    stop: tuple[str, ...]
    run: Callable[[Episode, Action], ToolResult]


def _fmt(model: Model, cfg: HarnessConfig) -> str:
    if cfg.action_format != "auto":
        return cfg.action_format
    return "native" if getattr(model, "native_tools", False) else "tagged"


def start_episode(
    spec: EpisodeSpec,
    sandbox: Sandbox,
    action_format: str,
    cfg: HarnessConfig,
    extra: ExtraTools | None = None,
) -> Episode:
    """A fresh episode on its own copy of the task's repository (or in `spec.workspace`); one whose copy
    failed has already ended (`sandbox_error`)."""
    ws = spec.workspace or new_workspace() / "repo"
    tools = Tools(spec.task, ws, sandbox, cfg.command_timeout_s, cfg.warm_pytest)
    try:
        if spec.workspace is None:
            shutil.copytree(spec.task.repo, ws, symlinks=True)
    except OSError as e:  # shutil.Error included: the infrastructure's failure, not the policy's
        ep = Episode(spec, tools, action_format, [], [], extra=extra)
        _infra_ending(ep, "sandbox_error", f"the workspace could not be copied: {e}")
        return ep
    files = sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*") if p.is_file())
    if spec.workspace is not None:  # a borrowed workspace may hold what running the tests wrote
        files = [f for f in files if not {"__pycache__", ".pytest_cache"} & set(f.split("/"))]
    system = system_prompt(spec.effort, action_format) + (f"\n{extra.help}" if extra else "")
    user = task_message(spec.task, files)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    turns = [{"role": "system", "text": system}, {"role": "user", "text": user}]
    return Episode(spec, tools, action_format, messages, turns, extra=extra)


def _infra_ending(ep: Episode, ending: str, error: str) -> None:
    """End `ep` with an infrastructure ending (`INFRA_ENDINGS`), recording what broke."""
    ep.ending, ep.error, ep.infra_failure = ending, error, INFRA_ENDINGS[ending]


def make_request(ep: Episode, cfg: HarnessConfig) -> Request:
    effort = ep.spec.effort
    budget = max(1, min(effort.turn_tokens, effort.max_tokens - ep.completion_tokens))
    native = ep.action_format == "native"
    meta = {"task_dir": str(ep.spec.task.root), "episode": ep.spec.id, "turn": ep.n_turns}
    if ep.summarizing:  # plain text answers it: no tools, no stop strings
        messages = [*ep.messages, {"role": "user", "content": cfg.summary_prompt}]
        return Request(
            messages=messages,
            max_tokens=budget,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=stable_seed(ep.spec.stream, ep.n_turns),
            meta={**meta, "summary": True},
        )
    return Request(
        messages=list(ep.messages),
        max_tokens=budget,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        stop=[] if native else [*STOP, *(ep.extra.stop if ep.extra else ())],
        tools=[*TOOLS, *(ep.extra.schema if ep.extra else ())] if native else None,
        seed=stable_seed(ep.spec.stream, ep.n_turns),
        meta=meta,
    )


def _assistant_turn(c: Completion, summary: bool = False) -> dict[str, Any]:
    turn: dict[str, Any] = {
        "role": "assistant",
        "text": c.text,
        "finish_reason": c.finish_reason,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
    }
    calls = [t for t in c.tool_calls if not t.get("error")]  # a malformed call is recorded as a format error
    if calls:
        turn["tool_calls"] = [{"name": t.get("name"), "arguments": t.get("arguments")} for t in calls]
    if c.token_ids is not None:
        turn.update(prompt_ids=c.prompt_ids, token_ids=c.token_ids, logprobs=c.logprobs, kept=c.kept)
    if c.policy_version is not None:
        turn["policy_version"] = c.policy_version
    if summary:
        turn["summary"] = True
    return turn


def observe(ep: Episode, c: Completion, gen_share_s: float, cfg: HarnessConfig) -> None:
    """Account for completion `c`, execute its action, and set the episode's ending if it has one."""
    ep.n_turns += 1
    ep.prompt_tokens += c.prompt_tokens
    ep.completion_tokens += c.completion_tokens
    ep.gen_s += gen_share_s
    ep.max_context_tokens = max(ep.max_context_tokens, c.prompt_tokens + c.completion_tokens)
    ep.turns.append(_assistant_turn(c, summary=ep.summarizing is not None))
    if ep.summarizing:
        take_summary(ep, c, cfg)
    elif c.error or c.finish_reason == "error":
        _infra_ending(ep, "model_error", c.error or "model error")
        return
    elif c.finish_reason == "context":
        overflow(ep, cfg)
    else:
        seen = len(ep.messages)
        if ep.action_format == "native":
            _act_native(ep, c, cfg)
        else:
            _act_tagged(ep, c, cfg)
        observations = [str(m.get("content") or "") for m in ep.messages[seen + 1 :]]
        if not ep.ending and _near_limit(ep, next_prompt_tokens(c, observations), cfg):
            _ask_for_summary(ep, "threshold", cfg)
    if not ep.ending:
        ep.ending = budget_ending(ep, cfg)


def _act_tagged(ep: Episode, c: Completion, cfg: HarnessConfig) -> None:
    names = _names(ep)
    stops = [*STOP, *(ep.extra.stop if ep.extra else ())]
    text = restore_stop(c.text, stops, names) if c.finish_reason == "stop" else c.text
    ep.messages.append({"role": "assistant", "content": text})
    try:
        action = parse_tagged(text, names)
    except FormatError as e:
        _format_error(ep, str(e), cfg, {"role": "user", "content": f"error: {e}"})
        return
    text = _execute(ep, action, cfg)
    ep.messages.append({"role": "user", "content": text})


def _act_native(ep: Episode, c: Completion, cfg: HarnessConfig) -> None:
    # a call the model wrote in its own syntax and got wrong (`chat_formats`): the turn calls nothing
    malformed = next((str(t["error"]) for t in c.tool_calls if t.get("error")), None)
    calls = [] if malformed else c.tool_calls
    calls = [dict(t, id=t.get("id") or f"call_{ep.n_turns}_{i}") for i, t in enumerate(calls)]
    message: dict[str, Any] = {"role": "assistant", "content": (c.text or None) if calls else c.text}
    if calls:
        message["tool_calls"] = [
            {
                "id": t["id"],
                "type": "function",
                "function": {"name": t.get("name"), "arguments": json.dumps(t.get("arguments") or {})},
            }
            for t in calls
        ]
    ep.messages.append(message)
    if not calls:
        why = malformed or "call one of the tools"
        reply = {"role": "user", "content": f"error: {why}"}
        _format_error(ep, malformed or f"no tool call: {why}", cfg, reply)
        return
    for t in calls:
        try:
            action = parse_native(t, _names(ep))
        except FormatError as e:
            _format_error(
                ep, str(e), cfg, {"role": "tool", "tool_call_id": t["id"], "content": f"error: {e}"}
            )
            continue
        text = _execute(ep, action, cfg)
        ep.messages.append({"role": "tool", "tool_call_id": t["id"], "content": text})
        if ep.ending:
            break


def _names(ep: Episode) -> tuple[str, ...]:
    return (*TOOL_NAMES, *ep.extra.names) if ep.extra else TOOL_NAMES


def _format_error(ep: Episode, message: str, cfg: HarnessConfig, reply: dict[str, Any]) -> None:
    ep.format_errors += 1
    ep.format_errors_in_row += 1
    ep.turns.append({"role": "tool", "name": "format_error", "text": f"error: {message}", "ok": False})
    ep.messages.append(reply)
    if ep.format_errors_in_row >= cfg.max_format_errors:
        ep.ending = "format_errors"


def _execute(ep: Episode, action: Action, cfg: HarnessConfig) -> str:
    ep.format_errors_in_row = 0
    t0 = time.perf_counter()
    if ep.extra and action.name in ep.extra.names:  # a tool the harness does not own: its seconds are its own
        result = ep.extra.run(ep, action)
        ep.tool_s += result.seconds
    else:
        result = ep.tools.execute(action)
        # the whole call, not just the command's own run: sandbox setup and teardown (and the sandbox's
        # one-time layout discovery on its first command) are the tool's cost, not the loop's
        ep.tool_s += max(result.seconds, time.perf_counter() - t0)
    text = _clip(result.text, cfg.observation_chars)
    turn = {"role": "tool", "name": action.name, "arguments": action.args, "text": text, "ok": result.ok}
    ep.turns.append(turn | {"edited": True} if result.edited else turn)
    if result.sandbox_error:  # the call has no result to show: the attempt ends, the infrastructure's fault
        _infra_ending(ep, "sandbox_error", result.sandbox_error)
        return text
    if result.edited and ep.first_edit_step is None:
        ep.first_edit_step = ep.n_turns
    if result.submitted:
        ep.ending = "submitted"
    return text


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters elided ...]\n{text[-half:]}"


def elide(messages: list[dict[str, Any]]) -> bool:
    """Shorten the old observations of a conversation in place (not the system prompt, the task or the last
    exchange). False: nothing left to cut."""
    changed = False
    for m in messages[2:-2]:
        content = m.get("content") or ""
        short = content[:100] + "\n[older output elided]"
        if m["role"] in ("user", "tool") and len(short) < len(content):  # an elided one stays as it is
            m["content"] = short
            changed = True
    return changed


def compact(ep: Episode, cfg: HarnessConfig) -> bool:
    """Self-compaction by elision: shorten old observations so the conversation fits again. False: nothing
    left to cut."""
    changed = elide(ep.messages)
    if changed:
        ep.compactions += 1
        ep.turns.append(_boundary("elided", True))
    return changed


def _boundary(kind: str, ok: bool) -> dict[str, Any]:
    """The record's mark of a compaction: "summary" (the conversation restarted) or "elided"."""
    return {"role": "tool", "name": "compaction", "text": kind, "ok": ok}


# ------------------------------------------------------------------------ model-written compaction
#
# Near the context limit (the next prompt would pass `compact_at` of the model's `max_context`) or past it
# (the model answered `finish_reason="context"`), the episode's next request asks the model to summarise
# its working state, in a turn of its own batched with the other episodes' requests. A summary that lands
# restarts the conversation from the system prompt, the task and one user message holding the summary and
# the latest observation; the budgets go on counting across the boundary. Past the limit, old observations
# are elided first so that the summary request itself fits. Where no summary can be had (empty text, an
# error, an overflow, or one too long for the restarted prompt to fit), elision is the fallback; an
# overflow that elision cannot answer ends the attempt `context_exhausted`.
#
# The next prompt's size is estimated, not counted: the last completion's prompt and completion tokens
# plus the new observations at 4 characters a token (the restarted prompt: all of it at 4 a token).


def next_prompt_tokens(c: Completion, observations: Sequence[str]) -> int:
    """An estimate of the next prompt's tokens: this turn's prompt and completion, then what was observed."""
    return c.prompt_tokens + c.completion_tokens + sum(len(o) for o in observations) // 4


def _near_limit(ep: Episode, tokens: int, cfg: HarnessConfig) -> bool:
    if cfg.compaction != "summary" or not ep.max_context or ep.summary_stuck:
        return False
    return tokens > cfg.compact_at * ep.max_context


def overflow(ep: Episode, cfg: HarnessConfig) -> None:
    """The model answered that the conversation does not fit: compact it as `cfg.compaction` says."""
    if cfg.compaction == "summary":
        ep.elided_for_summary = elide(ep.messages)
        _ask_for_summary(ep, "overflow", cfg)
    elif cfg.compaction == "none" or not compact(ep, cfg):
        ep.ending = "context_exhausted"


def _ask_for_summary(ep: Episode, why: str, cfg: HarnessConfig) -> None:
    """Make the episode's next request the summary request; the compaction counts from here."""
    ep.summarizing = why
    ep.compactions += 1
    ep.turns.append({"role": "user", "text": cfg.summary_prompt})


def take_summary(ep: Episode, c: Completion, cfg: HarnessConfig) -> None:
    """Restart the conversation from the summary in `c`, or fall back to elision."""
    why, elided = ep.summarizing, ep.elided_for_summary
    ep.summarizing, ep.elided_for_summary = None, False
    summary = "" if c.error or c.finish_reason in ("error", "context") else c.text.strip()
    if summary:
        messages = restarted(ep.messages, summary)
        if _fits(ep, messages, cfg):
            ep.messages, ep.summary_stuck = messages, False
            ep.turns.append(_boundary("summary", True))
            ep.turns.append({"role": "user", "text": messages[-1]["content"]})
            return
    further = elide(ep.messages)
    ep.turns.append(_boundary("elided", elided or further))
    if (c.finish_reason == "context" and not further) or (why == "overflow" and not (elided or further)):
        ep.ending = "context_exhausted"  # it still does not fit, and there is nothing left to cut
    elif not (elided or further):
        ep.summary_stuck = True


def restarted(messages: list[dict[str, Any]], summary: str) -> list[dict[str, Any]]:
    """The conversation after a summary: the system prompt, the task and one user message holding the
    summary and the latest observation (the messages after the last assistant one, or after the last
    restart)."""
    latest: list[str] = []
    for m in reversed(messages[2:]):
        content = str(m.get("content") or "")
        if m["role"] == "assistant" or content.startswith(RESUME_HEAD):
            break
        latest.insert(0, content)
    return [messages[0], messages[1], {"role": "user", "content": resume_message(summary, "\n".join(latest))}]


def _fits(ep: Episode, messages: list[dict[str, Any]], cfg: HarnessConfig) -> bool:
    """Whether a restarted conversation is below the compaction threshold (always, without a known context)."""
    if not ep.max_context:
        return True
    return sum(len(str(m.get("content") or "")) for m in messages) // 4 <= cfg.compact_at * ep.max_context


def budget_ending(ep: Episode, cfg: HarnessConfig) -> str | None:
    e = ep.spec.effort
    if ep.n_turns >= e.max_turns:
        return "turn_limit"
    if ep.completion_tokens >= e.max_tokens:
        return "token_limit"
    if ep.tool_s + ep.gen_s >= e.wall_s:  # its own seconds: the limit does not tighten with batch size
        return "time_limit"
    if episode_cost(ep, cfg) >= e.max_cost:
        return "cost_limit"
    return None


def episode_cost(ep: Episode, cfg: HarnessConfig) -> float:
    pricing = cfg.pricing or pricing_for(ep.model_name)
    return pricing.cost(ep.prompt_tokens, ep.completion_tokens, ep.tool_s + ep.gen_s)


def context_size(model: Model) -> int | None:
    """The model's context in tokens where it says (`max_context`, as the in-process engine does); else None,
    and only the model's context errors trigger compaction."""
    size = getattr(model, "max_context", None)
    return size if isinstance(size, int) and size > 0 else None


def _call_grader(grader: Grader, ep: Episode) -> Any:
    return grader(ep.spec.task, ep.tools.workspace, {"turns": _detector_turns(ep)})


def _detector_turns(ep: Episode) -> list[dict[str, Any]]:
    """The trajectory's actions in the shape the detector reads: assistant turns with tool calls."""
    calls = [
        {"name": t["name"], "arguments": t.get("arguments") or {}}
        for t in ep.turns
        if t["role"] == "tool" and t.get("name") in ("shell", "view", "edit")
    ]
    return [{"role": "assistant", "tool_calls": calls}]


def finish(ep: Episode, cfg: HarnessConfig, grader: Grader | None) -> Trajectory:
    """Grade the episode's workspace and build its trajectory record; never raises. A crashing grader
    marks the record an infrastructure failure ("grader"); an attempt the sandbox failed is not graded.
    An episode in a borrowed workspace (`EpisodeSpec.workspace`) is neither graded nor deleted here."""
    wall_s = time.perf_counter() - ep.start  # the attempt itself, grading excluded
    ep.tools.close()
    verdict = None
    borrowed = ep.spec.workspace is not None
    try:
        if grader is not None and ep.infra_failure != "sandbox" and not borrowed:
            verdict = _call_grader(grader, ep)
    except Exception as e:  # a grading crash is recorded, not raised
        verdict = Verdict(ep.spec.task.id, success=False, error=f"grader crashed: {e!r}")
        ep.infra_failure = ep.infra_failure or "grader"
    finally:
        if not cfg.keep_workspaces and not borrowed:
            shutil.rmtree(ep.tools.workspace.parent, ignore_errors=True)
    return Trajectory(
        id=ep.spec.id,
        task_id=ep.spec.task.id,
        effort=ep.spec.effort.name,
        seed=ep.spec.seed,
        index=ep.spec.index,
        policy_version=cfg.policy_version,
        model=ep.model_name,
        action_format=ep.action_format,
        turns=ep.turns,
        n_turns=ep.n_turns,
        prompt_tokens=ep.prompt_tokens,
        completion_tokens=ep.completion_tokens,
        wall_s=round(wall_s, 4),
        compute_s=round(ep.tool_s + ep.gen_s, 4),
        tool_s=round(ep.tool_s, 4),
        gen_s=round(ep.gen_s, 4),
        cost=episode_cost(ep, cfg),
        ending=ep.ending,
        error=ep.error,
        infra_failure=ep.infra_failure,
        format_errors=ep.format_errors,
        steps_to_first_edit=ep.first_edit_step,
        compactions=ep.compactions,
        max_context_tokens=ep.max_context_tokens,
        verdict=verdict,
        success=bool(verdict and verdict.success),
        workspace=str(ep.tools.workspace) if cfg.keep_workspaces else None,
    )


def run_episodes(
    specs: Sequence[EpisodeSpec],
    model: Model,
    *,
    cfg: HarnessConfig | None = None,
    sandbox: Sandbox | None = None,
    grader: Grader | None = None,
    concurrency: int = 8,
    on_record: Callable[[Trajectory], None] | None = None,
    extra_tools: ExtraTools | None = None,
) -> list[Trajectory]:
    """Run every episode to its ending, `concurrency` at a time; records in completion order.

    `grader` defaults to the shared verifier on the same sandbox (`flywheel.verify.default_grader`);
    `extra_tools`, tools beyond the harness's own (see `ExtraTools`).

    The active episodes form `cfg.cohorts` fixed cohorts that take turns, 0, 1, …, n-1, 0, …: at its turn
    a cohort collects what its tools did last time (records of the episodes that ended, graded), refills
    from the pending episodes, and sends one batched generate call whose actions then run in the
    background while the next cohorts take theirs. With one cohort this is the lockstep loop: generate,
    act, generate. With two, the model generates for one cohort while the other's tools run, so on a small
    machine the cores the sandboxed commands leave idle serve the model and the other way round. Each
    episode sees the same calls in the same order either way, and an episode's cohort is fixed by the
    order episodes start, so a run with seeded requests is as reproducible as before; the model only sees
    smaller batches.
    """
    cfg = cfg or HarnessConfig()
    check_config(cfg)  # a config changed after it was made is checked again
    sandbox = sandbox or get_sandbox()
    grader = grader or default_grader(sandbox)
    ensure_all((s.task.id, s.task.environment) for s in specs)  # task environments, built before episodes
    action_format = _fmt(model, cfg)
    n = max(1, cfg.cohorts)
    base, extra = divmod(min(concurrency, len(specs)), n)
    sizes = [base + (k < extra) for k in range(n)]  # `concurrency` in all, as evenly as it splits
    pending, cohorts, records = deque(specs), [[] for _ in range(n)], []
    jobs: list[Future | None] = [None] * n

    def emit(record: Trajectory) -> None:
        records.append(record)
        if on_record:
            on_record(record)

    def act(group: list[Episode], completions: list[Completion], shares: list[float]) -> list[Trajectory]:
        list(pool.map(lambda a: observe(a[0], a[1], a[2], cfg), zip(group, completions, shares, strict=True)))
        return list(pool.map(lambda ep: finish(ep, cfg, grader), [ep for ep in group if ep.ending]))

    with ThreadPoolExecutor(max(2, concurrency)) as pool, ThreadPoolExecutor(n) as turns:
        for k in itertools.cycle(range(n)):
            if jobs[k] is not None:
                for record in jobs[k].result():
                    emit(record)
                jobs[k] = None
                cohorts[k] = [ep for ep in cohorts[k] if not ep.ending]
            while pending and len(cohorts[k]) < sizes[k]:
                ep = start_episode(pending.popleft(), sandbox, action_format, cfg, extra_tools)
                ep.model_name, ep.max_context = model.name, context_size(model)
                if ep.ending:  # its workspace could not be made: recorded, never sent to the model
                    emit(finish(ep, cfg, grader))
                else:
                    cohorts[k].append(ep)
            if cohorts[k]:
                t0 = time.perf_counter()
                completions = model.generate([make_request(ep, cfg) for ep in cohorts[k]])
                gen_s = time.perf_counter() - t0
                total = sum(max(c.completion_tokens, 1) for c in completions)
                shares = [gen_s * max(c.completion_tokens, 1) / total for c in completions]
                jobs[k] = turns.submit(act, cohorts[k], completions, shares)
            elif not pending and not any(cohorts):
                break
    return records
