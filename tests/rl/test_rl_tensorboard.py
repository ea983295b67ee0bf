"""`[train] tensorboard = true`: metrics.jsonl's scalars as TensorBoard events, read back with TensorBoard's
own reader; a missing package is one error line before training starts."""

from __future__ import annotations

import json
import sys

import pytest

from flywheel.cli import main


def test_tensorboard_events_hold_the_scalars_of_metrics_jsonl(one_step_run):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (its extra)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = [json.loads(line) for line in (one_step_run / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(one_step_run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {k: v for k, v in rows[0].items() if k != "step" and isinstance(v, int | float)}
    assert {"reward", "success", "medium/success", "kl_k3", "is_weight_mean", "entropy"} <= set(scalars)
    assert set(events.Tags()["scalars"]) == set(scalars)
    for key, value in scalars.items():
        [event] = events.Scalars(key)
        assert event.step == rows[0]["step"] == 1
        assert event.value == pytest.approx(value, rel=1e-6, abs=1e-12)  # stored as float32


def test_a_missing_tensorboard_package_is_one_error_line_before_training(tmp_path, capsys, monkeypatch):
    config = tmp_path / "run.toml"
    config.write_text("[model]\npath = '/nope'\n\n[train]\ntensorboard = true\n")
    for name in ("tensorboard", "torch.utils.tensorboard"):  # as on a host without the package
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SystemExit) as e:
        main(["train", str(config), "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tensorboard" in err and "pip install tensorboard" in err
    assert not (tmp_path / "run").exists()
