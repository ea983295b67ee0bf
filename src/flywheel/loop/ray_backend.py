"""The `ray` backend: the same `TrainerHost` and `Pool` as Ray actors; the driver dispatches.

`ray.init(address=cfg.ray_address)` joins a running cluster (`"auto"`) or starts a local one (None).
The trainer host is one actor (`ray_trainer_options`, e.g. `{"num_gpus": 1}`); each pool is an actor
(`ray_pool_options`, e.g. `{"resources": {"pool": 1}}` to place pools on nodes started with
`ray start --resources='{"pool": 1}'`). A pool batch is one remote call returning its records; a pool
actor that dies (node lost, process killed) fails its call with an actor error, its work is reissued and
a new actor takes its place. Paths in work items (task directories) and `file://` stores must be
reachable from every node: use a shared file system, or s3:// stores for weights and checkpoints.
"""

from __future__ import annotations

import contextlib
from typing import Any

from flywheel.loop.dispatch import WorkItem
from flywheel.loop.host import TrainerHost
from flywheel.loop.pool import START_WAIT_S, Pool, PoolSpec

Event = tuple[str, str, Any]


class PoolActor:
    """A `Pool` behind a Ray actor: `ready()` after loading the weights, `run(items)` per batch."""

    def __init__(self, spec: PoolSpec) -> None:
        import os

        self.pool = Pool(spec)
        self.pid = os.getpid()

    def ready(self) -> dict[str, Any]:
        self.pool.catch_up(0, min(self.pool.spec.catch_up_wait_s, START_WAIT_S))
        if self.pool.version is None:
            raise RuntimeError(f"no weights in the store ({self.pool.sub.last_error})")
        return {"pid": self.pid, **self.pool.stats(int(self.pool.version), 0.0)}

    def run(self, items: list[WorkItem]) -> list[Event]:
        events: list[Event] = []
        stats = self.pool.run(
            items, lambda kind, payload: events.append((kind, self.pool.spec.pool_id, payload))
        )
        events.append(("batch", self.pool.spec.pool_id, stats))
        return events


class RayBackend:
    """Pools and trainer as Ray actors."""

    def __init__(self, host_args: dict[str, Any], trainer: Any, cfg: Any) -> None:
        import ray

        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=cfg.ray_address, include_dashboard=False)
        trainer_cls = ray.remote(TrainerHost).options(max_concurrency=1, **cfg.ray_trainer_options)
        self.host = trainer_cls.remote(trainer, **host_args)
        self.pool_cls = ray.remote(PoolActor)
        self.pool_options = dict(cfg.ray_pool_options)
        self.actors: dict[str, Any] = {}
        self.calls: dict[Any, tuple[str, str]] = {}  # ref -> (pool id, "ready" | "run")
        self.pids: dict[str, int] = {}

    # -- trainer

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.host, method).remote(*args)

    def done(self, handle: Any) -> bool:
        ready, _ = self.ray.wait([handle], timeout=0)
        return bool(ready)

    def result(self, handle: Any) -> Any:
        return self.ray.get(handle)

    # -- pools

    def start_pool(self, spec: PoolSpec) -> None:
        opts = dict(self.pool_options)
        actor = self.pool_cls.options(num_cpus=opts.pop("num_cpus", 0), **opts).remote(spec)
        self.actors[spec.pool_id] = actor
        self.calls[actor.ready.remote()] = (spec.pool_id, "ready")

    def pid(self, pool_id: str) -> int | None:
        return self.pids.get(pool_id)

    def submit(self, pool_id: str, items: list[WorkItem]) -> None:
        self.calls[self.actors[pool_id].run.remote(items)] = (pool_id, "run")

    def poll(self, timeout: float) -> list[Event]:
        if not self.calls:
            return []
        ready, _ = self.ray.wait(list(self.calls), num_returns=1, timeout=timeout)
        events: list[Event] = []
        for ref in ready:
            pool_id, kind = self.calls.pop(ref)
            try:
                value = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                events.append(("lost", pool_id, f"actor died: {type(exc).__name__}"))
                self.drop(pool_id)
                continue
            except self.ray.exceptions.RayTaskError as exc:
                events.append(("error", pool_id, str(exc)))
                continue
            if kind == "ready":
                self.pids[pool_id] = value["pid"]
                events.append(("ready", pool_id, value))
            else:
                events += value
        return events

    def drop(self, pool_id: str) -> None:
        actor = self.actors.pop(pool_id, None)
        for ref, (pid, _) in list(self.calls.items()):
            if pid == pool_id:
                del self.calls[ref]
        if actor is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)

    def close(self) -> None:
        for pool_id in list(self.actors):
            self.drop(pool_id)
        self.ray.kill(self.host, no_restart=True)
