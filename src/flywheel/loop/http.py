"""The `http` backend: the inference pools are HTTP servers that follow the trainer's weight store.

The production shape of the loop: only the trainer needs a tight machine; each pool is an
OpenAI-compatible server anywhere the store reaches, started by the operator as
`flywheel serve --model M --follow STORE` (`flywheel.sync.follow`), named in the run config by its base
URL (`[loop] pool_urls`). The trainer host runs in a worker thread of the driver (as in `local`) and
publishes each step's weights to `store` as a delta; the servers apply it between their generation
batches and report the version they serve (`GET /health`, and `policy_version` in every completion).

Per pool, a thread of the driver runs its batches: it waits until the server reports at least the
batch's `min_version` (at most `catch_up_wait_s`; with `sync`, until it does), then runs the episodes in
the driver's process (harness, sandbox and grader here; only generation is remote) with an `openai:`
model on the server's URL that asks for log-probs, so every turn carries the server's token ids,
log-probs, prompt ids and version. The driver assigns work as for every backend (`pool_batch` items to
each idle pool, the one idle longest first), so a pool that answers faster gets more batches.

Versions. A server applies new weights between its batches, so the turns of one episode can come from
different versions: each turn records its own, and the record's `policy_version` is the oldest of them,
the one the staleness bound (`max_staleness`) is checked against. The trainer's truncated importance
weight uses the log-probs each turn was sampled with; the top-p kept sets, which servers do not return,
are rebuilt by the trainer from its own distribution (`flywheel.rl.objective.rebuild_kept_mask`).

Faults. A URL that does not answer when the backend starts, or that serves fixed weights (no
`policy_version` in its health answer), is refused with one line. A server that stops answering for
`DOWN_S` is reported lost at its next batch: its leased work is reissued to the other pools, the records
it finished are kept (a turn it failed is an infrastructure failure, masked in training), and the driver's
restart waits up to `START_WAIT_S` for it to answer again (restarting the server is the operator's, or a
supervisor's, job).

Keys. Servers started with a key (`flywheel serve --api-key KEY`, or `FLYWHEEL_API_KEY`) answer only
requests that carry it: the backend sends `[loop] pool_api_key` (or, when that is empty, the driver's
`FLYWHEEL_API_KEY`) as the bearer key on every completion and health poll, and refuses at start, in one
line, a server that turns the key away (401) rather than let every turn fail. One key serves all pools.

What is not covered: servers that report no version (vLLM and SGLang as they ship: see the README), and
more than one store (every pool must follow `store`; the backend cannot check which store a server reads).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.loop.dispatch import WorkItem
from flywheel.loop.host import ThreadedHost, TrainerHost
from flywheel.loop.pool import START_WAIT_S, PoolSpec, grader_for, run_items
from flywheel.models.openai_backend import OpenAIConfig, OpenAIModel
from flywheel.record import Trajectory
from flywheel.settings import API_KEY_ENV

Event = tuple[str, str, Any]
HEALTH_TIMEOUT_S = 5.0  # one health request
POLL_S = 0.2  # how often a pool waiting for a version asks its server
DOWN_S = 10.0  # a server that does not answer for this long is lost


def pool_key(configured: str) -> str | None:
    """The key to send the servers: the run config's, else `FLYWHEEL_API_KEY`'s, else none."""
    return configured or os.environ.get(API_KEY_ENV) or None


def health_url(url: str) -> str:
    """`GET /health` of the server whose base URL is `url` (with or without the `/v1`)."""
    return url.rstrip("/").removesuffix("/v1") + "/health"


def get_json(url: str, key: str | None = None, timeout_s: float = HEALTH_TIMEOUT_S) -> Any:
    """`GET url`'s JSON answer, sending `key` as the bearer key; raises OSError (an HTTPError for a status
    that is not 2xx) or ValueError."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as r:
        return json.loads(r.read())


def health(url: str, timeout_s: float = HEALTH_TIMEOUT_S, key: str | None = None) -> dict[str, Any] | None:
    """The server's health answer (all of it with the server's `key`), or None when it does not answer."""
    try:
        body = get_json(health_url(url), key, timeout_s)
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else {}


def version_of(answer: dict[str, Any] | None) -> int | None:
    v = (answer or {}).get("policy_version")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def served_name(url: str, key: str | None = None) -> str:
    """The model name the server reports (`GET /v1/models`), or "policy"."""
    try:
        return str(get_json(url.rstrip("/") + "/models", key)["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "policy"


def check_servers(urls: list[str], key: str | None = None) -> None:
    """Refuse a URL that does not answer, whose server does not follow a store, or that refuses `key`
    (none sent when None), in one line."""
    for url in urls:
        answer = health(url, key=key)
        if answer is None:
            raise FlywheelError(f"loop: pool {url} does not answer (GET {health_url(url)})")
        if "policy_version" not in answer:
            raise FlywheelError(
                f"loop: pool {url} serves fixed weights (start it with flywheel serve --follow STORE)"
            )
        check_key_accepted(url, key)


def check_key_accepted(url: str, key: str | None) -> None:
    """Refuse a server that turns `key` away (`GET /v1/models` answers 401), in one line."""
    try:
        get_json(url.rstrip("/") + "/models", key)
    except urllib.error.HTTPError as e:
        if e.code == 401:
            what = "refuses the key sent" if key else "needs a key"
            raise FlywheelError(
                f"loop: pool {url} {what} (401 Unauthorized): set [loop] pool_api_key or {API_KEY_ENV} "
                "to the key it was started with (flywheel serve --api-key)"
            ) from None
    except (OSError, ValueError):
        pass  # answered health a moment ago: a later batch finds out if it is gone


def oldest_version(record: Trajectory, default: int) -> int:
    """The oldest weights' version among the record's turns (each turn records the version that generated
    it), or `default` when no turn says."""
    versions = [t["policy_version"] for t in record.turns if isinstance(t.get("policy_version"), int)]
    return min(versions, default=default)


class Lost(Exception):
    """The pool's server stopped answering."""


class HttpPool:
    """One server, seen from the driver: waits for versions, runs batches of episodes against it."""

    def __init__(self, spec: PoolSpec, url: str, concurrency: int, key: str | None = None) -> None:
        self.spec, self.url, self.key = spec, url, key
        config = OpenAIConfig(base_url=url, api_key=key, logprobs=True, concurrency=max(1, concurrency))
        self.engine = OpenAIModel(served_name(url, key), config)
        self.grader = grader_for(spec)
        self.version: int | None = None

    def wait_for(self, min_version: int, wait_s: float) -> tuple[int, dict[str, Any]]:
        """(version, health answer) once the server serves `min_version` or later, or once `wait_s` has
        passed and it serves some version; raises Lost when it stops answering for `DOWN_S`."""
        now = time.monotonic()
        deadline, answered = now + wait_s, now
        while True:
            answer = health(self.url, key=self.key)
            now = time.monotonic()
            if answer is not None:
                answered = now
            elif now - answered >= DOWN_S:
                raise Lost(f"{self.url} does not answer")
            version = version_of(answer)
            if version is not None and (version >= min_version or now >= deadline):
                return version, answer or {}
            if version is None and now >= deadline:
                raise Lost(f"{self.url} serves no weights version after {wait_s:g} s")
            time.sleep(POLL_S)

    def run(self, items: list[WorkItem], emit: Any) -> dict[str, Any]:
        """Generate `items` as one batch; `emit("started", ...)`, then `emit("record", r)` per episode."""
        version, answer = self.wait_for(min(it.min_version for it in items), self.spec.catch_up_wait_s)
        pauses = self.pauses(version, answer)

        def on_event(kind: str, payload: Any) -> None:
            if kind == "record":
                payload.policy_version = oldest_version(payload, version)
            emit(kind, payload)

        t0 = time.perf_counter()
        run_items(self.engine, self.spec, items, version, self.grader, on_event, concurrency=len(items))
        gen_s = time.perf_counter() - t0
        return {"version": version, "gen_s": gen_s, "pauses": pauses, "store_errors": 0, "digest": None}

    def pauses(self, version: int, answer: dict[str, Any]) -> list[tuple[int, float]]:
        """The server's last update pause, once per new version seen."""
        before, self.version = self.version, version
        pause = answer.get("last_pause_s")
        if before is None or version == before or not isinstance(pause, (int, float)):
            return []
        return [(version, float(pause))]

    def close(self) -> None:
        self.engine.close()


class HttpBackend(ThreadedHost):
    """Pools as `flywheel serve --follow` servers; the trainer host in a worker thread of the driver."""

    def __init__(self, host_args: dict[str, Any], trainer: Any, cfg: Any) -> None:
        self.key = pool_key(cfg.pool_api_key)
        check_servers(list(cfg.pool_urls), self.key)
        self.urls = {f"pool-{i}": url for i, url in enumerate(cfg.pool_urls)}
        self.concurrency = int(cfg.pool_batch)
        self.host = TrainerHost(trainer, **host_args)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")
        self.events: queue.Queue[Event] = queue.Queue()
        self.work: dict[str, queue.Queue[list[WorkItem] | None]] = {}
        self.threads: dict[str, threading.Thread] = {}

    # -- pools

    def start_pool(self, spec: PoolSpec) -> None:
        work: queue.Queue[list[WorkItem] | None] = queue.Queue()
        self.work[spec.pool_id] = work
        thread = threading.Thread(
            target=self._pool, args=(spec, self.urls[spec.pool_id], work), name=spec.pool_id, daemon=True
        )
        self.threads[spec.pool_id] = thread
        thread.start()

    def _pool(self, spec: PoolSpec, url: str, work: queue.Queue[list[WorkItem] | None]) -> None:
        pool = None
        try:
            pool = HttpPool(spec, url, self.concurrency, self.key)
            version, _ = pool.wait_for(0, START_WAIT_S)
            pool.version = version
            self.events.put(("ready", spec.pool_id, {"version": version, "pauses": [], "url": url}))
            while (items := work.get()) is not None:
                stats = pool.run(items, lambda kind, payload: self.events.put((kind, spec.pool_id, payload)))
                self.events.put(("batch", spec.pool_id, stats))
        except Lost as exc:
            self.events.put(("lost", spec.pool_id, str(exc)))
        except Exception as exc:
            self.events.put(("error", spec.pool_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        finally:
            if pool is not None:
                pool.close()

    def pid(self, pool_id: str) -> int | None:
        return None  # a server elsewhere

    def submit(self, pool_id: str, items: list[WorkItem]) -> None:
        self.work[pool_id].put(items)

    def poll(self, timeout: float) -> list[Event]:
        try:
            events = [self.events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                events.append(self.events.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        for work in self.work.values():
            work.put(None)
        for thread in self.threads.values():
            thread.join(timeout=30)
        self.worker.shutdown(wait=True)
