"""The pair: lead episodes whose `delegate` runs a sidekick episode in the lead's workspace.

`Fusion.rollout` runs and grades the lead's episodes with the `delegate` tool (`LEAD_HELP`, offered
through the harness's `ExtraTools` hook); each delegation runs a sidekick episode through
`flywheel.fusion.sidekick`. The attempt is graded once, at the lead's end, with the sidekick's actions
shown to the exploit detector (`_detector_turn`); `attach` then makes the lead's record the attempt's.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.actions import DELEGATE, DELEGATE_STOP, Action
from flywheel.fusion.review import LeadReview
from flywheel.fusion.sidekick import SidekickBatches, crashed, sidekick_report, sidekick_spec
from flywheel.harness import EpisodeSpec, HarnessConfig, run_episodes
from flywheel.harness.agent import Episode, ExtraTools
from flywheel.harness.effort import Effort
from flywheel.harness.tools import ToolResult
from flywheel.protocols import Grader, Model, Sandbox, Verdict
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.format import Task
from flywheel.tasks.patch import make_patch, read_tree
from flywheel.verify import default_grader

LEAD_HELP = """You lead a sidekick: a less expensive engineer with its own tools, in this same repository.
Delegate exploring, implementing and testing with a plan in words; read its report (its diff, the tests it
ran, how it ended, and a review of the change so far: the tests before and after it, and checks for gamed
tests), then delegate again with corrections, take over and edit yourself, or submit.
<delegate>INSTRUCTION</delegate>  hand work to the sidekick; its report comes back"""
_CACHES = {"__pycache__", ".pytest_cache"}


@dataclass
class FusionConfig:
    """How the sidekick is run; the lead's episodes take the harness's `HarnessConfig`."""

    sidekick_effort: str | None = None  # the sidekick's effort level; None: the lead's episode's
    max_delegations: int = 4  # per attempt; past them `delegate` is refused
    report_chars: int = 1200  # of the diff, the last test output and the last message each, in a report
    gather_s: float = 0.05  # a batch of sidekick episodes waits this long after its first delegation
    review: bool = True  # end each report with the review of the change so far (`flywheel.fusion.review`)
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
            run=functools.partial(
                self._delegate, batches, LeadReview(sandbox) if self.config.review else None
            ),
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

    def _delegate(
        self, batches: SidekickBatches, review: LeadReview | None, ep: Episode, action: Action
    ) -> ToolResult:
        """Run one sidekick episode in `ep`'s workspace; its report (and the review of the change so far)
        is the lead's observation."""
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
        report = sidekick_report(record, make_patch(before, after), k, self.config.report_chars)
        if review is not None:
            report += "\n" + review(ep.spec.task, ws)
        return ToolResult(report, edited=before != after)

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
    """Times the lead changed the repository itself after a delegation (once per delegation at most): an
    edit, or a shell command that wrote a file (records older than the turns' `edited` count edits only)."""
    count, pending = 0, False
    for t in turns:
        if t["role"] != "tool":
            continue
        if t.get("name") == "delegate":
            pending = True
        elif pending and t.get("ok") and (t.get("edited") or t.get("name") == "edit"):
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
