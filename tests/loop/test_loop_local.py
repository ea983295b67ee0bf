"""The loop on the local backend: pools as processes, faults injected with kill -9 and a stopped store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from loop_helpers import FakeTrainer, loop_config, trainer_keys

from flywheel.loop import run
from flywheel.sync import FsspecStore
from flywheel.sync.channel import marker_key, read_json


def lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def check_exactly_once(out: Path, rounds: int, samples: int) -> list[dict]:
    """Every issued id of the consumed rounds is used or dropped as stale, exactly once."""
    used, dropped = lines(out / "trajectories.jsonl"), lines(out / "dropped.jsonl")
    ids = [r["id"] for r in used] + [r["id"] for r in dropped]
    assert len(ids) == len(set(ids)) == rounds * samples
    return used


def test_pools_follow_deltas_with_bounded_staleness(tmp_path, tiny_model, clamp_task):
    out = tmp_path / "run"
    events: list[dict] = []
    trainer = FakeTrainer(tiny_model)
    summary = run(
        loop_config(tiny_model, steps=4, max_staleness=1), trainer, [clamp_task], out, on_event=events.append
    )
    assert summary["version"] == 4 == trainer.version
    metrics = lines(out / "metrics.jsonl")
    assert [m["version"] for m in metrics] == [1, 2, 3, 4]
    used = check_exactly_once(out, metrics[-1]["loop_round"] + 1, 2)
    for r in used:  # used at trainer version step - 1, generated at policy_version
        assert r["step"] - 1 - r["policy_version"] <= 1
    assert {m["loop_staleness_max"] for m in metrics} <= {0, 1}
    assert any(r["policy_version"] > 0 for r in used)  # pools moved on to published deltas
    store = FsspecStore(str(out / "weights"))
    publishes = [r for r in lines(out / "sync.jsonl") if r["kind"] == "publish"]
    assert [p["version"] for p in publishes] == [1, 2, 3, 4] and publishes[0]["publish"]["kind"] == "delta"
    assert publishes[2]["publish"]["kind"] == "delta+anchor"  # anchor_every=3
    applies = [r for r in lines(out / "sync.jsonl") if r["kind"] == "apply"]
    assert applies and all(a["pause_s"] >= 0 for a in applies)
    assert summary["pause_s"]["n"] == len(applies)
    assert read_json(store, marker_key(4))["weights_digest"]
    assert (out / "checkpoints" / "v00000004" / "MANIFEST.json").exists()


@pytest.mark.slow
@pytest.mark.fault
def test_pool_killed_mid_batch_work_reissued_and_pool_rejoins(tmp_path, tiny_model, clamp_task):
    out = tmp_path / "run"
    events: list[dict] = []
    killed: dict = {}

    def on_event(e: dict) -> None:
        events.append(e)
        if e["event"] == "started" and e["pool"] == "pool-1" and e["version"] >= 1 and not killed:
            os.kill(e["pid"], signal.SIGKILL)  # mid-batch: it has just started generating these
            killed.update(e)

    cfg = loop_config(tiny_model, steps=12, max_staleness=2, pool_batch=2, groups_per_step=1, samples=2)
    summary = run(cfg, FakeTrainer(tiny_model), [clamp_task], out, on_event=on_event)
    assert killed, "pool-1 never started a batch after version 1"
    lost = [e for e in events if e["event"] == "lost"]
    assert len(lost) == 1 and lost[0]["pool"] == "pool-1"
    assert set(lost[0]["reissued"]) <= set(killed["ids"]) and summary["reissued"] >= len(lost[0]["reissued"])
    assert summary["pool_restarts"] == 1 and summary["version"] == 12
    metrics = lines(out / "metrics.jsonl")
    used = check_exactly_once(out, metrics[-1]["loop_round"] + 1, 2)
    by_id = {r["id"]: r for r in used}
    for rid in lost[0]["reissued"]:
        assert rid not in by_id or by_id[rid]["pool"] == "pool-0"  # answered by the other pool
    ready = [e for e in events if e["event"] == "pool_ready" and e["pool"] == "pool-1"]
    assert len(ready) == 2 and ready[1]["version"] >= killed["version"]  # caught up: anchor + deltas
    store = FsspecStore(str(out / "weights"))
    assert read_json(store, marker_key(ready[1]["version"]))["anchor_version"] is not None


@pytest.mark.slow
@pytest.mark.fault
def test_store_outage_pools_keep_serving_and_publish_retries(tmp_path, tiny_model, clamp_task, weed):
    from sync_helpers import ACCESS_KEY, SECRET_KEY  # on the path through the weed fixture

    opts = {"endpoint_url": weed.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}
    out = tmp_path / "run"
    outage: dict = {}

    def on_event(e: dict) -> None:
        if e["event"] == "published" and e["version"] == 2 and not outage:
            weed.stop()  # down before version 3 is published
            outage["down"] = time.monotonic()
            threading.Timer(4.0, lambda: (weed.start(), outage.setdefault("up", time.monotonic()))).start()

    cfg = loop_config(
        tiny_model, steps=5, max_staleness=2, store="s3://weights/loop-outage", peer="s3://weights/loop-peer",
        store_options=opts, catch_up_wait_s=2.0,
    )  # fmt: skip
    summary = run(cfg, FakeTrainer(tiny_model), [clamp_task], out, on_event=on_event)
    assert outage.get("up") and summary["version"] == 5
    metrics = lines(out / "metrics.jsonl")
    assert max(m["loop_store_retries"] for m in metrics) > 0  # publishing retried while the store was down
    sync = lines(out / "sync.jsonl")
    assert any(r["kind"] == "store_errors" for r in sync)  # pools saw it down and kept their weights
    check_exactly_once(out, metrics[-1]["loop_round"] + 1, 2)
    # nothing corrupted: a fresh follower rebuilds the last version bit for bit from the store
    from flywheel.sync import Subscriber, open_store

    sub = Subscriber(open_store("s3://weights/loop-outage", **opts))
    assert sub.catch_up() == 5
    trainer_now = FakeTrainer(tiny_model)
    trainer_now.load(out / "checkpoints" / "v00000005" / "trainer")
    want = trainer_now.serving_weights()
    assert all(torch_equal(sub.weights[n], want[n]) for n in want)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.slow
@pytest.mark.fault
def test_trainer_killed_resumes_from_peer_with_equal_metrics(tmp_path, tiny_model, clamp_task):
    steps = 4
    reference = tmp_path / "reference"
    run(
        loop_config(tiny_model, steps=steps, deterministic=True),
        FakeTrainer(tiny_model),
        [clamp_task],
        reference,
    )
    out = tmp_path / "killed"
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    argv = [
        sys.executable,
        str(here / "loop_helpers.py"),
        str(tiny_model),
        str(clamp_task.root),
        str(out),
        str(steps),
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if any(r.get("kind") == "publish" and r["version"] >= 2 for r in lines(out / "sync.jsonl")):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(r["version"] for r in lines(out / "sync.jsonl") if r["kind"] == "publish")
    assert 2 <= killed_at < steps
    shutil.rmtree(out / "checkpoints")  # the local copy is gone: resume from the peer
    events: list[dict] = []
    run(
        loop_config(tiny_model, steps=steps, deterministic=True),
        FakeTrainer(tiny_model),
        [clamp_task],
        out,
        on_event=events.append,
    )
    resumed = next(e for e in events if e["event"] == "resumed")
    assert resumed["source"] == "peer" and resumed["version"] >= killed_at
    assert trainer_keys(out / "metrics.jsonl") == trainer_keys(reference / "metrics.jsonl")
    ids = [r["id"] for r in lines(out / "trajectories.jsonl")]
    assert len(ids) == len(set(ids)) == steps * 2
