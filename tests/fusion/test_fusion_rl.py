"""Training the sidekick under a frozen lead: `flywheel train` with `[fusion]` on the tiny SFT base."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flywheel.record import Trajectory, read_trajectories
from flywheel.rl.config import FusionSection, RunConfig, load_config
from flywheel.rl.train import train
from flywheel.rubric import modelled_cost, reward_cost, turns_of

ROOT = Path(__file__).resolve().parents[2]


def fused(base: Path, steps: int = 1) -> RunConfig:
    cfg = load_config(ROOT / "configs" / "quick.toml")
    cfg.model.path, cfg.train.steps = str(base), steps
    cfg.rollout.efforts, cfg.tasks.limit = ["medium"], 4
    cfg.fusion = FusionSection(lead="scripted-lead", lead_effort="max", max_delegations=2)
    return cfg


def test_train_replays_only_the_sidekicks_turns_and_charges_the_pairs_cost(base, tmp_path):
    [row] = train(fused(base), tmp_path / "run")
    records = read_trajectories(tmp_path / "run" / "trajectories.jsonl")
    assert len(records) == 2 * 2 and all(r.fusion and r.model == "scripted-lead" for r in records)
    for r in records:
        assert r.sidekick and len(r.sidekick) == r.fusion["delegations"]
        assert not any(t.get("token_ids") for t in r.turns)  # the scripted lead samples nothing
        assert turns_of(r) and all(t["token_ids"] for t in turns_of(r))
        s = r.rl
        assert s["cost"] == pytest.approx(s["lead_cost"] + s["sidekick_cost"])
        assert s["cost"] == pytest.approx(reward_cost(r, deterministic=True))
        assert s["lead_cost"] == pytest.approx(modelled_cost(r)) and s["sidekick_cost"] > 0
        assert s["reward"] == pytest.approx(float(r.success) - s["lambda"] * s["cost"])
    trained = [r for r in records if r.rl["advantage"] != 0.0]
    assert trained and row["train_tokens"] == sum(len(t["token_ids"]) for r in trained for t in turns_of(r))
    for key in ("delegations", "take_overs", "lead_cost", "sidekick_cost", "medium/delegations"):
        assert key in row
    assert row["delegations"] == pytest.approx(sum(r.fusion["delegations"] for r in records) / 4)
    assert row["cost"] == pytest.approx(row["lead_cost"] + row["sidekick_cost"])


# what a record measures (seconds, and the dollars priced from them), and the pool that ran it (a resumed
# run hands its first round to the first pool again)
UNSETTLED = {
    "wall_s", "compute_s", "tool_s", "gen_s", "cost", "lead_cost", "sidekick_cost", "workspace", "pool",
}  # fmt: skip


def settled(line: str) -> Any:
    """A trajectories.jsonl line without the fields that differ between equal runs (`UNSETTLED`)."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in UNSETTLED}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip(json.loads(line))


def test_a_deterministic_fusion_run_repeats_and_resumes_exactly(base, tmp_path):
    """Two runs of one deterministic `[fusion]` config agree (step 1 of both), and the one stopped after
    step 1 (a torn line after it) resumes to the uninterrupted run's metrics, trajectories and weights."""

    def fast(steps: int) -> RunConfig:
        cfg = fused(base, steps)
        cfg.rollout.tasks_per_step = 1
        return cfg

    a, c = tmp_path / "a", tmp_path / "c"
    train(fast(2), a)
    train(fast(1), c)
    lines = {run: (run / "metrics.jsonl").read_text().splitlines() for run in (a, c)}
    assert lines[c] == lines[a][:1]
    trainer = "checkpoints/v00000001/trainer"
    for name in ("model.safetensors", "optimizer.pt"):
        assert (c / trainer / name).read_bytes() == (a / trainer / name).read_bytes()
    for name in ("metrics.jsonl", "trajectories.jsonl"):
        with (c / name).open("a") as f:
            f.write('{"step": 2, "torn')
    train(fast(2), c)
    assert (c / "metrics.jsonl").read_bytes() == (a / "metrics.jsonl").read_bytes()
    trajectories = {run: (run / "trajectories.jsonl").read_text().splitlines() for run in (a, c)}
    assert len(trajectories[a]) == 2 * 2
    assert [settled(x) for x in trajectories[c]] == [settled(x) for x in trajectories[a]]
    records = read_trajectories(a / "trajectories.jsonl")
    assert all(r.sidekick and r.fusion["delegations"] for r in records)
    trainer = "checkpoints/v00000002/trainer"
    for name in ("model.safetensors", "optimizer.pt"):
        assert (c / trainer / name).read_bytes() == (a / trainer / name).read_bytes()


def test_a_deterministic_fusion_runs_engine_keeps_no_prefix_cache(base):
    """Delegations reach the engine in the order the concurrent leads delegate, and a prompt served from
    the prefix cache gets log-probs a few ulps from the same prompt prefilled whole."""
    from flywheel.rl.train import load_engine

    cfg = fused(base)
    assert cfg.deterministic and load_engine(cfg).prefix_store is None
    cfg.deterministic = False
    assert load_engine(cfg).prefix_store is not None


def test_turns_of_a_fusion_attempt_are_its_sidekicks_only():
    sampled = {"role": "assistant", "text": "x", "token_ids": [1, 2]}
    side = Trajectory("t/medium/s0/0/sidekick1", "t", "medium", turns=[sampled, {"role": "tool"}])
    lead = Trajectory("t/medium/s0/0", "t", "medium", turns=[{**sampled, "token_ids": [9]}])
    assert turns_of(lead) == [{**sampled, "token_ids": [9]}]
    lead.sidekick, lead.fusion = [side, side], {"delegations": 2}
    assert turns_of(lead) == [sampled, sampled]
    lead.sidekick = []
    assert turns_of(lead) == []


def test_bad_fusion_sections_exit_2_in_one_line(tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    for body, needle in [
        ("[fusion]\nmax_delegations = 2\n", "[fusion] lead is missing"),
        ("[fusion]\nlead = 'nope'\n", "[fusion] lead: unknown model 'nope'"),
        ("[fusion]\nlead = 'scripted-lead'\nlead_effort = 'turbo'\n", "[fusion] lead_effort"),
        ("[fusion]\nleed = 'scripted-lead'\n", "'leed'"),
    ]:
        bad.write_text(body)
        with pytest.raises(SystemExit) as exit_:
            main(["train", str(bad), "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and needle in err and err.count("\n") == 1, err


def test_calibration_measures_the_pair(base):
    from flywheel.eval.run import rollout
    from flywheel.fusion import sidekick_rollout
    from flywheel.rl.calibrate import measuring

    runner = measuring(fused(base))["runner"]
    assert runner.func is sidekick_rollout and runner.keywords["lead"] == "scripted-lead"
    cfg = fused(base)
    cfg.fusion = None
    assert measuring(cfg)["runner"] is rollout
