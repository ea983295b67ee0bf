"""Speculative decoding: the accept/resample rule against p, and the engine with drafts against the plain engine
and a replay of the target (the shipped toybugs-sweep base as target; its own layers, and a random Llama with
its tokenizer, as drafts)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from flywheel.errors import FlywheelError
from flywheel.models import fastllama, sampling
from flywheel.models.hf import load_hf
from flywheel.models.shipped import base_dir
from flywheel.models.speculative import continuation, pick, speculate
from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import TorchEngine
from flywheel.protocols import Completion, Request

PROMPTS = ["Fix the bug in mathx.py", "The tests in test_stack.py fail", "hello"]


@pytest.fixture(scope="module")
def target():
    return load_hf(base_dir("toybugs-sweep"))


@pytest.fixture(scope="module")
def random_draft(target, tmp_path_factory) -> str:
    """A one-layer random Llama (grouped-query attention) saved with the target's tokenizer: a poor draft,
    so most rounds end in a rejection."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tokenizer = target
    cfg = LlamaConfig(
        vocab_size=model.config.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        draft = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("draft") / "random"
    draft.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def plain(target) -> TorchEngine:
    return TorchEngine(*target, seed=0, prefix_cache_mb=0)


@pytest.fixture(scope="module")
def greedy(plain) -> tuple[list[Request], list[Completion]]:
    """Greedy requests and the plain engine's completions of them."""
    reqs = [ask(p, max_tokens=30, temperature=0.0) for p in PROMPTS]
    return reqs, plain.generate(reqs)


def engine(target, draft: str, **kw) -> TorchEngine:
    return TorchEngine(*target, seed=0, draft=draft, **kw)


def ask(text: str, **kw) -> Request:
    return Request(messages=[{"role": "user", "content": text}], **kw)


def replay(model, c: Completion, temperature: float, top_p: float):
    """Per generated token: (its log-prob renormalised over the nucleus, the nucleus in id order), from one
    plain forward of the target over prompt and tokens."""
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
    for row, token in zip(torch.log_softmax(logits / temperature, dim=-1), c.token_ids, strict=True):
        probs, order = row.exp().sort(descending=True)
        kept = order[torch.cumsum(probs, 0) - probs < top_p]
        yield (row[token] - torch.logsumexp(row[kept], 0)).item(), sorted(kept.tolist())


# ------------------------------------------------------------------------------------ the decision alone


def total_variation(samples: torch.Tensor, p: torch.Tensor) -> float:
    freq = torch.bincount(samples, minlength=p.numel()).double() / samples.numel()
    return 0.5 * (freq - p.double()).abs().sum().item()


def test_the_emitted_tokens_follow_p_whatever_q():
    # p zero where top-p dropped tokens (ids 4, 5); q puts mass there and misses id 3
    p = torch.tensor(
        [
            [0.50, 0.20, 0.20, 0.10, 0.00, 0.00],
            [0.05, 0.60, 0.00, 0.35, 0.00, 0.00],
            [0.25, 0.25, 0.25, 0.25, 0.00, 0.00],
        ]
    )
    q = torch.tensor([[0.10, 0.40, 0.10, 0.00, 0.30, 0.10], [0.30, 0.30, 0.30, 0.00, 0.05, 0.05]])
    n, k = 200_000, 2
    g = torch.Generator().manual_seed(0)
    proposed = pick(q.expand(n, k, 6), torch.rand((n, k), generator=g))
    accepted, token = speculate(
        p.expand(n, 3, 6), q.expand(n, k, 6), proposed, torch.rand((n, k + 1), generator=g)
    )
    emitted = torch.cat([proposed, torch.zeros((n, 1), dtype=torch.long)], dim=1)
    emitted[torch.arange(n), accepted] = token  # row i: the round's tokens, then padding
    assert not torch.isin(emitted[:, 0], torch.tensor([4, 5])).any()
    assert total_variation(emitted[:, 0], p[0]) < 0.01
    # the second token exists when the first proposal was accepted, and is drawn from p_1 then
    assert total_variation(emitted[accepted >= 1, 1], p[1]) < 0.01
    assert total_variation(emitted[accepted == 2, 2], p[2]) < 0.015
    # the first proposal is accepted with probability sum(min(p, q))
    assert math.isclose(
        (accepted >= 1).double().mean().item(), torch.minimum(p[0], q[0]).sum().item(), abs_tol=0.005
    )


def test_point_masses_accept_exactly_the_argmax():
    p = torch.eye(4)[[2, 1, 3]]  # the target's argmaxes: 2, 1, then 3
    q = torch.eye(4)[[2, 0]]  # the draft agrees on the first only
    accepted, token = speculate(p, q, torch.tensor([2, 0]), torch.tensor([0.99, 0.0, 0.5]))
    assert (accepted.item(), token.item()) == (1, 1)
    accepted, token = speculate(p, p[:2], torch.tensor([2, 1]), torch.tensor([0.99, 0.99, 0.99]))
    assert (accepted.item(), token.item()) == (2, 3)
    accepted, token = speculate(p, p[:0], torch.empty(0, dtype=torch.long), torch.tensor([0.3]))
    assert (accepted.item(), token.item()) == (0, 2)  # k = 0: plain sampling from p_0


# ---------------------------------------------------------------------------------------- the engine


@pytest.mark.parametrize(
    "draft,packed",
    [
        ("layers:1", False),
        ("layers:3", False),
        ("layers:4", False),
        ("random", False),
        ("lookup", False),
        ("layers:3", True),
        ("random", True),
    ],
)
def test_greedy_tokens_are_the_plain_engines(target, greedy, random_draft, draft, packed, monkeypatch):
    if packed:  # the target and draft multiply by packed matrices (too small to be packed by default)
        monkeypatch.setattr(fastllama, "PACK_MIN_HIDDEN", 0)
    spec = engine(target, random_draft if draft == "random" else draft, draft_tokens=3)
    assert spec.weights.pack == packed
    seen: list[int] = []
    reqs, wanted = [copy.copy(r) for r in greedy[0]], greedy[1]
    reqs[0].on_token = seen.append
    for want, got in zip(wanted, spec.generate(reqs), strict=True):
        assert got.error is None
        assert got.token_ids == want.token_ids and got.text == want.text
        assert got.finish_reason == want.finish_reason
        assert got.logprobs == [0.0] * len(got.token_ids) and got.kept == [[t] for t in got.token_ids]
    assert seen == wanted[0].token_ids  # streamed token by token, as the plain loop does
    stats = spec.spec_stats
    assert stats["tokens"] >= sum(len(c.token_ids) for c in wanted)
    if draft != "random":  # the random draft's argmax is hardly ever the target's
        assert stats["target_steps"] < stats["tokens"]  # some round emitted more than one token
    if draft == "layers:4":  # the target itself: every proposal is its argmax
        assert stats["accepted"] == stats["proposed"] > 0


@pytest.mark.parametrize(
    "draft,temperature,top_p,binned",
    [
        ("layers:2", 1.0, 0.9, False),
        ("layers:2", 0.7, 1.0, False),
        ("layers:2", 1.3, 0.95, True),
        ("random", 1.0, 0.9, False),
        ("random", 0.7, 1.0, False),
    ],
)
def test_sampled_logprobs_and_kept_sets_are_the_targets(
    target, random_draft, draft, temperature, top_p, binned, monkeypatch
):
    if binned:  # nuclei wider than a top-4 are found by `wide_nucleus`, for p and q alike
        monkeypatch.setattr(sampling, "TOPK_FIRST", 4)
    spec = engine(target, random_draft if draft == "random" else draft)
    reqs = [
        ask(p, max_tokens=24, temperature=temperature, top_p=top_p, seed=i) for i, p in enumerate(PROMPTS)
    ]
    for c in spec.generate(reqs):
        assert c.error is None and len(c.token_ids) == len(c.logprobs) == len(c.kept) > 0
        for token, lp, kept, (ref_lp, ref_kept) in zip(
            c.token_ids, c.logprobs, c.kept, replay(target[0], c, temperature, top_p), strict=True
        ):
            assert token in ref_kept
            assert math.isclose(lp, ref_lp, abs_tol=2e-4)
            assert kept == (None if top_p >= 1 else ref_kept)
    stats = spec.spec_stats
    assert stats["accepted"] < stats["proposed"]  # rejections resampled from the residual
    if draft != "random":  # the random draft's proposals are hardly ever in the target's nucleus
        assert stats["accepted"] > 0


def test_seeded_requests_are_reproducible_with_the_same_draft(target):
    req = ask(PROMPTS[0], max_tokens=24, temperature=1.0, top_p=0.95, seed=7)
    first = engine(target, "layers:2").generate([req])[0]
    assert engine(target, "layers:2").generate([req])[0].token_ids == first.token_ids
    other = ask(PROMPTS[0], max_tokens=24, temperature=1.0, top_p=0.95, seed=8)
    assert engine(target, "layers:2").generate([other])[0].token_ids != first.token_ids


@pytest.mark.parametrize("draft", ["layers:4", "lookup:1"])
def test_limits_and_stops_cut_a_multi_token_round(target, plain, draft):
    spec = engine(target, draft, draft_tokens=8)  # greedy: `layers:4` rounds emit up to 9 tokens
    base = plain.generate([ask("hello", max_tokens=40, temperature=0.0)])[0]
    short = spec.generate([ask("hello", max_tokens=5, temperature=0.0)])[0]
    assert (short.finish_reason, short.token_ids) == ("length", base.token_ids[:5])

    full = plain.tokenizer.decode(base.token_ids, skip_special_tokens=True)
    stop = full[10:13]
    req = ask("hello", max_tokens=40, temperature=0.0, stop=[stop])
    want, got = plain.generate([req])[0], spec.generate([req])[0]
    assert got.finish_reason == "stop" and got.text == full[: full.index(stop)] == want.text
    assert got.token_ids == want.token_ids and len(got.token_ids) < len(base.token_ids)

    eos = base.token_ids[6]
    stopped = TorchEngine(*target, eos_ids=[eos], draft=draft, draft_tokens=8)
    got = stopped.generate([ask("hello", max_tokens=40, temperature=0.0)])[0]
    assert got.finish_reason == "stop" and got.token_ids == base.token_ids[: base.token_ids.index(eos) + 1]

    room = len(base.prompt_ids) + 7
    tight = TorchEngine(*target, max_context=room, draft=draft, draft_tokens=8)
    got = tight.generate([ask("hello", max_tokens=40, temperature=0.0)])[0]
    assert (got.finish_reason, got.token_ids) == ("context", base.token_ids[:7])


@pytest.mark.parametrize("draft", ["layers:2", "lookup"])
def test_a_next_turn_prefills_from_the_targets_stored_prefix(target, plain, draft):
    spec = engine(target, draft)
    first = [{"role": "user", "content": PROMPTS[0]}]
    answer = spec.generate([Request(first, max_tokens=20, temperature=0.0)])[0]
    turn = [*first, {"role": "assistant", "content": answer.text}, {"role": "user", "content": "and now?"}]
    got = spec.generate([Request(turn, max_tokens=20, temperature=0.0)])[0]
    assert spec.prefix_store is not None and spec.prefix_store.hits == 1
    assert got.token_ids == plain.generate([Request(turn, max_tokens=20, temperature=0.0)])[0].token_ids


def test_a_lookup_continues_the_latest_occurrence_of_the_longest_tail():
    ctx = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3])
    assert continuation(ctx, 3, 2) == [7, 8]  # (1, 2, 3) last occurred before 7, 8
    assert continuation(ctx, 3, 10) == [7, 8, 4, 1, 2, 3]  # at most to the end of the context
    assert continuation(np.array([4, 6, 4, 9, 6]), 3, 2) == [4, 9]  # no (9, 6) nor (4, 9, 6): the last 6
    assert continuation(np.array([1, 2, 3]), 3, 4) == []  # nothing occurs twice
    assert continuation(np.array([7]), 3, 4) == []


def test_lookup_drafts_what_the_context_repeats_and_stays_exact(target, plain):
    first = [{"role": "user", "content": PROMPTS[0]}]
    answer = plain.generate([Request(first, max_tokens=60, temperature=0.0)])[0]
    turn = [*first, {"role": "assistant", "content": answer.text}, {"role": "user", "content": "exit code 1"}]
    spec = engine(target, "lookup")
    greedy = Request(turn, max_tokens=48, temperature=0.0)
    assert spec.generate([greedy])[0].token_ids == plain.generate([greedy])[0].token_ids
    sampled = [Request(turn, max_tokens=48, temperature=1.0, top_p=0.9, seed=i) for i in range(3)]
    for c in spec.generate(sampled):
        assert c.error is None and len(c.token_ids) == len(c.logprobs) == len(c.kept) > 0
        for token, lp, kept, (ref_lp, ref_kept) in zip(
            c.token_ids, c.logprobs, c.kept, replay(target[0], c, 1.0, 0.9), strict=True
        ):
            assert token in ref_kept and kept == ref_kept
            assert math.isclose(lp, ref_lp, abs_tol=2e-4)
    stats = spec.spec_stats
    assert 0 < stats["accepted"] <= stats["proposed"]  # the answer's command comes again


def test_a_lookup_batch_decides_each_row_as_if_alone(target, plain):
    """One generate call, one batch: greedy rows give the plain engine's tokens whatever their neighbours
    propose, and each seeded row samples what it samples alone, with the target's log-probs and kept sets,
    at its own temperature and top-p; rows leave the batch at their limits, stops and context."""
    first = [{"role": "user", "content": PROMPTS[0]}]
    answer = plain.generate([Request(first, max_tokens=60, temperature=0.0)])[0]
    turn = [*first, {"role": "assistant", "content": answer.text}, {"role": "user", "content": "exit code 1"}]
    base = plain.generate([ask("hello", max_tokens=40, temperature=0.0)])[0]
    full = plain.tokenizer.decode(base.token_ids, skip_special_tokens=True)
    greedy = [
        Request(turn, max_tokens=40, temperature=0.0),
        ask("hello", max_tokens=5, temperature=0.0),
        ask("hello", max_tokens=40, temperature=0.0, stop=[full[10:13]]),
        ask(PROMPTS[1], max_tokens=30, temperature=0.0),
    ]
    sampled = [
        Request(turn, max_tokens=32, temperature=1.0, top_p=0.9, seed=1),
        Request(turn, max_tokens=20, temperature=0.7, top_p=1.0, seed=2),
        ask(PROMPTS[2], max_tokens=24, temperature=1.3, top_p=0.95, seed=3),
    ]
    spec = engine(target, "lookup", draft_tokens=4)
    together = spec.generate([*greedy, *sampled])
    for got, want in zip(together[: len(greedy)], plain.generate(greedy), strict=True):
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    for req, got in zip(sampled, together[len(greedy) :], strict=True):
        alone = engine(target, "lookup", draft_tokens=4).generate([req])[0]
        assert got.token_ids == alone.token_ids and got.finish_reason == alone.finish_reason
        refs = replay(target[0], got, req.temperature, req.top_p)
        for token, lp, kept, (ref_lp, ref_kept) in zip(
            got.token_ids, got.logprobs, got.kept, refs, strict=True
        ):
            assert token in ref_kept and math.isclose(lp, ref_lp, abs_tol=2e-4)
            assert kept == (None if req.top_p >= 1 else ref_kept)
    stats = spec.spec_stats
    assert 0 < stats["accepted"] <= stats["proposed"] and stats["target_steps"] < stats["tokens"]


def test_unusable_drafts_are_refused(target, tmp_path):
    other = build_tiny_model(
        tmp_path / "other", ["def f(x):\n    return x\n"] * 10, vocab_size=300, hidden=32, layers=1
    )
    with pytest.raises(FlywheelError, match="its vocabulary is not the target's"):
        engine(target, str(other))
    with pytest.raises(FlywheelError, match="the target has 4 decoder layers"):
        engine(target, "layers:5")
    with pytest.raises(FlywheelError, match="use layers:N"):
        engine(target, "layers:half")
    with pytest.raises(FlywheelError, match="use lookup or lookup:N"):
        engine(target, "lookup:two")
    with pytest.raises(FlywheelError, match="at least 1 token"):
        engine(target, "lookup:0")
    with pytest.raises(FlywheelError, match="needs the fast Llama forward"):
        engine(target, "layers:2", fast=False)


def test_a_runs_model_config_names_the_draft():
    from flywheel.rl.config import RunConfig
    from flywheel.rl.train import load_engine

    cfg = RunConfig()
    cfg.model.path, cfg.model.device, cfg.model.draft, cfg.model.draft_tokens = (
        "toybugs-sweep",
        "cpu",
        "layers:2",
        3,
    )
    engine = load_engine(cfg)
    assert (engine.draft.config.num_hidden_layers, engine.draft_tokens) == (2, 3)
    assert engine.model.config.num_hidden_layers == 4  # the view changed its own config only
