"""The bases that ship inside the package: policies the project built with its own `flywheel sft`.

| name | what it is |
| --- | --- |
| `toybugs-sweep` | a ~1M-parameter Llama trained from scratch, on one CPU, to imitate `scripted-sweep` on the toybugs train split |

Each base is a folder under `bases/` holding the HF-format files and `BASE.json`: the command that built
it, the config it was built from (its path in the repository and its sha256), the imitation data format,
the sha256 of its weights, and the held-out scores measured when it was shipped, with the command that
measured them. `base_dir(name)` returns the folder after checking the weights against that digest, so a
damaged install is one clear error instead of a policy that quietly behaves otherwise.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError

ROOT = Path(__file__).resolve().parent / "bases"
BASES = ("toybugs-sweep",)
WEIGHTS = "model.safetensors"


def weights_digest(path: Path) -> str:
    """sha256 of a base folder's weights file."""
    return hashlib.sha256((Path(path) / WEIGHTS).read_bytes()).hexdigest()


def describe(name: str) -> dict[str, Any]:
    """The base's BASE.json: how it was built and what it scored."""
    if name not in BASES:
        raise FlywheelError(f"unknown shipped base '{name}' (shipped: {', '.join(BASES)})")
    path = ROOT / name / "BASE.json"
    if not path.is_file():
        raise FlywheelError(f"the shipped base '{name}' is missing from this install ({path})")
    return json.loads(path.read_text())


def base_dir(name: str) -> Path:
    """The folder of the shipped base `name`, its weights checked against the recorded digest."""
    meta = describe(name)
    folder = ROOT / name
    if weights_digest(folder) != meta["weights_sha256"]:
        raise FlywheelError(
            f"the shipped base '{name}' does not match its recorded digest: reinstall the package"
        )
    return folder
