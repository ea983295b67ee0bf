"""The trajectory record: one attempt at a task, as the harness builds it and every command reads it.

`Trajectory` is the one record type: the harness's `finish()` builds it, the loop ships it between
processes (it pickles), the trainer scores it, and evaluation, curation and imitation read it. On disk it
is one JSON object per line of a `trajectories.jsonl` (`to_json`, the public contract in the README);
`read_trajectories` is the one reader every command uses, and `write_trajectory` (one record to an open
file, flushed), `write_trajectories` and `append_trajectories` write through the one line format
(`json_line`).

The record holds no reward. Whether an attempt succeeded is the grader's (`verdict`, with `success` copied
beside it; a cheat is never a success); the reward ``S - λ·C`` is the trainer's and exists only in `rl`,
the score the loop writes beside a record it trained on (`flywheel.rubric`).

An attempt the infrastructure ended (the model server erred, the sandbox or the grader broke) carries its
cause in `infra_failure` (`INFRA_CAUSES`): it is kept, but it says nothing about the policy, so the trainer
leaves it out of its group's baseline and advantages and evaluation reports it apart from the success
rate. Without one, the attempt ended by the policy's own doing (`flywheel.harness.agent` sets both). The
training loop retries such an attempt (`[rollout] infra_retries`): the retry is a record of its own, with its
own id and seed, naming the attempt it replaces (`retry_of`) and its number (`retry`).

A Fusion attempt (`flywheel.fusion`) is the lead's record with the sidekick's episodes nested in
`sidekick`, each a whole record of its own (model turns with token ids and log-probs where the model is
in-process, so either side can be trained on), and `fusion` saying what the attempt was made of; its `cost`
is the sum of both sides' (`fusion["lead_cost"]` and `fusion["sidekick_cost"]`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Any

from flywheel.errors import FlywheelError
from flywheel.protocols import Verdict

REPLAY_KEYS = ("kept", "prompt_ids", "logprobs")  # per-token data only the trainer reads
OPTIONAL = (
    "infra_failure",
    "pool",
    "retry_of",
    "retry",
    "renamed_from",
    "step",
    "rl",
    "sidekick",
    "fusion",
)  # written only when set
LEGACY = ("reward", "loop_version")  # keys older files carry, dropped on reading
INFRA_CAUSES = ("model_server", "sandbox", "grader", "pool_lost")  # `Trajectory.infra_failure`'s values


@dataclass
class Trajectory:
    """One graded attempt; see the module docstring. Only `id`, `task_id` and `effort` are required."""

    id: str  # the episode id, `task/effort/s<seed>/<index>` (a ladder's rungs add `/<variant>`)
    task_id: str  # the task attempted
    effort: str  # the effort level's name
    seed: int = 0  # the episode's seed (its group's, in the loop)
    index: int = 0  # sample number within its (task, effort) group
    policy_version: int = 0  # the weights' version that generated it
    model: str = ""  # the model's name
    action_format: str = "tagged"  # "tagged" or "native" tool calls
    # system, user, assistant and tool turns: {"role", "text"}; model turns add finish_reason and token
    # counts, and for in-process models token_ids, logprobs, kept and prompt_ids (a model-written summary of
    # the context adds "summary": true); tool turns name, arguments and ok, and "edited": true when the call
    # changed the workspace (an edit, or a shell command that wrote a file); a compaction is a tool turn named
    # "compaction" with the text "summary" (the conversation restarted from the summary) or "elided"
    turns: list[dict[str, Any]] = field(default_factory=list)
    n_turns: int = 0  # model calls made
    prompt_tokens: int = 0  # prompt tokens over every model call (`usage.prompt_tokens` in JSON)
    completion_tokens: int = 0  # generated tokens over every model call (`usage.completion_tokens`)
    wall_s: float = 0.0  # elapsed seconds of the attempt, grading excluded
    compute_s: float = 0.0  # its own seconds: tool_s + gen_s
    tool_s: float = 0.0  # seconds in tool calls
    gen_s: float = 0.0  # its share of the batched generation calls
    cost: float = 0.0  # dollars (`flywheel.harness.cost`)
    ending: str | None = None  # how it ended (`flywheel.harness.agent.ENDINGS`)
    error: str | None = None  # what failed, for a `model_error` or `sandbox_error` ending
    infra_failure: str | None = None  # what broke (`INFRA_CAUSES`); None: the policy's own ending
    format_errors: int = 0  # malformed actions
    steps_to_first_edit: int | None = None  # the model call whose action first changed a file
    compactions: int = 0  # times the context was compacted: a summary asked for, or old observations elided
    max_context_tokens: int = 0  # the longest prompt + generation of any model call, in tokens
    verdict: Verdict | None = None  # the grader's decision; None when not graded
    success: bool = False  # the verdict's success (False without a verdict)
    workspace: str | None = None  # the kept workspace's path (`HarnessConfig.keep_workspaces`)
    pool: str | None = None  # the loop's pool that generated it
    retry_of: str | None = None  # a retry: the id of the attempt the infrastructure ended that it replaces
    retry: int | None = None  # a retry: its number (1: the first; at most `[rollout] infra_retries`)
    renamed_from: str | None = None  # for a renamed copy of a task, the original's id
    step: int | None = None  # the trainer step that used it
    rl: dict[str, float] | None = None  # the trainer's score: reward, advantage, cost, lambda, ...
    sidekick: list[Trajectory] | None = None  # Fusion: the sidekick's episodes, one per delegation
    # Fusion: lead, sidekick (model names), delegations, take_overs, lead_cost, sidekick_cost
    fusion: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one line of trajectories.jsonl; optional fields only when set."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "completion_tokens" or (f.name in OPTIONAL and getattr(self, f.name) is None):
                continue
            if f.name == "prompt_tokens":
                out["usage"] = {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                }
            elif f.name == "verdict":
                out["verdict"] = self.verdict.to_json() if self.verdict else None
            elif f.name == "sidekick":
                out["sidekick"] = [t.to_json() for t in self.sidekick or []]
            else:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trajectory:
        """The record `to_json` wrote. An unknown key is refused (FlywheelError naming it); the legacy keys
        `reward` and `loop_version` are dropped."""
        names = ({f.name for f in fields(cls)} - {"prompt_tokens", "completion_tokens"}) | {"usage"}
        unknown = sorted(set(data) - names - set(LEGACY))
        if unknown:
            raise FlywheelError(f"trajectory record {data.get('id', '?')}: unknown key '{unknown[0]}'")
        missing = [k for k in ("id", "task_id", "effort") if k not in data]
        if missing:
            raise FlywheelError(f"trajectory record {data.get('id', '?')}: missing key '{missing[0]}'")
        kw = {k: v for k, v in data.items() if k in names and k not in ("usage", "verdict", "sidekick")}
        if data.get("sidekick") is not None:
            kw["sidekick"] = [cls.from_json(t) for t in data["sidekick"]]
        usage = data.get("usage") or {}
        try:
            verdict = Verdict.from_json(data["verdict"]) if data.get("verdict") is not None else None
        except ValueError as e:
            raise FlywheelError(f"trajectory record {data['id']}: {e}") from None
        return cls(
            **kw,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            verdict=verdict,
        )

    def lite(self) -> Trajectory:
        """A copy without the per-token replay data (kept sets, prompt ids, log-probs): for logs."""
        turns = [{k: v for k, v in t.items() if k not in REPLAY_KEYS} for t in self.turns]
        sidekick = [t.lite() for t in self.sidekick] if self.sidekick is not None else None
        return replace(self, turns=turns, sidekick=sidekick)


def json_line(t: Trajectory) -> str:
    """One line of trajectories.jsonl, newline included."""
    return json.dumps(t.to_json()) + "\n"


def write_trajectory(f: IO[str], t: Trajectory) -> None:
    """Append `t` to an open trajectories.jsonl and flush, so an interrupted run keeps it."""
    f.write(json_line(t))
    f.flush()


def write_trajectories(path: Path, ts: Iterable[Trajectory]) -> None:
    """Write records as the whole of the file at `path`."""
    Path(path).write_text("".join(json_line(t) for t in ts))


def append_trajectories(path: Path, ts: Iterable[Trajectory]) -> None:
    """Append records to the trajectories.jsonl at `path` (created if missing)."""
    with open(path, "a") as f:
        f.write("".join(json_line(t) for t in ts))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; a torn line (an interrupted write) is skipped, a missing file is
    empty."""
    if not Path(path).is_file():
        return []
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_trajectories(path: Path) -> list[Trajectory]:
    """The records of a trajectories.jsonl; a torn line (an interrupted write) is skipped."""
    return [Trajectory.from_json(data) for data in read_jsonl(path)]
