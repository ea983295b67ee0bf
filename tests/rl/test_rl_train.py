"""The RL loop end to end on a tiny base: SFT, training steps, determinism, resume, config errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.rl.config import RunConfig, load_config
from flywheel.rl.sft import SftConfig, encode, messages_of, render_with_spans, run_sft
from flywheel.rl.train import Run, train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny base policy from `flywheel sft configs/sft-quick.toml` (real imitation data, real training)."""
    cfg = load_config(ROOT / "configs" / "sft-quick.toml", SftConfig)
    return run_sft(cfg, tmp_path_factory.mktemp("sft") / "base")


def quick(base: Path, steps: int = 2) -> RunConfig:
    cfg = load_config(ROOT / "configs" / "quick.toml")
    cfg.model.path = str(base)
    cfg.train.steps = steps
    return cfg


def test_sft_writes_a_loadable_model_and_its_loss(base):
    info = json.loads((base / "sft_config.json").read_text())
    assert info["episodes"] == 6 and info["tokens"] > 0
    rows = [json.loads(line) for line in (base / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["copy_step"] for r in rows if "copy_step" in r] == [1, 2, 3]  # copy pretraining comes first
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses and all(loss > 0 for loss in losses) and "copy_step" in rows[0]
    from flywheel.models.torch_engine import load_torch_model

    engine = load_torch_model(f"hf:{base}")
    assert engine.tokenizer.eos_token == "<|im_end|>"


def test_an_sft_base_is_evaluated_under_the_harness_it_learned(base):
    from flywheel.rl.sft import trained_harness

    info = json.loads((base / "sft_config.json").read_text())
    assert trained_harness(f"hf:{base}") == {
        "action_format": "tagged",
        "observation_chars": info["config"]["data"]["observation_chars"],
    }
    assert trained_harness("scripted") == {} and trained_harness(f"hf:{base / 'missing'}") == {}


def test_sft_learns_only_the_assistant_tokens():
    from flywheel.models.tiny import CHAT_TEMPLATE, train_tokenizer, wrap_tokenizer

    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "<run_tests/>"},
        {"role": "user", "content": "1 failed"},
    ]
    text, spans = render_with_spans(messages)
    tok = wrap_tokenizer(train_tokenizer([text] * 4, 300), CHAT_TEMPLATE)
    assert text == tok.apply_chat_template(messages, tokenize=False)  # the engine renders the same text
    ids, target = encode(tok, messages, 10_000)
    learned = tok.decode([i for i, t in zip(ids, target, strict=True) if t])
    assert learned == "<run_tests/><|im_end|>"
    ids, weights = encode(tok, messages, 10_000, context_weight=0.25)
    read = tok.decode([i for i, w in zip(ids, weights, strict=True) if w == 0.25])
    assert read == "sys<|im_end|>fix it<|im_end|>1 failed<|im_end|>"
    assert tok.decode([i for i, w in zip(ids, weights, strict=True) if w == 1.0]) == learned


def test_messages_of_a_record_replays_the_conversation():
    record = {
        "turns": [
            {"role": "system", "text": "s"},
            {"role": "user", "text": "u"},
            {"role": "assistant", "text": '<view path="a.py"/>'},
            {"role": "tool", "name": "view", "text": "1| x"},
            {"role": "assistant", "text": "oops"},
            {"role": "tool", "name": "format_error", "text": "error: no action"},
        ]
    }
    assert [m["role"] for m in messages_of(record)] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages_of(record)[-1]["content"] == "error: no action"


def test_sft_does_not_learn_the_teachers_malformed_actions():
    record = {
        "turns": [
            {"role": "system", "text": "s"},
            {"role": "user", "text": "u"},
            {"role": "assistant", "text": "I will look first."},
            {"role": "tool", "name": "format_error", "text": "error: no action found"},
            {"role": "assistant", "text": "<run_tests/>"},
            {"role": "tool", "name": "run_tests", "text": "1 failed"},
        ]
    }
    text, spans = render_with_spans(messages_of(record))
    assert "I will look first." in text  # still context: the model sees the recovery
    assert [text[a:b] for a, b in spans] == ["<run_tests/><|im_end|>"]


def test_deterministic_runs_are_byte_identical_and_resume_continues_the_same(base, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    rows = train(quick(base), a)
    train(quick(base), b)
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    for name in ("model.safetensors", "optimizer.pt"):
        assert (a / "checkpoints/step-000002" / name).read_bytes() == (
            b / "checkpoints/step-000002" / name
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
    records = [json.loads(line) for line in (a / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 3 * 2 and all("advantage" in r["rl"] for r in records)


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
        ("[train]\nupdate_threads = -1\n", "[train] update_threads"),
        ("[reward]\nlength_penalty = -0.1\n", "[reward] length_penalty"),
        ("[reward]\nlength_budget = { turbo = 3 }\n", "[reward] length_budget"),
        ("[reward]\nlength_scope = 'some'\n", "[reward] length_scope"),
        ("[loop]\nbackend = 'local'\n[train]\nmax_minutes = 5\n", "[train] max_minutes"),
        ("[loop]\nbackend = 'local'\n[tasks]\nrecurate_every = 2\n", "[tasks] recurate_every"),
    ]:
        bad.write_text(body)
        with pytest.raises(SystemExit) as exit_:
            main(["train", str(bad), "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert exit_.value.code == 2, err
        assert needle in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path, SftConfig if path.name.startswith("sft") else RunConfig)
    if isinstance(cfg, SftConfig) and cfg.data.teacher.startswith("scripted"):
        from flywheel.models import get_model

        assert get_model(cfg.data.teacher).name == cfg.data.teacher


def test_config_types_are_checked():
    from flywheel.rl.config import from_dict

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
        {"task_id": t, "success": ok, "policy_version": 1, "step": 2}
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


def test_weighted_loss_is_the_action_loss_when_context_weighs_nothing(tmp_path):
    import torch

    from flywheel.models.tiny import build_tiny_model
    from flywheel.models.torch_engine import load_torch_model
    from flywheel.rl.sft import collate, weighted_loss

    messages = [
        {"role": "user", "content": "fix add.py"},
        {"role": "assistant", "content": '<view path="add.py"/>'},
        {"role": "user", "content": "1| def add(a, b):"},
        {"role": "assistant", "content": "<submit/>"},
    ]
    build_tiny_model(
        tmp_path / "m", [render_with_spans(messages)[0]] * 4, vocab_size=300, hidden=32, layers=1, heads=2
    )
    engine = load_torch_model(f"hf:{tmp_path / 'm'}")
    ids, mask, weights = collate([encode(engine.tokenizer, messages, 512)], engine.tokenizer.pad_token_id)
    labels = torch.where(weights == 1.0, ids, torch.full_like(ids, -100))
    reference = engine.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    objective, action = weighted_loss(engine.model, ids, mask, weights)
    assert torch.allclose(objective, reference, atol=1e-5) and torch.allclose(action, reference, atol=1e-5)
    ids, mask, weights = collate(
        [encode(engine.tokenizer, messages, 512, 0.5)], engine.tokenizer.pad_token_id
    )
    objective, action = weighted_loss(engine.model, ids, mask, weights)
    assert torch.allclose(action, reference, atol=1e-5) and not torch.allclose(
        objective, reference, atol=1e-3
    )


def test_a_copy_example_learns_only_the_predictable_part_of_the_repeat():
    import random

    from flywheel.rl.sft import copy_example

    stream = list(range(1000, 1300))
    for seed in range(20):
        ids, weights = copy_example(stream, random.Random(seed))
        window, repeat = ids[:200], ids[200:]
        assert window == stream[window[0] - 1000 : window[0] - 1000 + 200] and 8 <= len(repeat) <= 40
        start = window.index(repeat[0])
        assert window[start : start + len(repeat)] == repeat  # the repeat is a span of the window
        assert weights == [0.0] * 202 + [1.0] * (len(repeat) - 2)


def test_sft_refuses_a_context_weight_the_actions_cannot_outweigh(tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\ncontext_weight = 1.0\n")
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--out", str(tmp_path / "base")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "train.context_weight" in err and err.count("\n") == 1, err
    assert not (tmp_path / "base").exists()


def test_sft_renames_its_share_of_the_teachers_episodes(base):
    from flywheel.rl.sft import augmented, collect

    cfg = load_config(ROOT / "configs" / "sft-quick.toml", SftConfig)
    records = collect(cfg)  # cached by the fixture's run
    convs = [messages_of(r) for r in records]
    out = augmented(convs, records, cfg)
    changed = [a != b for a, b in zip(convs, out, strict=True)]
    assert 0 < sum(changed) < len(convs)  # rename = 0.5 of 6 episodes, drawn from the seed
    assert out == augmented(convs, records, cfg)  # deterministic
    for before, after, r in zip(convs, out, records, strict=True):
        assert after[0] == before[0]  # the system prompt
        module = r["task_id"].split("-")[1]
        text = " ".join(m["content"] for m in after[1:])
        assert (f"{module}.py" in text) != (after != before)


def test_training_on_renamed_copies_of_its_tasks(base, tmp_path):
    cfg = quick(base, steps=1)
    cfg.tasks.rename = 1.0
    train(cfg, tmp_path / "r")
    copies = sorted(p.name for p in (tmp_path / "r" / "tasks").iterdir())
    assert len(copies) == cfg.rollout.tasks_per_step and all(c.endswith(".s000001") for c in copies)
    records = [json.loads(line) for line in (tmp_path / "r" / "trajectories.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in records} == set(copies)
    assert all(r["task_id"] == r["renamed_from"] + ".s000001" for r in records)


def test_sft_from_a_pretrained_model_trains_only_its_top_layers(base, tmp_path):
    import torch
    from safetensors.torch import load_file

    cfg = load_config(ROOT / "configs" / "sft-quick.toml", SftConfig)
    cfg.model.init, cfg.train.train_layers, cfg.train.copy_steps = f"hf:{base}", 1, 0
    out = run_sft(cfg, tmp_path / "tuned")
    before, after = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("model.layers.1.", "model.norm.")) for k in changed), changed
    assert (out / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()


def test_sft_refuses_more_train_layers_than_the_model_has(base, tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(
        f'[data]\nepisodes = 2\nconcurrency = 2\n[model]\ninit = "hf:{base}"\n[train]\ntrain_layers = 9\n'
    )
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--out", str(tmp_path / "tuned")])
    err = capsys.readouterr().err
    assert (
        exit_.value.code == 2
        and err == "flywheel: error: train.train_layers = 9: the model has 2 decoder layers\n"
    )
    assert not (tmp_path / "tuned").exists() and not (tmp_path / ".tuned.building").exists()
    bad.write_text(
        "[data]\nepisodes = 2\n[model]\nlayers = 2\n[train]\ntrain_layers = 3\n"
    )  # a new tiny model
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--out", str(tmp_path / "tuned")])
    err = capsys.readouterr().err  # one line, before any data is collected
    assert exit_.value.code == 2 and err == (
        "flywheel: error: train.train_layers = 3: must be 0 (all) or at most the model's 2 layers\n"
    )


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
    assert (tmp_path / "t" / "checkpoints" / "step-000001" / "trainer.json").is_file()
    assert train(cfg, tmp_path / "t") == []  # resumed: the budget was spent before
    cfg.train.max_minutes = 0.0
    assert [r["step"] for r in train(cfg, tmp_path / "t")] == [2]


def test_a_time_budget_starts_no_step_that_would_end_past_it(base, tmp_path):
    cfg = quick(base, steps=2)
    assert [r["step"] for r in train(cfg, tmp_path / "t")] == [1, 2]  # no budget; their timings kept
    spent = Run(tmp_path / "t").step_seconds()
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
    cfg.loop = {"backend": "local", "pools": 1}
    lcfg = loop_config(cfg)
    assert (lcfg.observation_chars, lcfg.cohorts, lcfg.action_format) == (300, 2, "tagged")
    assert lcfg.budgets["max"]["max_turns"] == 2 and lcfg.budgets["medium"]["max_tokens"] == 300
    assert [r["version"] for r in train(cfg, tmp_path / "run")] == [1]
    records = [
        json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert len(records) == 12 and {r["action_format"] for r in records} == {"tagged"}
    assert all(
        r["n_turns"] <= cfg.rollout.max_turns[r["effort"]] for r in records
    )  # not the defaults, 10/20/40


def test_torch_threads_sets_the_count_inside_the_block_and_restores_it():
    import torch

    from flywheel.rl.train import torch_threads

    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with torch_threads(0):
        assert torch.get_num_threads() == before
