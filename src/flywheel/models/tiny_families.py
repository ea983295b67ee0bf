"""Tiny random models of the families people start RL from, each built from its own `transformers` config.

`family_model(family, vocab)` is a randomly initialised causal LM of one of `FAMILIES`, the shape given
by its arguments (2 layers, hidden 64 by default), nothing downloaded; `build_family_model(out_dir,
family, texts)` saves one with a byte-level BPE tokenizer trained on `texts` (`flywheel.models.tiny`'s,
ChatML-shaped template), to load with `load_hf` or `load_torch_model(f"hf:{out_dir}")`. Tests check the
engine's fast path, its fallback and the trainer's replay on them; `benchmarks/bench_engine.py` times
them against `generate`.

What each family brings beyond a plain Llama, as its config sets it:
- `llama3`: the `llama3` rope scaling (factor 8 over an original context of `LLAMA3_ORIGINAL` tokens, so
  a short sequence already meets scaled and smoothed frequencies), grouped-query attention, untied head;
- `mistral`: the same decoder with a sliding window (the config's 4096 by default, wider than the
  2048-token context; `sliding_window=16` makes it narrower);
- `qwen2` (Qwen2 and Qwen2.5): biases on the q, k and v projections, a tied head (`tie=False`: untied);
- `qwen3` (dense): per-head q/k RMSNorm, a head size that is not hidden / heads, a tied head;
- `gemma2`: soft-capped attention scores and logits, sliding-window layers alternating with global ones,
  the (1+w) RMSNorm with four norms a layer, scaled embeddings;
- `gemma3`: Gemma 2's norms and embeddings, q/k norms, five sliding-window layers to one global (with a
  rotary base of their own).
Gemma's windows are 8 tokens by default, so that a short sequence already meets them.

Weights are drawn with a standard deviation of `init` (0.1 by default, where `transformers` draws 0.02),
and biases and norm weights, which `transformers` starts at 0 and 1, are moved by as much: attention then
picks out keys and logits spread over a few units, so a forward that drops a norm, a bias or a frequency
scaling changes the tokens and the log-probs by far more than float rounding does.
Deterministic for a fixed `seed` (drawn under a forked RNG).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from flywheel.errors import FlywheelError
from flywheel.models.tiny import CHAT_TEMPLATE, IM_END, PAD, _save_atomically, train_tokenizer, wrap_tokenizer

FAMILIES = ("llama3", "mistral", "qwen2", "qwen3", "gemma2", "gemma3")
LLAMA3_ORIGINAL = 64  # the llama3 rope scaling's original context: tiny, so that tests reach past it


def family_config(
    family: str,
    vocab: int,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate: int | None = None,
    max_positions: int = 2048,
    init: float = 0.1,
    tie: bool | None = None,
    **extra: Any,
):
    """The `transformers` config of a random `family` model of this shape (`extra`: more config fields,
    e.g. `sliding_window`). `head_dim` defaults to hidden / heads, but to twice that for `qwen3`;
    `intermediate` to 2 * hidden; `tie` to the family's usual (untied for `llama3` and `mistral`)."""
    import transformers

    if family not in FAMILIES:
        raise FlywheelError(f"unknown model family '{family}' (use {', '.join(FAMILIES)})")
    head_dim = head_dim or (hidden // heads) * (2 if family == "qwen3" else 1)
    common = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate or 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "initializer_range": init,
        "tie_word_embeddings": family in ("qwen2", "qwen3", "gemma2", "gemma3") if tie is None else tie,
    }
    if family == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0}
        rope |= {"high_freq_factor": 4.0, "original_max_position_embeddings": LLAMA3_ORIGINAL}
        return transformers.LlamaConfig(**common, rope_parameters=rope, **extra)
    if family == "mistral":
        return transformers.MistralConfig(**common, **extra)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, **extra)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, **extra)
    gemma = {"query_pre_attn_scalar": head_dim, "sliding_window": 8}
    if family == "gemma2":
        return transformers.Gemma2Config(**common, **(gemma | extra))
    return transformers.Gemma3TextConfig(**common, **(gemma | extra))


def family_model(family: str, vocab: int, *, seed: int = 0, device: str | torch.device = "cpu", **shape: Any):
    """A random `family` model (`family_config(family, vocab, **shape)`), float32, in eval mode, built on
    `device` (a large shape is drawn faster on a GPU)."""
    from transformers import AutoModelForCausalLM

    config = family_config(family, vocab, **shape)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():  # `transformers` starts biases at 0 and norms at 1 (Gemma's at 0): perturb
            for name, p in model.named_parameters():
                if name.endswith("bias") or "norm" in name:
                    p.add_(torch.randn_like(p), alpha=config.initializer_range)
    return model.eval()


def family_tokenizer(texts: Iterable[str], vocab_size: int = 300):
    """The tokenizer of `build_family_model`: byte-level BPE trained on `texts`, ChatML-shaped template."""
    return wrap_tokenizer(train_tokenizer(texts, vocab_size), CHAT_TEMPLATE)


def build_family_model(
    out_dir: str | os.PathLike[str],
    family: str,
    texts: Iterable[str],
    *,
    vocab_size: int = 300,
    seed: int = 0,
    **shape: Any,
) -> Path:
    """A tokenizer trained on `texts` and a random `family` model of its vocabulary (`family_model`), saved
    to `out_dir` (must not exist or be empty) in HF format, its EOS the template's `<|im_end|>`."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FlywheelError(f"{out}: refusing to build a model into a non-empty directory")
    tokenizer = family_tokenizer(texts, vocab_size)
    pad, eos = tokenizer.convert_tokens_to_ids(PAD), tokenizer.convert_tokens_to_ids(IM_END)
    shape = {"pad_token_id": pad, "eos_token_id": eos, "bos_token_id": None} | shape
    model = family_model(family, len(tokenizer), seed=seed, **shape)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = eos, pad
    _save_atomically(out, model, tokenizer)
    return out
