"""Top-p sampling-distribution replay: masks, log-probs against a per-row reference, zero gradients."""

from __future__ import annotations

import math

import pytest
import torch

from flywheel.rl import kept_mask, replay_entropy, replay_log_probs

KEPT = [[0, 3], None, [5], [], [1, 2, 4, 6, 7], [9, 0]]
TOKENS = torch.tensor([3, 8, 5, 2, 6, 9])
V = 11


def logits_fixture(seed: int = 0) -> torch.Tensor:
    return torch.randn(len(KEPT), V, generator=torch.Generator().manual_seed(seed))


def reference_log_probs(logits: torch.Tensor, kept, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Row by row: softmax over the kept ids only, then the token's entry."""
    out = []
    for row, ids, tok in zip(logits, kept, tokens.tolist(), strict=True):
        ids = list(range(logits.shape[1])) if not ids else list(ids)
        sub = torch.log_softmax(row[ids].double() / temperature, dim=0)
        out.append(sub[ids.index(tok)])
    return torch.stack(out).float()


def top_p_sample(logits: torch.Tensor, top_p: float, temperature: float, gen: torch.Generator):
    """A plain nucleus sampler: returns (token, kept ids, log-prob of the token under what it sampled)."""
    probs = torch.softmax(logits / temperature, dim=-1)
    order = torch.argsort(probs, descending=True)
    before = torch.cumsum(probs[order], 0) - probs[order]
    kept = order[before < top_p]
    renorm = probs[kept] / probs[kept].sum()
    pick = int(torch.multinomial(renorm, 1, generator=gen))
    return int(kept[pick]), kept.tolist(), float(torch.log(renorm[pick]))


def test_kept_mask_known_answer():
    mask = kept_mask([[1], None, [0, 2], []], vocab=3)
    expected = torch.tensor([[0, 1, 0], [1, 1, 1], [1, 0, 1], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_kept_mask_refuses_ids_outside_vocabulary():
    with pytest.raises(ValueError, match="kept token ids"):
        kept_mask([[0, 3]], vocab=3)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_replay_matches_per_row_reference(temperature):
    logits = logits_fixture()
    got = replay_log_probs(logits, KEPT, TOKENS, temperature=temperature)
    assert got.shape == (len(KEPT),) and got.dtype == torch.float32
    torch.testing.assert_close(got, reference_log_probs(logits, KEPT, TOKENS, temperature))


def test_single_token_kept_set_has_log_prob_zero():
    assert replay_log_probs(logits_fixture(), KEPT, TOKENS)[2].item() == 0.0


def test_full_vocabulary_rows_are_the_plain_softmax():
    logits = logits_fixture()
    got = replay_log_probs(logits, KEPT, TOKENS)
    plain = torch.log_softmax(logits, dim=-1).gather(1, TOKENS[:, None]).squeeze(1)
    torch.testing.assert_close(got[[1, 3]], plain[[1, 3]])


def test_precomputed_mask_gives_the_same_answer():
    logits = logits_fixture()
    torch.testing.assert_close(
        replay_log_probs(logits, kept_mask(KEPT, V), TOKENS), replay_log_probs(logits, KEPT, TOKENS)
    )
    as_bytes = kept_mask(KEPT, V).to(torch.uint8)
    torch.testing.assert_close(
        replay_log_probs(logits, as_bytes, TOKENS), replay_log_probs(logits, KEPT, TOKENS)
    )


def test_logits_outside_the_kept_set_get_exactly_zero_gradient():
    logits = logits_fixture().requires_grad_(True)
    (replay_log_probs(logits, KEPT, TOKENS, temperature=0.8) * torch.arange(1.0, 7.0)).sum().backward()
    mask = kept_mask(KEPT, V)
    assert torch.equal(logits.grad[~mask], torch.zeros(int((~mask).sum())))
    assert bool((logits.grad[mask] != 0).any())
    # row 2 kept one token: its log-prob is constant, so the whole row gets zero gradient
    assert torch.equal(logits.grad[2], torch.zeros(V))


def test_replay_reproduces_the_samplers_log_probs():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 50, generator=gen) * 3
    draws = [top_p_sample(row, top_p=0.9, temperature=0.7, gen=gen) for row in logits]
    tokens = torch.tensor([t for t, _, _ in draws])
    kept = [k for _, k, _ in draws]
    sampled = torch.tensor([lp for _, _, lp in draws])
    assert any(len(k) < 50 for k in kept)  # the nucleus really truncated something
    torch.testing.assert_close(replay_log_probs(logits, kept, tokens, temperature=0.7), sampled)


def test_low_precision_logits_are_replayed_in_float32():
    logits = logits_fixture()
    got = replay_log_probs(logits.bfloat16(), KEPT, TOKENS)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, replay_log_probs(logits, KEPT, TOKENS), atol=5e-2, rtol=0)


def test_token_outside_its_kept_set_is_refused():
    with pytest.raises(ValueError, match=r"outside its kept set at positions \[0\]"):
        replay_log_probs(logits_fixture(), KEPT, torch.tensor([1, 8, 5, 2, 6, 9]))


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_non_positive_temperature_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        replay_log_probs(logits_fixture(), KEPT, TOKENS, temperature=temperature)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="expected logits"):
        replay_log_probs(logits_fixture(), KEPT, TOKENS[:3])


def test_entropy_over_the_kept_set():
    logits = logits_fixture()
    mask = kept_mask(KEPT, V)
    got = replay_entropy(logits, mask, temperature=0.9)
    for t, ids in enumerate(KEPT):
        ids = ids or list(range(V))
        p = torch.softmax(logits[t, ids].double() / 0.9, dim=0)
        assert got[t].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)
    assert got[2].item() == 0.0


def test_entropy_of_uniform_logits_is_log_of_kept_size():
    mask = kept_mask([None, [0, 1, 2, 3]], vocab=16)
    got = replay_entropy(torch.zeros(2, 16), mask)
    torch.testing.assert_close(got, torch.tensor([math.log(16), math.log(4)]))


def test_entropy_gradient_is_finite_and_zero_outside_the_kept_set():
    logits = logits_fixture().requires_grad_(True)
    mask = kept_mask(KEPT, V)
    replay_entropy(logits, mask).sum().backward()
    assert bool(torch.isfinite(logits.grad).all())
    assert torch.equal(logits.grad[~mask], torch.zeros(int((~mask).sum())))
