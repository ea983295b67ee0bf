"""`flywheel eval`: run a suite through the harness and write trajectories and a summary.

With `--lead` and `--sidekick` instead of `--model`, each attempt is Fusion's (`flywheel.fusion`): the lead
works with a `delegate` tool that runs the sidekick in its workspace; `--compare` runs the lead alone, the
sidekick alone and the pair on the same tasks (`flywheel.fusion.compare`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from flywheel.errors import FlywheelError
from flywheel.models import SPECS


def eval_(
    suite: str = typer.Option(
        ...,
        "--suite",
        help="A built-in suite (toybugs, toybugs-long, humaneval, pypibugs) or a task directory.",
    ),
    model: str = typer.Option(None, "--model", help=f"{SPECS}."),
    lead: str = typer.Option(
        None, "--lead", help="Fusion: the lead's model (any --model spec); needs --sidekick."
    ),
    sidekick: str = typer.Option(None, "--sidekick", help="Fusion: the sidekick's model, run by `delegate`."),
    sidekick_effort: str = typer.Option(
        None, "--sidekick-effort", help="Fusion: the sidekick's effort level (default: --effort)."
    ),
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
    base_url: str = typer.Option(
        None, "--base-url", help="Server URL for openai:NAME models (Fusion: the lead's, and the sidekick's)."
    ),
    sidekick_base_url: str = typer.Option(
        None, "--sidekick-base-url", help="Fusion: the sidekick's server URL, when not --base-url."
    ),
    action_format: str = typer.Option(
        "auto",
        "--action-format",
        help="How MODEL (or the lead) acts: native (tool calls), tagged (text) or auto (native when "
        "the model says it supports tools, e.g. openai:NAME?tools=native).",
    ),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Top-p (nucleus) sampling."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler and of noisy oracles."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run directory's results."),
    compaction: str = typer.Option(
        "elide",
        "--compaction",
        help="Near or past the context limit: summary (the model summarises its state and restarts from "
        "it), elide (older observations shortened) or none.",
    ),
    compact_at: float = typer.Option(
        0.8, "--compact-at", help="Share of the model's context at which a summary is asked for, in (0, 1]."
    ),
    cold_pytest: bool = typer.Option(
        False,
        "--cold-pytest",
        help="Start every sandboxed `python -m pytest` afresh, not forked from the episode's warm parent "
        "(the same results, slower: see flywheel.sandbox.warm).",
    ),
    device: str = typer.Option(
        "auto", "--device", help="Torch engine models: auto (CUDA when a GPU is visible), cpu or cuda."
    ),
    dtype: str = typer.Option(
        "float32", "--dtype", help="Torch engine models: float32 or bfloat16 (weights and KV cache)."
    ),
    threads: int = typer.Option(
        1,
        "--threads",
        min=0,
        help="Torch engine models: torch's intra-op threads (0: torch's default, one per core). One is "
        "fastest where the sandboxed commands run beside the engine on a small machine.",
    ),
    draft: str = typer.Option(
        "",
        "--draft",
        help="Speculative decoding for a torch model: lookup[:N] (no model: what the context repeats), "
        "layers:N or a model with its vocabulary (which runs turns one at a time). It pays at "
        "--concurrency 1, hardly in batches. The distribution, log-probs and kept sets are the model's own.",
    ),
    draft_tokens: int = typer.Option(4, "--draft-tokens", min=1, help="Tokens the draft proposes per round."),
    lead_review: bool = typer.Option(
        True,
        "--lead-review/--no-lead-review",
        help="Fusion: end each sidekick report with the review of the change so far (the visible tests "
        "before and after, the exploit checks), as `flywheel review` makes one.",
    ),
    compare: bool = typer.Option(
        False,
        "--compare",
        help="Fusion: run the lead alone, the sidekick alone and the pair into OUT/lead, OUT/sidekick, "
        "OUT/pair; print one table and write OUT/compare.json.",
    ),
) -> None:
    """Evaluate MODEL (or a LEAD with its SIDEKICK) on SUITE at one effort level; prints the summary as JSON."""
    from flywheel.cli.policy import check_roles, engine_options, load_policy, set_threads
    from flywheel.eval import EvalSettings, Interrupted, eval_with_progress
    from flywheel.fusion import Fusion, FusionConfig, compare_table, run_compare
    from flywheel.harness import HarnessConfig, get_effort
    from flywheel.tasks import load_suite

    check_roles(model, lead, sidekick)
    if compare and not lead:
        raise FlywheelError("--compare needs --lead and --sidekick")
    spec = lead or model
    engine = engine_options(device, dtype, draft, draft_tokens, spec)
    set_threads(threads, model, lead, sidekick)
    get_effort(effort)  # a bad effort, compaction, device or dtype fails before anything loads
    HarnessConfig(compaction=compaction, compact_at=compact_at)
    if sidekick_effort:
        get_effort(sidekick_effort)
    tasks = load_suite(suite, split=split)
    settings = EvalSettings(tasks[:limit] if limit else tasks, effort, seed, concurrency, overwrite)
    policy, cfg = load_policy(spec, base_url, seed, temperature, top_p, cohorts, action_format, engine)
    if isinstance(getattr(policy, "path", None), str):  # the torch engine: its fast forward, or why not
        typer.echo(f"forward: {policy.path}", err=True)
    cfg = replace(cfg, compaction=compaction, compact_at=compact_at, warm_pytest=not cold_pytest)
    pair = None
    if sidekick:
        helper = load_policy(
            sidekick, sidekick_base_url or base_url, seed, temperature, top_p, 1, engine=engine
        )
        pair = Fusion(*helper, FusionConfig(sidekick_effort=sidekick_effort, review=lead_review))
    try:
        if compare:
            about = {"suite": suite, "effort": effort, "lead": lead, "sidekick": sidekick}
            typer.echo(compare_table(run_compare(settings, (policy, cfg), pair, out, about)))
        else:
            summary = eval_with_progress(settings, policy, cfg, out, pair.rollout if pair else None)
            typer.echo(json.dumps(summary, indent=1))
    except Interrupted as e:  # Ctrl-C: what finished is kept
        typer.echo(str(e), err=True)
        raise typer.Exit(130) from None
