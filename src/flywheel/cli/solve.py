"""`flywheel solve`: one attempt at an instruction on a local repository; the diff on stdout.

The work is `flywheel.eval.solve`'s: the agent works on a copy without `.git`, the repository changes only
with `--apply` and only when the whole patch applies. Progress and the report go to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flywheel.models import SCRIPTED, require_torch

if TYPE_CHECKING:
    from flywheel.eval.solve import SolveResult


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
    apply: bool = typer.Option(
        False, "--apply", help="Apply the patch to the repository if all of it applies."
    ),
    patch_out: Path = typer.Option(None, "--patch-out", help="Write the patch here instead of stdout."),
    out: Path = typer.Option(
        None, "--out", help="Run directory (new or empty): trajectories.jsonl, summary.json, patch.diff."
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
    """Let MODEL (or a LEAD with its SIDEKICK) work on REPO at INSTRUCTION; print the patch it made."""
    from flywheel.cli.eval import _policy
    from flywheel.errors import FlywheelError
    from flywheel.eval.solve import apply_to_repo, check_inputs, save_run
    from flywheel.eval.solve import solve as solve_repo
    from flywheel.fusion import Fusion
    from flywheel.harness import get_effort

    if bool(lead) != bool(sidekick) or bool(model) == bool(lead):
        raise FlywheelError("give --model, or --lead and --sidekick (Fusion)")
    get_effort(effort)
    check_inputs(repo, instruction, out)
    for role, spec in (("--model", model), ("--lead", lead), ("--sidekick", sidekick)):
        if spec in (*SCRIPTED, "scripted-lead"):
            raise FlywheelError(
                f"{role} {spec}: the scripted models replay a task's reference fix, and a repository has none; "
                "use a trained model (toybugs-sweep, hf:DIR) or openai:NAME"
            )
    engine = {"draft": draft} if draft else None
    if draft:
        require_torch(lead or model, "--draft")
    policy, cfg = _policy(lead or model, base_url, seed, temperature, 1.0, 1, action_format, engine)
    runner = None
    if sidekick:
        helper, helper_cfg = _policy(sidekick, base_url, seed, temperature, 1.0, 1)
        runner = Fusion(helper, helper_cfg).rollout
    result = solve_repo(
        repo,
        instruction,
        policy,
        effort=effort,
        test_command=test_command,
        cfg=cfg,
        runner=runner,
        log=lambda line: typer.echo(line, err=True),
    )
    if out is not None:
        save_run(out, result, {"repo": str(repo.resolve()), "instruction": instruction})
    if patch_out is not None:
        patch_out.write_text(result.patch)
    elif result.patch:
        typer.echo(result.patch, nl=False)
    for line in report(result, out, patch_out):
        typer.echo(line, err=True)
    if apply and result.patch:
        try:
            apply_to_repo(repo, result.patch)
        except FlywheelError as e:
            raise FlywheelError(f"not applied, the repository is unchanged: {e}") from None
        typer.echo(f"solve: applied to {repo}", err=True)


def report(result: SolveResult, out: Path | None, patch_out: Path | None) -> list[str]:
    """The lines that close a run on stderr: ending, files, tests, cost, where things went."""
    r, tests = result.record, result.tests
    files = result.summary()["files_changed"]
    last = tests["last_run"]
    verdict = "no test command" if last is None else "passed" if last["passed"] else "failed"
    lines = [
        f"solve: {r.ending} after {r.n_turns} turns, {r.wall_s:.1f}s, cost ${r.cost:.6f}"
        + (f" ({r.error})" if r.error else ""),
        f"solve: {len(files)} file(s) changed" + (f": {', '.join(files)}" if files else ""),
        f"solve: the agent ran the tests {tests['agent_runs']} time(s)",
        f"solve: tests: {result.test_command}: {verdict}" if last else f"solve: tests: {verdict}",
    ]
    if patch_out is not None:
        lines.append(f"solve: patch written to {patch_out}")
    lines.append(f"solve: run saved in {out}" if out is not None else "solve: no --out: the run is not saved")
    return lines
