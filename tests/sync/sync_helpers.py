"""Weights for the sync tests: small bf16 sets and realistic one-ulp steps between them."""

from __future__ import annotations

import numpy as np
import torch

ACCESS_KEY, SECRET_KEY = "flywheel", "flywheel-secret"  # the test S3 server's one identity


def make_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"emb": (300, 16), "layer.w": (64, 48), "layer.b": (48,), "norm": (7,)}
    return {n: (torch.randn(s, generator=g) * 0.02).bfloat16() for n, s in shapes.items()}


def bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[n].view(torch.int16), b[n].view(torch.int16)) for n in a
    )


def ulp_step(w: dict[str, torch.Tensor], frac: float, seed: int = 1) -> dict[str, torch.Tensor]:
    """Move a random `frac` of the weights by one bf16 ulp, up or down."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, t in w.items():
        b = t.view(torch.int16).numpy().copy()
        mask = rng.random(b.shape) < frac
        b[mask] += rng.choice(np.array([-1, 1], np.int16), size=int(mask.sum()))
        out[n] = torch.from_numpy(b).view(torch.bfloat16)
    return out


def clone(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in w.items()}


def versions(n: int) -> list[dict[str, torch.Tensor]]:
    out = [make_weights()]
    for i in range(1, n):
        out.append(ulp_step(out[-1], 0.05, seed=i))
    return out
