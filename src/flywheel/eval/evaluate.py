"""Evaluating a policy on tasks at one effort level: a run directory of trajectories and a summary.

`run_eval` writes each trajectory to `RUN_DIR/trajectories.jsonl` as soon as it is graded (so an
interrupted run keeps every finished attempt) and `summary.json` at the end; every workspace is graded.
`eval_with_progress` is `run_eval` as `flywheel eval` runs it (`EvalSettings`), with a progress line; Ctrl-C there
keeps what finished and raises `Interrupted`. `run_recorded` is the attempt-and-write step that
evaluation and curation (`flywheel.eval.curate`) share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from flywheel.errors import FlywheelError
from flywheel.eval.run import make_specs, rollout
from flywheel.eval.summary import write_summary
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort
from flywheel.progress import progress
from flywheel.protocols import Model, Sandbox
from flywheel.record import Trajectory, write_trajectory
from flywheel.sandbox import get_sandbox
from flywheel.tasks.format import Task
from flywheel.verify import default_grader

Runner = Callable[..., list[Trajectory]]  # `flywheel.eval.run.rollout`'s signature (Fusion's `rollout`)


def run_recorded(
    f: IO[str],
    runner: Runner,
    model: Model,
    specs: Sequence[EpisodeSpec],
    cfg: HarnessConfig,
    *,
    sandbox: Sandbox,
    concurrency: int,
    on_record: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Run and grade every spec with `runner` (every workspace graded), appending each record to the open
    trajectories.jsonl `f` as soon as it is graded, then handing it to `on_record`; returns the records."""

    def write(record: Trajectory) -> None:
        write_trajectory(f, record)
        if on_record:
            on_record(record)

    return runner(
        model,
        specs,
        cfg,
        concurrency=concurrency,
        sandbox=sandbox,
        grader=default_grader(sandbox),
        on_record=write,
    )


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
    runner: Runner = rollout,
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
        try:
            run_recorded(
                f,
                runner,
                model,
                specs,
                cfg or HarnessConfig(),
                sandbox=sandbox,
                concurrency=concurrency,
                on_record=on_record,
            )
        finally:
            f.flush()
            summary = write_summary(out, model_name=model.name, effort=effort)
    return summary


@dataclass(frozen=True)
class EvalSettings:
    """What one evaluation runs besides the policy and its harness settings (`flywheel eval`'s options)."""

    tasks: Sequence[Task]
    effort: str = "medium"  # the effort level
    seed: int = 0
    concurrency: int = 8  # episodes run at once
    overwrite: bool = False  # replace an existing run directory's results


class Interrupted(Exception):
    """Ctrl-C stopped an evaluation; what finished is kept in `out` and counted in `summary`."""

    def __init__(self, out: Path, summary: dict[str, Any]):
        super().__init__(f"interrupted: kept {summary['n']} finished trajectories in {out}")
        self.out, self.summary = out, summary


def eval_with_progress(
    settings: EvalSettings, policy: Model, cfg: HarnessConfig, out: Path, runner: Runner | None = None
) -> dict[str, Any]:
    """`run_eval` into `out` (with `runner`, `rollout` by default) and a progress line; on Ctrl-C the
    summary of what finished is written (`interrupted: true`) and `Interrupted` raised."""
    s = settings
    with success_progress(f"eval {policy.name} -> {out}", len(s.tasks)) as tick:
        try:
            return run_eval(
                s.tasks,
                policy,
                out,
                effort=s.effort,
                seed=s.seed,
                concurrency=s.concurrency,
                cfg=cfg,
                on_record=tick,
                overwrite=s.overwrite,
                runner=runner or rollout,
            )
        except KeyboardInterrupt:
            summary = write_summary(out, model_name=policy.name, effort=s.effort, interrupted=True)
            raise Interrupted(out, summary) from None


@contextmanager
def success_progress(description: str, total: int) -> Iterator[Callable[[Trajectory], None]]:
    """A progress line (`flywheel.progress`) for `total` attempts; yields the `on_record` that advances it
    by one graded record and shows the success rate so far."""
    wins: list[bool] = []
    with progress(description, total) as advance:

        def tick(record: Trajectory) -> None:
            wins.append(record.success)
            advance(success=sum(wins) / len(wins))

        yield tick
