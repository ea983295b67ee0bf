"""Calibrating the cost price λ_e of each effort level from the base model's cost/success frontier.

Input: for each effort level, points ``(mean_cost, success_rate)`` measured by running the base policy at
a ladder of budgets, and the effort's operating point (the point measured at its default budget). The
frontier is the upper concave hull of all points together, cut where success peaks, so it is concave
and non-decreasing: the best success rate reachable at each cost by any effort (mixing two budgets at
random reaches any point of a chord, hence concave). Nothing is assumed about zero cost.

``λ_e`` is the frontier's local slope at the effort's operating point. The iso-reward lines of
``R = S - λ_e C`` are lines ``S = λ_e C + const``; with ``λ_e`` tangent to the frontier at the operating
point, no move *along* the base frontier raises the reward, so RL can only gain by pushing the frontier
up. Slopes, by where the operating point lies (`Calibration.position`):

- ``"vertex"`` (a hull corner): the average of the slopes of the segments to its left and right. Any slope
  between the two supports the hull there; the midpoint makes the corner the strict maximiser of reward
  along the frontier, and on a finely sampled smooth curve it is the central-difference derivative. At
  the frontier's first or last corner only one segment exists and its slope is used;
- ``"edge"`` (on a segment, between corners): that segment's slope;
- ``"below"`` (dominated, within the hull's cost range): the slope of the hull segment spanning its cost
  (at a corner's exact cost, the corner's slope as above);
- ``"beyond"`` (costlier than the cheapest point of peak success): 0, the frontier is flat there.

A frontier of a single point (one measurement, or all at the same cost, or success falling with cost
from the cheapest point on) has no slope: every λ is 0. λ is clamped at 0 (it is by construction).

`run_calibration(cfg, out)` is `flywheel calibrate`: it measures the run's base policy at the ladder of
budgets (`flywheel.eval.measure.measure_ladder`, priced with the reward's cost), calibrates, and writes
`calibration.json` and `calibration.png`. `measuring(cfg)` is how a run config measures a policy: its
effort levels with their budgets, its harness settings, its concurrency, the reward's cost, and with
`[fusion]` the pair's runner (the lead delegating to the measured model), so that λ is the pair's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from flywheel.eval.measure import LADDER, measure_ladder
from flywheel.eval.run import rollout
from flywheel.fusion import sidekick_rollout
from flywheel.harness import efforts_for
from flywheel.progress import progress
from flywheel.rl.config import RunConfig
from flywheel.rl.train import (
    fusion_options,
    harness_config,
    load_engine,
    load_tasks,
    setup_torch,
)
from flywheel.rubric import reward_cost
from flywheel.seeding import stable_seed

Point = tuple[float, float]  # (mean cost per rollout, success rate)
_EPS = 1e-9


@dataclass(frozen=True)
class Calibration:
    """Result of `calibrate`: the frontier, the inputs, and one λ per effort level."""

    points: dict[str, list[Point]]  # per effort, the ladder of measured points
    operating: dict[str, Point]  # per effort, the point at its default budget
    hull: list[Point]  # frontier corners, cost increasing, success non-decreasing
    lambdas: dict[str, float]  # per effort, the cost price
    position: dict[str, str]  # per effort: "vertex" | "edge" | "below" | "beyond"

    def to_json(self) -> dict[str, Any]:
        return {
            "points": {e: [list(p) for p in ps] for e, ps in self.points.items()},
            "operating": {e: list(p) for e, p in self.operating.items()},
            "hull": [list(p) for p in self.hull],
            "lambdas": dict(self.lambdas),
            "position": dict(self.position),
        }


def _not_a_right_turn(o: Point, a: Point, b: Point) -> bool:
    """True when ``a`` lies on or below the chord ``o → b`` (collinear up to rounding counts as on)."""
    left = (a[0] - o[0]) * (b[1] - o[1])
    right = (a[1] - o[1]) * (b[0] - o[0])
    return left - right >= -_EPS * (abs(left) + abs(right))


def frontier(points: Sequence[Point]) -> list[Point]:
    """Upper concave hull of ``points``, from the cheapest point to the cheapest point of peak success."""
    if not points:
        raise ValueError("the frontier needs at least one point")
    best: dict[float, float] = {}
    for c, s in points:
        best[c] = max(s, best.get(c, -math.inf))
    hull: list[Point] = []
    for p in sorted(best.items()):
        while len(hull) >= 2 and _not_a_right_turn(hull[-2], hull[-1], p):
            hull.pop()
        hull.append(p)
    peak = max(range(len(hull)), key=lambda i: (hull[i][1], -i))
    return hull[: peak + 1]


def _segment_slope(hull: list[Point], j: int) -> float:
    (c0, s0), (c1, s1) = hull[j], hull[j + 1]
    return (s1 - s0) / (c1 - c0)


def _vertex_slope(hull: list[Point], i: int) -> float:
    sides = [_segment_slope(hull, j) for j in (i - 1, i) if 0 <= j < len(hull) - 1]
    return sum(sides) / len(sides) if sides else 0.0


def local_slope(hull: list[Point], point: Point) -> tuple[float, str]:
    """The frontier's slope at ``point`` and where the point lies (see the module docstring)."""
    cost, success = point
    scale = max(1.0, abs(cost))
    if cost < hull[0][0] - _EPS * scale:
        raise ValueError(f"point {point} is cheaper than the frontier, which starts at {hull[0]}")
    if cost > hull[-1][0] + _EPS * scale:
        return 0.0, "beyond"
    for i, (c, s) in enumerate(hull):
        if abs(cost - c) <= _EPS * scale:
            return _vertex_slope(hull, i), "vertex" if success >= s - _EPS else "below"
    j = max(i for i, (c, _) in enumerate(hull) if c < cost)
    slope = _segment_slope(hull, j)
    on_edge = success >= hull[j][1] + slope * (cost - hull[j][0]) - _EPS
    return slope, "edge" if on_edge else "below"


def _check(p: Sequence[float], where: str) -> Point:
    if len(p) != 2 or not all(math.isfinite(float(x)) for x in p):
        raise ValueError(f"{where}: expected a finite (cost, success) pair, got {p!r}")
    return float(p[0]), float(p[1])


def calibrate(points: Mapping[str, Sequence[Point]], operating: Mapping[str, Point]) -> Calibration:
    """λ per effort level: the frontier's local slope at each operating point (clamped at 0).

    ``points`` maps effort -> measured ``(mean_cost, success_rate)`` ladder; ``operating`` maps effort ->
    the point at its default budget (it joins the frontier's input even when it is not in the ladder).
    """
    if not operating:
        raise ValueError("calibration needs at least one effort level with an operating point")
    ladders = {e: [_check(p, f"effort {e!r}") for p in ps] for e, ps in points.items()}
    ops = {e: _check(p, f"operating point of {e!r}") for e, p in operating.items()}
    hull = frontier([p for ps in ladders.values() for p in ps] + list(ops.values()))
    slopes = {e: local_slope(hull, p) for e, p in ops.items()}
    return Calibration(
        points=ladders,
        operating=ops,
        hull=hull,
        lambdas={e: max(0.0, s) for e, (s, _) in slopes.items()},
        position={e: where for e, (_, where) in slopes.items()},
    )


def plot_calibration(result: Calibration, path: str | os.PathLike[str]) -> Path:
    """Write a PNG: each effort's ladder and operating point, the frontier, and its iso-reward tangents."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    costs = [p[0] for ps in result.points.values() for p in ps] + [p[0] for p in result.operating.values()]
    lo, hi = min(costs), max(costs)
    span = [lo - 0.05 * (hi - lo or 1), hi + 0.05 * (hi - lo or 1)]
    ax.plot(
        [c for c, _ in result.hull], [s for _, s in result.hull], "k-", lw=2, label="frontier (concave hull)"
    )
    for i, (effort, op) in enumerate(result.operating.items()):
        color = f"C{i}"
        ladder = sorted(result.points.get(effort, []))
        ax.plot([c for c, _ in ladder], [s for _, s in ladder], "o:", color=color, alpha=0.6)
        ax.plot(*op, "*", ms=14, color=color, label=f"{effort}: λ={result.lambdas[effort]:.4g}")
        lam = result.lambdas[effort]
        ax.plot(span, [op[1] + lam * (c - op[0]) for c in span], "--", color=color, lw=1)
    ax.set_xlim(*span)
    succ = [p[1] for ps in result.points.values() for p in ps] + [p[1] for p in result.operating.values()]
    pad = 0.1 * (max(succ) - min(succ) or 1)
    ax.set_ylim(min(succ) - pad, max(succ) + pad)
    ax.set_xlabel("mean cost per rollout")
    ax.set_ylabel("success rate")
    ax.set_title("Effort calibration: iso-reward lines S = λC + const")
    ax.legend(loc="lower right", fontsize=8)
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, out)
    return out


# ------------------------------------------------------------------------------------ measuring a run


def measuring(cfg: RunConfig) -> dict[str, Any]:
    """The run's way of measuring a policy, as `flywheel.eval.measure` takes it: `efforts` (the run's levels
    with their budgets), `cfg` (its harness settings), `concurrency`, `cost` (the reward's) and `runner`
    (with `[fusion]`, the lead delegating to the measured model)."""
    r = cfg.rollout
    return {
        "efforts": efforts_for(r.efforts, r.max_turns, r.max_tokens, cfg.deterministic),
        "cfg": harness_config(cfg, 0),
        "concurrency": r.concurrency,
        "cost": partial(reward_cost, deterministic=cfg.deterministic),
        "runner": partial(sidekick_rollout, **fusion_options(cfg)) if cfg.fusion else rollout,
    }


def run_calibration(
    cfg: RunConfig,
    out: Path,
    *,
    factors: Sequence[float] = LADDER,
    samples: int = 2,
    limit: int = 16,
    split: str = "train",
) -> dict[str, Any]:
    """Measure the base policy's ladders (with `[fusion]`, under its lead), calibrate λ per effort, write
    calibration.json/.png into `out`."""
    setup_torch(cfg)
    tasks = load_tasks(cfg, split=split, limit=limit)
    engine = load_engine(cfg)
    seed = stable_seed(cfg.seed, "calibrate") % 2**31
    total = len(tasks) * samples * len(factors) * len(cfg.rollout.efforts)
    with progress("calibrate", total) as advance:
        ladders = measure_ladder(
            engine,
            tasks,
            **measuring(cfg),
            seed=seed,
            factors=factors,
            samples=samples,
            on_record=lambda r: advance(),
        )
    points = {e: [(c, s) for _, c, s in rungs] for e, rungs in ladders.items()}
    operating = {e: next((c, s) for f, c, s in rungs if f == 1.0) for e, rungs in ladders.items()}
    result = calibrate(points, operating)
    data = {
        **result.to_json(),
        "factors": list(factors),
        "samples": samples,
        "tasks": len(tasks),
        "model": cfg.model.path,
        "ladders": {e: [list(r) for r in rungs] for e, rungs in ladders.items()},
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(data, indent=1) + "\n")
    plot_calibration(result, out / "calibration.png")
    return data
