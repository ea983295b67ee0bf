"""The hand-written Llama forward against the HF model's own, and the engine with it on and off."""

from __future__ import annotations

import copy

import pytest
import torch

from flywheel.models import fastllama
from flywheel.models.hf import load_hf
from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import TorchEngine
from flywheel.protocols import Request

CORPUS = ["def add(a, b):\n    return a + b\n", "class Stack:\n    def push(self, x):\n        pass\n"] * 10
ATOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", CORPUS, vocab_size=300, hidden=64, layers=2
    )
    return load_hf(path)


@pytest.fixture(scope="module")
def gqa_model():
    """A random Llama with grouped-query attention (3 query heads per KV head) and biases, like SmolLM2's GQA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        attention_bias=True,
        tie_word_embeddings=False,
        rope_theta=100000.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return LlamaForCausalLM(cfg).eval()


def left_padded(
    lengths: list[int], vocab: int, seed: int = 0, shared: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of `lengths`, left-padded; the first `shared` tokens are the same in every row."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    head = torch.randint(3, vocab, (shared,), generator=g)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(3, vocab, (n,), generator=g)
        ids[row, width - n : width - n + shared] = head
        mask[row, width - n :] = 1
    return ids, mask


def hf_last_logits(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("which,shared", [("tiny", 0), ("gqa", 0), ("tiny", 5), ("gqa", 5)])
def test_prefill_and_decode_logits_match_hf(which, shared, packed, tiny, gqa_model):
    model = tiny[0] if which == "tiny" else gqa_model
    assert fastllama.unsupported(model) is None
    mats = fastllama.pack_weights(model) if packed else None
    vocab = model.config.vocab_size
    lengths = [9, 4, 1, 7] if not shared else [9, 6, 7, 12]
    ids, mask = left_padded(lengths, vocab, shared=shared)
    assert fastllama.common_prefix(ids, mask) == (shared or 0)
    cache = fastllama.new_cache(model, ids.shape[0], capacity=ids.shape[1] + 1)  # forces one growth below
    with torch.inference_mode():
        got = fastllama.prefill(model, cache, ids, mask, mats)
        torch.testing.assert_close(got, hf_last_logits(model, ids, mask), atol=ATOL, rtol=0)
        g = torch.Generator().manual_seed(3)
        for _ in range(5):  # decode steps against a fresh full forward over the whole sequence
            new = torch.randint(3, vocab, (ids.shape[0],), generator=g)
            cache = fastllama.reserve(cache, 1)
            got = fastllama.decode(model, cache, new, mats)
            ids = torch.cat([ids, new[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            torch.testing.assert_close(got, hf_last_logits(model, ids, mask), atol=ATOL, rtol=0)
    assert cache.capacity >= ids.shape[1] and cache.length == ids.shape[1]


def test_the_packed_matrices_are_remade_only_when_the_weights_change(gqa_model, monkeypatch):
    assert fastllama.packable(gqa_model) == "hidden size 96 < 512"  # too small to gain: never packed
    monkeypatch.setattr(fastllama, "PACK_MIN_HIDDEN", 0)
    cached = fastllama.WeightsCache(gqa_model)
    assert fastllama.packable(gqa_model) is None and cached.pack
    first = cached.refresh()
    assert first is not None and cached.refresh() is first  # unchanged weights: the same copies
    bias = gqa_model.model.layers[1].self_attn.k_proj.bias
    saved = bias.detach().clone()
    try:
        bias.data.add_(0.25)  # not seen by the version counter; the sums see it
        second = cached.refresh()
        assert second is not first
        ids, mask = left_padded([5, 3], gqa_model.config.vocab_size, seed=6)
        with torch.inference_mode():
            got = fastllama.prefill(gqa_model, fastllama.new_cache(gqa_model, 2, 8), ids, mask, second)
            torch.testing.assert_close(got, hf_last_logits(gqa_model, ids, mask), atol=ATOL, rtol=0)
    finally:
        bias.data.copy_(saved)
    assert fastllama.WeightsCache(gqa_model, pack=False).refresh() is None
    assert fastllama.packable(copy.deepcopy(gqa_model).half()) == "dtype torch.float16"


def test_engine_tokens_are_the_same_with_and_without_packed_matrices(tiny, monkeypatch):
    monkeypatch.setattr(fastllama, "PACK_MIN_HIDDEN", 0)
    model, tokenizer = tiny
    packed = TorchEngine(model, tokenizer, eos_ids=[], prefix_cache_mb=0)
    plain = TorchEngine(model, tokenizer, eos_ids=[], prefix_cache_mb=0, pack=False)
    assert packed.weights.pack and not plain.weights.pack
    sampled = [
        Request(messages=r.messages, max_tokens=8, temperature=1.0, top_p=0.9, seed=i)
        for i, r in enumerate(requests())
    ]
    for a, b in zip(packed.generate(sampled), plain.generate(sampled), strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_select_rows_keeps_the_kept_rows_exact(gqa_model):
    ids, mask = left_padded([6, 3, 5], gqa_model.config.vocab_size, seed=2)
    with torch.inference_mode():
        full = fastllama.new_cache(gqa_model, 3, 16)
        fastllama.prefill(gqa_model, full, ids, mask)
        kept = fastllama.select_rows(full, torch.tensor([2, 0]))
        nxt = torch.tensor([5, 7])
        got = fastllama.decode(gqa_model, kept, nxt)
        alone = fastllama.new_cache(gqa_model, 2, 16)
        fastllama.prefill(gqa_model, alone, ids[[2, 0]], mask[[2, 0]])
        want = fastllama.decode(gqa_model, alone, nxt)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_non_llama_models_are_refused(tiny):
    model = tiny[0]
    assert "not LlamaForCausalLM" in fastllama.unsupported(model.model)


def requests() -> list[Request]:
    texts = ["hi", "def add(a, b):" * 3, "class Stack: " * 6, "x"]
    return [
        Request(messages=[{"role": "user", "content": t}], max_tokens=10 + 3 * i, temperature=0.0)
        for i, t in enumerate(texts)
    ]


def test_engine_greedy_tokens_same_with_fast_path_on_and_off(tiny):
    model, tokenizer = tiny
    fast = TorchEngine(model, tokenizer, eos_ids=[])
    slow = TorchEngine(model, tokenizer, eos_ids=[], fast=False)
    assert fast.fast and fast.slow_reason is None
    assert not slow.fast and slow.slow_reason == "disabled"
    for a, b in zip(fast.generate(requests()), slow.generate(requests()), strict=True):
        assert a.error is None and a.finish_reason == "length"
        assert a.token_ids == b.token_ids and a.text == b.text


def test_fast_engine_is_deterministic_and_sees_in_place_weight_updates(tiny):
    model, tokenizer = tiny
    engine = TorchEngine(model, tokenizer, eos_ids=[])
    sampled = [
        Request(messages=r.messages, max_tokens=8, temperature=1.0, top_p=0.9, seed=i)
        for i, r in enumerate(requests())
    ]
    first = engine.generate(sampled)
    again = engine.generate(sampled)
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    for a, f in zip(
        again, first, strict=True
    ):  # the second call reuses stored keys and values: equal up to rounding
        assert a.logprobs == pytest.approx(f.logprobs, abs=1e-5)
    weight = model.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():  # what an optimizer step does: the same parameter tensor, new values
            weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
        after = engine.generate(sampled)
        reference = TorchEngine(model, tokenizer, eos_ids=[], fast=False).generate(sampled)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert [c.logprobs for c in after] != [c.logprobs for c in first]
    assert [c.token_ids for c in after] == [c.token_ids for c in reference]
    for a, r in zip(after, reference, strict=True):
        assert a.logprobs == pytest.approx(r.logprobs, abs=1e-4)


def test_identical_prompts_are_computed_once_with_the_same_results(gqa_model):
    ids, mask = left_padded([6, 3, 5], gqa_model.config.vocab_size, seed=4)
    rows = torch.tensor([0, 1, 0, 2, 0, 1])
    with torch.inference_mode():
        cache, got = fastllama.prefill_unique(gqa_model, ids[rows], mask[rows], capacity=16)
        assert cache.k.shape[1] == 6 and cache.capacity == 16
        torch.testing.assert_close(got, hf_last_logits(gqa_model, ids[rows], mask[rows]), atol=ATOL, rtol=0)
        nxt = torch.arange(6) + 3
        got = fastllama.decode(gqa_model, cache, nxt)
        full = torch.cat([ids[rows], nxt[:, None]], dim=1)
        full_mask = torch.cat([mask[rows], torch.ones_like(mask[rows][:, :1])], dim=1)
        torch.testing.assert_close(got, hf_last_logits(gqa_model, full, full_mask), atol=ATOL, rtol=0)


def test_prefill_after_stored_prefixes_matches_a_full_prefill(gqa_model, monkeypatch):
    """Rows with stored prefixes of different lengths (and one without) give the full prompts' logits."""
    empty = fastllama.new_cache

    def poisoned(*args, **kw):  # fresh memory may hold anything: NaN in an unwritten column must not leak
        cache = empty(*args, **kw)
        cache.k.fill_(float("nan"))
        cache.v.fill_(float("nan"))
        return cache

    monkeypatch.setattr(fastllama, "new_cache", poisoned)
    ids, mask = left_padded([9, 7, 6], gqa_model.config.vocab_size, seed=5)
    prompts = [row[m.bool()] for row, m in zip(ids, mask, strict=True)]
    held = [5, 0, 2]  # tokens of each prompt already in the store
    with torch.inference_mode():
        stored = []
        for p, n in zip(prompts, held, strict=True):
            if not n:
                stored.append(None)
                continue
            one = fastllama.new_cache(gqa_model, 1, n)
            fastllama.prefill(gqa_model, one, p[None, :n], torch.ones((1, n), dtype=torch.long))
            stored.append(fastllama.row_kv(one, 0))
        cache = fastllama.cache_from(gqa_model, stored, capacity=20)
        rest, rest_mask = torch.zeros((3, 7), dtype=torch.long), torch.zeros((3, 7), dtype=torch.long)
        for j, (p, n) in enumerate(zip(prompts, held, strict=True)):
            rest[j, 7 - (len(p) - n) :], rest_mask[j, 7 - (len(p) - n) :] = p[n:], 1
        got = fastllama.prefill_after(gqa_model, cache, rest, rest_mask)
        torch.testing.assert_close(got, hf_last_logits(gqa_model, ids, mask), atol=ATOL, rtol=0)
        nxt = torch.tensor([4, 5, 6])
        got = fastllama.decode(gqa_model, cache, nxt)
        full = torch.cat([ids, nxt[:, None]], dim=1)
        full_mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        torch.testing.assert_close(got, hf_last_logits(gqa_model, full, full_mask), atol=ATOL, rtol=0)


def test_prefix_store_finds_the_longest_match_and_keeps_within_its_bytes():
    kv = lambda n: (torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4))  # noqa: E731  16 bytes a token each
    store = fastllama.PrefixStore(max_bytes=32 * 50, min_tokens=3)
    store.add(list(range(10)), *kv(10))
    store.add(list(range(5)) + [99] * 5, *kv(10))
    n, got = store.lookup(list(range(8)) + [7, 7])
    assert n == 8 and got[0].shape[2] == 8
    assert store.lookup(list(range(10)))[0] == 9  # at least one token is left to prefill
    assert store.lookup([1, 2, 3, 4]) == (0, None)  # no common prefix
    assert store.lookup([0, 1, 50]) == (0, None)  # shorter than min_tokens
    store.add(list(range(20)), *kv(20))  # extends the first entry, which goes
    assert [len(e[0]) for e in store.entries] == [10, 20]
    store.add(list(range(100, 130)), *kv(30))  # over 50 tokens: the oldest go
    assert [len(e[0]) for e in store.entries] == [20, 30]


def _turns(engine, first: list[Request], answers) -> list[Request]:
    return [
        Request(
            messages=r.messages
            + [
                {"role": "assistant", "content": a.text},
                {"role": "user", "content": f"exit code {i}\nok " * 3},
            ],
            max_tokens=10,
            temperature=1.0,
            top_p=0.9,
            seed=50 + i,
        )
        for i, (r, a) in enumerate(zip(first, answers, strict=True))
    ]


def test_a_next_turn_reuses_the_stored_sequence_and_samples_the_same(tiny):
    model, tokenizer = tiny
    engine = TorchEngine(model, tokenizer)
    plain = TorchEngine(model, tokenizer, prefix_cache_mb=0)
    assert plain.prefix_store is None
    first = [
        Request(
            messages=[
                {"role": "system", "content": "You fix bugs. " * 4},
                {"role": "user", "content": f"task {i}: def add(a, b):"},
            ],
            max_tokens=12,
            temperature=1.0,
            top_p=0.9,
            seed=i,
        )
        for i in range(4)
    ]
    answers = engine.generate(first)
    assert engine.prefix_store.hits == 0 and len(engine.prefix_store.entries) == 4
    second = _turns(engine, first, answers)
    got, want = engine.generate(second), plain.generate(second)
    assert engine.prefix_store.hits == 4 and engine.prefix_store.reused >= sum(
        len(a.prompt_ids) for a in answers
    )
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids and g.kept == w.kept and g.prompt_ids == w.prompt_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_the_prefix_store_is_emptied_when_the_weights_change_by_any_path(tiny):
    model, tokenizer = tiny
    engine = TorchEngine(model, tokenizer)
    first = [Request(messages=[{"role": "user", "content": "def add(a, b): " * 4}], max_tokens=8, seed=1)]
    answers = engine.generate(first)
    weight = model.model.layers[1].self_attn.o_proj.weight
    saved = weight.detach().clone()
    try:
        weight.data.add_(0.5)  # bypasses the version counter: the sums still see it
        got = engine.generate(_turns(engine, first, answers))
        want = TorchEngine(model, tokenizer, prefix_cache_mb=0).generate(_turns(engine, first, answers))
    finally:
        weight.data.copy_(saved)
    assert engine.prefix_store.hits == 0
    assert got[0].token_ids == want[0].token_ids and got[0].logprobs == pytest.approx(
        want[0].logprobs, abs=1e-4
    )


def test_without_the_prefix_store_a_repeated_call_is_bitwise_the_same(tiny):
    model, tokenizer = tiny
    engine = TorchEngine(model, tokenizer, eos_ids=[], prefix_cache_mb=0)
    sampled = [
        Request(messages=r.messages, max_tokens=8, temperature=1.0, top_p=0.9, seed=i)
        for i, r in enumerate(requests())
    ]
    first, again = engine.generate(sampled), engine.generate(sampled)
    assert [c.logprobs for c in again] == [c.logprobs for c in first]
