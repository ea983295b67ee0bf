"""What a torch model spec names: the HF-format directory of a model, and the draft of speculative decoding.

`torch_model_dir(spec)` is the directory behind `hf:PATH` (any HF-format directory), `smollm2-135m` (the
converted copy of `flywheel.models.hf.smollm2_dir`) or a shipped base (`flywheel.models.shipped`).
`load_draft(spec, model, tokenizer)` turns a `draft=` spec into what `flywheel.models.speculative` decodes
with: `layers:N`, `lookup[:N]`, or a model found as `torch_model_dir` finds one (or a directory).

`load_torch_model`, the loader the model registry names, stays beside the `TorchEngine` it builds
(`flywheel.models.torch_engine`): the engine loads its own draft by spec through this module.
"""

from __future__ import annotations

from pathlib import Path

from flywheel.errors import FlywheelError
from flywheel.models.fastllama import unsupported
from flywheel.models.hf import SMOLLM2, load_hf, smollm2_dir
from flywheel.models.shipped import BASES, base_dir
from flywheel.models.speculative import LayerSkip, Lookup, check_vocabulary


def torch_model_dir(spec: str):
    """The HF-format directory behind `hf:PATH`, `smollm2-135m` or a shipped base."""
    if spec.startswith("hf:") and spec[3:]:
        return spec[3:]
    if spec == SMOLLM2:
        return smollm2_dir()
    if spec in BASES:
        return base_dir(spec)
    raise FlywheelError(f"unknown torch model '{spec}' (use hf:PATH, {SMOLLM2} or {', '.join(BASES)})")


def load_draft(spec: str, model, tokenizer, context: int | None = None):
    """The draft `spec` names for speculative decoding of `model`: `layers:N` (`LayerSkip`: the model's own
    first N layers), `lookup` or `lookup:N` (`Lookup`: the context's own continuations of its last N tokens,
    3 by default), or an HF causal LM (`hf:PATH`, a directory, `smollm2-135m`, a shipped base) with
    `tokenizer`'s vocabulary, loaded in `model`'s dtype on its device, of a family the fast forward takes
    for `context` tokens (`fastllama.unsupported`)."""
    if spec == "lookup" or spec.startswith("lookup:"):
        if spec != "lookup" and not spec[7:].isdigit():
            raise FlywheelError(f"draft '{spec}': use lookup or lookup:N with N a number of tokens")
        return Lookup(int(spec[7:]) if spec != "lookup" else 3)
    if spec.startswith("layers:"):
        if not spec[7:].isdigit():
            raise FlywheelError(f"draft '{spec}': use layers:N with N a number of decoder layers")
        return LayerSkip(model, int(spec[7:]))
    path = spec if Path(spec).is_dir() else torch_model_dir(spec)
    draft, draft_tokenizer = load_hf(path, dtype=model.dtype, device=model.device)
    check_vocabulary(spec, model, tokenizer, draft, draft_tokenizer)
    why = unsupported(draft, context)
    if why:
        raise FlywheelError(f"draft '{spec}': speculative decoding needs the fast Llama forward ({why})")
    return draft
