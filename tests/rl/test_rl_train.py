"""The RL loop end to end on the tiny SFT base (tests/conftest.py): steps, determinism, resume, config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.loop import LoopConfig, RunDir
from flywheel.record import Trajectory, read_trajectories
from flywheel.rl.config import RunConfig, load_config
from flywheel.rl.train import train
from flywheel.settings import from_dict
from flywheel.settings import load_config as load_settings
from flywheel.sft import SftConfig

ROOT = Path(__file__).resolve().parents[2]


def quick(base: Path, steps: int = 2) -> RunConfig:
    cfg = load_config(ROOT / "configs" / "quick.toml")
    cfg.model.path = str(base)
    cfg.train.steps = steps
    return cfg


def test_deterministic_runs_are_byte_identical_and_resume_continues_the_same(base, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    rows = train(quick(base), a)
    train(quick(base), b)
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    for name in ("model.safetensors", "optimizer.pt"):
        assert (a / "checkpoints/v00000002/trainer" / name).read_bytes() == (
            b / "checkpoints/v00000002/trainer" / name
        ).read_bytes()
    # an interrupted run (one step, then a torn line) resumes to the same metrics
    train(quick(base, steps=1), c)
    with (c / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "torn')
    train(quick(base), c)
    assert (c / "metrics.jsonl").read_bytes() == (a / "metrics.jsonl").read_bytes()
    assert len(rows) == 2
    keys = rows[0].keys()
    for key in (
        "reward",
        "success",
        "cost",
        "turns",
        "tokens",
        "loss",
        "entropy",
        "is_weight_mean",
        "kl_k3",
        "grad_norm",
        "medium/success",
        "high/reward",
        "max/turns",
    ):
        assert key in keys
    records = read_trajectories(a / "trajectories.jsonl")
    assert len(records) == 2 * 2 * 3 * 2 and all("advantage" in r.rl for r in records)


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    for body, needle in [
        ("[optim]\nlr = 'fast'\n", "'lr'"),
        ("[rollout]\nsteps = 3\n", "'steps'"),
        ("[model]\npath = '/nope'\n", "[model] path"),
        ("[optim]\nkind = 'sgd'\n", "[optim] kind"),
        ("[objective]\npack_tokens = 0\n", "[objective] pack_tokens"),
        ("[tasks]\nrename = 2\n", "[tasks] rename"),
        ("[rollout]\ncohorts = 0\n", "[rollout] cohorts"),
        ("[rollout]\ncompaction = 'zip'\n", "[rollout] compaction"),
        ("[rollout]\ncompact_at = 1.5\n", "[rollout] compact_at"),
        ("[train]\nupdate_threads = -1\n", "[train] update_threads"),
        ("[reward]\nlength_penalty = -0.1\n", "[reward] length_penalty"),
        ("[reward]\nlength_budget = { turbo = 3 }\n", "[reward] length_budget"),
        ("[reward]\nlength_scope = 'some'\n", "[reward] length_scope"),
        ("[loop]\nbackend = 'slurm'\n", "unknown loop backend 'slurm'"),
        ("[loop]\npoolz = 2\n", "'poolz'"),
        ("[loop]\nsteps = 3\n", "[loop] steps"),
        ("[loop]\nbackend = 'local'\n[train]\ncheckpoint_every = 2\n", "checkpoint_every = 2"),
    ]:
        bad.write_text(body)
        with pytest.raises(SystemExit) as exit_:
            main(["train", str(bad), "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert exit_.value.code == 2, err
        assert needle in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "configs").glob("*.toml")) + sorted((ROOT / "experiments" / "configs").glob("*.toml")),
    ids=lambda p: p.name,
)
def test_every_shipped_config_loads(path):
    cfg = load_settings(path, SftConfig if path.name.startswith("sft") else RunConfig)
    if isinstance(cfg, SftConfig) and cfg.data.teacher.startswith("scripted"):
        from flywheel.models import get_model

        assert get_model(cfg.data.teacher).name == cfg.data.teacher


def test_config_types_are_checked():
    cfg = from_dict(RunConfig, {"optim": {"lr": 1}, "reward": {"lambdas": {"medium": 2}}}, "x")
    assert cfg.optim.lr == 1.0 and cfg.reward.lambdas == {"medium": 2.0}
    with pytest.raises(FlywheelError, match="deterministic"):
        from_dict(RunConfig, {"deterministic": "yes"}, "x")
    with pytest.raises(FlywheelError, match="efforts"):
        from_dict(RunConfig, {"rollout": {"efforts": "medium"}}, "x")


def test_recuration_drops_always_solved_and_never_solved_tasks_and_keeps_unmeasured():
    from types import SimpleNamespace

    from flywheel.rl.train import curated

    tasks = [SimpleNamespace(id=name) for name in ("easy", "hard", "some", "new")]
    cfg = RunConfig()
    cfg.tasks.recurate_every, cfg.tasks.p_max, cfg.tasks.recurate_window = 2, 0.75, 8
    history = [
        Trajectory(f"{t}/medium/s0/0", t, "medium", success=ok, policy_version=1, step=2)
        for t, ok in [
            ("easy", True),
            ("easy", True),
            ("hard", False),
            ("hard", False),
            ("some", True),
            ("some", False),
        ]
    ]
    assert [t.id for t in curated(tasks, history, cfg, step=2)] == ["easy", "hard", "some", "new"]  # not yet
    assert [t.id for t in curated(tasks, history, cfg, step=3)] == ["some", "new"]
    cfg.tasks.recurate_every = 0
    assert len(curated(tasks, history, cfg, step=3)) == 4


def test_a_curated_train_suite_is_evaluated_on_the_held_out_split_of_eval_suite(tmp_path):
    import shutil

    from flywheel.rl.train import load_heldout, load_tasks
    from flywheel.tasks import load_suite

    for t in load_suite("toybugs", split="train")[:2]:  # a curated subset, as `flywheel tasks curate` writes
        shutil.copytree(t.root, tmp_path / "tasks" / t.id)
    cfg = RunConfig()
    cfg.tasks.suite = str(tmp_path / "tasks")
    assert len(load_tasks(cfg)) == 2
    with pytest.raises(FlywheelError, match="no split 'heldout'"):
        load_heldout(cfg)
    cfg.tasks.eval_suite = "toybugs"
    assert [t.id for t in load_heldout(cfg)] == [t.id for t in load_suite("toybugs", split="heldout")]


def test_training_on_renamed_copies_of_its_tasks(base, tmp_path):
    cfg = quick(base, steps=1)
    cfg.tasks.rename = 1.0
    train(cfg, tmp_path / "r")
    copies = sorted(p.name for p in (tmp_path / "r" / "tasks").iterdir())
    assert len(copies) == cfg.rollout.tasks_per_step and all(c.endswith(".s000001") for c in copies)
    records = read_trajectories(tmp_path / "r" / "trajectories.jsonl")
    assert {r.task_id for r in records} == set(copies)
    assert all(r.task_id == r.renamed_from + ".s000001" for r in records)


def test_the_runs_engine_keeps_the_prefix_cache_the_config_asks_for(base):
    from flywheel.rl.train import load_engine

    cfg = quick(base)
    cfg.model.prefix_cache_mb = 8
    assert load_engine(cfg).prefix_store.max_bytes == 8 << 20
    cfg.model.prefix_cache_mb = 0
    assert load_engine(cfg).prefix_store is None


def test_calibrate_measures_every_rung_of_every_level_and_writes_lambdas(base, tmp_path, capsys):
    from flywheel.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "calibrate",
                str(ROOT / "configs" / "quick.toml"),
                "--model",
                str(base),
                "--out",
                str(tmp_path),
                "--limit",
                "2",
                "--samples",
                "1",
            ]
        )
    assert exit_.value.code == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    data = json.loads((tmp_path / "calibration.json").read_text())
    assert list(data["ladders"]) == ["medium", "high", "max"] and printed["lambdas"] == data["lambdas"]
    for rungs in data["ladders"].values():
        assert [f for f, _, _ in rungs] == data["factors"] == [0.5, 1.0, 2.0]
        assert all(cost > 0 and 0.0 <= success <= 1.0 for _, cost, success in rungs)
    assert (tmp_path / "calibration.png").stat().st_size > 0


def test_training_shows_a_steps_rollouts_as_they_finish(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_PROGRESS_EVERY", "0")
    train(quick(base, steps=1), tmp_path / "run")
    lines = capsys.readouterr().err.splitlines()
    counts = [line.split("rollouts=")[1] for line in lines if "step=1  rollouts=" in line]
    assert counts == [f"{i}/12" for i in range(1, 13)]


def test_a_time_budget_counts_the_minutes_spent_before_a_resume(base, tmp_path):
    cfg = quick(base, steps=2)
    cfg.train.max_minutes = 1e-4  # the first step passes it
    assert [r["step"] for r in train(cfg, tmp_path / "t")] == [1]
    assert (tmp_path / "t" / "checkpoints" / "v00000001" / "trainer" / "trainer.json").is_file()
    assert train(cfg, tmp_path / "t") == []  # resumed: the budget was spent before
    cfg.train.max_minutes = 0.0
    assert [r["step"] for r in train(cfg, tmp_path / "t")] == [2]


def test_a_time_budget_starts_no_step_that_would_end_past_it(base, tmp_path):
    cfg = quick(base, steps=2)
    assert [r["step"] for r in train(cfg, tmp_path / "t")] == [1, 2]  # no budget; their timings kept
    spent = RunDir(tmp_path / "t").step_seconds()
    cfg.train.steps = 3
    cfg.train.max_minutes = (sum(spent) + 0.5 * max(spent)) / 60  # room for half of the longest step
    assert train(cfg, tmp_path / "t") == []
    cfg.train.max_minutes = (sum(spent) + 100 * max(spent)) / 60
    assert [r["step"] for r in train(cfg, tmp_path / "t")] == [3]


def test_a_loop_backend_runs_episodes_under_the_run_configs_budgets(base, tmp_path):
    from flywheel.rl.train import loop_config

    cfg = quick(base, steps=1)
    cfg.rollout.max_turns = {"medium": 1, "high": 1, "max": 2}
    cfg.rollout.observation_chars, cfg.rollout.cohorts = 300, 2
    cfg.loop = LoopConfig(backend="local", pools=1)
    lcfg = loop_config(cfg)
    h = lcfg.harness
    assert (h.observation_chars, h.cohorts, h.action_format) == (300, 2, "tagged")
    cfg.rollout.compaction, cfg.rollout.compact_at = "summary", 0.5
    assert (loop_config(cfg).harness.compaction, loop_config(cfg).harness.compact_at) == ("summary", 0.5)
    cfg.rollout.compaction = "elide"
    assert lcfg.efforts["max"].max_turns == 2 and lcfg.efforts["medium"].max_tokens == 300
    assert [r["version"] for r in train(cfg, tmp_path / "run")] == [1]
    records = read_trajectories(tmp_path / "run" / "trajectories.jsonl")
    assert len(records) == 12 and {r.action_format for r in records} == {"tagged"}
    assert all(r.n_turns <= cfg.rollout.max_turns[r.effort] for r in records)  # not the defaults, 10/20/40


def test_torch_threads_sets_the_count_inside_the_block_and_restores_it():
    import torch

    from flywheel.rl.trainer import torch_threads

    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with torch_threads(0):
        assert torch.get_num_threads() == before
