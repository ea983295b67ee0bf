"""The model specs a user may name, and the one function that loads a backend by its spec (`get_model`);
each backend's module is imported only when its spec is used (see the package docstring for the table)."""

from __future__ import annotations

from typing import Any

from flywheel.errors import FlywheelError
from flywheel.protocols import Model
from flywheel.registry import load

SCRIPTED = ("scripted", "scripted-noisy", "scripted-search", "scripted-sweep")
# for help texts and errors
SPECS = (
    f"{', '.join(SCRIPTED)}, scripted-lead, scripted-sweep-lead, hf:PATH, smollm2-135m, toybugs-sweep "
    "or openai:NAME"
)
# a spec's kind (`hf` of `hf:PATH`, or the whole spec) -> the loader called with (spec, **opts)
MODELS = {
    **dict.fromkeys(SCRIPTED, "flywheel.models.scripted:load_scripted"),
    "scripted-lead": "flywheel.models.scripted_lead:load_scripted_lead",
    "scripted-sweep-lead": "flywheel.models.sweep_lead:load_sweep_lead",
    "hf": "flywheel.models.torch_engine:load_torch_model",
    "smollm2-135m": "flywheel.models.torch_engine:load_torch_model",
    "toybugs-sweep": "flywheel.models.torch_engine:load_torch_model",
    "openai": "flywheel.models.openai_backend:load_openai_model",
}


def is_torch(spec: str) -> bool:
    """Whether `spec` runs on the in-process torch engine (and takes `device` and `dtype`)."""
    return MODELS.get(spec.split(":", 1)[0] if ":" in spec else spec) == MODELS["hf"]


def require_torch(spec: str, option: str) -> None:
    """Refuse `option` (e.g. `--draft`) for a model that does not run on the torch engine."""
    if not is_torch(spec):
        raise FlywheelError(
            f"{option} needs a torch model (hf:PATH, smollm2-135m or toybugs-sweep), not {spec}"
        )


def get_model(spec: str, **opts: Any) -> Model:
    """The model backend named by `spec`; `opts` go to the backend (e.g. base_url, seed, context; the torch
    engine's device and dtype)."""
    if spec == "torch":
        raise FlywheelError("the torch engine needs weights: use hf:PATH or smollm2-135m")
    kind = spec.split(":", 1)[0] if ":" in spec else spec
    if kind not in MODELS:
        raise FlywheelError(f"unknown model '{spec}' (use {SPECS})")
    return load(MODELS[kind], "model backend")(spec, **opts)
