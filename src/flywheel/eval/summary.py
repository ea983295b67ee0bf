"""Summaries of evaluations: success against cost, as pure functions of trajectory records.

`summarize` reads records (`flywheel.record.Trajectory`, read back with
`flywheel.record.read_trajectories`) into one summary; `wilson_interval` is its success rate's 95%
interval; `paired_gain` is the change in success between two policies that attempted the same tasks, with
its paired interval; `write_summary` writes a run directory's `summary.json` from its `trajectories.jsonl`.
Which attempts count is the rubric's (`flywheel.rubric.counts`): those the infrastructure ended are
reported apart.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from flywheel.record import Trajectory, read_trajectories
from flywheel.rubric import counts


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sensible at 0 and n, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_gain(before: Iterable[Trajectory], after: Iterable[Trajectory], z: float = 1.96) -> dict[str, Any]:
    """Success after minus success before on the same tasks, paired by task id, with Newcombe's interval
    for a difference of paired proportions (his method 10: each side's Wilson interval, corrected by the
    pairs' correlation phi). A task either side lacks, or that the infrastructure ended on either side,
    is left out. Pairing narrows the interval when the same tasks tend to be solved by both: the
    discordant pairs (`before_only`, `after_only`) carry the difference.

    Example: 100 tasks, 12 solved by both, 11 only before, 14 only after: gain +0.03, about [-0.07, +0.13].
    """
    first = {r.task_id: r for r in before if counts(r)}
    second = {r.task_id: r for r in after if counts(r)}
    pairs = [(first[k].success, second[k].success) for k in sorted(first.keys() & second.keys())]
    n = len(pairs)
    cells = Counter(pairs)
    a, b, c, d = cells[True, True], cells[True, False], cells[False, True], cells[False, False]
    out = {"n": n, "both": a, "before_only": b, "after_only": c, "neither": d}
    if n == 0:
        return {**out, "gain": 0.0, "ci95": [-1.0, 1.0]}
    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = wilson_interval(a + b, n, z), wilson_interval(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(margins) if margins else 0.0
    down = math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    up = math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    return {**out, "gain": p2 - p1, "ci95": [p2 - p1 - down, p2 - p1 + up]}


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
    valid = [r for r in records if counts(r)]
    n = len(valid)
    wins = sum(r.success for r in valid)
    costs = [r.cost for r in valid]
    first_edits = [r.steps_to_first_edit for r in valid if r.steps_to_first_edit is not None]
    lo, hi = wilson_interval(wins, n)
    causes = Counter(r.infra_failure for r in records if not counts(r))
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


def write_summary(out: Path, **extra: Any) -> dict[str, Any]:
    """Summarise `out/trajectories.jsonl` into `out/summary.json` (written whole, then renamed), with
    `extra` (the model's name, the effort level, ...) first; returns the summary."""
    summary = {**extra, **summarize(read_trajectories(out / "trajectories.jsonl"))}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out / "summary.json")
    return summary
