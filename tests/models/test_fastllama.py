"""The hand-written Llama forward against the HF model's own, and the engine with it on and off."""

from __future__ import annotations

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


@pytest.mark.parametrize("which,shared", [("tiny", 0), ("gqa", 0), ("tiny", 5), ("gqa", 5)])
def test_prefill_and_decode_logits_match_hf(which, shared, tiny, gqa_model):
    model = tiny[0] if which == "tiny" else gqa_model
    assert fastllama.unsupported(model) is None
    vocab = model.config.vocab_size
    lengths = [9, 4, 1, 7] if not shared else [9, 6, 7, 12]
    ids, mask = left_padded(lengths, vocab, shared=shared)
    assert fastllama.common_prefix(ids, mask) == (shared or 0)
    cache = fastllama.new_cache(model, ids.shape[0], capacity=ids.shape[1] + 1)  # forces one growth below
    with torch.inference_mode():
        got = fastllama.prefill(model, cache, ids, mask)
        torch.testing.assert_close(got, hf_last_logits(model, ids, mask), atol=ATOL, rtol=0)
        g = torch.Generator().manual_seed(3)
        for _ in range(5):  # decode steps against a fresh full forward over the whole sequence
            new = torch.randint(3, vocab, (ids.shape[0],), generator=g)
            cache = fastllama.reserve(cache, 1)
            got = fastllama.decode(model, cache, new)
            ids = torch.cat([ids, new[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            torch.testing.assert_close(got, hf_last_logits(model, ids, mask), atol=ATOL, rtol=0)
    assert cache.capacity >= ids.shape[1] and cache.length == ids.shape[1]


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
    assert [c.logprobs for c in again] == [c.logprobs for c in first]
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
