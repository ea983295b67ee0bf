"""Running a policy over tasks: episode specs per (task, effort, sample), and graded rollouts.

`rollout(model, specs, cfg, ...)` runs episodes through the real harness and grader and returns their
trajectory records sorted by episode id, so that what follows never depends on which episode finished
first; `on_record` still sees each record as soon as it is graded. Evaluation (`run_eval`, `measure`),
curation's attempts, imitation data (`flywheel.sft`) and training's rollouts (`flywheel.rl`) all run
episodes through it.

By default a workspace that is byte-identical to the task's repository is not graded (the verifier's QA
already established that the unmodified repository fails; see `flywheel.verify.default_grader`); pass
`grader=default_grader(sandbox)` to grade every workspace.

`efforts_for` gives the effort levels with a run's budget overrides; `deterministic` lifts the budgets
that depend on measured seconds, so that an episode ends at the same point twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes
from flywheel.harness.effort import Effort
from flywheel.protocols import Grader, Model, Sandbox
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.format import Task
from flywheel.verify import default_grader


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


def rollout(
    model: Model,
    specs: Sequence[EpisodeSpec],
    cfg: HarnessConfig,
    *,
    concurrency: int = 24,
    sandbox: Sandbox | None = None,
    grader: Grader | None = None,
    on_record: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Run and grade every episode; records sorted by episode id.

    `grader` defaults to the shared verifier on `sandbox`, skipping unchanged workspaces.
    """
    sandbox = sandbox or get_sandbox()
    grader = grader or default_grader(sandbox, skip_unchanged=True)
    records = run_episodes(
        specs, model, cfg=cfg, sandbox=sandbox, grader=grader, concurrency=concurrency, on_record=on_record
    )
    return sorted(records, key=lambda r: r.id)
