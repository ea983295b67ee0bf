"""Effort levels: a marker in the system prompt plus the budgets of an attempt, all in one place.

SWE-2 trains `medium`, `high` and `max` in one RL run; each level is told which it is (the marker) and
gets its own budget. The RL cost penalty λ_e of each level is calibrated separately (flywheel.rl).

`efforts_for` gives the levels with a run's budget overrides (each refused by `get_effort` when it is not a
budget); `deterministic` lifts the budgets that depend on measured seconds, so that an episode ends at
the same point twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from flywheel.errors import FlywheelError


@dataclass(frozen=True)
class Effort:
    name: str
    marker: str  # the line added to the system prompt
    max_turns: int  # model turns before the episode ends with `turn_limit`
    max_tokens: int  # completion tokens over the whole episode (`token_limit`)
    wall_s: float  # seconds for the whole attempt: its tool time and its share of generation (`time_limit`)
    max_cost: float  # dollars (`cost_limit`)
    turn_tokens: int = 256  # completion tokens per model turn


EFFORTS: dict[str, Effort] = {
    "medium": Effort(
        "medium",
        "Effort: medium. Be direct: fix the bug with as few steps as you can.",
        10,
        1500,
        120.0,
        0.05,
    ),
    "high": Effort(
        "high", "Effort: high. Investigate enough to be sure, then fix and verify.", 20, 3000, 240.0, 0.10
    ),
    "max": Effort(
        "max", "Effort: max. Be thorough: explore, fix, and verify carefully.", 40, 6000, 480.0, 0.20
    ),
}


BUDGETS = {f.name for f in fields(Effort)} - {"name", "marker"}  # what a run may override


def get_effort(name: str, **overrides: float) -> Effort:
    """The effort level `name`, with budgets optionally overridden (a run's budgets, calibration's ladders);
    an unknown level or budget is refused with one line."""
    if name not in EFFORTS:
        raise FlywheelError(f"unknown effort '{name}' (choose from {', '.join(EFFORTS)})")
    unknown = sorted(set(overrides) - BUDGETS)
    if unknown:
        raise FlywheelError(f"not an effort budget: {', '.join(unknown)} (effort '{name}')")
    return replace(EFFORTS[name], **overrides) if overrides else EFFORTS[name]


def efforts_for(
    names: Sequence[str],
    max_turns: dict[str, int] | None = None,
    max_tokens: dict[str, int] | None = None,
    deterministic: bool = False,
) -> list[Effort]:
    """The effort levels `names`, with per-level budget overrides.

    `deterministic` lifts the wall-time and dollar budgets, which depend on measured seconds and so
    cannot end an episode at the same point twice; turn and token budgets still apply.
    """
    return [
        get_effort(name, **budget_overrides(name, max_turns, max_tokens, deterministic)) for name in names
    ]


def budget_overrides(
    name: str,
    max_turns: dict[str, int] | None = None,
    max_tokens: dict[str, int] | None = None,
    deterministic: bool = False,
) -> dict[str, Any]:
    """The budgets of effort `name` that differ from its defaults (see `efforts_for`)."""
    overrides: dict[str, Any] = {"wall_s": math.inf, "max_cost": math.inf} if deterministic else {}
    if max_turns and name in max_turns:
        overrides["max_turns"] = int(max_turns[name])
    if max_tokens and name in max_tokens:
        overrides["max_tokens"] = int(max_tokens[name])
    return overrides
