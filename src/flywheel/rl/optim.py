"""Optimizers for the trainer: Muon for hidden weight matrices, AdamW for everything else.

Muon (``torch.optim.Muon``) orthogonalises the momentum of each 2-D weight matrix with a few Newton-Schulz
iterations, so every direction of the matrix moves at a similar rate. It is meant for the matrices of
hidden layers only. Embeddings and the output head are lookup tables / classifiers over the vocabulary
(rows see very different gradient frequencies), and norms and biases are vectors, so they go to AdamW.
With tied embeddings the output head *is* the embedding matrix and goes to AdamW once.

How parameters are split (`split_parameters`):

- ``muon``: 2-D, trainable, not an embedding, not the output head, not inside a normalisation layer;
- ``adamw``: embeddings (any ``nn.Embedding``, any name containing ``embed``), the output head
  (``get_output_embeddings()`` when the model has it, any module named ``lm_head``) and tensors of more
  than two dimensions;
- ``adamw_no_decay``: vectors and scalars (biases, norm gains) and any parameter of a ``*Norm*`` module;
  weight decay never applies to them.

Muon uses ``adjust_lr_fn="match_rms_adamw"`` (Moonshot's scaling: the update's RMS matches AdamW's), so
one learning rate serves both halves unless ``muon_lr`` says otherwise. ``weight_decay`` defaults to 0:
when fine-tuning a pretrained policy with RL, decay pulls weights towards zero, not towards the base.

`build_optimizer` returns a `CompositeOptimizer`: one object with ``step`` / ``zero_grad`` /
``state_dict`` / ``load_state_dict`` so that the training loop and checkpoints treat it as one optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import torch
from torch import nn

Kind = Literal["muon", "adamw"]
GROUPS = ("muon", "adamw", "adamw_no_decay")


def _head_and_embedding_ids(model: nn.Module) -> set[int]:
    ids = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if isinstance(head, nn.Module):
        ids.update(id(p) for p in head.parameters())
    for name, module in model.named_modules():
        if name.split(".")[-1] == "lm_head":
            ids.update(id(p) for p in module.parameters())
    return ids


def _norm_ids(model: nn.Module) -> set[int]:
    return {id(p) for m in model.modules() if "Norm" in type(m).__name__ for p in m.parameters()}


def split_parameters(model: nn.Module, kind: Kind = "muon") -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Trainable parameters by optimizer group (see the module docstring); each parameter exactly once.

    With ``kind="adamw"`` the ``muon`` group is empty and its matrices join ``adamw``.
    """
    if kind not in ("muon", "adamw"):
        raise ValueError(f"unknown optimizer kind {kind!r}; expected 'muon' or 'adamw'")
    special, norms = _head_and_embedding_ids(model), _norm_ids(model)
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {g: [] for g in GROUPS}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or id(p) in norms:
            groups["adamw_no_decay"].append((name, p))
        elif kind == "muon" and p.ndim == 2 and id(p) not in special and "embed" not in name:
            groups["muon"].append((name, p))
        else:
            groups["adamw"].append((name, p))
    return groups


class CompositeOptimizer:
    """Several optimizers stepped together, checkpointed as one (``{name: optimizer.state_dict()}``)."""

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
        if not optimizers:
            raise ValueError("CompositeOptimizer needs at least one optimizer")
        self.optimizers = dict(optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every parameter group of every optimizer (to set learning rates by hand)."""
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def __iter__(self) -> Iterator[tuple[str, torch.optim.Optimizer]]:
        return iter(self.optimizers.items())

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Evaluate ``closure`` once (if given), then step every optimizer; returns the closure's value."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.optimizers.values():
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state has {sorted(state)}, expected {sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def build_optimizer(
    model: nn.Module,
    kind: Kind = "muon",
    lr: float = 1e-5,
    muon_lr: float | None = None,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
) -> CompositeOptimizer:
    """Muon for hidden matrices plus AdamW for the rest (``kind="muon"``), or AdamW for all (``"adamw"``).

    Returns a `CompositeOptimizer` with members ``"muon"`` (absent when the model has no hidden matrix)
    and ``"adamw"``.
    """
    groups = split_parameters(model, kind)
    adam_groups = [
        {"params": [p for _, p in groups["adamw"]], "weight_decay": weight_decay},
        {"params": [p for _, p in groups["adamw_no_decay"]], "weight_decay": 0.0},
    ]
    adam_groups = [g for g in adam_groups if g["params"]]
    optimizers: dict[str, torch.optim.Optimizer] = {}
    if groups["muon"]:
        optimizers["muon"] = torch.optim.Muon(
            [p for _, p in groups["muon"]],
            lr=lr if muon_lr is None else muon_lr,
            weight_decay=weight_decay,
            adjust_lr_fn="match_rms_adamw",
        )
    if adam_groups:
        optimizers["adamw"] = torch.optim.AdamW(adam_groups, lr=lr, betas=betas)
    if not optimizers:
        raise ValueError("the model has no trainable parameters")
    return CompositeOptimizer(optimizers)
