"""`flywheel export`: a trained model as a plain HF directory that any transformers-based tool loads.

A checkpoint's `trainer/` directory (`Trainer.save`) is an HF model directory already, its weights full
ones whatever trained them: a LoRA run's are the base with the adapters merged in (`flywheel.rl.lora`).
Beside them lie the trainer's own files (optimizer state, adapters, version), which a model directory
does not need and which can be twice the model's size (AdamW's two moments). `export_model` copies the
model's files (config, generation config, safetensors weights, tokenizer, chat template) and leaves the
trainer's out.

What it takes (`checkpoint_model`): a run directory (its newest complete local checkpoint,
`RunDir.latest_weights`; a peer replica is not consulted), one checkpoint `checkpoints/vNNNNNNNN` (checked against its
manifest), or a `trainer/` directory or any other HF model directory. Anything else, a run without a
complete checkpoint, a damaged checkpoint or an existing `--out` that is not empty is refused in one
line. The directory is written whole or not at all (`flywheel.files.building`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.files import building
from flywheel.loop import RunDir
from flywheel.loop.checkpoint import verify
from flywheel.rl.lora import SETTINGS, WEIGHTS

TRAINER_STATE = frozenset({"optimizer.pt", "trainer.json", WEIGHTS, SETTINGS})  # what `Trainer.save` adds
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def checkpoint_model(source: Path) -> Path:
    """The HF model directory `source` stands for (see the module docstring); FlywheelError otherwise."""
    source = Path(source)
    if not source.is_dir():
        raise FlywheelError(f"{source}: no such directory")
    if (source / "checkpoints").is_dir():  # a run directory (its config.json is the run's, not a model's)
        latest = RunDir(source).latest_weights()
        if latest is None:
            raise FlywheelError(f"{source}: the run has no complete checkpoint yet")
        return latest
    if (source / "trainer" / "config.json").is_file():
        if verify(source) is None:
            raise FlywheelError(
                f"{source}: an incomplete or damaged checkpoint (its manifest does not match)"
            )
        return source / "trainer"
    if (source / "config.json").is_file():
        return source
    raise FlywheelError(
        f"{source}: not a run directory, a checkpoint or an HF model directory (no config.json)"
    )


def export_model(source: Path, out: Path) -> dict[str, Any]:
    """Write the model `source` stands for into the new directory `out`; returns what was written."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FlywheelError(f"{out}: already exists; export writes a new directory")
    model = checkpoint_model(source)
    if not any((model / name).is_file() for name in MODEL_WEIGHTS):
        raise FlywheelError(f"{model}: no safetensors weights ({' or '.join(MODEL_WEIGHTS)})")
    files = sorted(p for p in model.iterdir() if p.is_file() and p.name not in TRAINER_STATE)
    with building(out) as tmp:
        for p in files:
            shutil.copy2(p, tmp / p.name)
    return {
        "out": str(out),
        "from": str(model),
        "lora_merged": (model / WEIGHTS).is_file(),
        "files": [p.name for p in files],
        "bytes": sum(p.stat().st_size for p in files),
    }
