"""`flywheel solve`: one attempt at an instruction on a local repository; the diff on stdout.

The work is `flywheel.solve`'s: the agent works on a copy without `.git`, in the environment the
repository declares (built once, then reused; `--no-env`: the project's own Python), and the repository
changes only with `--apply` and only when the whole patch applies. `--branch` commits the diff on a new
branch from HEAD without touching HEAD, the index or the working tree (`flywheel.solve.git`). Progress and
the report go to stderr.
"""

from __future__ import annotations

from pathlib import Path

import typer

from flywheel.errors import FlywheelError
from flywheel.models import require_torch


def solve(
    instruction: str = typer.Argument(..., help="What the agent should do, in words."),
    repo: Path = typer.Option(..., "--repo", help="The repository to work on (its copy, without .git)."),
    model: str = typer.Option(
        None, "--model", help="hf:PATH, smollm2-135m, toybugs-sweep or openai:NAME (not a scripted model)."
    ),
    lead: str = typer.Option(None, "--lead", help="Fusion: the lead's model; needs --sidekick."),
    sidekick: str = typer.Option(None, "--sidekick", help="Fusion: the sidekick's model, run by `delegate`."),
    effort: str = typer.Option("medium", "--effort", help="Effort level: medium, high or max."),
    test_command: str = typer.Option(
        None, "--test-command", help="The tests' command (default: pytest when the repository uses it)."
    ),
    requirements: Path = typer.Option(
        None,
        "--requirements",
        help="A requirements file whose lines join what the repository declares in its environment.",
    ),
    no_env: bool = typer.Option(
        False,
        "--no-env",
        help="Run on flywheel's own Python instead of building the environment the repository declares.",
    ),
    apply: bool = typer.Option(
        False,
        "--apply",
        help="Apply the patch to the repository's working tree if all of it applies (with --branch too: "
        "the branch is committed and the working tree also gets the patch; the branch is not checked out).",
    ),
    branch: str = typer.Option(
        None,
        "--branch",
        help="Commit the diff on this new branch from HEAD (a git repository's top level; 'auto': "
        "flywheel/<words of the instruction>). The agent works on HEAD's tree; HEAD, the index and the "
        "working tree are left as they are. A checkout whose tracked files have uncommitted changes is refused.",
    ),
    include_uncommitted: bool = typer.Option(
        False,
        "--include-uncommitted",
        help="With --branch: the agent works on the working tree as `git add -A` would stage it (ignored "
        "files left out), and the branch holds those uncommitted changes plus the agent's, in one commit.",
    ),
    patch_out: Path = typer.Option(None, "--patch-out", help="Write the patch here instead of stdout."),
    out: Path = typer.Option(
        None,
        "--out",
        help="Run directory (new or empty): trajectories.jsonl, summary.json, patch.diff and PR.md (the "
        "instruction, the agent's summary, the diff stat, the tests before and after, turns, tokens, cost).",
    ),
    base_url: str = typer.Option(None, "--base-url", help="Server URL for openai:NAME models."),
    action_format: str = typer.Option(
        "auto", "--action-format", help="How MODEL (or the lead) acts: native (tool calls), tagged or auto."
    ),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler."),
    draft: str = typer.Option(
        "",
        "--draft",
        help="Speculative decoding for a torch model: lookup[:N] (no model: what the context repeats), "
        "layers:N or a model with its vocabulary. The answers' distribution is the model's own.",
    ),
) -> None:
    """Let MODEL (or a LEAD with its SIDEKICK) work on REPO at INSTRUCTION; print the patch it made.

    The agent's commands and the test runs use an environment built (once, then reused) from what REPO
    declares: pyproject.toml's dependencies and test extras, requirements*.txt, setup.cfg; plus
    --requirements FILE. --no-env runs them on flywheel's own Python."""
    from flywheel.cli.policy import check_roles, load_policy
    from flywheel.fusion import Fusion
    from flywheel.harness import get_effort
    from flywheel.solve import apply_to_repo, check_inputs, deliver, refuse_scripted, repo_environment
    from flywheel.solve import solve as solve_repo
    from flywheel.solve.git import branch_plan

    check_roles(model, lead, sidekick)
    get_effort(effort)
    check_inputs(repo, instruction, out)
    refuse_scripted(model=model, lead=lead, sidekick=sidekick)
    plan = branch_plan(repo, branch, include_uncommitted, instruction)
    environment = repo_environment(repo, requirements, use_env=not no_env)
    engine = {"draft": draft} if draft else None
    if draft:
        require_torch(lead or model, "--draft")
    policy, cfg = load_policy(lead or model, base_url, seed, temperature, 1.0, 1, action_format, engine)
    runner = Fusion(*load_policy(sidekick, base_url, seed, temperature, 1.0, 1)).rollout if sidekick else None
    result = solve_repo(
        repo, instruction, policy, effort=effort, test_command=test_command, cfg=cfg, runner=runner,
        environment=environment, base=plan[0] if plan else None, log=lambda line: typer.echo(line, err=True),
    )  # fmt: skip
    if patch_out is None and result.patch:
        typer.echo(result.patch, nl=False)
    about = {"repo": str(repo.resolve()), "instruction": instruction}
    for line in deliver(result, repo, about, out, patch_out, plan):
        typer.echo(line, err=True)
    if apply and result.patch:
        try:
            apply_to_repo(repo, result.patch)
        except FlywheelError as e:
            raise FlywheelError(f"not applied, the repository is unchanged: {e}") from None
        typer.echo(f"solve: applied to {repo}", err=True)
