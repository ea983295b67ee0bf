"""The driver: releases rounds of work, hands them to pools, collects records, feeds the trainer.

Schedule. Rounds are consumed in order, one trainer step each (a round whose records are all stale is
skipped and counted). Asynchronous (default): the round the trainer waits for and up to k - 1 after it are
released, each item asking for at least the newest published version (`min_version`), so pools generate
the next batches while the trainer steps and publishes. Synchronous (`sync`, k = 0): round r is released
only once version r is published, and every item waits for exactly that version; with `deterministic`
(one item per pool batch, seeded sampling) a rerun, or a resumed run, gives equal trainer metrics.

Per step, in order: the trainer steps on the round's fresh records; the driver appends the step's metrics
line and the records it used (`metrics.jsonl`, `trajectories.jsonl`, each line naming the version the
step produced); the host checkpoints, replicates to the peer and publishes. On start the host restores
the newest complete checkpoint; lines of versions after it are dropped from the files and rewritten by the
resumed run.

Faults. A lost pool (process or actor gone) has its leased items reissued to the other pools and is
restarted; it loads the latest anchor plus the deltas after it before taking work again. Records are
accepted once per trajectory id (`Dispatcher`); answers to reissued work that arrive twice are dropped
and counted. A store that is down delays publishing (retried with backoff inside the host) while pools
keep serving the weights they hold.

Files under OUT_DIR: `metrics.jsonl` (one line per step: the trainer's metrics plus `loop_*` counters),
`trajectories.jsonl` (records used, with `pool` and `loop_version`), `dropped.jsonl` (stale records: id,
policy version, trainer version), `sync.jsonl` (publishes and pool updates with their pause), `summary.json`,
`checkpoints/`, and by default the weight store `weights/` and the peer `peer/`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.loop.config import LoopConfig, check_config
from flywheel.loop.dispatch import Dispatcher, round_items, split_fresh
from flywheel.loop.pool import PoolSpec
from flywheel.tasks.format import Task

EventHook = Callable[[dict[str, Any]], None]
COUNTERS = ("stale_dropped", "duplicates_dropped", "reissued", "pool_restarts", "rounds_skipped")


class RunFiles:
    """The run's JSONL files; lines of versions after a restored checkpoint are dropped on resume."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.metrics, self.trajectories = out / "metrics.jsonl", out / "trajectories.jsonl"
        self.dropped, self.sync = out / "dropped.jsonl", out / "sync.jsonl"

    def truncate(self, version: int) -> None:
        for path, key in (
            (self.metrics, "version"),
            (self.trajectories, "loop_version"),
            (self.dropped, "version"),
        ):
            if path.exists():
                keep = [
                    ln
                    for ln in path.read_text().splitlines()
                    if ln.strip() and line_version(ln, key) <= version
                ]
                path.write_text("".join(ln + "\n" for ln in keep))

    def append(self, path: Path, rows: Sequence[dict[str, Any]]) -> None:
        with open(path, "a") as f:
            f.write("".join(json.dumps(r, default=str) + "\n" for r in rows))
            f.flush()


def line_version(line: str, key: str) -> int:
    try:
        return int(json.loads(line).get(key, 0))
    except (ValueError, TypeError):
        return 1 << 62  # a torn last line: dropped


def pool_spec(cfg: LoopConfig, i: int, store: str) -> PoolSpec:
    return PoolSpec(
        pool_id=f"pool-{i}", model=cfg.model, store=store, store_options=dict(cfg.store_options),
        temperature=cfg.temperature, top_p=cfg.top_p, effort_overrides=dict(cfg.effort_overrides),
        budgets={k: dict(v) for k, v in cfg.budgets.items()}, observation_chars=cfg.observation_chars,
        action_format=cfg.action_format, cohorts=cfg.cohorts,
        max_context=cfg.max_context, torch_threads=cfg.torch_threads, grader=cfg.grader,
        catch_up_wait_s=cfg.catch_up_wait_s,
    )  # fmt: skip


class Driver:
    """The event loop of one run (backend-agnostic); see the module docstring."""

    def __init__(
        self,
        cfg: LoopConfig,
        backend: Any,
        tasks: Sequence[Task],
        out: Path,
        store: str,
        on_event: EventHook | None,
    ) -> None:
        self.cfg, self.backend, self.tasks, self.store = cfg, backend, list(tasks), store
        self.files = RunFiles(out)
        self.on_event = on_event or (lambda e: None)
        self.dispatcher = Dispatcher()
        self.counters: Counter[str] = Counter()
        self.restarts: Counter[str] = Counter()
        self.ready: set[str] = set()
        self.pauses: list[float] = []
        self.window: list[float] = []  # pauses since the last metrics line
        self.last_commit: dict[str, Any] = {}
        self.per_pool: Counter[str] = Counter()
        self.t0 = time.monotonic()

    def emit(self, event: str, **fields: Any) -> None:
        self.on_event({"event": event, **fields})

    # -- the loop

    def run(self) -> dict[str, Any]:
        started = self.backend.result(self.backend.call("start"))
        self.version = self.published = int(started["version"])
        state = started["state"] or {}
        self.next_round = self.released = int(state.get("round", 0))
        self.counters.update({k: int(v) for k, v in state.get("counters", {}).items()})
        self.files.truncate(self.version)
        self.emit("resumed", version=self.version, source=started["source"], skipped=started["skipped"])
        for i in range(self.cfg.pools):
            self.backend.start_pool(pool_spec(self.cfg, i, self.store))
        step_call = commit_call = None
        used: list[dict[str, Any]] = []
        while self.version < self.cfg.steps or step_call is not None or commit_call is not None:
            self.release(busy=step_call is not None or commit_call is not None)
            self.assign()
            for kind, pool, payload in self.backend.poll(0.05):
                self.handle(kind, pool, payload)
            self.counters["reissued"] += len(self.dispatcher.expire(self.cfg.lease_s))
            if commit_call is not None and self.backend.done(commit_call):
                self.committed(self.backend.result(commit_call))
                commit_call = None
            if step_call is not None and self.backend.done(step_call):
                result = self.backend.result(step_call)
                self.stepped(result, used)
                commit_call, step_call = self.backend.call("commit", self.state()), None
            if step_call is None and commit_call is None and self.version < self.cfg.steps:
                used = self.take_round()
                if used:
                    step_call = self.backend.call("step", used)
        return self.summary(started)

    def release(self, busy: bool) -> None:
        """Queue the rounds the schedule allows now."""
        remaining = self.cfg.steps - self.version
        if remaining <= 0:
            return
        if self.cfg.sync:
            allowed = self.next_round + 1 if not busy and self.published == self.version else self.next_round
        else:
            # round n + j is consumed at trainer version >= v + j and generated at >= the published v
            allowed = self.next_round + 1 + max(0, min(self.cfg.max_staleness - 1, remaining - 1))
        while self.released < allowed:
            c = self.cfg
            items = round_items(
                self.released, self.tasks, c.efforts, c.groups_per_step, c.samples, c.seed, self.published
            )
            self.dispatcher.release(items)
            self.released += 1

    def assign(self) -> None:
        for pool in sorted(self.ready):
            if self.dispatcher.held_by(pool) == 0:
                items = self.dispatcher.take(pool, self.cfg.pool_batch)
                if items:
                    self.backend.submit(pool, items)

    def take_round(self) -> list[dict[str, Any]]:
        """The next round's fresh records (empty: not complete yet, or all stale and skipped)."""
        if not self.dispatcher.complete_round(self.next_round):
            return []
        records = self.dispatcher.pop_round(self.next_round)
        fresh, stale = split_fresh(records, self.version, self.cfg.max_staleness)
        self.next_round += 1
        if stale:
            self.counters["stale_dropped"] += len(stale)
            rows = [{"id": r["id"], "policy_version": r["policy_version"], "trainer_version": self.version,
                     "version": self.version + 1, "pool": r.get("pool")} for r in stale]  # fmt: skip
            self.files.append(self.files.dropped, rows)
        if not fresh:
            self.counters["rounds_skipped"] += 1
        return fresh

    # -- trainer results

    def stepped(self, result: dict[str, Any], used: list[dict[str, Any]]) -> None:
        before, self.version = self.version, int(result["version"])
        lags = [before - int(r.get("policy_version") or 0) for r in used]
        line = {
            "step": self.version, "version": self.version, **result["metrics"],
            "loop_records": len(used), "loop_round": self.next_round - 1, "loop_staleness_max": max(lags, default=0),
            **{f"loop_{k}": self.counters[k] for k in COUNTERS},
            "loop_pause_s_max": max(self.window, default=0.0), "loop_step_s": result.get("step_s", 0.0),
            "loop_publish_s": self.last_commit.get("publish_s", 0.0),
            "loop_store_retries": self.last_commit.get("store_retries", 0),
            "loop_wall_s": time.monotonic() - self.t0,
        }  # fmt: skip
        self.window = []
        self.files.append(self.files.metrics, [line])
        self.files.append(self.files.trajectories, [{**r, "loop_version": self.version} for r in used])
        self.emit("step", version=self.version, metrics=line)

    def committed(self, result: dict[str, Any]) -> None:
        self.published, self.last_commit = int(result["version"]), result
        self.files.append(self.files.sync, [{"kind": "publish", **result}])
        self.emit("published", version=self.published, result=result)

    def state(self) -> dict[str, Any]:
        return {"round": self.next_round, "counters": {k: self.counters[k] for k in COUNTERS}}

    # -- pool events

    def handle(self, kind: str, pool: str, payload: Any) -> None:
        if kind == "record":
            if self.dispatcher.complete(payload):
                self.per_pool[pool] += 1
            else:
                self.counters["duplicates_dropped"] += 1
        elif kind == "started":
            self.emit("started", pool=pool, **payload)
        elif kind in ("ready", "batch"):
            self.pool_stats(kind, pool, payload)
        elif kind == "lost":
            self.lost(pool, str(payload))
        elif kind == "error":
            raise FlywheelError(f"{pool} failed: {str(payload).splitlines()[0]}")

    def pool_stats(self, kind: str, pool: str, stats: dict[str, Any]) -> None:
        if kind == "ready":
            self.ready.add(pool)
            self.emit("pool_ready", pool=pool, version=stats["version"], pid=stats.get("pid"))
        rows = [
            {"kind": "apply", "pool": pool, "version": v, "pause_s": s} for v, s in stats.get("pauses", [])
        ]
        if kind == "batch":
            self.pauses += [r["pause_s"] for r in rows]
            self.window += [r["pause_s"] for r in rows]
        else:
            rows = [{**r, "kind": "load"} for r in rows]
        if stats.get("store_errors"):
            rows.append({"kind": "store_errors", "pool": pool, "count": stats["store_errors"]})
        if rows:
            self.files.append(self.files.sync, rows)

    def lost(self, pool: str, why: str) -> None:
        self.ready.discard(pool)
        items = self.dispatcher.lost(pool)
        self.counters["reissued"] += len(items)
        self.emit("lost", pool=pool, why=why, reissued=[it.id for it in items])
        if self.restarts[pool] >= self.cfg.max_restarts:
            raise FlywheelError(f"{pool} was lost {self.restarts[pool] + 1} times ({why}); giving up")
        self.restarts[pool] += 1
        self.counters["pool_restarts"] += 1
        self.backend.start_pool(pool_spec(self.cfg, int(pool.rsplit("-", 1)[1]), self.store))

    def summary(self, started: dict[str, Any]) -> dict[str, Any]:
        pauses = sorted(self.pauses)
        out = {
            "version": self.version,
            "resumed_from": started["source"] or None,
            "start_version": int(started["version"]),
            **{k: self.counters[k] for k in COUNTERS},
            "records_per_pool": dict(self.per_pool),
            "pause_s": {
                "n": len(pauses),
                "max": pauses[-1] if pauses else 0.0,
                "median": pauses[len(pauses) // 2] if pauses else 0.0,
            },
            "wall_s": time.monotonic() - self.t0,
        }
        (self.files.out / "summary.json").write_text(json.dumps(out, indent=2))
        return out


def run(
    cfg: LoopConfig,
    trainer: Any,
    tasks: Sequence[Task],
    out_dir: str | Path,
    *,
    on_event: EventHook | None = None,
) -> dict[str, Any]:
    """Run the flywheel until the trainer reaches `cfg.steps`; returns the summary (also summary.json).

    `trainer` is a `LoopTrainer` or a zero-argument factory of one (the Ray backend builds it inside the
    trainer actor). A run directory that holds checkpoints resumes from the newest complete one.
    `on_event` sees the driver's events (`resumed`, `pool_ready`, `started`, `step`, `published`, `lost`).
    """
    check_config(cfg)
    tasks = list(tasks)
    if not tasks:
        raise FlywheelError("loop: no tasks to run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    store, peer = cfg.store or str(out / "weights"), cfg.peer or str(out / "peer")
    host_args = {
        "store": store, "peer": peer, "checkpoints": out / "checkpoints", "store_options": dict(cfg.store_options),
        "anchor_every": cfg.anchor_every, "keep": cfg.keep_checkpoints, "publish_attempts": cfg.publish_attempts,
    }  # fmt: skip
    if cfg.backend == "ray":
        from flywheel.loop.ray_backend import RayBackend

        backend: Any = RayBackend(host_args, trainer, cfg)
    else:
        from flywheel.loop.local import LocalBackend

        backend = LocalBackend(host_args, trainer)
    try:
        return Driver(cfg, backend, tasks, out, store, on_event).run()
    finally:
        backend.close()
