"""`flywheel grade TASK_DIR WORKSPACE`: grade a finished workspace.

`--json` prints the verdict and its `reward`: the reward at λ = 0 (`flywheel.rubric.reward` with
no cost term), 1 for a success and 0 otherwise. Verdicts carry no reward of their own; training's
reward, with its cost term, is the trainer's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from flywheel.errors import FlywheelError
from flywheel.protocols import Verdict


def grade(
    task_dir: Path = typer.Argument(
        ..., help="The task directory (task.toml, repo/, tests/, solution.patch)."
    ),
    workspace: Path = typer.Argument(
        ..., help="The finished workspace to grade (it is copied, never modified)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the verdict as one JSON object, with its reward at λ = 0 (1 or 0)."
    ),
) -> None:
    """Grade WORKSPACE against the task's hidden tests; exit 0 when it succeeds, 1 when it does not."""
    from flywheel.tasks import load_task
    from flywheel.verify import default_detector
    from flywheel.verify import grade as grade_workspace

    task = load_task(task_dir)
    if not workspace.is_dir():
        raise FlywheelError(f"{workspace}: workspace is not a directory")
    verdict = grade_workspace(task, workspace, detector=default_detector)
    if as_json:
        typer.echo(json.dumps(verdict_json(verdict)))
    else:
        f2p, p2p = verdict.fail_to_pass, verdict.pass_to_pass
        state = "success" if verdict.success else "failed"
        typer.echo(f"{task.id}: {state} (fail_to_pass {f2p[0]}/{f2p[1]}, pass_to_pass {p2p[0]}/{p2p[1]})")
        if verdict.error:
            typer.echo(f"  {verdict.error}")
        if verdict.cheat:
            typer.echo(f"  cheating: {', '.join(verdict.signatures)}")
    raise typer.Exit(0 if verdict.success else 1)


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    """The verdict's JSON and its `reward` at λ = 0 (no cost term)."""
    from flywheel.rubric import reward

    return {**verdict.to_json(), "reward": reward(verdict.success, 0.0, 0.0)}
