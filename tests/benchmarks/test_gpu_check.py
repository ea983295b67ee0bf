"""`benchmarks/gpu/check.sh --smoke`: the GPU check's three parts at tiny sizes on the CPU, end to end."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # SmolLM2 SFT, evaluations and an RL step on the CPU: one to three minutes
def test_smoke_check_records_every_part(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(
        ["bash", "benchmarks/gpu/check.sh", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["mode"] == "smoke"
    assert set(result["parts"]) == {"engine", "rl_step", "smollm2_rl"}
    for name, part in result["parts"].items():
        reason = part.get("error") or part.get("skipped")
        assert reason or "goal_met" in part, (name, part)
        assert "seconds" in part
    engine = result["parts"]["engine"]
    assert "error" not in engine, engine
    assert [r["batch"] for r in engine["rows"]] == [1, 2]
    assert all(r["engine_tok_s"] > 0 and r["generate_tok_s"] > 0 for r in engine["rows"])
    assert "part" in done.stdout and "smollm2_rl" in done.stdout  # the table
