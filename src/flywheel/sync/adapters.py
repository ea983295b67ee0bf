"""LoRA adapter payloads: what a LoRA run publishes per version instead of a delta of the merged weights.

With `[optim] lora` only the adapters move: per adapted matrix W, A `[rank, in]` and B `[out, rank]`,
served as ``W + (alpha / rank)·B·A``. A LoRA run ships the adapters themselves, float32 and
zstd-compressed, rather than a bf16 delta of the merged matrices: their size is fixed by the rank
(4 bytes per adapter parameter), where a merged delta grows with the positions a step moves.

Each payload is complete: it replaces the previous version's adapters, so a follower needs the frozen base
and the latest payload, never a chain. The base goes once per run (`flywheel.sync.channel.AdapterPublisher`)
in two parts: an ordinary bf16 anchor of every tensor, and the float32 base of the adapted matrices
(`encode_masters`, format ``FWLBASE1``). The float32 part is what makes a follower exact: the trainer
serves ``bf16(W + s·B·A)`` from its float32 W, and a follower that merged into the bf16 base instead would
round twice and lose every update smaller than half a bf16 step (measured on SmolLM2-135M: 13M of the
106M adapted entries a bf16 step off after one step, and log-probs up to 2.3 nats from the trainer's
where a full-weight pool's were 0.49 away). With it, `merge` computes ``bf16(W + (B @ A) *
(alpha / rank))`` in float32 as PEFT's merge does, and a follower's served
weights equal the trainer's `serving_weights()` bit for bit. The cost is a float32 copy of the adapted
matrices on every follower (4 bytes per adapted weight, beside its bf16 weights).

Wire formats: the codec's container (`flywheel.sync.codec.pack`), float32 values as four byte planes
(`plane_sections`: the sign-and-exponent byte compresses, the mantissa bytes barely). Adapters
(``FWADAPT1``): sections ``a0..a3`` and ``b0..b3``, every module's A (then B) in name order; the
manifest carries `version`, `rank`, `alpha`, the bf16 base anchor's digest, the merged weight set's
digest and, per adapted matrix, its shape and the crc32s of its float32 base and of its merged bf16 bits.
LoRA base (``FWLBASE1``): sections ``p0..p3``, the float32 matrices in name order, a crc32 per matrix.

Applying (`apply_adapters`): everything is checked before the receiver is touched. The payload is
decoded (frame and section checksums), its base digest compared with the receiver's, each adapted
matrix's float32 base checked against its published crc32, and the merged matrices computed into fresh
memory; each merged matrix's crc32 and the whole set's digest (the receiver's other tensors included)
must equal the manifest's. Only then are the merged matrices copied into the served weights, so a refused
payload leaves them bitwise as they were.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flywheel.sync.codec import (
    ADAPTERS_MAGIC,
    DEFAULT_LEVEL,
    FORMAT_VERSION,
    MASTERS_MAGIC,
    DeltaError,
    Weights,
    compress,
    pack,
    section,
    tensor_crc,
    unpack,
    weights_digest,
)


@dataclass
class AdapterWeights:
    """One version's adapters: A and B (float32, CPU) per adapted matrix, by the matrix's weight name."""

    rank: int
    alpha: float
    a: dict[str, torch.Tensor] = field(default_factory=dict)
    b: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def merge(master: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """The served bf16 matrix: ``bf16(master + (b @ a) * scale)``, in float32 (fresh memory)."""
    return (master.float() + (b.float() @ a.float()) * scale).to(torch.bfloat16).contiguous()


def master_crc(t: torch.Tensor) -> str:
    """crc32 of a float32 CPU tensor's bits, as 8 hex digits."""
    return f"{zlib.crc32(t.detach().to('cpu', torch.float32).contiguous().numpy()):08x}"


def merged_digest(base: Weights, base_crcs: Mapping[str, str], merged_crcs: Mapping[str, str]) -> str:
    """`weights_digest` of the bf16 base with the adapted matrices replaced by their merges."""
    return weights_digest((n, list(t.shape), merged_crcs.get(n, base_crcs[n])) for n, t in base.items())


def flat32(tensors: list[torch.Tensor]) -> np.ndarray:
    """The tensors' float32 values, concatenated flat."""
    parts = [t.detach().to("cpu", torch.float32).contiguous().numpy().ravel() for t in tensors]
    return np.concatenate(parts) if parts else np.empty(0, np.float32)


def plane_sections(flat: np.ndarray, prefix: str, level: int) -> dict[str, tuple[bytes, int]]:
    """Float32 values as four zstd-compressed byte planes (the sign-and-exponent byte compresses well, the
    mantissa bytes barely; measured 9% smaller than the values compressed whole)."""
    planes = flat.view(np.uint8).reshape(-1, 4)
    raws = [planes[:, i].tobytes() for i in range(4)]
    return {f"{prefix}{i}": (compress(raw, level), len(raw)) for i, raw in enumerate(raws)}


def from_planes(manifest: dict[str, Any], payload: memoryview, prefix: str, what: str) -> np.ndarray:
    """Inverse of `plane_sections`: the float32 values."""
    planes = [np.frombuffer(section(manifest, payload, f"{prefix}{i}", what), np.uint8) for i in range(4)]
    if len({p.size for p in planes}) != 1:
        raise DeltaError(f"corrupt {what}: byte planes of different lengths")
    return np.stack(planes, axis=1).reshape(-1).view(np.float32)


def encode_masters(masters: Mapping[str, torch.Tensor], *, level: int = DEFAULT_LEVEL) -> bytes:
    """The float32 base of the adapted matrices, by name: byte planes, zstd, a crc32 per matrix."""
    names = sorted(masters)
    manifest = {
        "format": "flywheel-lora-base",
        "format_version": FORMAT_VERSION,
        "version": 0,
        "checksum": "crc32",
        "tensors": [
            {"name": n, "shape": list(masters[n].shape), "crc32": master_crc(masters[n])} for n in names
        ],
    }
    return pack(MASTERS_MAGIC, manifest, plane_sections(flat32([masters[n] for n in names]), "p", level))


def decode_masters(blob: bytes) -> dict[str, torch.Tensor]:
    """The float32 matrices of `encode_masters`, each checked against its crc32."""
    manifest, payload = unpack(blob, MASTERS_MAGIC)
    try:
        flat = from_planes(manifest, payload, "p", "LoRA base")
        out, start = {}, 0
        for t in manifest["tensors"]:
            n = int(np.prod(t["shape"], dtype=np.int64))
            out[t["name"]] = torch.from_numpy(flat[start : start + n].copy()).reshape(t["shape"])
            start += n
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise DeltaError(f"corrupt LoRA base: malformed manifest ({exc})") from None
    if start != flat.size or any(master_crc(out[t["name"]]) != t["crc32"] for t in manifest["tensors"]):
        raise DeltaError("corrupt LoRA base: checksum mismatch")
    return out


def check_adapters(base: Weights, ad: AdapterWeights) -> None:
    if set(ad.a) != set(ad.b):
        raise DeltaError("adapters: A and B name different matrices")
    for name in ad.a:
        if name not in base:
            raise DeltaError(f"adapters: {name} is not a matrix of the base")
        out, inp = base[name].shape
        if tuple(ad.a[name].shape) != (ad.rank, inp) or tuple(ad.b[name].shape) != (out, ad.rank):
            raise DeltaError(f"adapters: {name} has A {tuple(ad.a[name].shape)}, B {tuple(ad.b[name].shape)}")


def encode_adapters(
    base: Weights,
    masters: Mapping[str, torch.Tensor],
    ad: AdapterWeights,
    *,
    version: int,
    base_crcs: Mapping[str, str] | None = None,
    level: int = DEFAULT_LEVEL,
) -> bytes:
    """The payload of version `version`: `ad`'s tensors, with the checksums of their merge into `masters`
    (the float32 base of each adapted matrix) and the digest of the served set (`base`: every bf16 tensor,
    as published in the base anchor; `base_crcs` may pass its crc32s already known)."""
    check_adapters(base, ad)
    base_crcs = base_crcs if base_crcs is not None else {n: tensor_crc(t) for n, t in base.items()}
    names = sorted(ad.a)
    if missing := [n for n in names if n not in masters]:
        raise DeltaError(f"adapters: no float32 base for {missing[0]}")
    merged = {n: tensor_crc(merge(masters[n], ad.a[n], ad.b[n], ad.scale)) for n in names}
    manifest = {
        "format": "flywheel-adapters",
        "format_version": FORMAT_VERSION,
        "version": int(version),
        "rank": int(ad.rank),
        "alpha": float(ad.alpha),
        "checksum": "crc32",
        "base_digest": weights_digest((n, list(t.shape), base_crcs[n]) for n, t in base.items()),
        "weights_digest": merged_digest(base, base_crcs, merged),
        "tensors": [
            {
                "name": n,
                "shape": list(base[n].shape),
                "base_crc32": master_crc(masters[n]),
                "crc32": merged[n],
            }
            for n in names
        ],
    }
    a, b = flat32([ad.a[n] for n in names]), flat32([ad.b[n] for n in names])
    return pack(ADAPTERS_MAGIC, manifest, plane_sections(a, "a", level) | plane_sections(b, "b", level))


def decode_adapters(blob: bytes) -> tuple[dict[str, Any], AdapterWeights]:
    """(manifest, adapters) from a payload, structurally checked; touches no weights."""
    manifest, payload = unpack(blob, ADAPTERS_MAGIC)
    try:
        rank = int(manifest["rank"])
        a, b = (
            from_planes(manifest, payload, "a", "adapters"),
            from_planes(manifest, payload, "b", "adapters"),
        )
        ad, ia, ib = AdapterWeights(rank, float(manifest["alpha"])), 0, 0
        for t in manifest["tensors"]:
            out, inp = (int(x) for x in t["shape"])
            na, nb = rank * inp, out * rank
            if ia + na > a.size or ib + nb > b.size:
                raise DeltaError(f"corrupt adapters: sections shorter than the manifest says ({t['name']})")
            ad.a[t["name"]] = torch.from_numpy(a[ia : ia + na].copy()).reshape(rank, inp)
            ad.b[t["name"]] = torch.from_numpy(b[ib : ib + nb].copy()).reshape(out, rank)
            ia, ib = ia + na, ib + nb
    except (KeyError, TypeError, ValueError) as exc:
        raise DeltaError(f"corrupt adapters: malformed manifest ({exc})") from None
    if ia != a.size or ib != b.size:
        raise DeltaError("corrupt adapters: sections longer than the manifest says")
    return manifest, ad


def apply_adapters(
    weights: Weights, masters: Mapping[str, torch.Tensor], blob: bytes, *, base_digest: str | None = None
) -> int:
    """Write the payload's merged matrices into `weights` (the served tensors) in place; returns its version.

    `masters`: the receiver's float32 base of each adapted matrix (`decode_masters`). Refused with
    `DeltaError`, leaving `weights` bitwise untouched, when the payload is corrupt, its base digest
    differs from `base_digest` (when given), a matrix is missing or of another shape, or the merged
    result's checksums or digest are not the trainer's (another base, or served weights that drifted from
    it).
    """
    manifest, ad = decode_adapters(blob)
    version = int(manifest["version"])
    if base_digest is not None and base_digest != manifest["base_digest"]:
        raise DeltaError(f"adapters {version}: published on another base than the receiver's")
    fresh: dict[str, torch.Tensor] = {}
    for t in manifest["tensors"]:
        name = t["name"]
        if name not in masters or name not in weights or list(weights[name].shape) != t["shape"]:
            raise DeltaError(f"adapters {version}: the receiver has no {tuple(t['shape'])} matrix {name}")
        if master_crc(masters[name]) != t["base_crc32"]:
            raise DeltaError(
                f"adapters {version}: the receiver's base of {name} differs from the published one; "
                "weights left unchanged"
            )
        fresh[name] = merge(masters[name], ad.a[name], ad.b[name], ad.scale)
        if tensor_crc(fresh[name]) != t["crc32"]:
            raise DeltaError(
                f"adapters {version} do not reproduce the trainer's {name}; weights left unchanged"
            )
    crcs = {n: tensor_crc(fresh[n]) if n in fresh else tensor_crc(w) for n, w in weights.items()}
    if weights_digest((n, list(w.shape), crcs[n]) for n, w in weights.items()) != manifest["weights_digest"]:
        raise DeltaError(
            f"adapters {version}: the receiver's other tensors differ from the trainer's; "
            "weights left unchanged"
        )
    for name, t in fresh.items():
        weights[name].copy_(t)
    return version
