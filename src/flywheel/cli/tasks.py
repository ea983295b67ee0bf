"""`flywheel tasks …`: list, build and validate task suites."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import typer

from flywheel.errors import FlywheelError

app = typer.Typer(help="List, build and validate task suites.", no_args_is_help=True)

SUITE = typer.Argument(..., help="A built-in suite (toybugs, humaneval) or a directory of tasks.")
SPLIT = typer.Option(None, "--split", help="Only tasks of this split (toybugs: train, heldout).")


@app.command("list")
def list_(suite: str = SUITE, split: str = SPLIT, seed: int = typer.Option(0, help="Suite seed.")) -> None:
    """Print the suite's task ids, one per line."""
    from flywheel.tasks import load_suite

    for task in load_suite(suite, split=split, seed=seed):
        typer.echo(task.id)


@app.command("build")
def build(
    suite: str = SUITE,
    out: Path = typer.Option(..., "--out", help="Directory to write the task directories into."),
    split: str = SPLIT,
    seed: int = typer.Option(0, help="Suite seed."),
) -> None:
    """Write the suite's task directories into OUT (one folder per task)."""
    from flywheel.tasks import load_suite

    tasks = load_suite(suite, split=split, seed=seed)
    if out.exists() and not out.is_dir():
        raise FlywheelError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        tmp = out / f".{task.id}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(task.root, tmp)
        shutil.rmtree(out / task.id, ignore_errors=True)
        tmp.rename(out / task.id)
    typer.echo(f"wrote {len(tasks)} tasks to {out}")


@app.command("validate")
def validate(
    suite: str = SUITE,
    split: str = SPLIT,
    k: int = typer.Option(1, "--k", min=1, help="Grade the reference solution k times (flakiness)."),
    limit: int = typer.Option(0, "--limit", min=0, help="Validate only the first N tasks (0: all)."),
    jobs: int = typer.Option(2, "--jobs", min=1, help="Tasks graded in parallel."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every task's result."),
) -> None:
    """Check each task: the reference solution passes and the unmodified repository fails."""
    from flywheel.progress import progress
    from flywheel.tasks import load_suite
    from flywheel.verify import validate_task

    tasks = load_suite(suite, split=split)
    tasks = tasks[:limit] if limit else tasks
    results = []
    with progress("validate", len(tasks)) as advance, ThreadPoolExecutor(jobs) as pool:
        for qa in pool.map(lambda t: validate_task(t, k=k), tasks):
            results.append(qa)
            advance(valid=sum(r.ok for r in results))
    valid = sum(r.ok for r in results)
    if as_json:
        summary = {"suite": suite, "total": len(results), "valid": valid, "tasks": [r.to_json() for r in results]}
        typer.echo(json.dumps(summary, indent=1))
    else:
        for r in results:
            if not r.ok:
                typer.echo(f"{r.task_id}: {'; '.join(r.reasons)}")
        typer.echo(f"{valid} of {len(results)} tasks valid")
    raise typer.Exit(0 if valid == len(results) else 1)
