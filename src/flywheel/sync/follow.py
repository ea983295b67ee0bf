"""Weights that follow the trainer: a served model's tensors updated in place from a weight store.

`Follower` binds a `flywheel.sync.Subscriber` to the tensors of a torch model (`bind`), so anchors and
deltas (or a LoRA run's merged adapters) land in the memory the engine reads. The inference pools of the `local` and `ray` backends bind
the same way (`flywheel.loop.pool`); `flywheel serve --follow STORE` drives a `Follower` from its
batcher's thread (`flywheel.serve.batcher.Batcher`), so updates happen only between generation batches:

- `start()` reads the store once: the latest anchor plus the deltas after it, applied now. A store that
  cannot be read raises `StoreError`; an empty store is not an error (the model keeps its own weights and
  reports no version until the first one is published).
- `update()`, between batches: applies a download that has finished (the pause is the time the apply
  takes, `last_pause_s`, plus `prepare()`'s: the torch engine's `weights.refresh`, which repacks its
  matrices for the new weights now rather than in the next batch), and every `poll_s` starts downloading whatever LATEST names beyond the version
  served. It never raises on store trouble: the subscriber refuses a delta that does not reproduce the
  trainer's checksums (weights left bitwise unchanged, then recovery from the latest anchor), a store
  that is down leaves the last good weights serving, and either is logged as an error.

What is not covered: the version is the weights', not the engine's state. The torch engine notices the
change itself (its prefix store and packed matrices are keyed on a fingerprint of the parameters); an
engine that caches anything else derived from the weights must drop it too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from flywheel.errors import FlywheelError
from flywheel.protocols import WeightStore
from flywheel.sync.channel import Subscriber, latest_version
from flywheel.sync.store import StoreError

log = logging.getLogger(__name__)


def bind(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors by state-dict name, for in-place updates.

    Tied weights (an LM head sharing the embedding's storage) appear under two names; the second name gets
    its own copy (a shadow), since applying the same delta twice to one storage would apply it on top of
    itself. The delta changes both names alike, so the storage the engine reads is updated once, through
    the first name, and the shadow keeps the second name's checksum honest.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def check_binding(bound: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], model: str) -> None:
    """Refuse published tensors that were loaded beside the model's own rather than into them."""
    for name, t in weights.items():
        if bound.get(name) is not t:
            raise FlywheelError(
                f"published tensor '{name}' does not fit the model {model} (unknown name, shape or dtype)"
            )


class Follower:
    """A torch model's weights kept at the store's latest version; see the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        store: WeightStore,
        *,
        name: str = "the model",
        poll_s: float = 0.5,
        prepare: Callable[[], object] | None = None,
    ) -> None:
        self.name, self.poll_s = name, poll_s
        self.prepare = prepare  # after a new version: what the engine derives from the weights, remade now
        self.bound = bind(model)
        self.sub = Subscriber(store, dict(self.bound), None)
        self.updates: list[tuple[int, float]] = []  # (version, seconds the apply paused serving)
        self.errors = 0
        self._next_poll = 0.0
        self._last_error: str | None = None

    @property
    def version(self) -> int | None:
        return self.sub.version

    def start(self) -> int | None:
        """Load the latest published weights now; raises StoreError when the store cannot be read."""
        latest_version(self.sub.store)
        self.sub.catch_up()
        check_binding(self.bound, self.sub.weights, self.name)
        if self.sub.last_error and self.sub.version is None:
            raise StoreError(self.sub.last_error)
        self._next_poll = time.monotonic() + self.poll_s
        return self.sub.version

    def update(self) -> int | None:
        """Between batches: apply what has been downloaded, start the next download when due; the version."""
        before = self.sub.version
        self.sub.last_error = None
        self.sub.apply_ready()
        check_binding(self.bound, self.sub.weights, self.name)
        if self.sub.last_error:
            self.errors += 1
            if self.sub.last_error != self._last_error:  # a lasting fault is logged once, not every poll
                log.error("weights: %s; serving version %s", self.sub.last_error, self.sub.version)
        self._last_error = self.sub.last_error
        if self.sub.version is not None and self.sub.version != before:
            pause = self.sub.last_pause_s
            if self.prepare is not None:  # part of the pause: the next batch would otherwise pay it
                t0 = time.perf_counter()
                self.prepare()
                pause += time.perf_counter() - t0
            self.updates = [*self.updates[-99:], (self.sub.version, pause)]
            log.info("weights: serving version %d (paused %.3f s)", self.sub.version, pause)
        now = time.monotonic()
        if now >= self._next_poll:
            self.sub.prefetch()
            self._next_poll = now + self.poll_s
        return self.sub.version

    def close(self) -> None:
        self.sub.close()
