"""The driver: releases rounds of work, hands them to pools, collects records, feeds the trainer.

One driver runs every backend (`inline`, `local`, `ray`; see `flywheel.loop.config`), so every run-level
feature behaves the same under each: the run directory, resume, the time budget, checkpoints, the rounds'
task choice (`Rounds`: re-curation and renaming live in the caller's rounds), exactly-once records.

Schedule. Rounds are consumed in order, one trainer step each (a round whose records are all stale is
skipped and counted). Asynchronous (default for pool backends): the round the trainer waits for and up to
k - 1 after it are released, each item asking for at least the newest published version (`min_version`),
so pools generate the next batches while the trainer steps and publishes. Synchronous (`sync`, k = 0, and
always inline): round r is released only once version r is published, and every item waits for exactly
that version; with `deterministic` (seeded sampling; pools take one item per batch) a rerun, or a resumed
run, gives equal trainer metrics.

Per step, in order: the trainer steps on the round's fresh records; the driver appends the step's metrics
line and the records it used with their scores (`metrics.jsonl`, `trajectories.jsonl`, each line naming
the step); the host checkpoints, replicates to the peer and publishes; the step's seconds go to
`timings.jsonl` (kept apart so that metrics can be byte-identical). On start the host restores the newest
complete checkpoint; lines of steps after it are dropped from the files and rewritten by the resumed run.

Time budget (`max_minutes`): a step starts only if one as long as the longest so far would end within the
budget, counting the steps before a resume; the last step run is checkpointed.

Faults. A lost pool (process or actor gone) has its leased items reissued to the other pools and is
restarted; it loads the latest anchor plus the deltas after it before taking work again. Records are
accepted once per trajectory id (`Dispatcher`); answers to reissued work that arrive twice are dropped
and counted. An attempt the model server, the sandbox or the grader ended is kept (the trainer masks it)
and retried up to `infra_retries` times, each retry with its own id and seed, in the same round and group
(`flywheel.loop.dispatch`; counted, and a `retry` event). A store that is down delays publishing
(retried with backoff inside the host) while pools keep serving the weights they hold.

Files under OUT_DIR (`RunDir`): `metrics.jsonl`, `trajectories.jsonl` (records used, with `step`, `pool`
and the trainer's score `rl`; a retry with `retry_of` and `retry`), `timings.jsonl`, `dropped.jsonl`
(stale records), `sync.jsonl` (publishes and pool updates with their pause), `events.jsonl` (the driver's
events with their time: pools ready with their pid, batches started, losses, retries, publishes; an
append-only log), `summary.json`, `checkpoints/`, and for pool backends by default the weight store
`weights/` and the peer `peer/`.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from flywheel.errors import FlywheelError
from flywheel.loop.checkpoint import Checkpointer
from flywheel.loop.config import LoopConfig, backend_class
from flywheel.loop.dispatch import Dispatcher, WorkItem, round_items, split_fresh
from flywheel.loop.pool import START_WAIT_S, PoolSpec
from flywheel.protocols import LoopBackend
from flywheel.record import Trajectory, append_trajectories, read_jsonl, read_trajectories
from flywheel.sandbox.envs import ensure_all
from flywheel.tasks.format import Task

EventHook = Callable[[dict[str, Any]], None]
COUNTERS = (
    "stale_dropped", "duplicates_dropped", "reissued", "pool_restarts", "rounds_skipped", "infra_retried",
)  # fmt: skip


class Rounds(Protocol):
    """What each round (one trainer step) generates."""

    def items(self, round_no: int, min_version: int) -> list[WorkItem]:
        """The work items of round `round_no` (0-based; it feeds step `round_no + 1`)."""
        ...

    def used(self, round_no: int, records: list[Trajectory]) -> dict[str, float]:
        """Called with the round's fresh records before the trainer sees them; returns extra metrics."""
        ...


class CycleRounds:
    """Groups cycle through the tasks, efforts cycle per group (`dispatch.round_items`)."""

    def __init__(self, cfg: LoopConfig, tasks: Sequence[Task]) -> None:
        self.cfg, self.tasks = cfg, list(tasks)

    def items(self, round_no: int, min_version: int) -> list[WorkItem]:
        c = self.cfg
        return round_items(
            round_no, self.tasks, list(c.efforts), c.groups_per_step, c.samples, c.seed, min_version
        )

    def used(self, round_no: int, records: list[Trajectory]) -> dict[str, float]:
        return {}


class RunDir:
    """A run directory's JSONL files; lines of steps after a restored checkpoint are dropped on resume.

    `trajectories.jsonl` holds `flywheel.record.Trajectory` lines, read and written through
    `flywheel.record` (`records`, `append_records`); the other files are plain rows (`read`, `append`).
    """

    FILES = ("metrics", "trajectories", "timings", "dropped", "sync", "events")

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.metrics, self.trajectories, self.timings, self.dropped, self.sync, self.events = (
            self.out / f"{name}.jsonl" for name in self.FILES
        )

    def truncate(self, step: int) -> None:
        for path in (self.metrics, self.trajectories, self.timings, self.dropped):
            if path.exists():
                keep = [ln for ln in path.read_text().splitlines() if ln.strip() and line_step(ln) <= step]
                path.write_text("".join(ln + "\n" for ln in keep))

    def append(self, path: Path, rows: Sequence[dict[str, Any]]) -> None:
        with open(path, "a") as f:
            f.write("".join(json.dumps(r, default=str) + "\n" for r in rows))
            f.flush()

    def read(self, path: Path) -> list[dict[str, Any]]:
        """The rows of one file; a torn last line (an interrupted write) is skipped."""
        return read_jsonl(path)

    def records(self) -> list[Trajectory]:
        """The trajectory records written so far; a torn last line is skipped."""
        return read_trajectories(self.trajectories) if self.trajectories.exists() else []

    def append_records(self, records: Sequence[Trajectory]) -> None:
        append_trajectories(self.trajectories, records)

    def latest_weights(self) -> Path | None:
        """The trainer's files in the newest complete checkpoint (an HF model directory for the RL
        trainer), or None before the first."""
        newest = Checkpointer(self.out / "checkpoints").newest_local()
        return newest[1] / "trainer" if newest else None

    def step_seconds(self) -> list[float]:
        """The wall seconds of each step so far, for a time budget kept across resumes."""
        return [float(t["wall_s"]) for t in self.read(self.timings)]


def line_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, TypeError):
        return 1 << 62  # a torn last line: dropped


def rounded(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: round(float(v), 6) if isinstance(v, float) else v for k, v in sorted(metrics.items())}


class Driver:
    """The event loop of one run (backend-agnostic); see the module docstring."""

    def __init__(
        self,
        cfg: LoopConfig,
        backend: LoopBackend,
        rounds: Rounds,
        out: Path,
        store: str,
        on_event: EventHook | None,
    ) -> None:
        self.cfg, self.backend, self.rounds, self.store = cfg, backend, rounds, store
        self.files = RunDir(out)
        self.on_event = on_event or (lambda e: None)
        self.dispatcher = Dispatcher(infra_retries=cfg.infra_retries)
        self.counters: Counter[str] = Counter()
        self.restarts: Counter[str] = Counter()
        self.ready: set[str] = set()
        self.pauses: list[float] = []
        self.window: list[float] = []  # pauses since the last metrics line
        self.last_commit: dict[str, Any] = {}
        self.per_pool: Counter[str] = Counter()
        self.assigned: dict[str, int] = {}  # pool -> when it last got work (a running count)
        self.assignments = itertools.count()
        self.durations: list[float] = []  # wall seconds of every step, those before a resume included
        self.out_of_time = False
        self.extra: dict[str, float] = {}  # the rounds' metrics for the step in flight
        self.step_s = 0.0
        self.t0 = self.step_start = time.monotonic()

    def emit(self, event: str, **fields: Any) -> None:
        """Tell the caller; every event but a record's also goes to `events.jsonl` (pids, losses, publishes)."""
        if event != "record":
            brief = {k: v for k, v in fields.items() if k not in ("result", "metrics")}
            self.files.append(
                self.files.events, [{"event": event, "t": round(time.monotonic() - self.t0, 3), **brief}]
            )
        self.on_event({"event": event, **fields})

    # -- the loop

    def run(self) -> dict[str, Any]:
        started = self.backend.result(self.backend.call("start"))
        self.version = self.published = self.start_version = int(started["version"])
        state = started["state"] or {}
        self.next_round = self.released = int(state.get("round", 0))
        self.counters.update({k: int(v) for k, v in state.get("counters", {}).items()})
        self.files.truncate(self.version)
        self.durations = self.files.step_seconds()
        self.out_of_time = not self.fits(self.durations)
        self.emit("resumed", version=self.version, source=started["source"], skipped=started["skipped"])
        for i in range(self.cfg.pools):
            self.backend.start_pool(PoolSpec.of(self.cfg, f"pool-{i}", self.store))
        self.await_pools()
        step_call = commit_call = None
        used: list[Trajectory] = []
        while self.wants_steps() or step_call is not None or commit_call is not None:
            self.release(
                busy=step_call is not None or commit_call is not None, training=step_call is not None
            )
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
                commit_call, step_call = (
                    self.backend.call("commit", self.state(), self.checkpoint_now()),
                    None,
                )
            if step_call is None and commit_call is None and self.wants_steps():
                used = self.take_round()
                if used:
                    step_call = self.backend.call("step", used)
        return self.summary(started)

    def await_pools(self) -> None:
        """Wait (up to START_WAIT_S) until every pool serves weights, so the first rounds are spread over
        the whole fleet rather than run by whichever pool started first."""
        deadline = time.monotonic() + START_WAIT_S
        while len(self.ready) < self.cfg.pools and time.monotonic() < deadline:
            for kind, pool, payload in self.backend.poll(0.05):
                self.handle(kind, pool, payload)

    def wants_steps(self) -> bool:
        return self.version < self.cfg.steps and not self.out_of_time

    def fits(self, durations: list[float]) -> bool:
        """True when one more step as long as the longest so far ends within the time budget."""
        budget = 60 * self.cfg.max_minutes
        return budget <= 0 or sum(durations) + max(durations, default=0.0) <= budget

    def checkpoint_now(self) -> bool:
        """Checkpoint this version: every `checkpoint_every`, the last, and the last the budget allows."""
        so_far = [*self.durations, time.monotonic() - self.step_start]
        last = self.version >= self.cfg.steps or not self.fits(so_far)
        return last or self.version % self.cfg.checkpoint_every == 0

    def release(self, busy: bool, training: bool = False) -> None:
        """Queue the rounds the schedule allows now (`training`: a taken round is being trained on, so
        one step fewer is still owed rounds; without it the last step's training released a round no step
        would use)."""
        remaining = self.cfg.steps - self.version
        if remaining <= 0 or self.out_of_time:
            return
        if self.cfg.sync:
            allowed = self.next_round + 1 if not busy and self.published == self.version else self.next_round
        else:
            remaining -= training
            if remaining <= 0:
                return
            # round n + j is consumed at trainer version >= v + j and generated at >= the published v
            allowed = self.next_round + 1 + max(0, min(self.cfg.max_staleness - 1, remaining - 1))
        while self.released < allowed:
            self.dispatcher.release(self.rounds.items(self.released, self.published))
            self.released += 1

    def assign(self) -> None:
        """Hand queued work to idle pools, the one idle longest first (so every pool gets work, not
        just the first in name order whenever one batch is all there is)."""
        for pool in sorted(self.ready, key=lambda p: (self.assigned.get(p, -1), p)):
            if self.dispatcher.held_by(pool) == 0:
                items = self.dispatcher.take(pool, self.cfg.pool_batch)
                if items:
                    self.backend.submit(pool, items)
                    self.assigned[pool] = next(self.assignments)

    def take_round(self) -> list[Trajectory]:
        """The next round's fresh records (empty: not complete yet, or all stale and skipped)."""
        if not self.dispatcher.complete_round(self.next_round):
            return []
        records = self.dispatcher.pop_round(self.next_round)
        fresh, stale = split_fresh(records, self.version, self.cfg.max_staleness)
        self.extra = self.rounds.used(self.next_round, fresh) if fresh else {}
        self.next_round += 1
        if stale:
            self.counters["stale_dropped"] += len(stale)
            rows = [{"id": r.id, "policy_version": r.policy_version, "trainer_version": self.version,
                     "step": self.version + 1, "pool": r.pool} for r in stale]  # fmt: skip
            self.files.append(self.files.dropped, rows)
        if not fresh:
            self.counters["rounds_skipped"] += 1
        return fresh

    # -- trainer results

    def stepped(self, result: dict[str, Any], used: list[Trajectory]) -> None:
        before, self.version = self.version, int(result["version"])
        lags = [before - r.policy_version for r in used]
        line = {
            "step": self.version, "version": self.version, **rounded({**result["metrics"], **self.extra}),
            "loop_records": len(used), "loop_round": self.next_round - 1, "loop_staleness_max": max(lags, default=0),
            **{f"loop_{k}": self.counters[k] for k in COUNTERS},
            "loop_store_retries": self.last_commit.get("store_retries", 0),
        }  # fmt: skip
        self.files.append(self.files.metrics, [line])
        if self.cfg.trajectories != "none":
            lite = self.cfg.trajectories == "lite"
            rows = [
                replace(r.lite() if lite else r, step=self.version, rl=s)
                for r, s in zip(used, result["scores"], strict=True)
            ]
            self.files.append_records(rows)
        self.step_s = float(result.get("step_s", 0.0))
        self.emit("step", version=self.version, metrics=line)

    def committed(self, result: dict[str, Any]) -> None:
        self.published, self.last_commit = int(result["version"]), result
        if result.get("publish") is not None:
            self.files.append(self.files.sync, [{"kind": "publish", **result}])
        now = time.monotonic()
        self.durations.append(now - self.step_start)
        timing = {
            "step": self.version, "wall_s": round(now - self.step_start, 3), "update_s": round(self.step_s, 3),
            "checkpoint_s": round(result["checkpoint_s"], 3), "publish_s": round(result["publish_s"], 3),
            "pause_s_max": round(max(self.window, default=0.0), 4), "run_s": round(now - self.t0, 3),
        }  # fmt: skip
        self.files.append(self.files.timings, [timing])
        self.window, self.step_start = [], now
        self.out_of_time = not self.fits(self.durations)
        self.emit("published", version=self.published, result=result)

    def state(self) -> dict[str, Any]:
        return {"round": self.next_round, "counters": {k: self.counters[k] for k in COUNTERS}}

    # -- pool events

    def handle(self, kind: str, pool: str, payload: Any) -> None:
        if kind == "record":
            self.accept(pool, payload)
        elif kind == "started":
            self.emit("started", pool=pool, **payload)
        elif kind in ("ready", "batch"):
            self.pool_stats(kind, pool, payload)
        elif kind == "lost":
            self.lost(pool, str(payload))
        elif kind == "error":
            raise FlywheelError(f"{pool} failed: {str(payload).splitlines()[0]}")

    def accept(self, pool: str, record: Trajectory) -> None:
        if not self.dispatcher.complete(record):
            self.counters["duplicates_dropped"] += 1
            return
        self.per_pool[pool] += 1
        n = self.dispatcher.round_of[record.id]
        ids = self.dispatcher.rounds.get(n, [])
        done = sum(i in self.dispatcher.done for i in ids)
        self.emit("record", pool=pool, id=record.id, round=n, done=done, total=len(ids))
        again = self.dispatcher.retries.get(record.id)
        if again is not None:
            self.counters["infra_retried"] += 1
            self.emit("retry", id=again.id, retry=again.retry, retry_of=record.id, cause=record.infra_failure)

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
        self.backend.start_pool(PoolSpec.of(self.cfg, pool, self.store))

    def summary(self, started: dict[str, Any]) -> dict[str, Any]:
        pauses = sorted(self.pauses)
        out = {
            "version": self.version,
            "resumed_from": started["source"] or None,
            "start_version": int(started["version"]),
            "out_of_time": self.out_of_time and self.version < self.cfg.steps,
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
    rounds: Rounds | None = None,
    on_event: EventHook | None = None,
) -> dict[str, Any]:
    """Run the flywheel until the trainer reaches `cfg.steps` (or the time budget); returns the summary
    (also summary.json).

    `trainer` is a `LoopTrainer` or a zero-argument factory of one (the Ray backend builds it inside the
    trainer actor). `rounds` chooses each round's work (default: `CycleRounds` over `tasks`). A run
    directory that holds checkpoints resumes from the newest complete one. `on_event` sees the driver's
    events (`resumed`, `pool_ready`, `started`, `record`, `step`, `published`, `lost`, `retry`).
    """
    if not cfg.model:
        raise FlywheelError("loop: `model` is required (hf:PATH or smollm2-135m: the pools' engine)")
    tasks = list(tasks)
    if not tasks:
        raise FlywheelError("loop: no tasks to run")
    ensure_all((t.id, t.environment) for t in tasks)  # before any pool starts: a failure names its task
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inline = cfg.backend == "inline"
    store = "" if inline else cfg.store or str(out / "weights")
    peer = cfg.peer or ("" if inline else str(out / "peer"))
    host_args = {
        "store": store, "peer": "" if peer == "none" else peer, "checkpoints": out / "checkpoints",
        "store_options": dict(cfg.store_options), "anchor_every": cfg.anchor_every, "keep": cfg.keep_checkpoints,
        "publish_attempts": cfg.publish_attempts,
    }  # fmt: skip
    backend = backend_class(cfg.backend)(host_args, trainer, cfg)
    try:
        return Driver(cfg, backend, rounds or CycleRounds(cfg, tasks), out, store, on_event).run()
    finally:
        backend.close()
