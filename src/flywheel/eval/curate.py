"""Difficulty curation's attempts: run a policy k times on every task, then keep the sometimes-solved.

`curate(tasks, model, out, k=8)` attempts every task k times through the real harness and grader (every
workspace graded), writing each trajectory to `out/trajectories.jsonl` as soon as it is graded, and then
hands the records to `flywheel.tasks.curate.write_curated`, which selects 0 < p ≤ p_max and writes the
curated suite (`out/tasks/`), `report.json` and `pass_rates.png`. The selection itself is pure data and
lives with the tasks; running a policy is evaluation's job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.eval.evaluate import run_recorded
from flywheel.eval.run import make_specs, rollout
from flywheel.harness import HarnessConfig, get_effort
from flywheel.protocols import Model
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.curate import select, write_curated
from flywheel.tasks.format import Task


def curate(
    tasks: Sequence[Task],
    model: Model,
    out: Path,
    *,
    k: int = 8,
    p_max: float = 0.75,
    effort: str = "medium",
    seed: int = 0,
    concurrency: int = 8,
    cfg: HarnessConfig | None = None,
    on_record: Callable[[Trajectory], None] | None = None,
) -> dict[str, Any]:
    """Attempt every task k times with `model`, keep 0 < p ≤ p_max; writes trajectories, tasks and report."""
    out = Path(out)
    if (out / "report.json").exists():
        raise FlywheelError(f"{out / 'report.json'} exists: choose another --out")
    select({}, p_max)  # a bad p_max fails before any attempt
    specs = make_specs(tasks, [get_effort(effort)], k, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    sandbox = get_sandbox()
    with (out / "trajectories.jsonl").open("w") as f:
        records = run_recorded(
            f,
            rollout,
            model,
            specs,
            cfg or HarnessConfig(),
            sandbox=sandbox,
            concurrency=concurrency,
            on_record=on_record,
        )
    settings = {"model": model.name, "effort": effort, "k": k, "p_max": p_max, "seed": seed}
    return write_curated(out, tasks, records, settings)
