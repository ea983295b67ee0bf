"""Measuring a policy the way training sees it: λ calibration ladders and per-effort evaluations.

`measure_ladder` runs the policy on calibration tasks at a ladder of budgets for each effort level (the
level's turn and token budgets scaled by each factor) and returns (mean cost, success rate) per rung, in
the same cost unit as the reward (`rollout.reward_cost`). `run_calibration` turns the ladders into λ per
effort with `calibrate.calibrate` (the local slope of the upper concave hull at each level's default
budget) and writes `calibration.json` and `calibration.png`.

`evaluate_policy` runs one policy on a task list at each effort level with the training run's harness
settings and returns the eval summary per level (`flywheel.eval.summarize`), writing trajectories under
`out/<effort>/`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from flywheel.rl.config import RunConfig
from flywheel.seeding import stable_seed

LADDER = (0.5, 1.0, 2.0)


def measure_ladder(
    engine,
    tasks: Sequence[Any],
    cfg: RunConfig,
    factors: Sequence[float] = LADDER,
    samples: int = 2,
    on_record=None,
) -> dict[str, list[tuple[float, float, float]]]:
    """effort -> [(factor, mean cost, success rate)] for each rung of the ladder.

    Every rung of every level runs in one rollout, so the engine batches up to `rollout.concurrency`
    episodes even when each rung has only a few tasks. The rungs share their random numbers (common random
    numbers): sample i of a task draws the same stream at every budget, so a bigger budget replays the
    smaller one's attempt and carries it on where the smaller one was cut. What differs between rungs is
    then what the budget changes, not the luck of the draw, and success rises with the budget per attempt.
    """
    from flywheel.rl.rollout import efforts_for, make_specs, reward_cost, rollout
    from flywheel.rl.train import harness_config

    seed = stable_seed(cfg.seed, "calibrate") % 2**31
    rung_of, specs = {}, []
    for base in efforts_for(
        cfg.rollout.efforts, cfg.rollout.max_turns, cfg.rollout.max_tokens, cfg.deterministic
    ):
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
    records = rollout(
        engine, specs, harness_config(cfg, 0), concurrency=cfg.rollout.concurrency, on_record=on_record
    )
    by_rung: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in records:
        by_rung.setdefault(rung_of[r["id"]], []).append(r)
    out: dict[str, list[tuple[float, float, float]]] = {}
    for name, f in dict.fromkeys(rung_of.values()):  # levels and rungs in the order asked
        rs = by_rung[name, f]
        cost = statistics.fmean(reward_cost(r, cfg.deterministic) for r in rs)
        out.setdefault(name, []).append((f, cost, statistics.fmean(float(r["success"]) for r in rs)))
    return out


def run_calibration(
    cfg: RunConfig,
    out: Path,
    *,
    factors: Sequence[float] = LADDER,
    samples: int = 2,
    limit: int = 16,
    split: str = "train",
) -> dict[str, Any]:
    """Measure the base policy's ladders, calibrate λ per effort, write calibration.json/.png into `out`."""
    from flywheel.progress import progress
    from flywheel.rl.calibrate import calibrate, plot_calibration
    from flywheel.rl.train import load_engine, load_tasks, setup_torch

    setup_torch(cfg)
    tasks = load_tasks(cfg, split=split, limit=limit)
    engine = load_engine(cfg)
    total = len(tasks) * samples * len(factors) * len(cfg.rollout.efforts)
    with progress("calibrate", total) as advance:
        ladders = measure_ladder(engine, tasks, cfg, factors, samples, on_record=lambda r: advance())
    points = {e: [(c, s) for _, c, s in rungs] for e, rungs in ladders.items()}
    operating = {e: next((c, s) for f, c, s in rungs if f == 1.0) for e, rungs in ladders.items()}
    result = calibrate(points, operating)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        **result.to_json(),
        "factors": list(factors),
        "samples": samples,
        "tasks": len(tasks),
        "model": cfg.model.path,
        "ladders": {e: [list(r) for r in rungs] for e, rungs in ladders.items()},
    }
    (out / "calibration.json").write_text(json.dumps(data, indent=1) + "\n")
    plot_calibration(result, out / "calibration.png")
    return data


def _tally(advance, successes: list[float], record: dict[str, Any]) -> None:
    successes.append(float(record["success"]))
    advance(success=statistics.fmean(successes))


def evaluate_policy(
    engine, tasks: Sequence[Any], cfg: RunConfig, out: Path, *, samples: int = 1, seed: int = 12345
) -> dict[str, dict[str, Any]]:
    """Summaries per effort level of `engine` on `tasks` (trajectories in out/<effort>/)."""
    from flywheel.eval import summarize
    from flywheel.progress import progress
    from flywheel.rl.rollout import efforts_for, make_specs, reward_cost, rollout
    from flywheel.rl.train import harness_config

    out = Path(out)
    result = {}
    for level in efforts_for(
        cfg.rollout.efforts, cfg.rollout.max_turns, cfg.rollout.max_tokens, cfg.deterministic
    ):
        with progress(f"evaluate {level.name}", len(tasks) * samples) as advance:
            records = rollout(
                engine,
                make_specs(tasks, [level], samples, seed=seed),
                harness_config(cfg, 0),
                concurrency=cfg.rollout.concurrency,
                on_record=partial(_tally, advance, []),
            )
        (out / level.name).mkdir(parents=True, exist_ok=True)
        with (out / level.name / "trajectories.jsonl").open("w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        summary = summarize(records)
        summary["mean_reward_cost"] = statistics.fmean(reward_cost(r, cfg.deterministic) for r in records)
        result[level.name] = summary
    return result
