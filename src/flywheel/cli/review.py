"""`flywheel review`: review a change to a repository; markdown on stdout (`--json` for machines), exit 0
to approve, 1 to request changes, 2 for bad input. The work is `flywheel.review`'s."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from flywheel.errors import FlywheelError


def review(
    repo: Path = typer.Option(..., "--repo", help="The git repository the change is to."),
    diff: Path = typer.Option(None, "--diff", help="The change as a diff file, against HEAD."),
    branch: str = typer.Option(
        None, "--branch", help="The change as a branch, against its merge base with HEAD."
    ),
    model: str = typer.Option(
        None,
        "--model",
        help="A review agent: hf:PATH, a shipped base, openai:NAME, or scripted-reviewer (a fake for tests and "
        "demos: it repeats the checks and is never a result). Without it the tests and the checks decide.",
    ),
    base_url: str = typer.Option(None, "--base-url", help="Server URL for openai:NAME models."),
    instruction: str = typer.Option(None, "--instruction", help="What the change was meant to do."),
    test_command: str = typer.Option(
        None, "--test-command", help="The tests' command (default: pytest, with per-test results)."
    ),
    effort: str = typer.Option("medium", "--effort", help="The review agent's effort level."),
    no_env: bool = typer.Option(False, "--no-env", help="Run the tests on flywheel's own Python."),
    as_json: bool = typer.Option(False, "--json", help="Print the review as JSON."),
    seed: int = typer.Option(0, "--seed", help="Seed of the review agent's sampler."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="The review agent's temperature."),
) -> int:
    """Review a change to REPO (--diff FILE or --branch B): the tests before and after it in the sandbox,
    the verifier's exploit checks against the repository's own tests, and, with --model, a review agent
    with read-only tools that ends in a verdict with comments tied to file:line."""
    from flywheel.harness import get_effort
    from flywheel.review import CHANGES, SCRIPTED_REVIEWER, ScriptedReviewer, markdown
    from flywheel.review import review as review_change

    get_effort(effort)
    if diff is not None and branch is not None:
        raise FlywheelError("give the change as --diff FILE or as --branch B, not both")
    policy, cfg = None, None
    if model == SCRIPTED_REVIEWER:
        policy = ScriptedReviewer()
    elif model is not None:
        from flywheel.cli.policy import load_policy
        from flywheel.solve import refuse_scripted

        refuse_scripted(model=model)
        policy, cfg = load_policy(model, base_url, seed, temperature, 1.0, 1)
    result = review_change(
        repo, diff_file=diff, branch=branch, model=policy, cfg=cfg, instruction=instruction,
        test_command=test_command, use_env=not no_env, effort=effort, log=lambda line: typer.echo(line, err=True),
    )  # fmt: skip
    typer.echo(json.dumps(result.to_json(), indent=1) if as_json else markdown(result))
    return 1 if result.decision == CHANGES else 0
