"""An inference pool: its own engine, serving bf16 weights that follow the store, applied between batches.

`Pool` is the backend-agnostic shell the local processes and the Ray actors both run. It loads the
engine's architecture and tokenizer from `PoolSpec.model` in bf16, binds a `Subscriber` to the model's
own tensors (so deltas and anchors are applied in place, in the memory the engine reads), and loads the
weights from the store: the latest anchor plus the deltas after it. Per batch:

1. `apply_ready()`: a delta downloaded in the background during the previous batch is applied now,
   between batches; its duration is the pool's pause for that update (`pauses`).
2. When the weights are older than the batch's `min_version`, a blocking catch-up (retried until
   `catch_up_wait_s`); a store that stays unreachable leaves the last good weights serving.
3. `prefetch()` starts downloading the next version while this batch generates.
4. `run_episodes` at `policy_version` = the version being served; each finished record is handed to
   `emit` at once (a pool killed mid-batch loses only what it had not yet handed over).

A published tensor that does not fit the model (unknown name, other shape) is refused with an error
rather than silently loaded beside the weights the engine reads. A LoRA run's store is followed the same
way: the subscriber loads its base once and merges each version's adapters into the bound tensors
(`flywheel.sync.adapters`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from flywheel.errors import FlywheelError
from flywheel.harness import Effort, EpisodeSpec, HarnessConfig, run_episodes
from flywheel.loop.config import LoopConfig
from flywheel.loop.dispatch import WorkItem
from flywheel.protocols import Grader, Model
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.sync.follow import bind, check_binding
from flywheel.verify import default_grader

START_WAIT_S = 60.0  # longest a starting pool waits for the store's first weights


@dataclass
class PoolSpec:
    """Everything a pool process or actor needs (picklable): the run's harness and effort budgets whole."""

    pool_id: str
    model: str
    store: str
    store_options: dict[str, Any] = field(default_factory=dict)
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    efforts: dict[str, Effort] = field(default_factory=dict)
    max_context: int | None = None
    torch_threads: int = 1
    grader: Grader | None = None  # None: the shared verifier
    catch_up_wait_s: float = 30.0
    episodes: Callable[..., Any] | None = None  # `LoopConfig.episodes` (None: the harness's run_episodes)

    @classmethod
    def of(cls, cfg: LoopConfig, pool_id: str, store: str) -> PoolSpec:
        """Pool `pool_id`'s spec under run config `cfg`, following `store`."""
        return cls(
            pool_id, cfg.model, store, dict(cfg.store_options), cfg.harness, dict(cfg.efforts), cfg.max_context,
            cfg.torch_threads, cfg.grader,
            catch_up_wait_s=math.inf if cfg.sync else cfg.catch_up_wait_s,  # older weights: only stale records
            episodes=cfg.episodes,
        )  # fmt: skip


def grader_for(spec: PoolSpec) -> Grader:
    """The spec's grader, else the shared verifier (an unchanged workspace is a failure without a grading
    run)."""
    return spec.grader or default_grader(get_sandbox(), skip_unchanged=True)


def run_items(
    engine: Model,
    spec: PoolSpec,
    items: Sequence[WorkItem],
    version: int,
    grader: Grader,
    emit: Callable[[str, Any], None],
    concurrency: int,
) -> None:
    """Run `items` on `engine` under the spec's harness settings; `emit` "started", then each record
    (a retry's says which attempt it retries: `retry_of`, `retry`). The spec's `episodes` runner, when it
    has one, runs them instead of the harness's `run_episodes`."""
    emit("started", {"ids": [it.id for it in items], "version": version, "pid": os.getpid()})
    specs = [
        EpisodeSpec(it.task, spec.efforts[it.effort], seed=it.seed, index=it.index, variant=it.variant)
        for it in items
    ]
    retries = {it.id: it for it in items if it.retry}
    cfg = replace(spec.harness, policy_version=version)

    def on_record(record: Trajectory) -> None:
        record.pool = spec.pool_id
        if record.id in retries:
            record.retry_of, record.retry = retries[record.id].retry_of, retries[record.id].retry
        emit("record", record)

    if spec.episodes:  # e.g. Fusion: the engine is the sidekick of a lead loaded by the runner
        spec.episodes(engine, specs, cfg, grader=grader, concurrency=concurrency, on_record=on_record)
        return
    run_episodes(specs, engine, cfg=cfg, grader=grader, concurrency=concurrency, on_record=on_record)


class Pool:
    """One inference engine that follows the published weights; see the module docstring."""

    def __init__(self, spec: PoolSpec) -> None:
        from flywheel.models.torch_engine import load_torch_model
        from flywheel.sync import Subscriber, open_store

        torch.set_num_threads(max(1, spec.torch_threads))
        self.spec = spec
        opts: dict[str, Any] = {"dtype": torch.bfloat16, "name": spec.model}
        if spec.max_context:
            opts["max_context"] = spec.max_context
        self.engine = load_torch_model(spec.model, **opts)
        self.bound = bind(self.engine.model)
        self.sub = Subscriber(open_store(spec.store, **spec.store_options), dict(self.bound), None)
        self.grader = grader_for(spec)
        self.pauses: list[tuple[int, float]] = []  # (version, seconds the update paused serving)
        self.store_errors = 0

    @property
    def version(self) -> int | None:
        return self.sub.version

    def check_binding(self) -> None:
        check_binding(self.bound, self.sub.weights, self.spec.model)

    def catch_up(self, min_version: int, wait_s: float) -> int | None:
        """Block until the weights are at least `min_version` or `wait_s` has passed."""
        deadline = time.monotonic() + wait_s
        while True:
            before, t0 = self.sub.version, time.perf_counter()
            version = self.sub.catch_up()
            self.check_binding()
            if self.sub.version != before and before is not None:
                self.pauses.append((int(self.sub.version or 0), time.perf_counter() - t0))
            if version is None and self.sub.last_error:
                self.store_errors += 1
            if self.sub.version is not None and self.sub.version >= min_version:
                return self.sub.version
            if time.monotonic() >= deadline:
                return self.sub.version
            time.sleep(0.2)

    def between_batches(self, min_version: int) -> None:
        before = self.sub.version
        if self.sub.apply_ready() is not None:
            self.check_binding()
            self.pauses.append((int(self.sub.version or 0), self.sub.last_pause_s))
        elif self.sub.last_error and self.sub.version == before:
            self.store_errors += 1
            self.sub.last_error = None
        if self.sub.version is None or self.sub.version < min_version:
            self.catch_up(min_version, self.spec.catch_up_wait_s)

    def run(self, items: Sequence[WorkItem], emit: Callable[[str, Any], None]) -> dict[str, Any]:
        """Generate `items` as one batch; `emit("started", ...)`, then `emit("record", r)` per episode."""
        self.between_batches(min(it.min_version for it in items))
        if self.sub.version is None:
            raise FlywheelError(f"pool {self.spec.pool_id}: no weights published yet ({self.sub.last_error})")
        self.sub.prefetch()
        version = int(self.sub.version)
        t0 = time.perf_counter()
        run_items(self.engine, self.spec, items, version, self.grader, emit, concurrency=len(items))
        return self.stats(version, time.perf_counter() - t0)

    def stats(self, version: int, gen_s: float) -> dict[str, Any]:
        pauses, self.pauses = self.pauses, []
        errors, self.store_errors = self.store_errors, 0
        return {
            "version": version,
            "gen_s": gen_s,
            "pauses": pauses,
            "store_errors": errors,
            "digest": self.sub.digest,
        }

    def close(self) -> None:
        self.sub.close()


# ------------------------------------------------------------------------------------------ local process


def pool_process(spec: PoolSpec, work: Any, results: Any) -> None:
    """Body of a local pool process: batches from `work`, events to `results` (both one-way pipes).

    Exits when the driver closes its end (EOF) or sends None; any other failure is reported as an
    "error" event with the traceback.
    """
    pool = None
    try:
        pool = Pool(spec)
        pool.catch_up(0, min(spec.catch_up_wait_s, START_WAIT_S))
        if pool.version is None:
            raise FlywheelError(f"pool {spec.pool_id}: no weights in the store ({pool.sub.last_error})")
        pauses = pool.stats(int(pool.version), 0.0)
        results.send(
            ("ready", spec.pool_id, {"pid": os.getpid(), **pauses, "recoveries": pool.sub.recoveries})
        )
        while True:
            items = work.recv()
            if items is None:
                break
            stats = pool.run(items, lambda kind, payload: results.send((kind, spec.pool_id, payload)))
            results.send(("batch", spec.pool_id, stats))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    except Exception as exc:
        with contextlib.suppress(OSError):
            results.send(("error", spec.pool_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if pool is not None:
            pool.close()
