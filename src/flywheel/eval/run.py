"""Running a policy over tasks: episode specs per (task, effort, sample), and graded rollouts.

`rollout(model, specs, cfg, ...)` runs episodes through the real harness and grader and returns their
trajectory records sorted by episode id, so that what follows never depends on which episode finished
first; `on_record` still sees each record as soon as it is graded. Evaluation (`run_eval`, `measure`),
curation's attempts, imitation data (`flywheel.sft`) and training's rollouts (`flywheel.rl`) all run
episodes through it.

By default a workspace that is byte-identical to the task's repository is not graded (the verifier's QA
already established that the unmodified repository fails; see `flywheel.verify.default_grader`); pass
`grader=default_grader(sandbox)` to grade every workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flywheel.harness import EpisodeSpec, HarnessConfig, run_episodes
from flywheel.harness.effort import Effort
from flywheel.protocols import Grader, Model, Sandbox
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.format import Task
from flywheel.verify import default_grader


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
