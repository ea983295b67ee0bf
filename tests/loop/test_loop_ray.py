"""The same loop with pools and trainer as Ray actors, on a local two-CPU Ray cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from loop_helpers import FakeTrainer, loop_config

ray = pytest.importorskip("ray")


@pytest.mark.slow
@pytest.mark.fault
def test_ray_backend_runs_the_loop(tmp_path, tiny_model, clamp_task):
    here = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH", "")] if p)
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        from flywheel.loop import run

        out = tmp_path / "run"
        events: list[dict] = []
        cfg = loop_config(tiny_model, backend="ray", steps=3, max_staleness=1)
        summary = run(cfg, lambda: FakeTrainer(tiny_model), [clamp_task], out, on_event=events.append)
    finally:
        ray.shutdown()
    assert summary["version"] == 3
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [1, 2, 3]
    ids = [json.loads(ln)["id"] for ln in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) >= 2
    assert {e["pool"] for e in events if e["event"] == "pool_ready"} == {"pool-0", "pool-1"}
