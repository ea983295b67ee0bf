"""`flywheel eval`: run a suite through the harness and write trajectories and a summary."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from flywheel.models import SPECS
from flywheel.record import Trajectory


def eval_(
    suite: str = typer.Option(
        ..., "--suite", help="A built-in suite (toybugs, humaneval) or a task directory."
    ),
    model: str = typer.Option(..., "--model", help=f"{SPECS}."),
    out: Path = typer.Option(
        ..., "--out", help="Run directory: trajectories.jsonl and summary.json go here."
    ),
    split: str = typer.Option(None, "--split", help="Only tasks of this split (toybugs: train, heldout)."),
    effort: str = typer.Option("medium", "--effort", help="Effort level: medium, high or max."),
    limit: int = typer.Option(0, "--limit", min=0, help="Evaluate only the first N tasks (0: all)."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Episodes run at once."),
    cohorts: int = typer.Option(
        1,
        "--cohorts",
        min=1,
        help="Groups of those episodes that take turns: one generates while the others' "
        "commands run (1: all step together).",
    ),
    base_url: str = typer.Option(None, "--base-url", help="Server URL for openai:NAME models."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Top-p (nucleus) sampling."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler and of noisy oracles."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run directory's results."),
) -> None:
    """Evaluate MODEL on SUITE at one effort level; prints the summary as JSON."""
    from flywheel.eval import run_eval, write_summary
    from flywheel.harness import HarnessConfig, get_effort
    from flywheel.models import get_model
    from flywheel.progress import progress
    from flywheel.tasks import load_suite

    get_effort(effort)  # a bad effort fails before anything loads
    tasks = load_suite(suite, split=split)
    tasks = tasks[:limit] if limit else tasks
    opts = {"base_url": base_url} if model.startswith("openai:") else {}
    policy = get_model(model, seed=seed, **opts) if model.startswith("scripted") else get_model(model, **opts)
    learned = {}
    if model.startswith("hf:"):  # a `flywheel sft` base is evaluated under the harness settings it learned
        from flywheel.sft import trained_harness

        learned = trained_harness(model)
    cfg = HarnessConfig(temperature=temperature, top_p=top_p, cohorts=cohorts, **learned)
    wins = []
    with progress(f"eval {model}", len(tasks)) as advance:

        def tick(record: Trajectory) -> None:
            wins.append(record.success)
            advance(success=sum(wins) / len(wins))

        try:
            summary = run_eval(
                tasks,
                policy,
                out,
                effort=effort,
                seed=seed,
                concurrency=concurrency,
                cfg=cfg,
                on_record=tick,
                overwrite=overwrite,
            )
        except KeyboardInterrupt:
            summary = write_summary(out, model_name=policy.name, effort=effort, interrupted=True)
            typer.echo(f"interrupted: kept {summary['n']} finished trajectories in {out}", err=True)
            raise typer.Exit(130) from None
    typer.echo(json.dumps(summary, indent=1))
