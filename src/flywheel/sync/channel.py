"""Publishing weight versions from the trainer and following them on inference workers.

Layout in a `WeightStore` (every payload under a content key, markers published last)::

    objects/delta-<v>-<hash>.fwd     delta from the previous published version to v
    objects/anchor-<v>-<hash>.fwa    full copy of version v
    versions/<v>.json                marker: version, base_version, delta key, anchor key (if any),
                                     anchor_version (latest anchor at or before v), weights digest,
                                     payload hashes and sizes
    LATEST                           {"version": v}

`Publisher.start(weights, version)` is a (re)started trainer's first call: it publishes the version as an
anchor, or resumes when the store already holds exactly that version (checked by digest).
`Publisher.publish(weights, version)` writes a delta from the last published version and, every
`anchor_every` versions (and for the first), also an anchor; then the marker, then LATEST. A reader that
follows LATEST and the markers sees only whole versions. The publisher keeps a private copy of the last
published bf16 weights (and their crc32s) to diff against.

LoRA runs (`AdapterPublisher`, `flywheel.sync.adapters`) publish the frozen base once, as a bf16 anchor
(``objects/base-<hash>.fwa``) and the float32 base of the adapted matrices (``objects/masters-<hash>.fwm``),
and then per version one complete adapters payload (``objects/adapters-<v>-<hash>.fwl``); the marker names
all three (`base`, `masters`, `adapters`, `base_digest`). Each payload replaces the last, so there is no
chain: a follower loads the base when it lacks it, then applies the latest payload alone.

`Subscriber` holds bf16 weights and their version. `catch_up()` reads LATEST, walks the markers back to
its own version and applies the deltas in order, in place. It starts from the latest anchor instead when
the chain is longer than `max_chain` (or it holds no weights yet), and recovers from the anchor plus the chain after it when a delta is refused (corrupt,
wrong base). Store failures leave the weights at the last good version (`last_error` says why).
`prefetch()` downloads the pending chain in a background thread; `apply_ready()` applies it between
batches without waiting, and records the pause in `last_pause_s`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from flywheel.protocols import WeightStore
from flywheel.sync.adapters import (
    AdapterWeights,
    apply_adapters,
    decode_masters,
    encode_adapters,
    encode_masters,
)
from flywheel.sync.codec import (
    DEFAULT_LEVEL,
    DeltaError,
    ValueMode,
    apply_delta,
    digest_of,
    encode_anchor,
    encode_delta,
    load_anchor_into,
    read_manifest,
    tensor_crc,
)
from flywheel.sync.store import StoreError

LATEST = "LATEST"


def marker_key(version: int) -> str:
    return f"versions/{version:010d}.json"


def content_key(kind: str, version: int, blob: bytes) -> str:
    if kind in ("base", "masters"):  # one per base model, whatever the version: a restart finds it in place
        return f"objects/{kind}-{blob_hash(blob)}.{'fwa' if kind == 'base' else 'fwm'}"
    ext = {"delta": "fwd", "adapters": "fwl"}.get(kind, "fwa")
    return f"objects/{kind}-{version:010d}-{hashlib.blake2b(blob, digest_size=12).hexdigest()}.{ext}"


def blob_hash(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


def read_json(store: WeightStore, key: str) -> dict[str, Any]:
    try:
        return json.loads(store.get(key))
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{key}: malformed JSON ({exc})") from None


def latest_version(store: WeightStore) -> int | None:
    """The published LATEST version, or None when nothing is published yet."""
    if not store.exists(LATEST):
        return None
    return int(read_json(store, LATEST)["version"])


# ----------------------------------------------------------------------------------------------- publisher


@dataclass
class PublishStats:
    """What one publish did."""

    version: int
    kind: str  # "delta", "anchor" or "delta+anchor"
    delta_bytes: int = 0
    anchor_bytes: int = 0
    encode_s: float = 0.0  # checksums and encoding
    upload_s: float = 0.0  # payloads, marker and LATEST written
    keep_s: float = 0.0  # copying the weights kept to diff the next version against


class Publisher:
    """Trainer side: publishes each new bf16 version as a delta, with an anchor every `anchor_every`."""

    def __init__(
        self,
        store: WeightStore,
        *,
        anchor_every: int = 10,
        value_mode: ValueMode = "auto",
        level: int = DEFAULT_LEVEL,
    ) -> None:
        if anchor_every < 1:
            raise ValueError("anchor_every must be at least 1")
        self.store, self.anchor_every, self.value_mode, self.level = store, anchor_every, value_mode, level
        self.prev: dict[str, torch.Tensor] | None = None
        self.prev_crcs: dict[str, str] = {}
        self.prev_version: int | None = None
        self.anchor_version: int | None = None
        self.since_anchor = 0

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> PublishStats:
        """Publish `weights` (bf16) as `version`; versions must increase."""
        if self.prev_version is not None and version <= self.prev_version:
            raise ValueError(f"version {version} is not after the last published {self.prev_version}")
        t0 = time.perf_counter()
        crcs = {n: tensor_crc(t) for n, t in weights.items()}
        delta = anchor = None
        if self.prev is not None:
            delta = encode_delta(
                self.prev, weights, version=version, base_version=self.prev_version or 0,
                value_mode=self.value_mode, level=self.level, old_crcs=self.prev_crcs, new_crcs=crcs,
            )  # fmt: skip
        if self.prev is None or self.since_anchor + 1 >= self.anchor_every:
            anchor = encode_anchor(weights, version, level=self.level, crcs=crcs)
        t1 = time.perf_counter()
        self.upload(version, delta, anchor, digest_of(weights, crcs))
        t2 = time.perf_counter()
        self.remember(weights, version, crcs, anchor is not None)
        kind = "+".join(k for k, b in (("delta", delta), ("anchor", anchor)) if b is not None)
        sizes = len(delta or b""), len(anchor or b"")
        return PublishStats(version, kind, *sizes, t1 - t0, t2 - t1, time.perf_counter() - t2)

    def upload(self, version: int, delta: bytes | None, anchor: bytes | None, digest: str) -> None:
        """Payloads first, then the marker, then LATEST."""
        marker: dict[str, Any] = {
            "version": version,
            "base_version": self.prev_version,
            "weights_digest": digest,
        }
        for kind, blob in (("delta", delta), ("anchor", anchor)):
            if blob is not None:
                key = content_key(kind, version, blob)
                self.store.put(key, blob)
                marker[kind] = {"key": key, "size": len(blob), "blake2b": blob_hash(blob)}
        marker["anchor_version"] = version if anchor is not None else self.anchor_version
        self.store.put(marker_key(version), json.dumps(marker).encode())
        self.store.put(LATEST, json.dumps({"version": version}).encode())

    def resume(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Continue after a restart: `weights` are already published as `version`; diff the next against them.

        Refuses (DeltaError) weights whose digest differs from the published marker's, so a trainer that
        restarted from an older checkpoint can never publish a version twice with different contents.
        """
        marker = read_json(self.store, marker_key(version))
        crcs = {n: tensor_crc(t) for n, t in weights.items()}
        if digest_of(weights, crcs) != marker["weights_digest"]:
            raise DeltaError(f"version {version} is published with other weights than the ones resumed from")
        self.prev = {n: t.detach().clone() for n, t in weights.items()}
        self.prev_crcs, self.prev_version = crcs, version
        self.anchor_version = marker.get("anchor_version")
        self.since_anchor = version - self.anchor_version if self.anchor_version is not None else 0

    def start(self, weights: Mapping[str, torch.Tensor], version: int) -> PublishStats | None:
        """First call of a (re)started trainer: publish `version` unless the store already has it.

        LATEST older than `version` (or none): publish, as an anchor (the first publish of a publisher
        always anchors). LATEST equal: resume from it. LATEST newer: refused, since the store is ahead of
        the weights being resumed and a version number would name two different weight sets.
        """
        latest = latest_version(self.store)
        if latest is None or latest < version:
            return self.publish(weights, version)
        if latest == version:
            self.resume(weights, version)
            return None
        raise DeltaError(
            f"the store already holds version {latest}, ahead of the weights at version {version}"
        )

    def remember(
        self, weights: Mapping[str, torch.Tensor], version: int, crcs: dict[str, str], anchored: bool
    ) -> None:
        self.prev = {n: t.detach().clone() for n, t in weights.items()}
        self.prev_crcs, self.prev_version = crcs, version
        if anchored:
            self.anchor_version, self.since_anchor = version, 0
        else:
            self.since_anchor += 1


class AdapterPublisher:
    """Trainer side of a LoRA run: the base once, then each version's adapters whole (module docstring).

    The same verbs as `Publisher`: `start(base, adapters, version)` publishes or resumes, `publish(adapters,
    version)` publishes the next version. `base` is the frozen base in float32 (the trainer's master
    weights); the publisher keeps its bf16 copy (and crc32s) and the float32 adapted matrices, to compute
    the merged checksums every follower must reproduce.
    """

    def __init__(self, store: WeightStore, *, level: int = DEFAULT_LEVEL) -> None:
        self.store, self.level = store, level
        self.base: dict[str, torch.Tensor] = {}
        self.masters: dict[str, torch.Tensor] = {}
        self.base_crcs: dict[str, str] = {}
        self.refs: dict[str, dict[str, Any]] = {}  # "base", "masters": their keys, sizes and hashes
        self.unsent: dict[str, bytes] = {}  # those not in the store yet
        self.base_digest = ""
        self.prev_version: int | None = None

    def keep_base(self, base: Mapping[str, torch.Tensor], adapted: list[str]) -> None:
        self.base = {n: t.detach().to("cpu", torch.bfloat16).contiguous().clone() for n, t in base.items()}
        self.masters = {n: base[n].detach().to("cpu", torch.float32).contiguous().clone() for n in adapted}
        self.base_crcs = {n: tensor_crc(t) for n, t in self.base.items()}
        self.base_digest = digest_of(self.base, self.base_crcs)
        blobs = {
            "base": encode_anchor(self.base, 0, level=self.level, crcs=self.base_crcs),
            "masters": encode_masters(self.masters, level=self.level),
        }
        for kind, blob in blobs.items():
            key = content_key(kind, 0, blob)
            self.refs[kind] = {"key": key, "size": len(blob), "blake2b": blob_hash(blob)}
            if not self.store.exists(key):
                self.unsent[kind] = blob

    def encode(self, adapters: AdapterWeights, version: int) -> bytes:
        return encode_adapters(
            self.base, self.masters, adapters, version=version, base_crcs=self.base_crcs, level=self.level
        )

    def start(
        self, base: Mapping[str, torch.Tensor], adapters: AdapterWeights, version: int
    ) -> PublishStats | None:
        """First call of a (re)started trainer: keep `base`, then publish `version` unless the store has it
        (resumed when LATEST is `version` with the same merged digest; refused when LATEST is newer)."""
        self.keep_base(base, sorted(adapters.a))
        latest = latest_version(self.store)
        if latest is None or latest < version:
            return self.publish(adapters, version)
        if latest > version:
            raise DeltaError(
                f"the store already holds version {latest}, ahead of the weights at version {version}"
            )
        marker = read_json(self.store, marker_key(version))
        blob = self.encode(adapters, version)
        if marker.get("base_digest") != self.base_digest or (
            read_manifest(blob)["weights_digest"] != marker["weights_digest"]
        ):
            raise DeltaError(f"version {version} is published with other weights than the ones resumed from")
        self.prev_version = version
        return None

    def publish(self, adapters: AdapterWeights, version: int) -> PublishStats:
        """Publish `adapters` as `version` (the base first, if the store lacks it); versions must increase."""
        if not self.refs:
            raise ValueError("AdapterPublisher.start must run before publish")
        if self.prev_version is not None and version <= self.prev_version:
            raise ValueError(f"version {version} is not after the last published {self.prev_version}")
        t0 = time.perf_counter()
        blob = self.encode(adapters, version)
        t1 = time.perf_counter()
        base_bytes = sum(len(b) for b in self.unsent.values())
        for kind, b in list(self.unsent.items()):
            self.store.put(self.refs[kind]["key"], b)
            del self.unsent[kind]
        key = content_key("adapters", version, blob)
        self.store.put(key, blob)
        marker = {
            "version": version,
            "base_version": self.prev_version,
            "weights_digest": read_manifest(blob)["weights_digest"],
            "base_digest": self.base_digest,
            **self.refs,
            "adapters": {"key": key, "size": len(blob), "blake2b": blob_hash(blob)},
            "anchor_version": None,
        }
        self.store.put(marker_key(version), json.dumps(marker).encode())
        self.store.put(LATEST, json.dumps({"version": version}).encode())
        self.prev_version = version
        kind = "adapters+base" if base_bytes else "adapters"
        return PublishStats(version, kind, len(blob), base_bytes, t1 - t0, time.perf_counter() - t1)


# ---------------------------------------------------------------------------------------------- subscriber


@dataclass
class Step:
    """One downloaded payload waiting to be applied."""

    marker: dict[str, Any]
    kind: str  # "delta", "anchor", or for LoRA "base", "masters", "adapters"
    blob: bytes


@dataclass
class Plan:
    """The payloads that bring a subscriber from `start` to `target`, in order."""

    start: int | None
    target: int
    steps: list[Step] = field(default_factory=list)


class Subscriber:
    """Receiver side: bf16 weights kept at the latest published version, updated in place."""

    def __init__(
        self,
        store: WeightStore,
        weights: dict[str, torch.Tensor] | None = None,
        version: int | None = None,
        *,
        digest: str | None = None,
        max_chain: int = 32,
    ) -> None:
        self.store, self.max_chain = store, max_chain
        self.weights: dict[str, torch.Tensor] = weights if weights is not None else {}
        self.version = version if weights is not None else None
        self.digest = digest
        # LoRA stores: the digest of the base anchor loaded, and the float32 base of each adapted matrix
        self.base_digest: str | None = None
        self.masters: dict[str, torch.Tensor] = {}
        self.last_error: str | None = None
        self.last_pause_s = 0.0
        self.recoveries = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-prefetch")
        self._pending: Future[Plan | None] | None = None
        self._lock = threading.Lock()

    # -- planning and downloading (no weights touched) --

    def marker(self, version: int) -> dict[str, Any]:
        return read_json(self.store, marker_key(version))

    def fetch(self, marker: dict[str, Any], kind: str) -> Step:
        ref = marker[kind]
        blob = self.store.get(ref["key"])
        if len(blob) != ref["size"] or blob_hash(blob) != ref["blake2b"]:
            raise DeltaError(f"{ref['key']}: downloaded payload does not match its marker")
        return Step(marker, kind, blob)

    def plan(self, *, from_anchor: bool = False) -> Plan | None:
        """Download what brings the weights to LATEST; None when already there."""
        target = latest_version(self.store)
        if target is None or (target == self.version and not from_anchor):
            return None
        head = self.marker(target)
        if "adapters" in head:  # a LoRA version: the base when not held, then the payload alone
            payload = self.fetch(head, "adapters")  # first: a damaged payload costs no base download
            load_base = from_anchor or self.base_digest != head["base_digest"]
            steps = [self.fetch(head, "base"), self.fetch(head, "masters")] if load_base else []
            return Plan(self.version, target, [*steps, payload])
        chain = None if from_anchor or self.version is None else self.chain(head, self.version)
        if chain is None:
            if head.get("anchor_version") is None:
                raise DeltaError(f"no anchor published at or before version {target}")
            chain = self.chain(head, head["anchor_version"]) or []
            steps = [self.fetch(self.marker(head["anchor_version"]), "anchor")]
        else:
            steps = []
        steps += [self.fetch(m, "delta") for m in chain]
        return Plan(self.version, target, steps)

    def chain(self, head: dict[str, Any], start: int) -> list[dict[str, Any]] | None:
        """Markers after `start` up to `head`, oldest first; None when too long or unreachable."""
        out, m = [], head
        while m["version"] != start:
            if m["base_version"] is None or m["version"] < start or len(out) >= self.max_chain:
                return None
            out.append(m)
            m = self.marker(m["base_version"])
        return out[::-1]

    # -- applying (in place) --

    def apply(self, plan: Plan) -> int | None:
        """Apply a downloaded plan; on a refused delta, recover from the latest anchor plus its chain."""
        t0 = time.perf_counter()
        with self._lock:
            try:
                self.run(plan)
            except DeltaError as exc:
                self.last_error, self.recoveries = str(exc), self.recoveries + 1
                self.recover()
        self.last_pause_s = time.perf_counter() - t0
        return self.version

    def recover(self) -> None:
        try:
            recovery = self.plan(from_anchor=True)
            if recovery is not None:
                self.run(recovery)
        except (StoreError, DeltaError) as exc:
            self.last_error = f"{self.last_error}; recovery failed: {exc}"

    def run(self, plan: Plan) -> None:
        if plan.start != self.version and plan.steps and plan.steps[0].kind == "delta":
            raise DeltaError(f"plan starts at version {plan.start}, weights are at {self.version}")
        for step in plan.steps:
            if step.kind == "anchor":
                self.version = load_anchor_into(self.weights, step.blob)
            elif step.kind == "base":  # the base alone is no version; the payload after it makes one
                self.version, self.base_digest, self.masters = None, None, {}
                load_anchor_into(self.weights, step.blob)
                self.base_digest = read_manifest(step.blob)["weights_digest"]
            elif step.kind == "masters":
                self.masters = decode_masters(step.blob)
                continue  # the weights are still the base's
            elif step.kind == "adapters":
                self.version = apply_adapters(
                    self.weights, self.masters, step.blob, base_digest=self.base_digest
                )
            else:
                self.version = apply_delta(
                    self.weights, step.blob, expect_base=self.version if self.version is not None else -1,
                    base_digest=self.digest,
                )  # fmt: skip
            self.digest = read_manifest(step.blob)["weights_digest"]

    # -- the public verbs --

    def catch_up(self) -> int | None:
        """Download and apply everything up to LATEST now; returns the version (None if store down)."""
        try:
            plan = self.plan()
        except StoreError as exc:
            return self.failed(exc)
        except DeltaError as exc:  # a payload that does not match its marker
            self.last_error, self.recoveries = str(exc), self.recoveries + 1
            with self._lock:
                self.recover()
            return self.version
        if plan is not None:
            self.apply(plan)
        return self.version

    poll = catch_up

    def prefetch(self) -> Future[Plan | None]:
        """Start downloading the pending chain in the background (at most one download at a time)."""
        if self._pending is None:
            self._pending = self._pool.submit(self.plan)
        return self._pending

    def apply_ready(self, *, wait: bool = False) -> int | None:
        """Apply a finished prefetch (waiting for it when `wait`); returns the new version or None."""
        pending = self._pending
        if pending is None or (not wait and not pending.done()):
            return None
        self._pending = None
        try:
            plan = pending.result()
        except StoreError as exc:
            return self.failed(exc)
        except DeltaError:
            return self.catch_up()
        if plan is None:
            return None
        if plan.start != self.version:  # weights moved since the download started: plan again
            return self.catch_up()
        return self.apply(plan)

    def failed(self, exc: Exception) -> None:
        self.last_error = str(exc)
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
