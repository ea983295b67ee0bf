"""The `inline` backend: the whole loop in one process, generating with the trainer's own engine.

The trainer's engine shares the trainer's parameters, so the rollouts of a round always see the newest
update without a weight store, a delta or a pause: nothing is published. One worker thread runs both the
trainer host's calls and the pool's batches, so a rollout and an update never overlap (the schedule is
synchronous anyway: round r is generated at exactly version r). The driver above it is the same as for
the `local` and `ray` backends: the same run directory, checkpoints, resume, time budget and exactly-once
records.

The trainer (or its factory's result) must carry `engine`: a `Model` generating from its parameters
(`flywheel.rl.train.make_trainer` sets it).
"""

from __future__ import annotations

import os
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.loop.config import LoopConfig
from flywheel.loop.dispatch import WorkItem
from flywheel.loop.host import ThreadedHost, TrainerHost
from flywheel.loop.pool import PoolSpec, grader_for, run_items

Event = tuple[str, str, Any]


class InlineBackend(ThreadedHost):
    """One in-process pool on the trainer's engine; the trainer host in the same worker thread."""

    def __init__(self, host_args: dict[str, Any], trainer: Any, cfg: LoopConfig) -> None:
        self.host = TrainerHost(trainer, **host_args)
        self.engine = getattr(self.host.trainer, "engine", None)
        if self.engine is None:
            raise FlywheelError(
                "the inline loop backend needs a trainer with an `engine` (a Model on its weights)"
            )
        self.concurrency = cfg.concurrency
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inline")
        self.events: queue.Queue[Event] = queue.Queue()
        self.specs: dict[str, PoolSpec] = {}

    # -- the pool

    def start_pool(self, spec: PoolSpec) -> None:
        self.specs[spec.pool_id] = spec
        self.grader = grader_for(spec)
        version = int(self.host.trainer.version)
        self.events.put(("ready", spec.pool_id, {"pid": os.getpid(), "version": version, "pauses": []}))

    def pid(self, pool_id: str) -> int | None:
        return os.getpid()

    def submit(self, pool_id: str, items: list[WorkItem]) -> None:
        self.worker.submit(self._run, self.specs[pool_id], items)

    def _run(self, spec: PoolSpec, items: list[WorkItem]) -> None:
        version = int(self.host.trainer.version)
        try:
            emit = lambda kind, payload: self.events.put((kind, spec.pool_id, payload))  # noqa: E731
            run_items(self.engine, spec, items, version, self.grader, emit, self.concurrency or len(items))
            self.events.put(("batch", spec.pool_id, {"version": version, "pauses": []}))
        except Exception as exc:  # reported to the driver, which stops the run with it
            self.events.put(("error", spec.pool_id, f"{type(exc).__name__}: {exc}"))

    def poll(self, timeout: float) -> list[Event]:
        out: list[Event] = []
        try:
            out.append(self.events.get(timeout=timeout))
            while True:
                out.append(self.events.get_nowait())
        except queue.Empty:
            return out

    def close(self) -> None:
        self.worker.shutdown(wait=True)
