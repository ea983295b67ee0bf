"""`flywheel sft`, `flywheel calibrate`, `flywheel train`: the base policy, λ, and the RL loop."""

from __future__ import annotations

import json
from pathlib import Path

import typer

CONFIG = typer.Argument(
    ..., help="A TOML run config (configs/ holds the product ones; docs/configuration.md)."
)
SFT_CONFIG = typer.Argument(..., help="A TOML SFT config (configs/sft.toml; docs/configuration.md).")


def _load(config: Path, cls=None):
    from flywheel.rl.config import RunConfig
    from flywheel.settings import load_config

    return load_config(config, cls or RunConfig)


def sft(
    config: Path = SFT_CONFIG,
    out: Path = typer.Option(..., "--out", help="Directory for the base model (HF format); must not exist."),
) -> None:
    """Train a base policy by imitating a teacher's episodes ([data] teacher; configs/sft.toml: scripted-noisy)."""
    from flywheel.sft import SftConfig, run_sft

    cfg = _load(config, SftConfig)
    path = run_sft(cfg, out)
    typer.echo(json.dumps(json.loads((path / "sft_config.json").read_text()) | {"out": str(path)}, indent=1))


def calibrate(
    config: Path = CONFIG,
    out: Path = typer.Option(..., "--out", help="Directory for calibration.json and calibration.png."),
    model: str = typer.Option(None, "--model", help="Override [model] path (hf:DIR or a directory)."),
    limit: int = typer.Option(16, "--limit", min=1, help="Calibration tasks."),
    samples: int = typer.Option(2, "--samples", min=1, help="Attempts per task and budget."),
    split: str = typer.Option("train", "--split", help="Calibration split of the run's suite."),
) -> None:
    """Set λ per effort level from the base policy's cost/success frontier; prints λ as JSON."""
    from flywheel.rl.calibrate import run_calibration

    cfg = _load(config)
    if model:
        cfg.model.path = model
    data = run_calibration(cfg, out, samples=samples, limit=limit, split=split)
    typer.echo(
        json.dumps(
            {
                "lambdas": data["lambdas"],
                "operating": data["operating"],
                "calibration": str(Path(out) / "calibration.json"),
            },
            indent=1,
        )
    )


def train(
    config: Path = CONFIG,
    out: Path = typer.Option(..., "--out", help="Run directory (resumed when it holds checkpoints)."),
    model: str = typer.Option(None, "--model", help="Override [model] path."),
    steps: int = typer.Option(None, "--steps", min=0, help="Override [train] steps."),
) -> None:
    """Run the RL flywheel: roll out, grade, reward, update; metrics.jsonl and checkpoints in --out."""
    from flywheel.rl.train import train as run

    cfg = _load(config)
    if model:
        cfg.model.path = model
    if steps is not None:
        cfg.train.steps = steps
    rows = run(cfg, out)
    if rows:
        last = rows[-1]
        typer.echo(
            json.dumps({k: last[k] for k in ("step", "reward", "success", "cost", "turns", "loss")}, indent=1)
        )
