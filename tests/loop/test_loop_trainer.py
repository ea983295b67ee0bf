"""End to end with the RL package's real trainer: pools generate, `flywheel.rl.trainer.Trainer` steps."""

from __future__ import annotations

import json

from loop_helpers import loop_config

from flywheel.loop import run
from flywheel.protocols import LoopTrainer


def test_real_trainer_drives_the_loop(tmp_path, tiny_model, clamp_task):
    from flywheel.models.hf import load_hf
    from flywheel.rl.config import RunConfig
    from flywheel.rl.trainer import Trainer

    model, tokenizer = load_hf(tiny_model)
    trainer = Trainer(model, tokenizer, RunConfig(), lambdas={"medium": 0.0})
    assert isinstance(trainer, LoopTrainer)
    out = tmp_path / "run"
    summary = run(loop_config(tiny_model, steps=2, max_staleness=1), trainer, [clamp_task], out)
    assert summary["version"] == 2 == trainer.version
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [1, 2] and all("loop_records" in m for m in metrics)
    assert (out / "checkpoints" / "v00000002" / "trainer" / "trainer.json").exists()
    assert (out / "peer" / "checkpoints" / "LATEST").exists()
