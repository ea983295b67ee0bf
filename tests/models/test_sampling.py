"""Sampling on hand-made logits: the top-p nucleus by hand, the top-k and binned paths, rows independent."""

from __future__ import annotations

import math

import pytest
import torch

from flywheel.models import sampling
from flywheel.models.sampling import sample_step


def test_sample_step_nucleus_by_hand():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    s = sample_step(logits, torch.tensor([1.0]), torch.tensor([0.8]), torch.tensor([0.7]))
    # kept {1, 3} (mass 0.8); renormalised cdf [0.625, 1.0]; u=0.7 picks token 3
    assert s.tokens.tolist() == [3]
    assert math.isclose(s.logprobs.item(), math.log(0.3 / 0.8), rel_tol=1e-5)
    assert sorted(s.kept_ids[0, : s.kept_n[0]].tolist()) == [1, 3]
    wider = sample_step(logits, torch.tensor([1.0]), torch.tensor([0.81]), torch.tensor([0.0]))
    assert sorted(wider.kept_ids[0, : wider.kept_n[0]].tolist()) == [1, 2, 3]
    assert wider.tokens.tolist() == [1]


@pytest.mark.parametrize("vocab", [500, 1000])  # one sort; a top-k, then `wide_nucleus` for the flat row
def test_sample_step_mixed_rows_and_wide_nucleus(vocab):
    torch.manual_seed(0)
    logits = torch.randn(3, vocab) * 0.01  # nearly flat: the nucleus is wider than the first top-k
    temp = torch.tensor([0.0, 1.0, 1.0])
    top_p = torch.tensor([1.0, 1.0, 0.9])
    s = sample_step(logits, temp, top_p, torch.tensor([0.3, 0.3, 0.3]))
    assert s.tokens[0].item() == logits[0].argmax().item() and s.logprobs[0].item() == 0.0
    if vocab <= 2 * sampling.TOPK_FIRST:
        assert s.kept_rows.tolist() == [0, 2] and s.kept_n.tolist()[0] == 1
        assert 0.85 * vocab < s.kept_n.tolist()[1] < 0.95 * vocab
    else:
        assert s.kept_rows.tolist() == [0] and s.kept_n.tolist() == [1] and s.wide_rows.tolist() == [2]
        assert 0.85 * vocab < s.wide_mask[0].sum().item() < 0.95 * vocab
    full = torch.log_softmax(logits[1], -1)
    assert math.isclose(s.logprobs[1].item(), full[s.tokens[1]].item(), abs_tol=1e-5)


def test_each_row_takes_its_own_nucleus_path_whatever_shares_its_batch():
    g = torch.Generator().manual_seed(5)
    peaked = torch.randn(20000, generator=g) * 6.0  # the nucleus fits in the first top-k
    flat = torch.randn(20000, generator=g) * 0.05  # most of the vocabulary: `wide_nucleus`
    temp, top_p, u = torch.ones(2), torch.full((2,), 0.9), torch.tensor([0.4, 0.4])
    both = sample_step(torch.stack([peaked, flat]), temp, top_p, u)
    alone = sample_step(peaked.unsqueeze(0), temp[:1], top_p[:1], u[:1])
    assert both.kept_rows.tolist() == [0] and both.wide_rows.tolist() == [1]
    assert both.tokens[0] == alone.tokens[0] and both.logprobs[0] == alone.logprobs[0]
    assert both.kept_n[0] == alone.kept_n[0] and alone.wide_rows is None
    scaled = flat.unsqueeze(0)
    want, _ = sampling.wide_nucleus(scaled, torch.logsumexp(scaled, dim=-1), top_p[:1])
    assert torch.equal(both.wide_mask[0], want[0]) and bool(want[0, both.tokens[1]])


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_the_binned_nucleus_keeps_what_a_full_sort_keeps(top_p):
    g = torch.Generator().manual_seed(3)
    rows = [
        torch.randn(5000, generator=g) * 0.3,  # flat: the nucleus is most of the vocabulary
        torch.randn(5000, generator=g) * 4.0,  # peaked
        torch.cat([torch.randn(4000, generator=g), torch.full((1000,), float("-inf"))]),  # masked tokens
        torch.zeros(5000),  # all equal: one bin holds everything
    ]
    scaled = torch.stack(rows)
    logz = torch.logsumexp(scaled, dim=-1)
    keep, probs = sampling.wide_nucleus(scaled, logz, torch.full((4,), top_p))
    for r in range(4):
        order = torch.argsort(scaled[r], descending=True, stable=True)
        p = torch.exp(scaled[r] - logz[r]).double()[order]  # the engine's probabilities, summed exactly
        want = order[(torch.cumsum(p, 0) - p) < top_p]
        got = keep[r].nonzero().squeeze(1)
        if r == 3:  # ties: any int(top_p * V) + 1 of them is the rule's answer (up to rounding)
            assert abs(len(got) - len(want)) <= 1
        else:
            assert got.tolist() == sorted(want.tolist())
    torch.testing.assert_close(probs, torch.softmax(scaled, dim=-1))
