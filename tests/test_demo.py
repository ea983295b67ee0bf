"""`make demo` end to end at a tiny size: every stage runs and the promised files and table appear."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_runs_every_stage_and_writes_its_results(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    env = {**os.environ, "FLYWHEEL_DEMO_TASKS": "2", "FLYWHEEL_DEMO_STEPS": "1", "FLYWHEEL_DEMO_MINUTES": "0"}
    run = subprocess.run(
        [sys.executable, "-m", "flywheel.demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for n in range(1, 8):
        assert f"[{n}/7" in run.stdout
    results = json.loads((tmp_path / "runs/demo/results.json").read_text())
    assert set(results) == {"base", "trained"}
    assert {e: s["n"] for e, s in results["trained"].items()} == {"medium": 2, "high": 2, "max": 2}
    assert "gain    max" in run.stdout and "λ = medium:" in run.stdout
    assert (tmp_path / "runs/demo/report.html").stat().st_size > 0


def test_the_demo_outside_the_repository_root_is_one_line_and_exit_2(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "flywheel.demo"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 2
    assert (
        run.stderr.strip()
        == "flywheel: error: run the demo from the repository root (configs/demo.toml not found)"
    )
