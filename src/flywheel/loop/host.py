"""The trainer side of the loop: step, then checkpoint, replicate and publish (in that order).

`TrainerHost` wraps a `LoopTrainer` with its `Checkpointer` and `Publisher`. The driver calls `start()`
once (restore the newest complete checkpoint, publish the current weights unless the store already has
them), then per step `step(records)` and, after it has written the step's metrics line, `commit(state)`.
Split in two so the metrics line is on disk before the checkpoint that makes the step permanent: a
trainer killed in between resumes before the step and its metrics line is dropped and rewritten.

The inline and local backends run the host in a thread of the driver, the Ray backend in an actor; all
call the same methods. Without a store (the inline backend: its engine shares the trainer's parameters)
nothing is published, and `commit` may skip the checkpoint of a version (`[train] checkpoint_every`). Publishing retries a store that is down with exponential backoff (`publish_attempts`),
counting retries; the driver keeps dispatching meanwhile, so pools keep serving the last good weights.
A LoRA trainer (one with `lora` adapters) publishes through an `AdapterPublisher`: its frozen base once,
then each version's adapters (`flywheel.sync.adapters`), never a delta of the merged weights.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flywheel.loop.checkpoint import Checkpointer
from flywheel.record import Trajectory


class TrainerHost:
    """A trainer with its checkpoints and its publisher."""

    def __init__(
        self,
        trainer: Any,
        *,
        store: str = "",
        peer: str = "",
        checkpoints: Path,
        store_options: dict[str, Any] | None = None,
        anchor_every: int = 10,
        keep: int = 2,
        publish_attempts: int = 30,
    ) -> None:
        from flywheel.sync import AdapterPublisher, Publisher, Retry, open_store

        if callable(trainer) and not hasattr(trainer, "step"):
            trainer = trainer()  # a factory: build the trainer where it runs (a Ray actor's node)
        self.trainer = trainer
        self.retries = 0
        retry = Retry(attempts=publish_attempts, base_s=0.2, max_s=5.0)
        # Reads are as patient as writes: the host reads only when it starts (the peer's checkpoint, the
        # store's LATEST), and a trainer restarted during a store outage must wait for the store.
        opts = {"retry": retry, "read_retry": retry, "on_retry": self._count_retry, **(store_options or {})}
        peer_store = open_store(peer, **opts) if peer else None
        self.ckpt = Checkpointer(Path(checkpoints), peer_store, keep=keep)
        self.publisher: Any = None  # a Publisher, or an AdapterPublisher for a LoRA trainer
        self.adapters = getattr(trainer, "lora", None) is not None  # LoRA: the base once, then adapters
        if store:
            weights = open_store(store, **opts)
            self.publisher = (
                AdapterPublisher(weights) if self.adapters else Publisher(weights, anchor_every=anchor_every)
            )

    def _count_retry(self, attempt: int, exc: BaseException) -> None:
        self.retries += 1

    def start(self) -> dict[str, Any]:
        """Restore the newest complete checkpoint and make sure its weights are published."""
        state = self.ckpt.restore(self.trainer)
        stats = None
        if self.publisher is not None:
            version = int(self.trainer.version)
            if self.adapters:
                stats = self.publisher.start(
                    self.trainer.serving_base(), self.trainer.serving_adapters(), version
                )
            else:
                stats = self.publisher.start(self.trainer.serving_weights(), version)
        return {
            "version": int(self.trainer.version),
            "state": state,
            "source": self.ckpt.source,
            "skipped": list(self.ckpt.skipped),
            "publish": asdict(stats) if stats is not None else None,
        }

    def step(self, records: list[Trajectory]) -> dict[str, Any]:
        """One trainer step: its metrics and each record's score (reward, advantage, ...), in order."""
        t0 = time.perf_counter()
        metrics, scores = self.trainer.step(records)
        return {
            "version": int(self.trainer.version),
            "metrics": dict(metrics),
            "scores": list(scores),
            "step_s": time.perf_counter() - t0,
        }

    def commit(self, state: dict[str, Any], checkpoint: bool = True) -> dict[str, Any]:
        """Checkpoint locally (unless told not to), replicate to the peer, then publish the new weights."""
        t0 = time.perf_counter()
        if checkpoint:
            self.ckpt.replicate(self.ckpt.save(self.trainer, state))
        t1 = time.perf_counter()
        stats = None
        if self.publisher is not None:
            payload = self.trainer.serving_adapters() if self.adapters else self.trainer.serving_weights()
            stats = asdict(self.publisher.publish(payload, int(self.trainer.version)))
        return {
            "version": int(self.trainer.version),
            "checkpoint_s": t1 - t0,
            "publish_s": time.perf_counter() - t1,
            "publish": stats,
            "store_retries": self.retries,
        }

    def ping(self) -> int:
        return int(self.trainer.version)


class ThreadedHost:
    """The trainer side of a backend whose `TrainerHost` runs on one worker thread of the driver: a call is a
    `Future` of a host method (the `LoopBackend` trainer calls: `call`, `done`, `result`)."""

    host: TrainerHost
    worker: ThreadPoolExecutor

    def call(self, method: str, *args: Any) -> Future[Any]:
        return self.worker.submit(getattr(self.host, method), *args)

    def done(self, handle: Future[Any]) -> bool:
        return handle.done()

    def result(self, handle: Future[Any]) -> Any:
        return handle.result()
