"""Rollouts for training: episode specs per (task, effort, sample), grading, and the cost the reward sees.

`rollout(model, specs, ...)` runs episodes through the real harness and grader and returns their
trajectory records sorted by episode id, so that what follows never depends on which episode finished
first. Two departures from `flywheel eval`, both for throughput and both exact:

- A workspace that is byte-identical to the task's repository is not graded: the verifier's QA already
  established that the unmodified repository fails, so the verdict is a failure ("workspace unchanged")
  without spending a sandboxed pytest run. Anything that changed a file, through any tool, is graded.
- Conversations keep observations up to `observation_chars` (small models have small contexts).

`reward_cost(record, deterministic)` is the C of ``R = S - λ·C``. Normally it is the harness's cost in
dollars (tokens and compute seconds). Seconds are not reproducible, so a deterministic run prices a
modelled time instead: fixed seconds per generated token, per prompt token and per tool call
(`MODELLED_SECONDS`), which keeps the cost's shape (longer and busier attempts cost more) and makes two
runs with the same seed identical.
"""

from __future__ import annotations

import filecmp
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, pricing_for, run_episodes
from flywheel.harness.effort import Effort
from flywheel.protocols import Model, Verdict
from flywheel.tasks.format import Task

# seconds per completion token, per prompt token, per tool call (a small CPU model and a sandboxed tool)
MODELLED_SECONDS = (0.004, 0.0002, 0.4)


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


def make_specs(
    tasks: Sequence[Task], efforts: Sequence[Effort], group_size: int, seed: int
) -> list[EpisodeSpec]:
    """`group_size` attempts of every task at every effort level, all seeded by `seed`."""
    return [
        EpisodeSpec(task, effort, seed=seed, index=i)
        for task in tasks
        for effort in efforts
        for i in range(group_size)
    ]


def same_tree(a: Path, b: Path) -> bool:
    """True when directories `a` and `b` hold the same files with the same bytes."""
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    if mismatch or errors:
        return False
    return all(same_tree(a / d, b / d) for d in cmp.common_dirs)


def skip_unchanged(grader: Callable[[Task, Path, dict], Any]) -> Callable[[Task, Path, dict], Any]:
    """`grader`, except that an unchanged workspace is a failure without a grading run."""

    def grade(task: Task, workspace: Path, trajectory: dict) -> Any:
        if same_tree(task.repo, workspace):
            return Verdict(task.id, success=False, reward=0.0, error="workspace unchanged")
        return grader(task, workspace, trajectory)

    return grade


def default_grader(sandbox: Any) -> Callable[[Task, Path, dict], Any]:
    from flywheel.verify import detect, grade

    return lambda task, ws, traj: grade(task, ws, sandbox=sandbox, detector=lambda t, w: detect(t, w, traj))


def rollout(
    model: Model,
    specs: Sequence[EpisodeSpec],
    cfg: HarnessConfig,
    *,
    concurrency: int = 24,
    sandbox: Any = None,
    grader: Callable[[Task, Path, dict], Any] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run and grade every episode; records sorted by episode id."""
    from flywheel.sandbox import get_sandbox

    sandbox = sandbox or get_sandbox()
    grader = grader or skip_unchanged(default_grader(sandbox))
    records = run_episodes(
        specs, model, cfg=cfg, sandbox=sandbox, grader=grader, concurrency=concurrency, on_record=on_record
    )
    return sorted(records, key=lambda r: r["id"])


def tool_calls(record: dict[str, Any]) -> int:
    return sum(
        t["role"] == "tool" and t.get("name") not in ("format_error", "compaction") for t in record["turns"]
    )


def reward_cost(record: dict[str, Any], deterministic: bool = False) -> float:
    """The attempt's cost in dollars: the harness's, or with modelled seconds when `deterministic`."""
    if not deterministic:
        return float(record["cost"])
    usage = record["usage"]
    per_gen, per_prompt, per_tool = MODELLED_SECONDS
    seconds = (
        usage["completion_tokens"] * per_gen
        + usage["prompt_tokens"] * per_prompt
        + tool_calls(record) * per_tool
    )
    return pricing_for(record["model"]).cost(usage["prompt_tokens"], usage["completion_tokens"], seconds)
