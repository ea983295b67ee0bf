"""`flywheel export`: a run's trained model as a plain HF directory (`flywheel.rl.export`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def export(
    run: Path = typer.Argument(
        ...,
        help="A run directory (its newest complete checkpoint), one checkpoint (checkpoints/vNNNNNNNN) or "
        "its trainer/ directory.",
    ),
    out: Path = typer.Option(..., "--out", help="The HF model directory to write; must not exist."),
) -> None:
    """Write a run's newest checkpoint as an HF model directory (config, safetensors, tokenizer) that
    transformers loads; a LoRA run's adapters are merged into the weights."""
    from flywheel.rl.export import export_model

    typer.echo(json.dumps(export_model(run, out), indent=1))
