"""`flywheel eval`: run a suite through the harness and write trajectories and a summary.

With `--lead` and `--sidekick` instead of `--model`, each attempt is Fusion's (`flywheel.fusion`): the lead
works with a `delegate` tool that runs the sidekick in its workspace; `--compare` runs the lead alone, the
sidekick alone and the pair on the same tasks (`flywheel.eval.compare`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flywheel.models import SPECS, is_torch, require_torch
from flywheel.record import Trajectory

ACTION_FORMATS = ("auto", "native", "tagged")

if TYPE_CHECKING:
    from flywheel.harness import HarnessConfig
    from flywheel.protocols import Model


def eval_(
    suite: str = typer.Option(
        ..., "--suite", help="A built-in suite (toybugs, toybugs-long, humaneval) or a task directory."
    ),
    model: str = typer.Option(None, "--model", help=f"{SPECS} (or scripted-lead)."),
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
    compare: bool = typer.Option(
        False,
        "--compare",
        help="Fusion: run the lead alone, the sidekick alone and the pair into OUT/lead, OUT/sidekick, "
        "OUT/pair; print one table and write OUT/compare.json.",
    ),
) -> None:
    """Evaluate MODEL (or a LEAD with its SIDEKICK) on SUITE at one effort level; prints the summary as JSON."""
    from flywheel.errors import FlywheelError
    from flywheel.eval.compare import compare_rows, compare_table
    from flywheel.eval.run import rollout
    from flywheel.fusion import Fusion, FusionConfig
    from flywheel.harness import HarnessConfig, get_effort
    from flywheel.models.hf import resolve_device, resolve_dtype
    from flywheel.tasks import load_suite

    if bool(lead) != bool(sidekick) or bool(model) == bool(lead):
        raise FlywheelError("give --model, or --lead and --sidekick (Fusion)")
    if compare and not lead:
        raise FlywheelError("--compare needs --lead and --sidekick")
    engine = {"device": resolve_device(device, "--device").type, "dtype": resolve_dtype(dtype, "--dtype")}
    if draft:
        require_torch(lead or model, "--draft")
        engine.update(draft=draft, draft_tokens=draft_tokens)
    if threads and any(is_torch(spec) for spec in (model, lead, sidekick) if spec):
        import torch

        torch.set_num_threads(threads)
    get_effort(effort)  # a bad effort, compaction, device or dtype fails before anything loads
    HarnessConfig(compaction=compaction, compact_at=compact_at)
    if sidekick_effort:
        get_effort(sidekick_effort)
    tasks = load_suite(suite, split=split)
    tasks = tasks[:limit] if limit else tasks
    policy, cfg = _policy(lead or model, base_url, seed, temperature, top_p, cohorts, action_format, engine)
    cfg = replace(cfg, compaction=compaction, compact_at=compact_at)
    run = partial(_run, tasks, effort=effort, seed=seed, concurrency=concurrency, overwrite=overwrite)
    if not sidekick:
        typer.echo(json.dumps(run(policy, cfg, out, rollout), indent=1))
        return
    helper_url = sidekick_base_url or base_url
    helper, helper_cfg = _policy(sidekick, helper_url, seed, temperature, top_p, 1, engine=engine)
    pair = Fusion(helper, helper_cfg, FusionConfig(sidekick_effort=sidekick_effort)).rollout
    if not compare:
        typer.echo(json.dumps(run(policy, cfg, out, pair), indent=1))
        return
    lone_effort = sidekick_effort or effort  # the sidekick alone runs at the level it has in the pair
    summaries = {
        "lead": run(policy, cfg, out / "lead", rollout),
        "sidekick": _run(tasks, helper, helper_cfg, out / "sidekick", rollout, effort=lone_effort,
                         seed=seed, concurrency=concurrency, overwrite=overwrite),
        "pair": run(policy, cfg, out / "pair", pair),
    }  # fmt: skip
    rows = compare_rows(summaries)
    (out / "compare.json").write_text(
        json.dumps({"suite": suite, "effort": effort, "lead": lead, "sidekick": sidekick, "policies": rows},
                   indent=1) + "\n"
    )  # fmt: skip
    typer.echo(compare_table(rows))


def _run(
    tasks: list,
    policy: Model,
    cfg: HarnessConfig,
    out: Path,
    runner: Callable[..., list[Trajectory]],
    *,
    effort: str,
    seed: int,
    concurrency: int,
    overwrite: bool,
) -> dict:
    """One evaluation into `out` with a progress line; Ctrl-C keeps what finished (exit 130)."""
    from flywheel.eval import run_eval, write_summary
    from flywheel.progress import progress

    wins = []
    with progress(f"eval {policy.name} -> {out}", len(tasks)) as advance:

        def tick(record: Trajectory) -> None:
            wins.append(record.success)
            advance(success=sum(wins) / len(wins))

        try:
            return run_eval(
                tasks,
                policy,
                out,
                effort=effort,
                seed=seed,
                concurrency=concurrency,
                cfg=cfg,
                on_record=tick,
                overwrite=overwrite,
                runner=runner,
            )
        except KeyboardInterrupt:
            summary = write_summary(out, model_name=policy.name, effort=effort, interrupted=True)
            typer.echo(f"interrupted: kept {summary['n']} finished trajectories in {out}", err=True)
            raise typer.Exit(130) from None


def _policy(
    spec: str,
    base_url: str | None,
    seed: int,
    temperature: float,
    top_p: float,
    cohorts: int,
    action_format: str = "auto",
    engine: dict | None = None,
) -> tuple[Model, HarnessConfig]:
    """The model named by `spec` and the harness settings it runs under (`action_format` other than
    "auto" wins over what the model says and what an SFT base learned; `engine`: a torch engine model's
    device and dtype)."""
    from flywheel.errors import FlywheelError
    from flywheel.fusion import load_model
    from flywheel.harness import HarnessConfig

    if action_format not in ACTION_FORMATS:
        raise FlywheelError(f"bad --action-format {action_format!r}: use {', '.join(ACTION_FORMATS)}")
    opts = {"base_url": base_url} if spec.startswith("openai:") else {}
    if is_torch(spec):
        opts.update(engine or {})
    policy = load_model(spec, seed=seed, **opts) if spec.startswith("scripted") else load_model(spec, **opts)
    from flywheel.models.shipped import BASES, base_dir

    learned = {}
    if spec.startswith("hf:") or spec in BASES:  # a `flywheel sft` base runs under the harness it learned
        from flywheel.sft import trained_harness

        learned = trained_harness(f"hf:{base_dir(spec)}" if spec in BASES else spec)
    if action_format != "auto":
        learned["action_format"] = action_format
    return policy, HarnessConfig(temperature=temperature, top_p=top_p, cohorts=cohorts, **learned)
