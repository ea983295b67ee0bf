"""`flywheel tasks …`: list, build, validate (verifier QA), synthesise, curate, import and export suites."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flywheel.errors import FlywheelError
from flywheel.models import SPECS

if TYPE_CHECKING:
    from flywheel.protocols import Environment
    from flywheel.tasks import Task
    from flywheel.verify.qa import TaskQA

app = typer.Typer(
    help="List, build, validate, synthesise, curate, import and export task suites.", no_args_is_help=True
)

SUITE = typer.Argument(
    ..., help="A built-in suite (toybugs, toybugs-long, humaneval, pypibugs) or a directory of tasks."
)
SPLIT = typer.Option(None, "--split", help="Only tasks of this split (toybugs: train, heldout).")
FORMAT = typer.Option(..., "--format", help="harbor (task directories) or swebench (instances in JSONL).")


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
    k: int = typer.Option(
        3, "--k", min=1, help="Grade the reference solution k times (flaky: passes only sometimes)."
    ),
    mutants: int = typer.Option(
        3, "--mutants", min=0, help="Other mutants of the fixed function graded as wrong patches."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the mutant sample."),
    strict: bool = typer.Option(
        False, "--strict", help="Reject a task when a mutant passes (default: a warning)."
    ),
    limit: int = typer.Option(0, "--limit", min=0, help="Validate only the first N tasks (0: all)."),
    jobs: int = typer.Option(2, "--jobs", min=1, help="Tasks graded in parallel."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every task's result."),
) -> None:
    """Verifier QA: the reference passes k times, the unmodified repository and wrong patches fail."""
    from flywheel.sandbox.envs import ensure_all
    from flywheel.tasks import load_suite
    from flywheel.verify.qa import summarize

    tasks = load_suite(suite, split=split)
    tasks = tasks[:limit] if limit else tasks
    ensure_all((t.id, t.environment) for t in tasks)
    results = _validate_all(tasks, jobs, k=k, n_mutants=mutants, seed=seed, strict=strict)
    summary = summarize(results)
    if as_json:
        head = {"suite": suite, "k": k, "mutants": mutants, "strict": strict}
        typer.echo(json.dumps({**head, **summary, "tasks": [r.to_json() for r in results]}, indent=1))
    else:
        for line in _validate_lines(results, summary):
            typer.echo(line)
    raise typer.Exit(0 if summary["valid"] == summary["total"] else 1)


def _validate_all(tasks: list[Task], jobs: int, **options: Any) -> list[TaskQA]:
    """`validate_task(task, **options)` for every task, `jobs` at a time, in order, with a progress line."""
    from flywheel.progress import progress
    from flywheel.verify import validate_task

    results = []
    with progress("validate", len(tasks)) as advance, ThreadPoolExecutor(jobs) as pool:
        for qa in pool.map(lambda t: validate_task(t, **options), tasks):
            results.append(qa)
            advance(valid=sum(r.ok for r in results))
    return results


def _validate_lines(results: list[TaskQA], summary: dict) -> list[str]:
    """The text report: each rejected task with its reasons, then the totals and the error rates."""
    rejections = ", ".join(f"{code} {n}" for code, n in summary["rejections"].items()) or "none"
    warned = ", ".join(f"{code} {n}" for code, n in summary["warnings"].items()) or "none"
    return [
        *(f"{r.task_id}: {'; '.join(r.reasons)}" for r in results if not r.ok),
        f"{summary['valid']} of {summary['total']} tasks valid; rejections: {rejections}; warnings: {warned}",
        f"estimated false-negative rate {summary['false_negative_rate']:.3f} "
        f"({summary['reference_runs']} reference runs), false-positive rate "
        f"{summary['false_positive_rate']:.3f} ({summary['wrong_patches']} wrong patches)",
    ]


@app.command("synth")
def synth(
    from_dir: Path = typer.Option(
        ..., "--from-dir", help="A Python project with its pytest suite (an unpacked sdist, a checkout)."
    ),
    out: Path = typer.Option(
        ..., "--out", help="Directory to write the task directories and synth.json into."
    ),
    max_tasks: int = typer.Option(50, "--max", min=1, help="Stop after this many tasks."),
    seed: int = typer.Option(0, "--seed", help="Seed of the candidate order and the bug reports."),
    timeout: float = typer.Option(
        None, "--timeout", min=1, help="Seconds per candidate's test run (default: 3x the baseline + 5)."
    ),
    name: str = typer.Option(
        None, "--name", help="Project name in task ids (default: the directory's name)."
    ),
    jobs: int = typer.Option(2, "--jobs", min=1, help="Candidates evaluated in parallel."),
    requirements: Path = typer.Option(
        None,
        "--requirements",
        help="A requirements file: the tests run in an environment built from it, and every task carries it.",
    ),
    python: str = typer.Option(
        None, "--python", help="Python version of that environment (X.Y, one this host has)."
    ),
    split: str = typer.Option("train", "--split", help="The split every task written takes."),
) -> None:
    """Plant bugs in a real project's functions; keep those its tests catch; write them as tasks."""
    from flywheel.progress import progress
    from flywheel.sandbox import get_sandbox
    from flywheel.tasks.synth import synthesize, write_report
    from flywheel.verify.synth_check import suite_runner

    if not from_dir.is_dir():
        raise FlywheelError(f"{from_dir}: not a directory")
    if out.exists() and not out.is_dir():
        raise FlywheelError(f"{out}: exists and is not a directory")
    environment = _synth_environment(requirements, python, from_dir.name)
    with progress(f"synth {from_dir.name}", max_tasks) as advance:
        seen = {"evaluated": 0, "kept": 0}

        def tick(verdict: str, kept: int) -> None:
            seen["evaluated"] += 1
            advance(kept - seen["kept"], evaluated=seen["evaluated"])
            seen["kept"] = kept

        rep = synthesize(
            from_dir,
            out,
            run_suite=suite_runner(get_sandbox(), environment),
            max_tasks=max_tasks,
            seed=seed,
            timeout_s=timeout,
            name=name,
            jobs=jobs,
            on_candidate=tick,
            environment=environment,
            split=split,
        )
    write_report(rep, out)
    dropped = ", ".join(f"{r} {n}" for r, n in rep.dropped.items() if n) or "none"
    typer.echo(
        f"{rep.project}: {rep.kept} tasks from {rep.evaluated} candidates evaluated "
        f"(yield {rep.yield_:.2f}; {rep.candidates} proposed); dropped: {dropped}; wrote {out}"
    )


def _synth_environment(requirements: Path | None, python: str | None, label: str) -> Environment:
    """The environment `--requirements`/`--python` ask for, built now (or found built); the default
    (the project's own Python) when neither is given."""
    from flywheel.protocols import Environment
    from flywheel.sandbox.envs import ensure
    from flywheel.tasks.declared import read_requirements
    from flywheel.tasks.format import parse_environment

    if requirements is None and python is None:
        return Environment()
    if requirements is not None and not requirements.is_file():
        raise FlywheelError(f"{requirements}: not a file")
    table: dict[str, Any] = {"requirements": read_requirements(requirements) if requirements else []}
    if python is not None:
        table["python"] = python
    environment = parse_environment(table, "--requirements/--python")
    ensure(environment, label=label, on_build=lambda message: typer.echo(message, err=True))
    return environment


@app.command("curate")
def curate(
    suite: str = SUITE,
    model: str = typer.Option(..., "--model", help=f"{SPECS}."),
    out: Path = typer.Option(
        ..., "--out", help="Directory for report.json, pass_rates.png, trajectories and tasks/."
    ),
    k: int = typer.Option(8, "--k", min=1, help="Attempts per task."),
    p_max: float = typer.Option(
        0.75, "--p-max", min=0.0, max=1.0, help="Keep tasks with 0 < pass rate <= P."
    ),
    effort: str = typer.Option("medium", "--effort", help="Effort level: medium, high or max."),
    split: str = SPLIT,
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N tasks (0: all)."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Episodes run at once."),
    base_url: str = typer.Option(None, "--base-url", help="Server URL for openai:NAME models."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler and of noisy oracles."),
) -> None:
    """Pass rate of each task over k attempts of MODEL; keep the tasks it solves only sometimes."""
    from flywheel.cli.policy import model_from_options
    from flywheel.eval import success_progress
    from flywheel.eval.curate import curate as run_curate
    from flywheel.harness import get_effort
    from flywheel.tasks import load_suite

    get_effort(effort)  # bad input fails before anything loads
    if p_max <= 0:
        raise FlywheelError("--p-max must be above 0")
    if (out / "report.json").exists():
        raise FlywheelError(f"{out / 'report.json'} exists: choose another --out")
    tasks = load_suite(suite, split=split)
    tasks = tasks[:limit] if limit else tasks
    policy = model_from_options(model, base_url, seed)
    with success_progress(f"curate {model}", len(tasks) * k) as tick:
        rep = run_curate(
            tasks,
            policy,
            out,
            k=k,
            p_max=p_max,
            effort=effort,
            seed=seed,
            concurrency=concurrency,
            on_record=tick,
        )
    h = rep["histogram_before"]
    typer.echo(
        f"kept {rep['kept']} of {rep['tasks']} tasks (0 < p <= {p_max}); never solved {h['never_solved']}, "
        f"always solved {h['always_solved']}; wrote {out / 'report.json'} and {out / 'tasks'}"
    )


@app.command("import")
def import_(
    src: Path = typer.Argument(
        ...,
        help="harbor: a task directory or a folder of them; swebench: a JSONL or JSON file of instances "
        "(or a folder holding instances.jsonl).",
    ),
    fmt: str = FORMAT,
    out: Path = typer.Option(..., "--out", help="Suite directory to write (absent or empty)."),
    repos: Path = typer.Option(
        None, "--repos", help="swebench: checkouts as DIR/OWNER__NAME (default: repos/ beside the instances)."
    ),
    environment: Path = typer.Option(
        None,
        "--environment",
        help="swebench: the instances' requirements: one requirements file for all, or a TOML/JSON mapping "
        "OWNER__NAME = FILE (relative to it); default: what each repository declares (pyproject.toml, "
        "requirements*.txt, setup.cfg).",
    ),
) -> None:
    """Read another system's tasks into a suite of ours; refuse, naming it, any task we cannot grade."""
    from flywheel.sandbox.envs import find_python
    from flywheel.tasks.interop import import_tasks

    tasks = import_tasks(fmt, src, out, repos=repos, environment=environment, check_python=find_python)
    typer.echo(f"imported {len(tasks)} tasks from {src} ({fmt}) into {out}")


@app.command("export")
def export(
    suite: str = SUITE,
    fmt: str = FORMAT,
    out: Path = typer.Option(..., "--out", help="Directory to write (absent or empty)."),
    split: str = SPLIT,
    seed: int = typer.Option(0, help="Suite seed."),
    limit: int = typer.Option(0, "--limit", min=0, help="Export only the first N tasks (0: all)."),
) -> None:
    """Write the suite's tasks as Harbor task directories or SWE-bench instances with their repositories."""
    from flywheel.tasks import load_suite
    from flywheel.tasks.interop import check_format, export_tasks

    check_format(fmt)
    tasks = load_suite(suite, split=split, seed=seed)
    tasks = tasks[:limit] if limit else tasks
    export_tasks(fmt, tasks, out)
    typer.echo(f"exported {len(tasks)} tasks of {suite} as {fmt} to {out}")
