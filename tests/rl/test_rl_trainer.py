"""The trainer on real sampled completions of a tiny model: scoring, batched replay, the update's direction."""

from __future__ import annotations

import pytest
import torch

from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import load_torch_model
from flywheel.protocols import Request, Verdict
from flywheel.record import Trajectory
from flywheel.rl.config import RunConfig
from flywheel.rl.trainer import Trainer, token_batches
from flywheel.rubric import outcome_metrics, score

TEXTS = ["<run_tests/>", '<view path="a.py"/>', "def f(x):\n    return x + 1\n", "1 failed, 2 passed"] * 10


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", TEXTS, vocab_size=300, hidden=32, layers=2, heads=2
    )
    return load_torch_model(f"hf:{path}", seed=0)


def records_from(engine, prompts, success, effort="medium"):
    reqs = [
        Request([{"role": "user", "content": p}], max_tokens=12, top_p=0.9, seed=i)
        for i, p in enumerate(prompts)
    ]
    out = []
    for i, c in enumerate(engine.generate(reqs)):
        turn = {
            "role": "assistant",
            "text": c.text,
            "prompt_ids": c.prompt_ids,
            "token_ids": c.token_ids,
            "logprobs": c.logprobs,
            "kept": c.kept,
        }
        out.append(
            Trajectory(
                f"t/{effort}/{i}",
                "t",
                effort,
                model="hf:x",
                turns=[turn],
                n_turns=1,
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                cost=0.001,
                success=success[i],
                verdict=Verdict("t", success=success[i]),
            )
        )
    return out


def test_score_is_reward_minus_length_weighted_baseline(engine):
    records = records_from(engine, ["a", "b"], [True, False])
    records[1].verdict = Verdict("t", success=False, cheat=True)  # the grader's cheat: never a success
    s = score(records, {"medium": 10.0}, "length_weighted", deterministic=False)
    assert s[0]["reward"] == pytest.approx(1 - 10 * 0.001) and s[1]["reward"] == pytest.approx(-0.01)
    lengths = [len(r.turns[0]["token_ids"]) for r in records]
    b = (s[0]["reward"] * lengths[0] + s[1]["reward"] * lengths[1]) / sum(lengths)
    assert s[0]["advantage"] == pytest.approx(s[0]["reward"] - b)


def test_infrastructure_failures_are_kept_but_masked_from_baseline_and_advantage(engine):
    records = records_from(engine, ["a", "b", "c", "d"], [True, False, False, True])
    records[2].infra_failure, records[3].infra_failure = "model_server", "grader"
    s = score(records, {"medium": 10.0}, "mean", deterministic=False)
    assert len(s) == 4 and s[3]["reward"] == pytest.approx(1 - 10 * 0.001)  # scored, but not learned from
    b = (s[0]["reward"] + s[1]["reward"]) / 2  # the two valid attempts only
    assert [x["advantage"] for x in s] == pytest.approx([s[0]["reward"] - b, s[1]["reward"] - b, 0.0, 0.0])
    records[1].infra_failure = "sandbox"  # one valid attempt left: the group trains nothing
    assert [x["advantage"] for x in score(records, {}, "length_weighted", False)] == [0.0] * 4


def test_a_solved_scope_ignores_a_success_the_infrastructure_ended(engine):
    records = records_from(engine, ["a", "b", "c"], [True, False, False])
    for r in records:
        r.n_turns = 5
    records[0].infra_failure = "grader"
    s = score(records, {}, "mean", False, 0.1, {"medium": 3}, "solved")
    assert [x["length_penalty"] for x in s] == [0.0, 0.0, 0.0]


def test_outcome_metrics_are_over_valid_records_and_count_the_others():
    def rec(i, success, effort="medium", infra=None):
        return Trajectory(f"t/{effort}/{i}", "t", effort, n_turns=i, success=success, infra_failure=infra)

    records = [
        rec(1, True),
        rec(3, False),
        rec(9, False, infra="model_server"),
        rec(8, False, "max", "sandbox"),
    ]
    scores = [{"reward": x, "cost": 0.1, "tokens": 4} for x in (1.0, 0.0, -5.0, -5.0)]
    m = outcome_metrics(records, scores)
    assert m["success"] == 0.5 and m["reward"] == 0.5 and m["turns"] == 2.0 and m["medium/turns"] == 2.0
    assert "max/success" not in m  # no valid record at that level
    assert (m["infra_failures"], m["infra/model_server"], m["infra/sandbox"]) == (2.0, 1.0, 1.0)
    assert outcome_metrics(records[:2], scores[:2])["infra_failures"] == 0.0
    assert set(outcome_metrics(records[2:], scores[2:])) == {
        "infra_failures",
        "infra/model_server",
        "infra/sandbox",
    }


def test_the_length_penalty_applies_in_penalised_steps_to_budgeted_efforts(engine):
    records = records_from(engine, ["a", "b"], [True, False]) + records_from(engine, ["a"], [False], "max")
    for r, turns in zip(records, (5, 2, 9), strict=True):
        r.n_turns = turns
    cfg = RunConfig()
    cfg.reward.length_penalty, cfg.reward.length_budget, cfg.reward.length_phase = 0.1, {"medium": 3}, 1
    trainer = Trainer(engine.model, engine.tokenizer, cfg, {})
    free, penalised = trainer.scores(records, 1), trainer.scores(records, 2)
    assert [s["reward"] for s in free] == [1.0, 0.0, 0.0]
    assert [s["reward"] for s in penalised] == pytest.approx([0.8, 0.0, 0.0])
    assert [s["length_penalty"] for s in penalised] == pytest.approx([0.2, 0.0, 0.0])


def test_a_solved_scope_penalises_length_only_in_groups_with_a_success(engine):
    """Where no attempt solved the task, a short failure must not score above a long one: that teaches giving up."""
    records = records_from(engine, ["a", "b", "c", "d"], [True, False, False, False])
    for r, task, turns in zip(records, "ttuu", (5, 6, 6, 2), strict=True):
        r.task_id, r.n_turns = task, turns
    everywhere = score(records, {}, "mean", False, 0.1, {"medium": 3})
    solved = score(records, {}, "mean", False, 0.1, {"medium": 3}, "solved")
    assert [s["length_penalty"] for s in everywhere] == pytest.approx([0.2, 0.3, 0.3, 0.0])
    assert [s["length_penalty"] for s in solved] == pytest.approx([0.2, 0.3, 0.0, 0.0])
    assert [s["advantage"] for s in solved] == pytest.approx([0.55, -0.55, 0.0, 0.0])
    assert [s["advantage"] for s in everywhere][2:] == pytest.approx([-0.15, 0.15])


def test_a_step_without_scores_takes_its_length_penalty_phase_from_the_version(engine):
    """The loop host calls `Trainer.step(records)`: step `version + 1` decides whether the penalty applies."""
    records = records_from(engine, ["a", "b"], [True, False])
    for r, turns in zip(records, (5, 6), strict=True):
        r.n_turns = turns
    cfg = RunConfig()
    cfg.reward.length_penalty, cfg.reward.length_budget, cfg.reward.length_phase = 0.1, {"medium": 3}, 1
    trainer = Trainer(engine.model, engine.tokenizer, cfg, {})
    rewards = [trainer.step(records)[0]["medium/reward"] for _ in range(3)]
    assert rewards == pytest.approx([0.5, (0.8 - 0.3) / 2, 0.5])
    assert trainer.version == 3


def test_batched_logits_match_one_forward_per_turn(engine):
    records = records_from(engine, ["short", "a much longer prompt than the other one"], [True, False])
    trainer = Trainer(engine.model, engine.tokenizer, RunConfig(), {})
    turns = [r.turns[0] for r in records]
    batched = trainer._generated_logits(turns)
    singles = []
    for t in turns:
        ids = torch.tensor([t["prompt_ids"] + t["token_ids"]])
        singles.append(engine.model(input_ids=ids).logits[0, len(t["prompt_ids"]) - 1 : -1])
    assert torch.allclose(batched, torch.cat(singles).float(), atol=1e-4)


def test_a_step_raises_the_likelihood_of_the_rewarded_completion(engine):
    cfg = RunConfig()
    cfg.optim.kind, cfg.optim.lr = "adamw", 1e-2
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    records = records_from(engine, ["x", "x"], [True, False])
    trainer = Trainer(engine.model, engine.tokenizer, cfg, {"medium": 0.0})

    def logp(record):
        t = record.turns[0]
        with torch.no_grad():
            logits = trainer._generated_logits([t])
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(t["token_ids"]).unsqueeze(1)).sum().item()

    before = [logp(r) for r in records]
    metrics, _ = trainer.step(records)
    after = [logp(r) for r in records]
    assert trainer.version == 1 and metrics["success"] == 0.5 and metrics["grad_norm"] > 0
    assert after[0] > before[0] and after[1] < before[1]
    engine.model.load_state_dict(state)


def test_zero_advantage_groups_change_nothing(engine):
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    records = records_from(engine, ["x", "x"], [False, False])
    for r in records:
        r.turns[0]["token_ids"] = r.turns[0]["token_ids"][:3]
        r.turns[0]["logprobs"] = r.turns[0]["logprobs"][:3]
        r.turns[0]["kept"] = r.turns[0]["kept"][:3]
    Trainer(engine.model, engine.tokenizer, RunConfig(), {"medium": 0.0}).step(records)
    assert all(torch.equal(state[k], v) for k, v in engine.model.state_dict().items())


def test_token_batches_respect_the_budget():
    turns = [{"prompt_ids": [0] * n, "token_ids": [1] * 4} for n in (10, 200, 12, 11)]
    batches = token_batches(turns, 64)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    assert [1] in batches and all(len(b) * 16 <= 64 for b in batches if 1 not in b)


def single_logits(engine, t):
    ids = torch.tensor([t["prompt_ids"] + t["token_ids"]])
    return engine.model(input_ids=ids).logits[0, len(t["prompt_ids"]) - 1 : -1].float()


def test_packed_logits_match_one_forward_per_turn(engine):
    """Shared prompts (a group) and a turn that extends another (an episode's next turn) share trie nodes,
    and still every generated token is predicted from exactly its own prefix."""
    records = records_from(engine, ["x", "x", "x", "another prompt"], [True, False, True, False])
    turns = [r.turns[0] for r in records]
    first = turns[0]
    turns.append(
        {"prompt_ids": first["prompt_ids"] + first["token_ids"] + [5, 6, 7], "token_ids": [8, 9, 10]}
    )
    trainer = Trainer(engine.model, engine.tokenizer, RunConfig(), {})
    packed = trainer._packed_logits(turns)
    with torch.no_grad():
        expected = torch.cat([single_logits(engine, t) for t in turns])
    assert packed.shape == expected.shape
    assert torch.allclose(packed, expected, atol=1e-4)


def test_packed_and_padded_steps_give_the_same_update(engine):
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    records = records_from(engine, ["x", "x", "y", "y"], [True, False, False, True])
    after = {}
    for pack in (True, False):
        cfg = RunConfig()
        cfg.optim.kind, cfg.optim.lr, cfg.objective.pack = "adamw", 1e-2, pack
        engine.model.load_state_dict(state)
        metrics, _ = Trainer(engine.model, engine.tokenizer, cfg, {"medium": 0.0}).step(records)
        after[pack] = ({k: v.clone() for k, v in engine.model.state_dict().items()}, metrics)
    engine.model.load_state_dict(state)
    assert after[True][1]["grad_norm"] == pytest.approx(after[False][1]["grad_norm"], rel=1e-4)
    assert after[True][1]["loss"] == pytest.approx(after[False][1]["loss"], rel=1e-4, abs=1e-7)
    # AdamW's first step moves each weight by lr * g / (|g| + eps): where a gradient is near eps (1e-8),
    # float rounding between the two layouts moves it by a visible fraction of lr; 1% of lr is the bound
    assert all(torch.allclose(after[True][0][k], after[False][0][k], atol=1e-4) for k in state)


def test_activation_checkpointing_recomputes_the_layers_and_gives_the_same_update(engine):
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    records = records_from(engine, ["x", "x", "y", "y"], [True, False, False, True])
    calls: list[bool] = []
    mlp = engine.model.model.layers[0].mlp  # runs once in the forward pass, again in a recompute
    plain = mlp.forward

    def counted(*args, **kwargs):
        calls.append(True)
        return plain(*args, **kwargs)

    mlp.forward = counted
    after = {}
    try:
        for recompute in (False, True):
            cfg = RunConfig()
            cfg.optim.kind, cfg.optim.lr = "adamw", 1e-2
            cfg.objective.activation_checkpointing = recompute
            engine.model.load_state_dict(state)
            calls.clear()
            metrics, _ = Trainer(engine.model, engine.tokenizer, cfg, {"medium": 0.0}).step(records)
            after[recompute] = (
                {k: v.clone() for k, v in engine.model.state_dict().items()},
                metrics,
                len(calls),
            )
    finally:
        del mlp.forward
        engine.model.activation_checkpointing_disable()
        engine.model.load_state_dict(state)
    assert after[True][2] == 2 * after[False][2] > 0  # each layer ran again in the backward pass
    assert not engine.model.training  # back in eval mode for the engine
    assert after[True][1]["loss"] == pytest.approx(after[False][1]["loss"], rel=1e-5, abs=1e-7)
    assert after[True][1]["grad_norm"] == pytest.approx(after[False][1]["grad_norm"], rel=1e-5)
    assert all(torch.allclose(after[True][0][k], after[False][0][k], atol=1e-4) for k in state)
