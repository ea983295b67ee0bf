"""The truncated-importance-sampling policy loss: value, gradient, weights, normalisation, stats, sign."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from flywheel.rl import importance_weights, kept_mask, policy_loss, replay_log_probs


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_importance_weights_truncate_at_c_and_are_detached():
    lp = leaf([math.log(0.5), math.log(0.3), math.log(0.9)])
    lq = torch.tensor([math.log(0.5), math.log(0.1), math.log(0.6)])
    ratio, w = importance_weights(lp, lq, clip_c=2.0)
    torch.testing.assert_close(ratio, torch.tensor([1.0, 3.0, 1.5]))
    torch.testing.assert_close(w, torch.tensor([1.0, 2.0, 1.5]))
    assert not ratio.requires_grad and not w.requires_grad


def test_on_policy_loss_is_reinforce_over_a_constant_budget():
    lp = leaf([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    adv = torch.tensor([[1.0], [-2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, stats = policy_loss(lp, lp.detach(), adv, mask, token_budget=10)
    expected = -(1.0 * (-1.0 - 2.0 - 0.5) + -2.0 * (-0.1 - 3.0)) / 10
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.1, -0.1, -0.1], [0.2, 0.2, 0.0]]))
    assert stats["is_weight_mean"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0
    assert stats["kl_k1"] == pytest.approx(0.0) and stats["kl_k3"] == pytest.approx(0.0)
    assert stats["tokens"] == 5


def test_gradient_carries_the_truncated_weight_but_not_its_derivative():
    lp = leaf([math.log(0.3), math.log(0.9)])
    lq = torch.tensor([math.log(0.1), math.log(0.6)])  # ratios 3 (truncated to 2) and 1.5
    adv = torch.tensor([1.0, 1.0])
    loss, stats = policy_loss(lp, lq, adv, torch.ones(2), token_budget=1)
    loss.backward()
    # d/dlp of -w·A·lp with w held constant: -w·A
    torch.testing.assert_close(lp.grad, torch.tensor([-2.0, -1.5]))
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["is_ratio_max"] == pytest.approx(3.0)
    assert stats["is_weight_mean"] == pytest.approx(1.75)


def test_custom_truncation_level():
    lp = leaf([math.log(0.3)])
    loss, stats = policy_loss(
        lp, torch.tensor([math.log(0.1)]), torch.tensor([1.0]), torch.ones(1), clip_c=5.0
    )
    assert stats["clip_frac"] == 0.0 and stats["is_weight_mean"] == pytest.approx(3.0)


def test_kl_estimators_known_answer():
    lp = leaf([math.log(0.5), math.log(0.2)])
    lq = torch.tensor([math.log(0.25), math.log(0.4)])  # log ratios log 2 and -log 2
    _, stats = policy_loss(lp, lq, torch.zeros(2), torch.ones(2))
    assert stats["kl_k1"] == pytest.approx(0.0, abs=1e-7)  # (-log2 + log2) / 2
    k3 = ((2 - 1 - math.log(2)) + (0.5 - 1 + math.log(2))) / 2
    assert stats["kl_k3"] == pytest.approx(k3)


def test_masked_positions_are_ignored_even_when_infinite():
    lp = leaf([[-1.0, -math.inf], [-0.5, -0.2]])
    lq = torch.tensor([[-1.0, 0.0], [-math.inf, -0.2]])
    mask = torch.tensor([[True, False], [False, True]])
    loss, stats = policy_loss(lp, lq, torch.ones(2, 1), mask, token_budget=2)
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx((1.0 + 0.2) / 2)
    assert bool(torch.isfinite(lp.grad).all())
    assert lp.grad[0, 1].item() == 0.0 and lp.grad[1, 0].item() == 0.0
    assert all(math.isfinite(v) for v in stats.values())


def test_default_budget_is_the_padded_batch_shape():
    lp = leaf([[-1.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0]])
    loss, _ = policy_loss(lp, lp.detach(), torch.ones(1, 1), mask)
    assert loss.item() == pytest.approx(2.0 / 4)


def per_token_gradient(normalise: str) -> torch.Tensor:
    """Gradient on each token's log-prob: a 1-token sequence and a 3-token one, same advantage."""
    lp = leaf([[-1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, _ = policy_loss(lp, lp.detach(), torch.ones(2, 1), mask, normalise=normalise, token_budget=6)
    loss.backward()
    return lp.grad


def test_token_sum_over_constant_weights_every_token_equally():
    g = per_token_gradient("token_sum/constant")
    torch.testing.assert_close(g, torch.tensor([[-1 / 6, 0, 0], [-1 / 6, -1 / 6, -1 / 6]]))


def test_token_mean_divides_by_the_batch_token_count():
    g = per_token_gradient("token_mean")
    torch.testing.assert_close(g, torch.tensor([[-1 / 4, 0, 0], [-1 / 4, -1 / 4, -1 / 4]]))


def test_seq_mean_upweights_short_sequences():
    g = per_token_gradient("seq_mean")
    # mean over each sequence, then over the 2 sequences: the lone token weighs 3x a long-sequence token
    torch.testing.assert_close(g, torch.tensor([[-1 / 2, 0, 0], [-1 / 6, -1 / 6, -1 / 6]]))


def test_empty_mask_gives_zero_loss_that_still_backpropagates():
    lp = leaf([[-1.0, -2.0]])
    for how in ("token_sum/constant", "token_mean", "seq_mean"):
        loss, stats = policy_loss(lp, lp.detach(), torch.ones(1, 1), torch.zeros(1, 2), normalise=how)
        loss.backward()
        assert loss.item() == 0.0 and stats["tokens"] == 0
    assert torch.equal(lp.grad, torch.zeros(1, 2))


def test_bad_arguments_are_refused():
    lp = leaf([[-1.0, -2.0]])
    with pytest.raises(ValueError, match="unknown normalisation"):
        policy_loss(lp, lp.detach(), torch.ones(1, 1), torch.ones(1, 2), normalise="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one dimension per"):
        policy_loss(lp, lp.detach(), torch.ones(1), torch.ones(1, 2))
    with pytest.raises(ValueError, match="share one shape"):
        policy_loss(lp, lp.detach(), torch.ones(1, 1), torch.ones(2))
    with pytest.raises(ValueError, match="token budget"):
        policy_loss(lp, lp.detach(), torch.ones(1, 1), torch.ones(1, 2), token_budget=0)


# ----------------------------------------------------------------- end to end on a tiny linear policy

VOCAB, FEATURES = 12, 5
KEPT = [[0, 1, 2, 3], [2, 3, 4], None, [1, 3]]
TOKENS = torch.tensor([1, 3, 7, 3])


def tiny_policy() -> tuple[nn.Linear, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    head = nn.Linear(FEATURES, VOCAB)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, FEATURES, generator=gen) * 0.3)
        head.bias.zero_()
    return head, torch.randn(len(KEPT), FEATURES, generator=gen)


def sgd_step_changes_logp(advantage: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    head, feats = tiny_policy()
    mask = torch.ones(len(KEPT)) if mask is None else mask
    with torch.no_grad():
        before = replay_log_probs(head(feats), KEPT, TOKENS, temperature=0.8)
    lp = replay_log_probs(head(feats), KEPT, TOKENS, temperature=0.8)
    loss, _ = policy_loss(lp, before, torch.full((len(KEPT),), advantage), mask)
    loss.backward()
    torch.optim.SGD(head.parameters(), lr=0.5).step()
    with torch.no_grad():
        return replay_log_probs(head(feats), KEPT, TOKENS, temperature=0.8) - before


def test_positive_advantage_raises_the_sampled_tokens_log_prob():
    assert sgd_step_changes_logp(+1.0).sum().item() > 0


def test_positive_advantage_on_one_token_raises_that_token():
    assert sgd_step_changes_logp(+1.0, mask=torch.tensor([0.0, 0.0, 1.0, 0.0]))[2].item() > 0


def test_negative_advantage_lowers_the_sampled_tokens_log_prob():
    assert sgd_step_changes_logp(-1.0).sum().item() < 0


def test_vocabulary_rows_never_kept_receive_no_gradient():
    head, feats = tiny_policy()
    lp = replay_log_probs(head(feats[:2]), KEPT[:2], TOKENS[:2])
    loss, _ = policy_loss(lp, lp.detach(), torch.ones(2), torch.ones(2))
    loss.backward()
    never = ~kept_mask(KEPT[:2], VOCAB).any(0)  # ids 5..11 are in neither kept set
    assert torch.equal(head.weight.grad[never], torch.zeros(int(never.sum()), FEATURES))
    assert torch.equal(head.bias.grad[never], torch.zeros(int(never.sum())))
    assert bool((head.weight.grad[~never] != 0).any())
