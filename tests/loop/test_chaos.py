"""Chaos: one deterministic `flywheel train` run on the local backend survives a pool killed -9, a store
outage with the trainer killed -9 in the middle of it and restarted, and ends exactly where an
uninterrupted run ends.

The run is the real command (`python -m flywheel train CONFIG --out DIR`) on the tiny SFT base, with its
weights and checkpoint replica on a real S3 server (SeaweedFS). Faults are injected from outside, driven
by the run's own `events.jsonl`: a pool is killed as it starts a batch after the first update, the store
stops for a few seconds after the second publish, and the whole process (driver and trainer: one failure
domain in the local backend) is killed during the outage; the same command then resumes the run, waiting
for the store to come back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

STEPS = 6


def config(base: Path, loop: str) -> str:
    return f"""
seed = 0
deterministic = true
[model]
path = "{base}"
[tasks]
suite = "toybugs"
limit = 4
[rollout]
efforts = ["medium"]
tasks_per_step = 1
group_size = 2
concurrency = 2
max_turns = {{ medium = 2 }}
max_tokens = {{ medium = 150 }}
[reward]
lambdas = {{ medium = 10.0 }}
[optim]
lr = 1e-3
[train]
steps = {STEPS}
threads = 1
trajectories = "full"
[loop]
backend = "local"
pools = 2
{loop}
"""


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return out


def train(cfg: Path, out: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "flywheel", "train", str(cfg), "--out", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def inject_faults(proc: subprocess.Popen, out: Path, weed) -> dict:
    """Kill a pool as it starts a batch after the first update; stop the store after the second publish
    (the run held with SIGSTOP meanwhile; the store comes back 3 s later); kill the whole run a second
    into the outage, while it cannot publish (so it cannot have finished first). Returns when it is dead."""
    done: dict = {}
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        events = lines(out / "events.jsonl")
        published = max((e["version"] for e in events if e["event"] == "published"), default=0)
        started = [
            e for e in events if e["event"] == "started" and e["pool"] == "pool-1" and e["version"] >= 1
        ]
        if "pool" not in done and started:
            os.kill(started[0]["pid"], signal.SIGKILL)
            done["pool"] = started[0]
        if "store" not in done and "pool" in done and published >= 2:
            proc.send_signal(
                signal.SIGSTOP
            )  # held still while the store goes down, so it cannot finish first
            weed.stop()
            proc.send_signal(signal.SIGCONT)
            done["store"] = time.monotonic()
            threading.Timer(3.0, weed.start).start()
        if "trainer" not in done and "store" in done and time.monotonic() > done["store"] + 1:
            proc.send_signal(signal.SIGKILL)
            done["trainer"] = published
        time.sleep(0.05)
    proc.wait(timeout=60)
    return done


@pytest.mark.slow
@pytest.mark.fault
def test_a_run_survives_a_killed_pool_a_store_outage_and_a_killed_trainer(base, weed, tmp_path):
    from sync_helpers import ACCESS_KEY, SECRET_KEY  # on the path through the weed fixture

    reference = tmp_path / "reference"
    (tmp_path / "ref.toml").write_text(config(base, ""))
    ref = train(tmp_path / "ref.toml", reference)
    assert ref.wait(timeout=600) == 0, ref.stderr.read()

    s3 = (
        f'store = "s3://weights/chaos"\npeer = "s3://weights/chaos-peer"\n'
        f'store_options = {{ endpoint_url = "{weed.endpoint}", key = "{ACCESS_KEY}", secret = "{SECRET_KEY}" }}'
    )
    (tmp_path / "chaos.toml").write_text(config(base, s3))
    out = tmp_path / "chaos"
    faults = inject_faults(train(tmp_path / "chaos.toml", out), out, weed)
    assert set(faults) == {"pool", "store", "trainer"}, faults
    again = train(tmp_path / "chaos.toml", out)  # the same command resumes the run
    assert again.wait(timeout=600) == 0, again.stderr.read()

    events = lines(out / "events.jsonl")
    assert any(e["event"] == "lost" and e["pool"] == "pool-1" for e in events)
    resumed = [e for e in events if e["event"] == "resumed"]
    assert len(resumed) == 2 and resumed[1]["version"] >= 1
    used = [r["id"] for r in lines(out / "trajectories.jsonl")]
    assert len(used) == len(set(used)) == STEPS * 2  # every id used once, none lost
    trainer_only = [
        {k: v for k, v in m.items() if not k.startswith("loop_")} for m in lines(out / "metrics.jsonl")
    ]
    want = [
        {k: v for k, v in m.items() if not k.startswith("loop_")} for m in lines(reference / "metrics.jsonl")
    ]
    assert trainer_only == want
    final = f"checkpoints/v{STEPS:08d}/trainer/model.safetensors"
    assert (out / final).read_bytes() == (reference / final).read_bytes()
