"""Fusion: a lead agent and a less expensive sidekick, each with its own model and its own context.

The lead (often a frontier model) interprets the task, plans and reviews; the sidekick (often the
RL-trained model) explores, implements and tests what the lead hands it. The lead is an ordinary harness
episode with one tool more, `delegate` (`flywheel.models.actions.DELEGATE`, offered through the harness's
`ExtraTools` hook; a plain agent never sees it). A delegation runs one whole sidekick episode under the
harness in the lead's own workspace (`EpisodeSpec.workspace`): its own tools, budgets, effort level and
conversation, which starts from the task and the lead's instruction. Its report is the tool's output
(`sidekick_report`): the diff it made against the workspace as it was before the delegation, the tests it
ran and their last result, how it ended, and its last message. The lead may then review (view,
run_tests), delegate again with corrections, take over and edit itself, or submit. A sidekick that crashes
or runs out of budget is such a report, never a crashed attempt.

The attempt is graded once, at the lead's end (a sidekick's episode in a borrowed workspace is not
graded); the exploit detector reads both sides' actions. Each side keeps its own budgets and cost: the
lead's budgets count its own turns, tokens and seconds (a delegation's time is the sidekick's, not the
lead's tool time). The record is the lead's (`flywheel.record.Trajectory`) with its `cost` the sum of both
sides', `fusion` splitting it (`lead_cost`, `sidekick_cost`, `delegations`, `take_overs`), and the
sidekick's episodes nested whole in `sidekick`, so that either side can be trained on later.

Delegations of concurrent lead episodes run together: the sidekick's model is used by one thread
(`SidekickBatches`), which gathers the delegations that are waiting and runs their episodes as one batch
under the harness (batched generation, concurrent tools), so a pair evaluated 64 at a time asks its
sidekick for up to 64 episodes at once rather than one after another. A delegation made while a batch runs
waits for the next one.

What is not covered: each delegation starts the sidekick from a fresh conversation (it knows earlier delegations only through the
workspace and the lead's words); a take-over is counted when the lead's own `edit` succeeds after a
delegation (a `shell` command that edits files is not counted).

Training the sidekick under its lead (`flywheel train` with `[fusion]`): `sidekick_rollout` runs Fusion's
attempts with `rollout`'s signature and the sidekick as the model, the lead loaded by spec and frozen, so
that the loop's pools (`flywheel.loop.pool.run_items`, by its `episodes` reference) and calibration run
the pair as they run a single policy. The trainer then replays only the nested sidekick's turns
(`flywheel.rl.trainer.turns_of`), each scored with its whole attempt's reward, the lead's cost included.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes
from flywheel.harness.agent import Episode, ExtraTools
from flywheel.harness.cost import pricing_for
from flywheel.harness.effort import Effort
from flywheel.harness.tools import ToolResult
from flywheel.models import get_model
from flywheel.models.actions import DELEGATE, DELEGATE_STOP, Action
from flywheel.protocols import Grader, Model, Sandbox, Verdict
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.format import Task
from flywheel.tasks.patch import make_patch, read_tree
from flywheel.verify import default_grader

LEAD_HELP = """You lead a sidekick: a less expensive engineer with its own tools, in this same repository.
Delegate exploring, implementing and testing with a plan in words; review its report (its diff, the tests
it ran, how it ended), then delegate again with corrections, take over and edit yourself, or submit.
<delegate>INSTRUCTION</delegate>  hand work to the sidekick; its report comes back"""
_CACHES = {"__pycache__", ".pytest_cache"}


@dataclass
class FusionConfig:
    """How the sidekick is run; the lead's episodes take the harness's `HarnessConfig`."""

    sidekick_effort: str | None = None  # the sidekick's effort level; None: the lead's episode's
    max_delegations: int = 4  # per attempt; past them `delegate` is refused
    report_chars: int = 1200  # of the diff, the last test output and the last message each, in a report
    gather_s: float = 0.05  # a batch of sidekick episodes waits this long after its first delegation
    # the sidekick's level, budgets included, by the lead's episode id (over `sidekick_effort`)
    sidekick_levels: dict[str, Effort] = field(default_factory=dict)


class Fusion:
    """Runs lead episodes whose `delegate` runs a sidekick episode in the lead's workspace.

    `rollout` has the signature of `flywheel.eval.run.rollout`, with the lead as its model, so evaluation
    runs Fusion as it runs a single policy (`flywheel.eval.run_eval(..., runner=fusion.rollout)`).
    """

    def __init__(
        self,
        sidekick: Model,
        sidekick_cfg: HarnessConfig | None = None,
        config: FusionConfig | None = None,
    ):
        self.sidekick, self.sidekick_cfg = sidekick, sidekick_cfg or HarnessConfig()
        self.config = config or FusionConfig()
        self._lock = threading.Lock()  # over the two maps below; lead episodes delegate from many threads
        self._episodes: dict[str, list[Trajectory]] = {}  # lead episode id -> its sidekick's episodes
        self._owners: dict[Path, str] = {}  # lead workspace -> lead episode id, for the grader

    def rollout(
        self,
        lead: Model,
        specs: Sequence[EpisodeSpec],
        cfg: HarnessConfig,
        *,
        concurrency: int = 8,
        sandbox: Sandbox | None = None,
        grader: Grader | None = None,
        on_record: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run and grade every lead episode with its delegations; records sorted by episode id."""
        sandbox = sandbox or get_sandbox()
        grader = grader or default_grader(sandbox)
        batches = SidekickBatches(functools.partial(self._run_sidekicks, sandbox), self.config.gather_s)
        extra = ExtraTools(
            names=("delegate",),
            schema=(DELEGATE,),
            help=LEAD_HELP,
            stop=(DELEGATE_STOP,),
            run=functools.partial(self._delegate, batches),
        )

        def grade(task: Task, workspace: Path, trajectory: dict[str, Any]) -> Verdict:
            with self._lock:
                owner = self._owners.pop(Path(workspace).resolve(), None)
                sidekick = list(self._episodes.get(owner, [])) if owner else []
            turns = [*trajectory["turns"], *(_detector_turn(t) for t in sidekick)]
            return grader(task, workspace, {**trajectory, "turns": turns})

        def done(record: Trajectory) -> None:
            with self._lock:
                sidekick = self._episodes.pop(record.id, [])
            attach(record, sidekick, self.sidekick.name)
            if on_record:
                on_record(record)

        try:
            records = run_episodes(
                specs,
                lead,
                cfg=cfg,
                sandbox=sandbox,
                grader=grade,
                concurrency=concurrency,
                on_record=done,
                extra_tools=extra,
            )
        finally:
            batches.close()
        return sorted(records, key=lambda r: r.id)

    def _delegate(self, batches: SidekickBatches, ep: Episode, action: Action) -> ToolResult:
        """Run one sidekick episode in `ep`'s workspace; its report is the lead's observation."""
        ws = ep.tools.workspace
        with self._lock:
            self._owners[ws] = ep.spec.id
            done = self._episodes.setdefault(ep.spec.id, [])
        k = len(done) + 1  # one lead episode delegates one turn at a time
        if k > self.config.max_delegations:
            return ToolResult(
                f"error: no delegations left ({self.config.max_delegations} per attempt)", ok=False
            )
        effort = self.config.sidekick_levels.get(ep.spec.id) or self.config.sidekick_effort
        spec = sidekick_spec(ep.spec, action.args["instruction"], k, ws, effort)
        before = _tree(ws)
        record = batches.run(spec)
        after = _tree(ws)
        with self._lock:
            done.append(record)
        diff = make_patch(before, after)
        return ToolResult(sidekick_report(record, diff, k, self.config.report_chars), edited=before != after)

    def _run_sidekicks(self, sandbox: Sandbox, specs: list[EpisodeSpec]) -> list[Trajectory]:
        """The sidekick's records for `specs`, in their order, run as one batch; when the model raised (a
        backend that broke the `Model` contract) each is a `model_error` record, nothing is raised."""
        try:
            records = run_episodes(
                specs, self.sidekick, cfg=self.sidekick_cfg, sandbox=sandbox, concurrency=len(specs)
            )
        except Exception as e:  # the lead's tool result, never its crash
            return [crashed(spec, self.sidekick.name, e) for spec in specs]
        by_id = {r.id: r for r in records}
        return [by_id[s.id] for s in specs]


class SidekickBatches:
    """One thread that owns the sidekick's model: it takes the delegations waiting (those that arrive within
    `gather_s` of the first), runs them together with `run_batch`, hands each caller its record, and
    repeats. `run` blocks its caller (a lead episode's tool thread) until its episode has ended."""

    def __init__(self, run_batch: Callable[[list[EpisodeSpec]], list[Trajectory]], gather_s: float = 0.05):
        self._run_batch, self.gather_s = run_batch, gather_s
        self._queue: queue.Queue[tuple[EpisodeSpec, Future] | None] = queue.Queue()
        self.sizes: list[int] = []  # each batch's size, in order
        self._thread = threading.Thread(target=self._serve, name="fusion-sidekick", daemon=True)
        self._thread.start()

    def run(self, spec: EpisodeSpec) -> Trajectory:
        future: Future[Trajectory] = Future()
        self._queue.put((spec, future))
        return future.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (first := self._queue.get()) is not None:
            batch, closing = [first], False
            deadline = time.monotonic() + self.gather_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self.sizes.append(len(batch))
            try:
                records = self._run_batch([spec for spec, _ in batch])
            except BaseException as e:  # never leave a lead episode waiting: its tool call raises instead
                for _, future in batch:
                    future.set_exception(e)
            else:
                for (_, future), record in zip(batch, records, strict=True):
                    future.set_result(record)
            if closing:
                return


def crashed(spec: EpisodeSpec, model: str, error: Exception) -> Trajectory:
    """The record of a sidekick episode whose model raised."""
    return Trajectory(
        id=spec.id,
        task_id=spec.task.id,
        effort=spec.effort.name,
        seed=spec.seed,
        index=spec.index,
        model=model,
        ending="model_error",
        error=f"the sidekick crashed: {error!r}"[:500],
        infra_failure="model_server",
    )


def sidekick_spec(
    lead: EpisodeSpec, instruction: str, k: int, workspace: Path, effort: str | Effort | None
) -> EpisodeSpec:
    """The `k`-th delegation's episode: the lead's task, told the lead's instruction, in the lead's
    workspace, at `effort` (a level's name or the level itself; None: the lead's); its id is the lead's
    with `/sidekick<k>` after it."""
    task = replace(
        lead.task, instruction=f"{lead.task.instruction.strip()}\n\nYour lead asks:\n{instruction}"
    )
    variant = f"{lead.variant}/sidekick{k}" if lead.variant else f"sidekick{k}"
    return replace(
        lead,
        task=task,
        effort=(get_effort(effort) if isinstance(effort, str) else effort) or lead.effort,
        variant=variant,
        workspace=workspace,
    )


def sidekick_report(record: Trajectory, diff: str, k: int, limit: int = 1200) -> str:
    """What the lead reads after delegation `k`: the sidekick's ending, its diff, its tests, its last word.

    Its price is the sidekick's tokens' (no measured seconds), so that a deterministic run's lead reads the
    same report in every run."""
    ending = f"{record.ending}" + (f" ({record.error})" if record.error else "")
    tests = [t for t in record.turns if t["role"] == "tool" and t.get("name") == "run_tests"]
    last = next((t for t in reversed(record.turns) if t["role"] == "assistant"), None)
    said = (last.get("text") or "") if last else ""
    if last and not said and last.get("tool_calls"):
        said = "; ".join(f"{c['name']} {c.get('arguments') or {}}" for c in last["tool_calls"])
    price = pricing_for(record.model).cost(record.prompt_tokens, record.completion_tokens, 0.0)
    parts = [
        f"sidekick report (delegation {k}): it ended with {ending} after {record.n_turns} turns; "
        f"its tokens cost ${price:.6f}.",
        "its changes (a diff against the repository before this delegation):",
        _cut(diff, limit) if diff else "(no changes)",
        f"it ran the tests {len(tests)} time(s)" + ("; the last result:" if tests else "."),
        *([_cut(tests[-1]["text"], limit)] if tests else []),
        "its last message:",
        _cut(said, limit) or "(none)",
    ]
    return "\n".join(parts)


def attach(record: Trajectory, sidekick: list[Trajectory], sidekick_model: str) -> None:
    """Make the lead's `record` the attempt's: nest the sidekick's episodes, sum the costs, count."""
    lead_cost = record.cost
    sidekick_cost = sum(t.cost for t in sidekick)
    record.sidekick = sidekick
    record.cost = lead_cost + sidekick_cost
    record.fusion = {
        "lead": record.model,
        "sidekick": sidekick_model,
        "delegations": len(sidekick),
        "take_overs": take_overs(record.turns),
        "lead_cost": lead_cost,
        "sidekick_cost": sidekick_cost,
    }


def take_overs(turns: Sequence[dict[str, Any]]) -> int:
    """Times the lead edited the repository itself after a delegation (once per delegation at most)."""
    count, pending = 0, False
    for t in turns:
        if t["role"] != "tool":
            continue
        if t.get("name") == "delegate":
            pending = True
        elif pending and t.get("name") == "edit" and t.get("ok"):
            count, pending = count + 1, False
    return count


def _detector_turn(record: Trajectory) -> dict[str, Any]:
    """The sidekick's actions in the shape the exploit detector reads (as the harness gives the lead's)."""
    calls = [
        {"name": t["name"], "arguments": t.get("arguments") or {}}
        for t in record.turns
        if t["role"] == "tool" and t.get("name") in ("shell", "view", "edit")
    ]
    return {"role": "assistant", "tool_calls": calls}


def _tree(workspace: Path) -> dict[str, str]:
    return {p: text for p, text in read_tree(workspace).items() if not _CACHES & set(p.split("/"))}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit // 2]}\n[...]\n{text[-limit // 2 :]}"


def sidekick_rollout(
    sidekick: Model,
    specs: Sequence[EpisodeSpec],
    cfg: HarnessConfig,
    *,
    lead: str,
    lead_base_url: str = "",
    lead_effort: str = "",
    max_delegations: int = 4,
    concurrency: int = 8,
    sandbox: Sandbox | None = None,
    grader: Grader | None = None,
    on_record: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Fusion's attempts at `specs` with `flywheel.eval.run.rollout`'s signature, `sidekick` as its model:
    the lead (loaded by spec, frozen) runs each spec and delegates to `sidekick` at the spec's level.

    `lead_effort` gives the lead the turn and token budgets and the prompt line of that level; its name
    (so the record's id and effort are the spec's) and its wall-time and dollar budgets stay the spec's.
    (a calibration ladder scales the sidekick's budgets, not the lead's). Both sides run under `cfg`."""
    levels = {s.id: s.effort for s in specs}  # a calibration ladder's rungs share a level's name
    fusion = Fusion(sidekick, cfg, FusionConfig(max_delegations=max_delegations, sidekick_levels=levels))
    if lead_effort:
        top = get_effort(lead_effort)
        specs = [
            replace(s, effort=replace(
                s.effort, marker=top.marker, max_turns=top.max_turns, max_tokens=top.max_tokens,
                turn_tokens=top.turn_tokens,
            ))
            for s in specs
        ]  # fmt: skip
    return fusion.rollout(
        lead_model(lead, lead_base_url),
        specs,
        cfg,
        concurrency=concurrency,
        sandbox=sandbox,
        grader=grader,
        on_record=on_record,
    )


@functools.lru_cache(maxsize=4)
def lead_model(spec: str, base_url: str = "") -> Model:
    """The lead named by `spec` (with its server for `openai:NAME`), loaded once per process."""
    return load_model(spec, **({"base_url": base_url} if base_url else {}))


def load_model(spec: str, **opts: Any) -> Model:
    """`flywheel.models.get_model`, plus `scripted-lead` (`flywheel.fusion.scripted`), for either side."""
    if spec == "scripted-lead":
        from flywheel.fusion.scripted import ScriptedLead

        return ScriptedLead()
    return get_model(spec, **opts)
