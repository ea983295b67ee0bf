"""Length budgets over turns, generated tokens and compute seconds (`[reward] length_budgets` and
`length_prices`): the penalty through the real scoring on hand-made records, its alternating phases, the
phase and overrun rates a real tiny trainer step reports, and the config errors `flywheel train` refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import load_torch_model
from flywheel.protocols import Request, Verdict
from flywheel.record import Trajectory
from flywheel.rl.config import RunConfig, load_config
from flywheel.rl.trainer import Trainer
from flywheel.rubric import budget_penalty, length_penalty_on, score
from flywheel.settings import from_dict

BUDGETS = {"medium": {"turns": 3, "tokens": 800, "seconds": 20}, "max": {"tokens": 2000}}
PRICES = {"turns": 0.1, "tokens": 0.0005, "seconds": 0.01}


def attempt(
    i: int,
    effort: str = "medium",
    *,
    turns: int = 1,
    tokens: int = 0,
    seconds: float = 0.0,
    success: bool = False,
    task: str = "t",
) -> Trajectory:
    """A graded record with the usage a budget reads: model calls, generated tokens, compute seconds."""
    return Trajectory(
        f"{task}/{effort}/{i}",
        task,
        effort,
        n_turns=turns,
        completion_tokens=tokens,
        compute_s=seconds,
        success=success,
        verdict=Verdict(task, success=success),
    )


# ----------------------------------------------------------------------------------------------- penalty


def test_the_penalty_sums_price_times_overrun_over_every_budgeted_quantity():
    records = [
        attempt(0, turns=5, tokens=1000, seconds=10, success=True),  # 2 turns and 200 tokens over
        attempt(1, turns=3, tokens=800, seconds=25),  # exactly on two budgets, 5 s over the third
        attempt(2, "max", turns=9, tokens=2500, seconds=99),  # max budgets tokens only: 500 over
        attempt(3, "high", turns=50, tokens=10**5, seconds=10**3),  # high has no budget
    ]
    s = score(records, {}, "mean", False, PRICES, BUDGETS)
    assert [x["length_penalty"] for x in s] == pytest.approx([0.2 + 0.1, 0.05, 0.25, 0.0])
    assert [x["reward"] for x in s] == pytest.approx([1 - 0.3, -0.05, -0.25, 0.0])
    assert s[0]["advantage"] == pytest.approx(((1 - 0.3) - (-0.05)) / 2)  # one group: t at medium
    assert budget_penalty({"turns": 5, "tokens": 1000}, {"turns": 3, "tokens": 800}, {"turns": 0.1}) == (
        pytest.approx(0.2)  # a quantity without a price costs nothing
    )


def test_a_plain_turn_budget_and_price_score_as_they_always_did():
    records = [attempt(i, turns=n, tokens=10**4, success=i == 0) for i, n in enumerate((5, 2, 4))]
    plain = score(records, {}, "mean", False, 0.1, {"medium": 3})
    named = score(records, {}, "mean", False, {"turns": 0.1}, {"medium": {"turns": 3}})
    assert plain == named
    assert [x["length_penalty"] for x in plain] == pytest.approx([0.2, 0.0, 0.1])
    assert all(isinstance(x["length_penalty"], float) for x in plain)


def test_a_solved_scope_penalises_every_quantity_only_in_groups_with_a_success():
    records = [
        attempt(0, tokens=900, success=True, task="t"),
        attempt(1, tokens=1000, task="t"),
        attempt(2, tokens=1000, task="u"),  # no attempt at u succeeded: a long failure is not punished
        attempt(3, tokens=100, task="u"),
    ]
    s = score(records, {}, "mean", False, PRICES, BUDGETS, "solved")
    assert [x["length_penalty"] for x in s] == pytest.approx([0.05, 0.1, 0.0, 0.0])


def test_the_config_reads_the_plain_form_the_named_form_and_both_together(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[reward]\nlength_penalty = 0.1\nlength_budget = { medium = 3 }\n")
    plain = load_config(path).reward
    assert (plain.budgets(), plain.prices()) == ({"medium": {"turns": 3.0}}, {"turns": 0.1})
    path.write_text(
        "[reward]\nlength_budget = { high = 6 }\n"
        "length_budgets = { medium = { turns = 3, tokens = 800, seconds = 20 }, max = { tokens = 2000 } }\n"
        "length_prices = { turns = 0.1, tokens = 0.0005, seconds = 0.01 }\n"
    )
    both = load_config(path).reward
    assert both.budgets() == {
        "medium": {"turns": 3.0, "tokens": 800.0, "seconds": 20.0},
        "max": {"tokens": 2000.0},
        "high": {"turns": 6.0},
    }
    assert both.prices() == PRICES


# ------------------------------------------------------------------------------- phases and step metrics


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    texts = ["<run_tests/>", '<view path="a.py"/>', "def f(x):\n    return x + 1\n"] * 10
    path = build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", texts, vocab_size=300, hidden=32, layers=2, heads=2
    )
    return load_torch_model(f"hf:{path}", seed=0)


def sampled(engine, usages: list[tuple[str, int, int, float, bool]]) -> list[Trajectory]:
    """Records with real sampled turns (so a step has something to replay) and the given
    (effort, turns, tokens, seconds, success)."""
    reqs = [
        Request([{"role": "user", "content": "fix it"}], max_tokens=8, top_p=0.9, seed=i)
        for i in range(len(usages))
    ]
    out = []
    for i, (c, (effort, turns, tokens, seconds, success)) in enumerate(
        zip(engine.generate(reqs), usages, strict=True)
    ):
        turn = {
            "role": "assistant",
            "text": c.text,
            "prompt_ids": c.prompt_ids,
            "token_ids": c.token_ids,
            "logprobs": c.logprobs,
            "kept": c.kept,
        }
        record = attempt(i, effort, turns=turns, tokens=tokens, seconds=seconds, success=success)
        record.turns = [turn]
        out.append(record)
    return out


def budgeted(phase: int) -> RunConfig:
    return from_dict(
        RunConfig,
        {"reward": {"length_budgets": BUDGETS, "length_prices": PRICES, "length_phase": phase}},
        "test",
    )


def test_penalised_phases_alternate_success_only_first(engine):
    assert [length_penalty_on(step, 2) for step in range(1, 7)] == [False, False, True, True, False, False]
    records = [attempt(0, turns=5, success=True), attempt(1, tokens=1800)]
    trainer = Trainer(engine.model, engine.tokenizer, budgeted(2), {})
    penalties = [s["length_penalty"] for step in range(1, 6) for s in trainer.scores(records, step)]
    assert penalties == pytest.approx([0, 0, 0, 0, 0.2, 0.5, 0.2, 0.5, 0, 0])
    every = Trainer(engine.model, engine.tokenizer, budgeted(0), {})
    assert [every.scores(records, step)[1]["length_penalty"] for step in (1, 2)] == pytest.approx([0.5, 0.5])


def test_a_tiny_trainer_step_reports_its_phase_and_each_budgets_overrun_rate(engine):
    records = sampled(
        engine,
        [
            ("medium", 5, 100, 1.0, True),  # over turns
            ("medium", 2, 900, 1.0, False),  # over tokens
            ("medium", 3, 100, 30.0, True),  # over seconds
            ("medium", 1, 100, 1.0, False),  # within every budget
            ("max", 9, 2500, 99.0, True),  # max budgets tokens only: over it
            ("max", 9, 1000, 99.0, False),
            ("high", 50, 10**5, 10**3, False),  # no budget: in no rate
        ],
    )
    lost = sampled(engine, [("medium", 50, 10**5, 10**3, False)])[0]
    lost.infra_failure = "model_server"  # says nothing about the policy: in no rate either
    trainer = Trainer(engine.model, engine.tokenizer, budgeted(1), {})
    first, _ = trainer.step([*records, lost])
    assert first["length_penalised"] == 0.0 and "loss" in first and "grad_norm" in first
    assert first["over_turns"] == pytest.approx(1 / 4) and first["over_seconds"] == pytest.approx(1 / 4)
    assert first["over_tokens"] == pytest.approx(2 / 6)  # medium's 4 and max's 2 budget tokens
    assert (first["medium/over_tokens"], first["max/over_tokens"]) == (0.25, 0.5)
    assert "max/over_turns" not in first and not any(k.startswith("high/over") for k in first)
    second, scores = trainer.step(records)
    assert second["length_penalised"] == 1.0 and second["over_tokens"] == first["over_tokens"]
    assert scores[4]["length_penalty"] == pytest.approx(0.25) and scores[6]["length_penalty"] == 0.0


def test_a_run_without_budgets_reports_no_budget_metrics(engine):
    records = sampled(engine, [("medium", 5, 100, 1.0, True), ("medium", 2, 900, 1.0, False)])
    metrics, _ = Trainer(engine.model, engine.tokenizer, RunConfig(), {}).step(records)
    assert "length_penalised" not in metrics and not any(k.startswith("over_") for k in metrics)


# --------------------------------------------------------------------------------------------- bad input

PRICED = "length_prices = { turns = 0.1, tokens = 0.0005, seconds = 0.01 }\n"
BAD = [
    ("length_budgets = { medium = { turnz = 3 } }\n" + PRICED, "[reward] length_budgets.medium.turnz"),
    ("length_budgets = { medium = { tokens = -5 } }\n" + PRICED, "[reward] length_budgets.medium.tokens"),
    ("length_prices = { tokens = -0.1 }\n", "[reward] length_prices.tokens"),
    ("length_prices = { watts = 0.1 }\n", "[reward] length_prices.watts"),
    (
        "length_budgets = { medium = { tokens = 800 } }\n",
        "[reward] length_budgets.medium.tokens has no price",
    ),
    ("length_budgets = { medium = { turns = 3 } }\n", "[reward] length_budgets.medium.turns has no price"),
    ("length_budgets = { turbo = { tokens = 8 } }\n" + PRICED, "[reward] length_budgets: effort 'turbo'"),
    ("length_budgets = { medium = 3 }\n", "'length_budgets'"),
    (
        "length_budget = { medium = 3 }\nlength_budgets = { medium = { turns = 4 } }\n" + PRICED,
        "medium.turns",
    ),
    ("length_penalty = 0.1\n" + PRICED, "[reward] length_prices.turns"),
]


@pytest.mark.parametrize(("body", "needle"), BAD, ids=[n for _, n in BAD])
def test_a_bad_budget_exits_2_with_one_line_naming_the_key(tmp_path, capsys, body, needle):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[reward]\n" + body)
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(bad), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_a_deterministic_run_refuses_a_seconds_budget(tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(
        "deterministic = true\n[reward]\nlength_budgets = { medium = { seconds = 20 } }\n" + PRICED
    )
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(bad), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "[reward] length_budgets.medium.seconds" in err, err


def test_python_m_flywheel_train_exits_2_with_one_line_on_a_bad_budget(tmp_path):
    (tmp_path / "run.toml").write_text("[reward]\nlength_budgets = { medium = { tokens = 800 } }\n")
    argv = [sys.executable, "-m", "flywheel", "train", "run.toml", "--out", "out"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "[reward] length_budgets.medium.tokens has no price" in done.stderr


def test_a_good_budget_passes_every_config_check(tmp_path, capsys):
    from flywheel.cli import main

    good = tmp_path / "run.toml"
    good.write_text(
        "[reward]\nlength_budgets = { medium = { turns = 3, tokens = 800, seconds = 20 } }\n" + PRICED
    )
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(good), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "[model] path is missing" in err, err  # past every [reward] check
