"""The base that ships in the package: its digest, its provenance, loading it by name, and (slow) that the
project's own `flywheel sft` rebuilds a base that scores as the shipped one does."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.models import get_model, shipped
from flywheel.protocols import Request
from flywheel.rl.train import model_spec
from flywheel.sft import DATA_FORMAT

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_base_is_what_its_config_builds_and_matches_its_digest():
    meta = shipped.describe("toybugs-sweep")
    config = ROOT / meta["config"]
    assert hashlib.sha256(config.read_bytes()).hexdigest() == meta["config_sha256"], (
        f"{meta['config']} changed since the base was built: rebuild it with `{meta['command']}`"
    )
    assert meta["data_format"] == DATA_FORMAT, f"the teacher's data changed: rebuild with `{meta['command']}`"
    folder = shipped.base_dir("toybugs-sweep")
    assert shipped.weights_digest(folder) == meta["weights_sha256"]
    assert sum(p.stat().st_size for p in folder.iterdir()) < 10 * 2**20


def test_the_shipped_base_is_a_model_spec_and_a_run_config_path():
    engine = get_model("toybugs-sweep")
    (done,) = engine.generate([Request([{"role": "user", "content": "hello"}], max_tokens=4, seed=0)])
    assert done.error is None and done.completion_tokens > 0
    assert model_spec("toybugs-sweep") == f"hf:{shipped.ROOT / 'toybugs-sweep'}"


def test_a_damaged_base_is_one_clear_error(tmp_path, monkeypatch):
    shutil.copytree(shipped.ROOT / "toybugs-sweep", tmp_path / "toybugs-sweep")
    weights = tmp_path / "toybugs-sweep" / shipped.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(shipped, "ROOT", tmp_path)
    with pytest.raises(FlywheelError, match="does not match its recorded digest"):
        shipped.base_dir("toybugs-sweep")
    with pytest.raises(FlywheelError, match="unknown shipped base"):
        shipped.describe("nope")


def held_out_success(spec: str, out: Path) -> float:
    argv = [sys.executable, "-m", "flywheel", "eval", "--suite", "toybugs", "--split", "heldout"]
    argv += ["--model", spec, "--effort", "medium", "--limit", "40", "--out", str(out)]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads((out / "summary.json").read_text())["success_rate"]


@pytest.mark.slow
def test_flywheel_sft_rebuilds_a_base_that_scores_as_the_shipped_one(tmp_path):
    """About 25 minutes on 2 cores: the imitation data is collected and the model trained anew."""
    meta = shipped.describe("toybugs-sweep")
    rebuilt = tmp_path / "base"
    argv = [sys.executable, "-m", "flywheel", "sft", str(ROOT / meta["config"]), "--out", str(rebuilt)]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    ours = held_out_success(f"hf:{rebuilt}", tmp_path / "rebuilt-eval")
    theirs = held_out_success("toybugs-sweep", tmp_path / "shipped-eval")
    assert abs(ours - theirs) <= 0.1, (ours, theirs)
