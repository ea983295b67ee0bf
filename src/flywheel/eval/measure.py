"""Measuring a policy the way training sees it: budget ladders for λ calibration, evaluations per effort.

`measure_ladder` runs the policy on calibration tasks at a ladder of budgets for each effort level (the
level's turn and token budgets scaled by each factor) and returns (factor, mean cost, success rate) per
rung, with the cost priced by the caller's `cost(record)` (training passes the reward's cost,
`flywheel.rubric.reward_cost`). `flywheel.rl.calibrate.run_calibration` turns the ladders into λ.

`evaluate_policy` runs one policy on a task list at each effort level and returns the eval summary per
level (`flywheel.eval.summarize`, plus `mean_reward_cost` over the valid attempts), writing trajectories
under `out/<effort>/`.

Both take plain arguments (effort levels, harness settings, concurrency, the cost, and what runs the
episodes: `rollout`, or Fusion's `sidekick_rollout` to measure a lead with `engine` as its sidekick), so that evaluation
needs nothing from the training code; `flywheel.rl.calibrate.measuring(cfg)` builds them from a run config.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from flywheel.eval import summarize
from flywheel.eval.run import make_specs, rollout
from flywheel.harness import EpisodeSpec, HarnessConfig
from flywheel.harness.effort import Effort
from flywheel.progress import progress
from flywheel.protocols import Model
from flywheel.record import Trajectory, write_trajectories
from flywheel.rubric import counts
from flywheel.tasks.format import Task

LADDER = (0.5, 1.0, 2.0)
Cost = Callable[[Trajectory], float]  # a trajectory record's cost, in the reward's unit
Runner = Callable[..., list[Trajectory]]  # runs episodes with `rollout`'s signature (Fusion: its pair's)


def ladder_specs(
    tasks: Sequence[Task], efforts: Sequence[Effort], factors: Sequence[float], samples: int, seed: int
) -> tuple[list[EpisodeSpec], dict[str, tuple[str, float]]]:
    """Every rung's episodes, and each episode's (effort, factor) by id; rungs share their seeds."""
    rung_of, specs = {}, []
    for base in efforts:
        for f in factors:
            level = replace(
                base,
                max_turns=max(1, round(base.max_turns * f)),
                max_tokens=max(1, round(base.max_tokens * f)),
            )
            for spec in make_specs(tasks, [level], samples, seed=seed):
                spec = replace(spec, variant=f"x{f:g}")
                rung_of[spec.id] = (base.name, f)
                specs.append(spec)
    return specs, rung_of


def measure_ladder(
    engine: Model,
    tasks: Sequence[Task],
    efforts: Sequence[Effort],
    cfg: HarnessConfig,
    *,
    concurrency: int,
    cost: Cost,
    seed: int,
    factors: Sequence[float] = LADDER,
    samples: int = 2,
    on_record: Callable[[Trajectory], None] | None = None,
    runner: Runner = rollout,
) -> dict[str, list[tuple[float, float, float]]]:
    """effort -> [(factor, mean cost, success rate)] for each rung of the ladder.

    Every rung of every level runs in one rollout, so the engine batches up to `concurrency` episodes
    even when each rung has only a few tasks. The rungs share their random numbers (common random
    numbers): sample i of a task draws the same stream at every budget, so a bigger budget replays the
    smaller one's attempt and carries it on where the smaller one was cut. What differs between rungs is
    then what the budget changes, not the luck of the draw, and success rises with the budget per attempt.
    Attempts the infrastructure failed are left out of a rung (unless every one of its attempts was).
    """
    specs, rung_of = ladder_specs(tasks, efforts, factors, samples, seed)
    records = runner(engine, specs, cfg, concurrency=concurrency, on_record=on_record)
    by_rung: dict[tuple[str, float], list[Trajectory]] = {}
    for r in records:
        by_rung.setdefault(rung_of[r.id], []).append(r)
    out: dict[str, list[tuple[float, float, float]]] = {}
    for name, f in dict.fromkeys(rung_of.values()):  # levels and rungs in the order asked
        rs = [r for r in by_rung[name, f] if not r.infra_failure] or by_rung[name, f]
        mean_cost = statistics.fmean(cost(r) for r in rs)
        out.setdefault(name, []).append((f, mean_cost, statistics.fmean(float(r.success) for r in rs)))
    return out


def _tally(advance, successes: list[float], record: Trajectory) -> None:
    successes.append(float(record.success))
    advance(success=statistics.fmean(successes))


def evaluate_policy(
    engine: Model,
    tasks: Sequence[Task],
    efforts: Sequence[Effort],
    cfg: HarnessConfig,
    out: Path,
    *,
    concurrency: int,
    cost: Cost,
    samples: int = 1,
    seed: int = 12345,
    runner: Runner = rollout,
    limits: Mapping[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Summaries per effort level of `engine` on `tasks` (trajectories in out/<effort>/).

    `limits` caps a level at its first n tasks (the same n tasks for every policy measured). Every level
    runs in one rollout, so the engine batches episodes of all levels together; the longest levels start
    first, so that short episodes fill the tail."""
    out = Path(out)
    limits = limits or {}
    specs = [
        spec
        for level in sorted(efforts, key=lambda lv: -lv.max_turns)
        for spec in make_specs(tasks[: limits.get(level.name, len(tasks))], [level], samples, seed=seed)
    ]
    with progress("evaluate", len(specs)) as advance:
        records = runner(engine, specs, cfg, concurrency=concurrency, on_record=partial(_tally, advance, []))
    result = {}
    for level in efforts:
        mine = [r for r in records if r.effort == level.name]
        (out / level.name).mkdir(parents=True, exist_ok=True)
        write_trajectories(out / level.name / "trajectories.jsonl", mine)
        summary = summarize(mine)
        valid = [cost(r) for r in mine if counts(r)]  # as summarize's means
        summary["mean_reward_cost"] = statistics.fmean(valid) if valid else 0.0
        result[level.name] = summary
    return result
