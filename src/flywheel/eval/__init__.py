"""Evaluation: run a policy over tasks and summarise success against cost.

`run_eval` writes each trajectory to `RUN_DIR/trajectories.jsonl` as soon as it is graded (so an
interrupted run keeps every finished attempt) and `summary.json` at the end; every workspace is graded.
`summarize` is a pure function of trajectory records (`flywheel.record.Trajectory`, read back with
`flywheel.record.read_trajectories`).

Modules: `run` (the episode-running primitive every caller shares: specs, effort budgets, `rollout`),
`measure` (budget ladders and per-effort evaluations, as training measures a policy), `curate`
(difficulty curation's attempts), `solve` (one attempt on any local repository: `flywheel solve`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.eval.run import make_specs, rollout
from flywheel.harness import HarnessConfig, get_effort
from flywheel.protocols import Model
from flywheel.record import Trajectory, read_trajectories, write_trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.format import Task
from flywheel.verify import default_grader


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sensible at 0 and n, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(records: Iterable[Trajectory]) -> dict[str, Any]:
    """Success rate (with its 95% interval), cost, turns, steps to the first edit, endings.

    `n` counts every attempt and `endings` every ending; the attempts the infrastructure ended
    (`Trajectory.infra_failure`) are reported apart, `infra_failures` and `infra_causes` ({cause: count}),
    and the success rate, its interval, the successes and the means and medians are over the other
    `n_valid` attempts only, so that an outage does not read as a worse policy. `format_errors` and
    `cheats` count over every attempt. Fusion's records (`Trajectory.fusion`) add the means of each side's
    cost and the delegations and take-overs per attempt.
    """
    records = list(records)
    valid = [r for r in records if r.infra_failure is None]
    n = len(valid)
    wins = sum(r.success for r in valid)
    costs = [r.cost for r in valid]
    first_edits = [r.steps_to_first_edit for r in valid if r.steps_to_first_edit is not None]
    lo, hi = wilson_interval(wins, n)
    causes = Counter(r.infra_failure for r in records if r.infra_failure is not None)
    return {
        "n": len(records),
        "n_valid": n,
        "infra_failures": len(records) - n,
        "infra_causes": dict(sorted(causes.items())),
        "success_rate": wins / n if n else 0.0,
        "success_ci95": [lo, hi],
        "successes": wins,
        "mean_cost": statistics.fmean(costs) if costs else 0.0,
        "median_cost": _median(costs) or 0.0,
        "mean_turns": statistics.fmean(r.n_turns for r in valid) if n else 0.0,
        "median_steps_to_first_edit": _median(first_edits),
        "mean_completion_tokens": statistics.fmean(r.completion_tokens for r in valid) if n else 0.0,
        "format_errors": sum(r.format_errors for r in records),
        "cheats": sum(bool(r.verdict and r.verdict.cheat) for r in records),
        "endings": dict(sorted(Counter(r.ending for r in records).items())),
        **_fusion_summary([r.fusion for r in valid if r.fusion is not None]),
    }


def _fusion_summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Fusion's means over its valid attempts; nothing when no record is Fusion's."""
    if not parts:
        return {}
    return {
        key: statistics.fmean(float(p.get(field, 0)) for p in parts)
        for key, field in (
            ("mean_lead_cost", "lead_cost"),
            ("mean_sidekick_cost", "sidekick_cost"),
            ("delegations_per_attempt", "delegations"),
            ("take_overs_per_attempt", "take_overs"),
        )
    }


def run_eval(
    tasks: Sequence[Task],
    model: Model,
    out: Path,
    *,
    effort: str = "medium",
    seed: int = 0,
    concurrency: int = 8,
    cfg: HarnessConfig | None = None,
    on_record: Callable[[Trajectory], None] | None = None,
    overwrite: bool = False,
    runner: Callable[..., list[Trajectory]] = rollout,
) -> dict[str, Any]:
    """Evaluate `model` on `tasks` at one effort level; returns the summary also written to summary.json.

    `runner` runs the episodes, with `rollout`'s signature: Fusion passes its own (`flywheel.fusion`), with
    the lead as `model`."""
    out = Path(out)
    traj_path = out / "trajectories.jsonl"
    if traj_path.exists() and not overwrite:
        raise FlywheelError(f"{traj_path} exists: choose another --out, or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    specs = make_specs(tasks, [get_effort(effort)], 1, seed=seed)
    sandbox = get_sandbox()
    with traj_path.open("w") as f:

        def write(record: Trajectory) -> None:
            write_trajectory(f, record)
            if on_record:
                on_record(record)

        try:
            runner(
                model,
                specs,
                cfg or HarnessConfig(),
                concurrency=concurrency,
                sandbox=sandbox,
                grader=default_grader(sandbox),
                on_record=write,
            )
        finally:
            f.flush()
            summary = write_summary(out, model_name=model.name, effort=effort)
    return summary


def write_summary(out: Path, **extra: Any) -> dict[str, Any]:
    summary = {**extra, **summarize(read_trajectories(out / "trajectories.jsonl"))}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out / "summary.json")
    return summary
