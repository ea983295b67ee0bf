"""LoRA for the trainer: low-rank adapters on chosen matrices, trained while the base model stays frozen.

With `[optim] lora = { rank, alpha, targets, dropout }` every linear layer whose name is, or ends in, one
of the targets (`q_proj`, `down_proj`, ...) gets two small matrices, A `[rank, in]` and B `[out, rank]`,
and computes ``W·x + (alpha / rank)·B·(A·x)``; W never changes. PEFT's `inject_adapter_in_model` puts the
adapters in place: the model keeps its class and its forward (the trainer's `base_model(...)` call and
output head work as before; `get_peft_model`'s wrapper would change what `base_model` is), and only the
adapters require gradients, so the base gets no gradients and no optimizer state. A starts as PEFT draws
it (Kaiming-uniform, here under a CPU generator seeded from the run's seed, so the rest of the run draws
what it would have drawn without LoRA), B as zeros: step 0 is the base model exactly.

`Adapters` holds two models that share every tensor but the adapted matrices:
- `model`, the one the trainer trains: a copy of the base with the adapters injected;
- `served`, the base model itself, whose adapted matrices hold ``W + (alpha / rank)·B·A`` after every
  update (`merge`). The rollout engine generates from it, and `serving_weights`, checkpoints and
  `flywheel export` read it, so whatever consumes weights gets a plain HF model with full weights.
Why merged: the engine's fast path (`flywheel.models.fastllama`) multiplies by each layer's `.weight`
directly, which on an injected layer is the frozen base weight alone; it would generate from the base and
never see an update. Merged weights give it the trained policy at its full speed (packed matrices and the
prefix cache included). The cost is one more copy of the adapted matrices, nothing else.

Numerics: the engine computes ``(W + s·B·A)·x`` and the trainer ``W·x + s·B·(A·x)``; they agree up to
float32 rounding, which the tests bound as they bound the full-weight path (1e-4 nats).

Optimizers: A and B are 2-D, so `[optim] kind = "muon"` gives each to Muon (B's first gradient is
orthogonalised like any matrix's; A's is zero while B is, and Muon's normalised step of a zero gradient is
zero), with `match_rms_adamw` scaling its update to AdamW's RMS, so one learning rate serves both kinds.

Checkpoints (`save` / `load`): `lora.safetensors` holds the adapters under the trained model's parameter
names and `lora.json` the settings they were made with, beside the merged HF weights and the optimizer.
`load` restores the adapters only (the base is the run's `[model] path`, loaded as the run starts) and
refuses, in one line, a checkpoint made with other settings, or whose merged weights the restored
adapters do not reproduce on this base (another base model).

Pools (`local`, `ray` and `http` loop backends, `flywheel serve --follow`): the trainer publishes the
frozen base once (`base_weights`, in float32) and then each version's adapters alone (`adapter_tensors`),
never a delta of the merged matrices; every follower merges them into its own float32 copy of the base
and serves the trainer's bf16 merge bit for bit (`flywheel.sync.adapters`).

What is not covered: adapters on anything but `nn.Linear` layers of the decoder (embeddings and the
output head are refused), several adapters at once, DoRA or rsLoRA scaling, adapter payloads smaller than
float32 (each version ships 4 bytes per adapter parameter, however little a step moves them), and
followers without a float32 copy of the adapted matrices' base (a bf16-only follower would round twice).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from flywheel.errors import FlywheelError

if TYPE_CHECKING:
    from flywheel.rl.config import LoraConfig

# every linear layer of a Llama-shaped decoder: attention's four projections and the gated MLP's three
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHTS, SETTINGS = "lora.safetensors", "lora.json"
PEFT_MISSING = "[optim] lora needs the peft package: pip install 'swe-flywheel[lora]' (the lora extra)"
ADAPTER = "default"  # PEFT's name for the one adapter


def require_peft() -> None:
    """FlywheelError naming the `lora` extra when peft is not installed."""
    if importlib.util.find_spec("peft") is None:
        raise FlywheelError(PEFT_MISSING)


def target_modules(model: nn.Module, targets: list[str]) -> dict[str, nn.Linear]:
    """The linear layers `targets` name (a module whose name is a target or ends in `.target`), by full
    name; FlywheelError for a target that names no module, or names one that is not a linear layer of the
    decoder (the output head, an embedding, a block)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head}
    )
    found: dict[str, nn.Linear] = {}
    for t in targets:
        hits = {n: m for n, m in model.named_modules() if n == t or n.endswith(f".{t}")}
        if not hits:
            raise FlywheelError(
                f"[optim] lora.targets: {type(model).__name__} has no module named '{t}' "
                f"(its linear layers: {', '.join(linear)})"
            )
        for name, m in hits.items():
            if not isinstance(m, nn.Linear) or m is head:
                raise FlywheelError(
                    f"[optim] lora.targets: '{t}' names {name}, not a linear layer of the decoder"
                )
            found[name] = m
    return found


class Adapters:
    """The trained copy of a model with LoRA adapters, and the model itself serving the merged weights; see
    the module docstring."""

    def __init__(self, base: nn.Module, cfg: LoraConfig, seed: int = 0) -> None:
        try:
            from peft import LoraConfig as PeftLoraConfig
            from peft import inject_adapter_in_model
        except ImportError:
            raise FlywheelError(PEFT_MISSING) from None
        self.cfg, self.served = cfg, base
        self.names = sorted(target_modules(base, cfg.targets))
        adapted = {id(base.get_submodule(n).weight) for n in self.names}
        shared = {id(t): t for t in (*base.parameters(), *base.buffers()) if id(t) not in adapted}
        self.model = copy.deepcopy(base, shared)  # memo: every tensor but the adapted weights is shared
        for p in (*base.parameters(), *self.model.parameters()):
            p.requires_grad_(False)
        peft_cfg = PeftLoraConfig(
            r=cfg.rank, lora_alpha=cfg.alpha, target_modules=self.names, lora_dropout=cfg.dropout, bias="none"
        )
        with torch.random.fork_rng(devices=[]):  # PEFT draws A on the CPU, from the global generator
            torch.default_generator.manual_seed(seed)
            inject_adapter_in_model(peft_cfg, self.model, adapter_name=ADAPTER)
        self.model.eval()  # the new modules start in training mode; the trainer's forward sets its own
        self.layers = {n: self.model.get_submodule(n) for n in self.names}

    def trainable(self) -> Iterator[tuple[str, nn.Parameter]]:
        """The adapters' parameters (all that require gradients), by name."""
        return ((n, p) for n, p in self.model.named_parameters() if p.requires_grad)

    def served_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The served model's adapted (merged) matrices, by parameter name."""
        return ((f"{n}.weight", self.served.get_submodule(n).weight) for n in self.names)

    def adapter_tensors(self) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        """(served weight name, A, B) per adapted matrix: what a LoRA run publishes per version."""
        for n, layer in self.layers.items():
            yield f"{n}.weight", layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight

    def base_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The frozen base's tensors under the served model's names (the adapted matrices unmerged)."""
        frozen = {f"{n}.weight": layer.base_layer.weight for n, layer in self.layers.items()}
        for name, t in self.served.state_dict().items():
            yield name, frozen.get(name, t)

    def dropouts(self) -> list[nn.Module]:
        """The adapters' dropout modules (none when `dropout` is 0: PEFT puts an identity there)."""
        return [
            m
            for layer in self.layers.values()
            for m in layer.lora_dropout.values()
            if isinstance(m, nn.Dropout)
        ]

    @torch.no_grad()
    def merge(self) -> None:
        """Write ``W + (alpha / rank)·B·A`` into each adapted matrix of the served model."""
        for (_, weight), layer in zip(self.served_weights(), self.layers.values(), strict=True):
            weight.copy_(layer.base_layer.weight + layer.get_delta_weight(ADAPTER))

    def settings(self) -> dict[str, object]:
        c = self.cfg
        return {"rank": c.rank, "alpha": c.alpha, "targets": list(c.targets), "modules": self.names}

    def save(self, path: Path) -> None:
        """`lora.safetensors` (the adapters) and `lora.json` (their settings) into directory `path`."""
        from safetensors.torch import save_file

        save_file({n: p.detach().contiguous() for n, p in self.trainable()}, str(Path(path) / WEIGHTS))
        (Path(path) / SETTINGS).write_text(json.dumps(self.settings(), indent=1) + "\n")

    def load(self, path: Path) -> None:
        """Restore the adapters `save` wrote into `path`, merge them, and check the merge against the
        checkpoint's own merged weights (`model.safetensors`); FlywheelError in one line when the settings,
        the tensors or the base model differ."""
        from safetensors.torch import load_file

        path = Path(path)
        saved = json.loads((path / SETTINGS).read_text())
        if saved != self.settings():
            ours = {k: v for k, v in self.settings().items() if k != "modules"}
            theirs = {k: saved.get(k) for k in ours}
            raise FlywheelError(f"{path}: adapters made with {theirs}, but [optim] lora is {ours}")
        state = load_file(str(path / WEIGHTS))
        params = dict(self.trainable())
        if set(state) != set(params) or any(state[n].shape != p.shape for n, p in params.items()):
            raise FlywheelError(f"{path}: {WEIGHTS} does not hold this model's adapters")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state[name])
        self.merge()
        self.check_base(path / "model.safetensors")

    def check_base(self, merged: Path) -> None:
        """Refuse a checkpoint whose merged weights differ from this base plus the restored adapters beyond
        float rounding: its adapters were trained on another base model."""
        from safetensors import safe_open

        own = self.served.state_dict()
        with safe_open(str(merged), framework="pt", device=str(next(self.served.parameters()).device)) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key in own and not torch.allclose(f.get_tensor(key), own[key], rtol=1e-4, atol=1e-5):
                    raise FlywheelError(
                        f"{merged.parent}: its adapters were trained on another base model ({key} differs "
                        "from this run's [model] path plus the adapters)"
                    )
