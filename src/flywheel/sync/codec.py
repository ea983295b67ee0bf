"""The bf16 weight-delta codec: sparse, lossless, verified, applied in place.

Inference serves bf16 weights, and one RL step moves only a small fraction of them by one bf16 step (an
fp32 master update of 1e-6 is far below the spacing of bf16 numbers near 0.02, so the cast rounds most
weights back to the same bits). A delta therefore carries only the positions whose bits changed and
their new bits, and everything is compared bitwise (tensors viewed as int16), never as floats: NaN, inf
and -0.0 round-trip exactly.

Wire format (one blob; `encode_delta`, `encode_anchor`)::

    magic (8 bytes) | manifest length (u32 LE) | crc32 of the manifest (u32 LE) | manifest JSON | payload

The manifest carries the format version, a crc32 per compressed section, `version`, `base_version`, the value mode, the payload's
sections (offset, compressed and raw size) and, per tensor, name, shape, dtype, number of changed
positions, its byte counts in the raw streams and the crc32 of the NEW tensor's bits. `weights_digest`
(a blake2b over the per-tensor names, shapes and crc32s) names a whole weight set; a delta records the
digest of its base and of its result.

Positions. Per tensor, the changed flat positions become gaps (the number of unchanged positions before
each change). A gap is written as bytes of 255 meaning "add 255 and go on", closed by one byte below 255.
This is a base-255 unary/remainder code: geometric gaps (what independent changes give) stay nearly
memoryless, so zstd's Huffman stage codes the byte stream close to the mask's entropy, and both encode and
decode are a handful of numpy array operations (the decoder finds the closing bytes and takes differences
of a cumulative sum; no Python loop over elements).

Values. For each changed position one 16-bit symbol: `raw` (the new bits), `xor` (old ^ new) or `diff`
(the zigzag-mapped wrap-around difference new - old, so a one-ulp move in either direction is 1 or 2).
Symbols are packed two to a byte (4 bits each; 15 escapes to a side stream of full 16-bit symbols, itself
split into low and high byte planes): zstd's Huffman stage spends at least one bit per byte, and one-ulp
moves make the symbols nearly binary, so pairing halves that floor (measured: 1.83 bits per symbol
against 2.55 for plain byte planes, entropy 1.67). `value_mode="auto"` (the default) compresses `xor` and
`diff` and keeps the smaller (`diff` won by 10-12% on synthetic one-ulp steps; `raw` is twice as large).

Compression: each stream is its own zstd frame with a content checksum, at level 1 by default (measured:
levels 3 and 9 are slower and no smaller on these near-memoryless streams).

Checksums: zlib.crc32 per tensor (measured 1.7 GB/s here against 0.56 GB/s for blake2b), blake2b only
over the small digest list.

Applying in place, safely (`apply_delta`). Everything that can be checked without touching the receiver
is checked first: header, manifest crc, payload frames, version and base version, the base digest when
the caller knows it, tensor names, shapes and dtypes, and the decoded positions' bounds. Then the changes
are staged into the receiver's own storage: the old bits at the changed positions are saved (a copy the
size of the delta, never of the model), the new bits written, and each tensor's crc32 is compared with the
manifest's. On any mismatch every tensor written so far is restored from the saved bits, so a refused
delta leaves the receiver bitwise untouched. Checking the result, not the base, is what makes the apply
lossless: a wrong base anywhere in a tensor shows up in that tensor's result crc. The cost is one crc pass
over the weights per apply (`verify="changed"` limits it to tensors with changes, for callers that trust
the base digest).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import zstandard

from flywheel.errors import FlywheelError

DELTA_MAGIC = b"FWDELTA1"
ANCHOR_MAGIC = b"FWANCHR1"
ADAPTERS_MAGIC = b"FWADAPT1"  # LoRA adapter payloads (`flywheel.sync.adapters`)
MASTERS_MAGIC = b"FWLBASE1"  # a LoRA run's float32 base of its adapted matrices (the same module)
FORMAT_VERSION = 1
DEFAULT_LEVEL = 1  # measured: levels 3-9 are slower and no smaller on these streams
VALUE_MODES = ("raw", "xor", "diff")
AUTO_MODES = ("xor", "diff")  # raw never wins on real steps; `value_mode="raw"` still selects it
ESCAPE = 15
HEADER = struct.Struct("<II")  # manifest length, crc32 of the manifest
MAX_NUMEL = 2**40  # gaps are int64 internally; far above any real tensor

ValueMode = Literal["auto", "raw", "xor", "diff"]
Weights = Mapping[str, torch.Tensor]


class DeltaError(FlywheelError):
    """A delta or anchor is corrupt, or does not fit the weights it is applied to."""


# ---------------------------------------------------------------------------------------- tensor views


def bits(t: torch.Tensor) -> np.ndarray:
    """The raw bits of a contiguous CPU bf16 tensor as a flat uint16 array sharing its storage."""
    if t.dtype != torch.bfloat16:
        raise DeltaError(f"expected a bfloat16 tensor, got {t.dtype}")
    if t.device.type != "cpu":
        raise DeltaError(f"expected a CPU tensor, got one on {t.device}")
    if not t.is_contiguous():
        raise DeltaError("expected a contiguous tensor")
    return t.view(-1).view(torch.int16).numpy().view(np.uint16)


def tensor_crc(t: torch.Tensor) -> str:
    """crc32 of a bf16 tensor's bits, as 8 hex digits."""
    return f"{zlib.crc32(bits(t)):08x}"


def weights_digest(entries: Iterable[tuple[str, list[int], str]]) -> str:
    """Digest of a weight set from (name, shape, crc32) entries, independent of their order."""
    h = hashlib.blake2b(digest_size=16)
    for name, shape, crc in sorted(entries):
        h.update(f"{name}|{','.join(map(str, shape))}|{crc};".encode())
    return h.hexdigest()


def digest_of(weights: Weights, crcs: Mapping[str, str] | None = None) -> str:
    """`weights_digest` of a dict of bf16 tensors (crc32s computed unless given)."""
    crcs = crcs if crcs is not None else {n: tensor_crc(t) for n, t in weights.items()}
    return weights_digest((n, list(t.shape), crcs[n]) for n, t in weights.items())


# ------------------------------------------------------------------------------------ gaps <-> indices


def encode_gaps(idx: np.ndarray) -> np.ndarray:
    """Strictly increasing flat positions -> the base-255 gap byte stream."""
    if idx.size == 0:
        return np.empty(0, np.uint8)
    gaps = np.diff(idx, prepend=-1) - 1
    q, r = np.divmod(gaps, 255)
    ends = np.cumsum(q + 1) - 1
    out = np.full(int(ends[-1]) + 1, 255, np.uint8)
    out[ends] = r
    return out


def decode_gaps(stream: np.ndarray) -> np.ndarray:
    """The gap byte stream -> flat positions (int64). A trailing run of 255s is malformed."""
    if stream.size and stream[-1] == 255:
        raise DeltaError("corrupt delta: the position stream ends inside a gap")
    ends = np.flatnonzero(stream != 255)
    csum = np.cumsum(stream, dtype=np.int64)
    totals = csum[ends]
    gaps = np.diff(totals, prepend=0)
    return np.cumsum(gaps + 1) - 1


# ---------------------------------------------------------------------------------------- value symbols


def value_symbols(old: np.ndarray, new: np.ndarray, mode: str) -> np.ndarray:
    """16-bit symbols for the changed positions' values (old/new: uint16 bits at those positions)."""
    if mode == "raw":
        return new.copy()
    if mode == "xor":
        return old ^ new
    if mode == "diff":
        d = (new - old).view(np.int16)
        return ((d << 1) ^ (d >> 15)).view(np.uint16)
    raise DeltaError(f"unknown value mode {mode!r}; expected one of {', '.join(VALUE_MODES)}")


def new_values(old: np.ndarray, sym: np.ndarray, mode: str) -> np.ndarray:
    """Inverse of `value_symbols`: the new bits from the old bits and the symbols."""
    if mode == "raw":
        return sym
    if mode == "xor":
        return old ^ sym
    if mode == "diff":
        d = (sym >> 1) ^ (np.uint16(0) - (sym & np.uint16(1)))
        return old + d
    raise DeltaError(f"unknown value mode {mode!r}")


def planes(sym: np.ndarray) -> tuple[bytes, bytes]:
    """Low and high byte planes of uint16 symbols."""
    pair = sym.view(np.uint8).reshape(-1, 2)
    return pair[:, 0].tobytes(), pair[:, 1].tobytes()


def unplanes(lo: bytes, hi: bytes) -> np.ndarray:
    """Inverse of `planes`."""
    if len(lo) != len(hi):
        raise DeltaError("corrupt payload: byte planes of different lengths")
    out = np.empty((len(lo), 2), np.uint8)
    out[:, 0] = np.frombuffer(lo, np.uint8)
    out[:, 1] = np.frombuffer(hi, np.uint8)
    return out.reshape(-1).view(np.uint16)


def pack_nibbles(sym: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Two symbols per byte (4 bits each, 15 = escape) and the escaped symbols in order.

    Huffman coding spends at least one bit per byte; packing pairs halves that floor, which matters
    because one-ulp moves make the value symbols nearly binary (about 1.7 bits of entropy).
    """
    small = np.minimum(sym, ESCAPE).astype(np.uint8)
    if small.size % 2:
        small = np.append(small, np.uint8(0))
    return (small[0::2] | (small[1::2] << 4)).tobytes(), sym[sym >= ESCAPE]


def unpack_nibbles(packed: bytes, escaped: np.ndarray, count: int) -> np.ndarray:
    """Inverse of `pack_nibbles` for `count` symbols."""
    b = np.frombuffer(packed, np.uint8)
    if b.size != (count + 1) // 2:
        raise DeltaError("corrupt payload: value stream length does not match the manifest")
    sym = np.empty(2 * b.size, np.uint16)
    sym[0::2], sym[1::2] = b & 15, b >> 4
    sym = sym[:count]
    where = sym == ESCAPE
    if int(where.sum()) != escaped.size:
        raise DeltaError("corrupt payload: escape count does not match")
    sym[where] = escaped
    return sym


# ------------------------------------------------------------------------------------------- container


def compress(data: bytes, level: int) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_checksum=True).compress(data)


def decompress(frame: bytes, raw_size: int, what: str) -> bytes:
    try:
        out = zstandard.ZstdDecompressor().decompress(frame, max_output_size=raw_size)
    except zstandard.ZstdError as exc:
        raise DeltaError(f"corrupt {what}: {exc}") from None
    if len(out) != raw_size:
        raise DeltaError(f"corrupt {what}: {len(out)} bytes, expected {raw_size}")
    return out


def pack(magic: bytes, manifest: dict[str, Any], sections: Mapping[str, tuple[bytes, int]]) -> bytes:
    """Container: header, manifest (with section table), then the compressed sections in order."""
    table, offset = {}, 0
    for name, (frame, raw) in sections.items():
        table[name] = {"offset": offset, "size": len(frame), "raw_size": raw, "crc32": zlib.crc32(frame)}
        offset += len(frame)
    body = json.dumps({**manifest, "sections": table}, separators=(",", ":")).encode()
    head = magic + HEADER.pack(len(body), zlib.crc32(body))
    return b"".join([head, body, *(frame for frame, _ in sections.values())])


def unpack(blob: bytes, magic: bytes) -> tuple[dict[str, Any], memoryview]:
    """Header and manifest checked; returns (manifest, payload)."""
    what = {DELTA_MAGIC: "delta", ADAPTERS_MAGIC: "adapters", MASTERS_MAGIC: "LoRA base"}.get(magic, "anchor")
    if len(blob) < len(magic) + HEADER.size or blob[: len(magic)] != magic:
        kinds = {DELTA_MAGIC: "a delta", ANCHOR_MAGIC: "an anchor", ADAPTERS_MAGIC: "adapters"}
        kinds[MASTERS_MAGIC] = "a LoRA base"
        other = kinds.get(bytes(blob[: len(magic)]))
        raise DeltaError(f"not a Flywheel {what}" + (f" (it is {other})" if other else ""))
    size, crc = HEADER.unpack_from(blob, len(magic))
    start = len(magic) + HEADER.size
    body = bytes(blob[start : start + size])
    if len(body) != size or zlib.crc32(body) != crc:
        raise DeltaError(f"corrupt {what}: manifest checksum mismatch")
    manifest = json.loads(body)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DeltaError(f"unsupported {what} format version {manifest.get('format_version')}")
    return manifest, memoryview(blob)[start + size :]


def section(manifest: dict[str, Any], payload: memoryview, name: str, what: str) -> bytes:
    s = manifest["sections"][name]
    frame = payload[s["offset"] : s["offset"] + s["size"]]
    if len(frame) != s["size"]:
        raise DeltaError(f"corrupt {what}: payload truncated")
    if zlib.crc32(frame) != s["crc32"]:
        raise DeltaError(f"corrupt {what}: {name} section checksum mismatch")
    return decompress(bytes(frame), s["raw_size"], f"{what} ({name} section)")


def read_manifest(blob: bytes) -> dict[str, Any]:
    """The manifest of a delta, an anchor or a LoRA payload (header checked, payload not decoded)."""
    head = bytes(blob[: len(DELTA_MAGIC)])
    magic = head if head in (ANCHOR_MAGIC, ADAPTERS_MAGIC, MASTERS_MAGIC) else DELTA_MAGIC
    return unpack(blob, magic)[0]


# ---------------------------------------------------------------------------------------------- encode


def check_pair(old: Weights, new: Weights) -> None:
    if set(old) != set(new):
        missing, extra = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        raise DeltaError(f"tensor names differ: only in new {missing[:3]}, only in old {extra[:3]}")
    for name in new:
        if old[name].shape != new[name].shape:
            raise DeltaError(f"{name}: shape {tuple(old[name].shape)} vs {tuple(new[name].shape)}")
        if new[name].numel() >= MAX_NUMEL:
            raise DeltaError(f"{name}: too many elements for the delta format")


@dataclass
class Changes:
    """The changed positions of every tensor, and their old and new bits (all tensors concatenated)."""

    names: list[str]
    idx: list[np.ndarray]
    old: np.ndarray
    new: np.ndarray


def find_changes(old: Weights, new: Weights) -> Changes:
    names, idxs, olds, news = sorted(new), [], [], []
    for name in names:
        a, b = bits(old[name]), bits(new[name])
        i = np.flatnonzero(a != b)
        idxs.append(i)
        olds.append(a[i])
        news.append(b[i])
    cat = np.concatenate
    return Changes(
        names,
        idxs,
        cat(olds) if olds else np.empty(0, np.uint16),
        cat(news) if news else np.empty(0, np.uint16),
    )


def value_sections(sym: np.ndarray, level: int) -> dict[str, tuple[bytes, int]]:
    packed, escaped = pack_nibbles(sym)
    lo, hi = planes(escaped)
    return {
        name: (compress(b, level), len(b)) for name, b in (("nib", packed), ("esc_lo", lo), ("esc_hi", hi))
    }


def encode_values(ch: Changes, mode: ValueMode, level: int) -> tuple[str, dict[str, tuple[bytes, int]]]:
    """Compress the value symbols in `mode` (for "auto": xor and diff, keeping the smaller)."""
    best: tuple[str, dict[str, tuple[bytes, int]]] | None = None
    for m in AUTO_MODES if mode == "auto" else (mode,):
        secs = value_sections(value_symbols(ch.old, ch.new, m), level)
        if best is None or sum(len(f) for f, _ in secs.values()) < sum(len(f) for f, _ in best[1].values()):
            best = (m, secs)
    assert best is not None
    return best


def encode_delta(
    old: Weights,
    new: Weights,
    *,
    version: int,
    base_version: int,
    value_mode: ValueMode = "auto",
    level: int = DEFAULT_LEVEL,
    old_crcs: Mapping[str, str] | None = None,
    new_crcs: Mapping[str, str] | None = None,
) -> bytes:
    """The delta that turns `old` (version `base_version`) into `new` (version `version`), bitwise.

    `old_crcs` / `new_crcs` may pass per-tensor crc32s already known (a publisher keeps the previous
    version's), saving a pass over the weights.
    """
    check_pair(old, new)
    ch = find_changes(old, new)
    gap_streams = [encode_gaps(i) for i in ch.idx]
    mode, value_secs = encode_values(ch, value_mode, level)
    new_crcs = new_crcs if new_crcs is not None else {n: tensor_crc(new[n]) for n in ch.names}
    old_crcs = old_crcs if old_crcs is not None else {n: tensor_crc(old[n]) for n in ch.names}
    tensors = [
        {
            "name": n,
            "shape": list(new[n].shape),
            "dtype": "bfloat16",
            "changed": int(i.size),
            "gap_bytes": int(g.size),
            "value_bytes": 2 * int(i.size),
            "crc32": new_crcs[n],
        }
        for n, i, g in zip(ch.names, ch.idx, gap_streams, strict=True)
    ]
    gaps = np.concatenate(gap_streams).tobytes() if gap_streams else b""
    manifest = {
        "format": "flywheel-delta",
        "format_version": FORMAT_VERSION,
        "version": int(version),
        "base_version": int(base_version),
        "value_mode": mode,
        "level": level,
        "checksum": "crc32",
        "weights_digest": digest_of(new, new_crcs),
        "base_digest": digest_of(old, old_crcs),
        "tensors": tensors,
    }
    return pack(DELTA_MAGIC, manifest, {"gaps": (compress(gaps, level), len(gaps)), **value_secs})


def encode_anchor(
    weights: Weights, version: int, *, level: int = DEFAULT_LEVEL, crcs: Mapping[str, str] | None = None
) -> bytes:
    """A full copy of `weights` (bf16), byte planes zstd-compressed, with the same checksums."""
    names = sorted(weights)
    crcs = crcs if crcs is not None else {n: tensor_crc(weights[n]) for n in names}
    flat = np.concatenate([bits(weights[n]) for n in names]) if names else np.empty(0, np.uint16)
    lo, hi = planes(flat)
    manifest = {
        "format": "flywheel-anchor",
        "format_version": FORMAT_VERSION,
        "version": int(version),
        "checksum": "crc32",
        "weights_digest": digest_of(weights, crcs),
        "tensors": [
            {"name": n, "shape": list(weights[n].shape), "dtype": "bfloat16", "crc32": crcs[n]} for n in names
        ],
    }
    return pack(
        ANCHOR_MAGIC, manifest, {"lo": (compress(lo, level), len(lo)), "hi": (compress(hi, level), len(hi))}
    )


# ---------------------------------------------------------------------------------------------- decode


@dataclass
class DecodedDelta:
    """A delta checked and decoded, ready to apply: per tensor, positions and value symbols."""

    manifest: dict[str, Any]
    idx: dict[str, np.ndarray]
    sym: dict[str, np.ndarray]

    @property
    def version(self) -> int:
        return int(self.manifest["version"])

    @property
    def base_version(self) -> int:
        return int(self.manifest["base_version"])


def decode_delta(blob: bytes) -> DecodedDelta:
    """Parse, decompress and structurally check a delta, touching no weights."""
    manifest, payload = unpack(blob, DELTA_MAGIC)
    try:
        gaps = np.frombuffer(section(manifest, payload, "gaps", "delta"), np.uint8)
        escaped = unplanes(
            section(manifest, payload, "esc_lo", "delta"), section(manifest, payload, "esc_hi", "delta")
        )
        count = sum(int(t["changed"]) for t in manifest["tensors"])
        sym = unpack_nibbles(section(manifest, payload, "nib", "delta"), escaped, count)
        return split_streams(manifest, gaps, sym)
    except (KeyError, TypeError, ValueError) as exc:
        raise DeltaError(f"corrupt delta: malformed manifest ({exc})") from None


def split_streams(manifest: dict[str, Any], gaps: np.ndarray, sym: np.ndarray) -> DecodedDelta:
    idx, syms, g0, v0 = {}, {}, 0, 0
    for t in manifest["tensors"]:
        g1, v1 = g0 + int(t["gap_bytes"]), v0 + int(t["changed"])
        if g1 > gaps.size or v1 > sym.size:
            raise DeltaError(f"corrupt delta: streams shorter than the manifest says ({t['name']})")
        i = decode_gaps(gaps[g0:g1])
        numel = int(np.prod(t["shape"], dtype=np.int64))
        if i.size != t["changed"] or (i.size and i[-1] >= numel):
            raise DeltaError(f"corrupt delta: positions of {t['name']} do not fit its shape")
        idx[t["name"]], syms[t["name"]] = i, sym[v0:v1]
        g0, v0 = g1, v1
    if g0 != gaps.size or v0 != sym.size:
        raise DeltaError("corrupt delta: streams longer than the manifest says")
    return DecodedDelta(manifest, idx, syms)


def check_fits(manifest: dict[str, Any], weights: Weights) -> None:
    names = {t["name"] for t in manifest["tensors"]}
    if names != set(weights):
        missing, extra = sorted(names - set(weights)), sorted(set(weights) - names)
        raise DeltaError(f"delta does not fit these weights: missing {missing[:3]}, unexpected {extra[:3]}")
    for t in manifest["tensors"]:
        w = weights[t["name"]]
        bits(w)  # bf16, CPU, contiguous: refused here, before anything is written
        if list(w.shape) != t["shape"] or w.dtype != torch.bfloat16:
            raise DeltaError(
                f"{t['name']}: receiver has {w.dtype} {tuple(w.shape)}, delta expects bf16 {tuple(t['shape'])}"
            )


# ----------------------------------------------------------------------------------------------- apply


def stage(weights: Weights, d: DecodedDelta) -> dict[str, np.ndarray]:
    """Write the delta's new bits into `weights` in place; returns the old bits it overwrote."""
    mode, saved = d.manifest["value_mode"], {}
    for name, i in d.idx.items():
        if i.size:
            flat = bits(weights[name])
            old = flat[i]
            saved[name] = old
            flat[i] = new_values(old, d.sym[name], mode)
    return saved


def restore(weights: Weights, d: DecodedDelta, saved: Mapping[str, np.ndarray]) -> None:
    for name, old in saved.items():
        bits(weights[name])[d.idx[name]] = old


def mismatched(weights: Weights, manifest: dict[str, Any], names: set[str] | None = None) -> list[str]:
    """Tensors whose crc32 differs from the manifest's (only `names`, when given)."""
    return [
        t["name"]
        for t in manifest["tensors"]
        if (names is None or t["name"] in names) and tensor_crc(weights[t["name"]]) != t["crc32"]
    ]


def apply_delta(
    weights: Weights,
    delta: bytes,
    *,
    expect_base: int,
    base_digest: str | None = None,
    verify: Literal["all", "changed"] = "all",
) -> int:
    """Apply `delta` to `weights` in place; returns the new version.

    Refused with `DeltaError`, leaving `weights` bitwise untouched, when the delta is corrupt, its base
    version is not `expect_base`, its base digest differs from `base_digest` (when given), the tensors do
    not fit, or the result's checksums do not match the trainer's (a different base).
    """
    d = decode_delta(delta)
    if d.base_version != expect_base:
        raise DeltaError(
            f"delta {d.version} is based on version {d.base_version}, the weights are at {expect_base}"
        )
    if base_digest is not None and base_digest != d.manifest["base_digest"]:
        raise DeltaError(f"delta {d.version}: base digest differs from the receiver's weights")
    check_fits(d.manifest, weights)
    saved = stage(weights, d)
    bad = mismatched(weights, d.manifest, None if verify == "all" else set(saved))
    if bad:
        restore(weights, d, saved)
        raise DeltaError(
            f"delta {d.version} does not reproduce the trainer's weights ({len(bad)} tensors differ, "
            f"e.g. {bad[0]}): the receiver's base is not version {d.base_version}; weights left unchanged"
        )
    return d.version


def decode_anchor(blob: bytes) -> tuple[int, dict[str, torch.Tensor]]:
    """(version, freshly allocated bf16 weights) from an anchor, checksums verified."""
    manifest, payload = unpack(blob, ANCHOR_MAGIC)
    try:
        flat = unplanes(
            section(manifest, payload, "lo", "anchor"), section(manifest, payload, "hi", "anchor")
        )
        out, start = {}, 0
        for t in manifest["tensors"]:
            n = int(np.prod(t["shape"], dtype=np.int64))
            chunk = flat[start : start + n]
            out[t["name"]] = torch.from_numpy(chunk.view(np.int16)).view(torch.bfloat16).reshape(t["shape"])
            start += n
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise DeltaError(f"corrupt anchor: malformed manifest ({exc})") from None
    if start != flat.size or mismatched(out, manifest):
        raise DeltaError(f"corrupt anchor {manifest['version']}: checksum mismatch")
    return int(manifest["version"]), out


def load_anchor_into(weights: dict[str, torch.Tensor], blob: bytes) -> int:
    """Overwrite `weights` in place from an anchor (decoded and verified first); returns its version.

    Tensors the receiver lacks are added; a tensor whose shape differs is replaced. The anchor is staged
    whole in fresh memory before the copy, so a corrupt anchor never touches `weights`.
    """
    version, fresh = decode_anchor(blob)
    for name in [n for n in weights if n not in fresh]:
        del weights[name]
    for name, t in fresh.items():
        w = weights.get(name)
        if w is not None and w.shape == t.shape and w.dtype == t.dtype:
            w.copy_(t)
        else:
            weights[name] = t
    return version


def summarize(blob: bytes) -> dict[str, Any]:
    """Sizes of a delta: changed fraction, bytes, bits per changed weight, per-tensor counts."""
    m = read_manifest(blob)
    tensors = [
        {
            "name": t["name"],
            "numel": int(np.prod(t["shape"], dtype=np.int64)),
            "changed": int(t.get("changed", 0)),
        }
        for t in m["tensors"]
    ]
    numel = sum(t["numel"] for t in tensors)
    changed = sum(t["changed"] for t in tensors)
    return {
        "kind": "anchor" if m["format"] == "flywheel-anchor" else "delta",
        "version": m["version"],
        "base_version": m.get("base_version"),
        "value_mode": m.get("value_mode"),
        "bytes": len(blob),
        "full_bf16_bytes": 2 * numel,
        "weights": numel,
        "changed": changed,
        "changed_fraction": changed / numel if numel else 0.0,
        "bits_per_changed": 8 * len(blob) / changed if changed else None,
        "sections": {k: v["size"] for k, v in m["sections"].items()},
        "tensors": tensors,
    }
