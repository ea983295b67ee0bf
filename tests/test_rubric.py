"""Reward, baselines and advantages: known answers and the variance property of the baseline."""

from __future__ import annotations

import math
import random

import pytest

from flywheel.rubric import (
    advantages,
    advantages_flat,
    group_mean_baseline,
    length_penalty_on,
    length_weighted_baseline,
    over_budget,
    reward,
)


def test_reward_success_pays_cost():
    assert reward(True, cost=2.0, lam=0.1) == pytest.approx(0.8)


def test_reward_failure_is_minus_cost():
    assert reward(False, cost=2.0, lam=0.1) == pytest.approx(-0.2)


@pytest.mark.parametrize("cost, lam", [(1.0, -0.1), (math.nan, 0.1), (1.0, math.inf)])
def test_reward_rejects_bad_prices(cost, lam):
    with pytest.raises(ValueError):
        reward(True, cost=cost, lam=lam)


def test_length_penalty_phases_alternate_success_only_first():
    assert [length_penalty_on(step, 1) for step in range(1, 6)] == [False, True, False, True, False]
    assert [length_penalty_on(step, 2) for step in range(1, 8)] == [
        False,
        False,
        True,
        True,
        False,
        False,
        True,
    ]
    assert all(length_penalty_on(step, 0) for step in range(1, 4))


def test_length_penalty_counts_turns_over_the_budget_only():
    assert over_budget(8, 3, 0.1) == pytest.approx(0.5)
    assert over_budget(3, 3, 0.1) == 0.0 and over_budget(2, 3, 0.1) == 0.0
    assert over_budget(20, None, 0.1) == 0.0


def test_length_weighted_baseline_worked_example():
    # (1·10 + 0·30 + 0.5·20) / (10 + 30 + 20) = 20 / 60
    assert length_weighted_baseline([1.0, 0.0, 0.5], [10, 30, 20]) == pytest.approx(1 / 3)
    # the plain mean of the same rewards is 0.5: the long failure pulls the weighted baseline down
    assert group_mean_baseline([1.0, 0.0, 0.5]) == pytest.approx(0.5)


def test_length_weighted_equals_mean_for_equal_lengths():
    rewards = [0.3, -0.2, 1.0, 0.0]
    assert length_weighted_baseline(rewards, [7] * 4) == pytest.approx(group_mean_baseline(rewards))


def test_length_weighted_falls_back_to_mean_when_no_tokens():
    assert length_weighted_baseline([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0]) == pytest.approx(0.25)


def test_zero_length_rollouts_do_not_move_the_baseline():
    assert length_weighted_baseline([1.0, -5.0], [4, 0]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "rewards, lengths",
    [([1.0], [1, 2]), ([1.0, 0.0], [3, -1]), ([], [])],
    ids=["mismatch", "negative", "empty"],
)
def test_baseline_rejects_bad_input(rewards, lengths):
    with pytest.raises(ValueError):
        length_weighted_baseline(rewards, lengths)


def test_length_weighted_baseline_minimises_length_weighted_squared_advantage():
    """b* = argmin_b Σ (R_i - b)² L_i: the gradient variance when ‖g_i‖² ∝ L_i (see objective.py)."""
    rng = random.Random(0)
    rewards = [rng.choice([1.0, 0.0]) - 0.01 * rng.random() for _ in range(16)]
    lengths = [rng.randint(1, 400) for _ in range(16)]

    def variance(b: float) -> float:
        return sum((r - b) ** 2 * n for r, n in zip(rewards, lengths, strict=True))

    best = length_weighted_baseline(rewards, lengths)
    assert variance(best) < variance(group_mean_baseline(rewards))
    assert variance(best) < min(variance(best - 1e-3), variance(best + 1e-3))


def test_advantages_by_group_known_answer():
    groups = {
        ("t1", "medium"): [(1.0, 10), (0.0, 30)],  # b = 10/40 = 0.25
        ("t1", "high"): [(0.5, 5)],  # a group of one has no peer: advantage 0
    }
    out = advantages(groups)
    assert out[("t1", "medium")] == pytest.approx([0.75, -0.25])
    assert out[("t1", "high")] == [0.0]
    assert advantages(groups, baseline="mean")[("t1", "medium")] == pytest.approx([0.5, -0.5])


def test_length_weighted_advantages_cancel_token_weighted():
    rng = random.Random(1)
    group = [(rng.uniform(-1, 1), rng.randint(0, 50)) for _ in range(9)]
    adv = advantages({"g": group})["g"]
    assert sum(a * n for a, (_, n) in zip(adv, group, strict=True)) == pytest.approx(0.0, abs=1e-9)


def test_advantages_flat_keeps_input_order_with_interleaved_groups():
    rewards = [1.0, 0.0, 0.0, 1.0]
    lengths = [10, 5, 30, 5]
    keys = [("a", "medium"), ("b", "medium"), ("a", "medium"), ("b", "medium")]
    # group a: b = 10/40 = 0.25; group b: b = 5/10 = 0.5
    assert advantages_flat(rewards, lengths, keys) == pytest.approx([0.75, -0.5, -0.25, 0.5])


def test_masked_rollouts_have_zero_advantage_and_leave_their_groups_baseline():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.2]
    lengths = [10, 30, 99, 5, 7, 3]
    keys = ["a", "a", "a", "b", "b", "c"]
    valid = [True, True, False, True, False, True]
    out = advantages_flat(rewards, lengths, keys, valid=valid)
    # group a over its two valid rollouts only: b = 10/40; group b keeps one valid rollout: nothing to learn
    assert out == pytest.approx([0.75, -0.25, 0.0, 0.0, 0.0, 0.0])
    assert out[2] == out[3] == out[4] == out[5] == 0.0  # exactly: skipped by the update
    assert advantages_flat(rewards, lengths, keys, valid=[True] * 6) == advantages_flat(
        rewards, lengths, keys
    )
    with pytest.raises(ValueError, match="5 valid flags"):
        advantages_flat(rewards, lengths, keys, valid=valid[:5])


def test_a_group_of_one_has_exactly_zero_advantage():
    assert advantages({"g": [(0.1, 3)]})["g"] == [0.0]  # 0.1 * 3 / 3 is not 0.1 in floating point


def test_unknown_baseline_is_refused():
    with pytest.raises(ValueError, match="unknown baseline"):
        advantages({"g": [(1.0, 1)]}, baseline="median")  # type: ignore[arg-type]


def test_the_rubric_imports_no_torch():
    """Evaluation, calibration and `flywheel grade` price attempts without loading a deep-learning stack."""
    import subprocess
    import sys

    code = "import sys, flywheel.rubric; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
