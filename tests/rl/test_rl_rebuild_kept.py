"""Kept sets rebuilt by the trainer for turns whose sampler did not record them (HTTP pools)."""

from __future__ import annotations

import pytest
import torch

from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import load_torch_model
from flywheel.protocols import Request, Verdict
from flywheel.record import Trajectory
from flywheel.rl.config import RunConfig
from flywheel.rl.objective import kept_mask, rebuild_kept_mask, replay_log_probs, replay_mask
from flywheel.rl.trainer import Trainer

TEXTS = ["<run_tests/>", '<view path="a.py"/>', "def f(x):\n    return x + 1\n", "1 failed, 2 passed"] * 10
TOP_P = 0.8


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", TEXTS, vocab_size=300, hidden=32, layers=2, heads=2
    )
    return load_torch_model(f"hf:{path}", seed=0)


def sampled(engine, n: int = 4):
    reqs = [Request([{"role": "user", "content": "x"}], max_tokens=12, top_p=TOP_P, seed=i) for i in range(n)]
    return engine.generate(reqs)


def generated_logits(engine, c) -> torch.Tensor:
    with torch.no_grad():
        logits = engine.model(torch.tensor([c.prompt_ids + c.token_ids])).logits[0]
    return logits[len(c.prompt_ids) - 1 : -1].float()


def test_rebuilt_kept_sets_are_the_samplers_on_the_same_weights(engine):
    for c in sampled(engine):
        logits, tokens = generated_logits(engine, c), torch.tensor(c.token_ids)
        assert torch.equal(rebuild_kept_mask(logits, tokens, TOP_P), kept_mask(c.kept, logits.shape[1]))
        exact = replay_log_probs(logits, c.kept, tokens)
        rebuilt = replay_log_probs(logits, None, tokens, top_p=TOP_P)
        assert torch.allclose(exact, rebuilt) and torch.allclose(rebuilt, torch.tensor(c.logprobs), atol=1e-4)


def test_a_drawn_token_outside_the_rebuilt_set_is_kept():
    logits = torch.tensor([[5.0, 0.0, 0.0, -1.0]])
    mask = rebuild_kept_mask(logits, torch.tensor([3]), top_p=0.5)
    assert mask.tolist() == [[True, False, False, True]]
    assert rebuild_kept_mask(logits, torch.tensor([3]), top_p=1.0).all()


def test_replay_mask_mixes_recorded_and_rebuilt_turns():
    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]])
    tokens = torch.tensor([1, 1, 2])
    mask = replay_mask([[[0, 1]], None], [1, 2], logits, tokens, top_p=0.5)
    assert mask.tolist() == [[True, True, False], [False, True, False], [False, False, True]]


def records(engine, kept: bool) -> list[Trajectory]:
    out = []
    for i, c in enumerate(sampled(engine, 2)):
        turn = {"role": "assistant", "text": c.text, "prompt_ids": c.prompt_ids, "token_ids": c.token_ids}
        turn.update(logprobs=c.logprobs, kept=c.kept if kept else None)
        out.append(
            Trajectory(
                f"t/medium/{i}",
                "t",
                "medium",
                model="hf:x",
                turns=[turn],
                n_turns=1,
                cost=0.001,
                completion_tokens=c.completion_tokens,
                success=i == 0,
                verdict=Verdict("t", success=i == 0),
            )  # fmt: skip
        )
    return out


def test_a_trainer_step_without_kept_sets_equals_the_step_with_them(engine):
    cfg = RunConfig()
    cfg.optim.kind, cfg.optim.lr, cfg.rollout.top_p = "adamw", 1e-2, TOP_P
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with_kept, without = records(engine, kept=True), records(engine, kept=False)
    after = []
    for recs in (with_kept, without):
        engine.model.load_state_dict(state)
        metrics, _ = Trainer(engine.model, engine.tokenizer, cfg, {"medium": 0.0}).step(recs)
        after.append(({k: v.clone() for k, v in engine.model.state_dict().items()}, metrics))
    engine.model.load_state_dict(state)
    (a, ma), (b, mb) = after
    assert ma["grad_norm"] > 0 and ma["loss"] == pytest.approx(mb["loss"], rel=1e-5)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
