"""The torch engine on a tiny random Llama: batching, replay data (log-probs, kept sets), stopping, limits."""

from __future__ import annotations

import math

import pytest
import torch

from flywheel.models import sampling, torch_engine
from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import (
    TorchEngine,
    cut_at_stop,
    fallback_template,
    load_torch_model,
    render_prompt,
)
from flywheel.protocols import Completion, Model, Request

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def push(self, x):\n        self.items.append(x)\n",
    "The quick brown fox jumps over the lazy dog. ",
    "for i in range(10):\n    print(i * i)\n",
] * 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", CORPUS, vocab_size=400, hidden=64, layers=2
    )


@pytest.fixture(scope="module")
def engine(model_dir) -> TorchEngine:
    return load_torch_model(f"hf:{model_dir}", seed=0)


def ask(text: str, **kw) -> Request:
    return Request(messages=[{"role": "user", "content": text}], **kw)


PROMPTS = ["hi", "def add(a, b):" * 3, "print", "class Stack: " * 7, "x"]


def reference_logprobs(engine: TorchEngine, c: Completion, temperature: float, top_p: float):
    """Per generated position: (renormalised log-probs over the nucleus, the nucleus) from one full forward."""
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0].float()
    start = len(c.prompt_ids) - 1
    out = []
    for i in range(len(c.token_ids)):
        logp = torch.log_softmax(logits[start + i] / temperature, dim=-1)
        order = torch.argsort(logp, descending=True)
        probs = logp[order].exp()
        before = torch.cumsum(probs, 0) - probs
        kept = order[before < top_p]
        renorm = logp[kept] - torch.logsumexp(logp[kept], 0)
        out.append((dict(zip(kept.tolist(), renorm.tolist(), strict=True)), sorted(kept.tolist())))
    return out


def test_engine_is_a_model(engine):
    assert isinstance(engine, Model)
    assert engine.name.startswith("hf:")


def test_batch_equals_single_greedy(engine):
    reqs = [ask(p, max_tokens=12, temperature=0.0) for p in PROMPTS]
    batched = engine.generate(reqs)
    for req, b in zip(reqs, batched, strict=True):
        alone = engine.generate([req])[0]
        assert alone.token_ids == b.token_ids
        assert alone.prompt_ids == b.prompt_ids
        assert b.kept == [[t] for t in b.token_ids]
        assert b.logprobs == [0.0] * len(b.token_ids)


def test_prompt_ids_are_the_rendered_template(engine):
    c = engine.generate([ask("hello there", max_tokens=1)])[0]
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello there"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert c.prompt_ids == engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert c.prompt_tokens == len(c.prompt_ids)


@pytest.mark.parametrize("wide", [False, True, "binned"])
@pytest.mark.parametrize("temperature,top_p", [(0.8, 0.9), (1.0, 1.0), (1.3, 0.5)])
def test_logprobs_and_kept_match_a_full_forward(engine, temperature, top_p, wide, monkeypatch):
    if wide:  # every kept set takes the path for nuclei wider than WIDE_NUCLEUS
        monkeypatch.setattr(torch_engine, "WIDE_NUCLEUS", 0)
    if wide == "binned":  # nuclei wider than a top-4 are found by `wide_nucleus`, not a sort
        monkeypatch.setattr(sampling, "TOPK_FIRST", 4)
    reqs = [
        ask(p, max_tokens=10, temperature=temperature, top_p=top_p, seed=i) for i, p in enumerate(PROMPTS)
    ]
    for c in engine.generate(reqs):
        assert c.error is None and len(c.logprobs) == len(c.token_ids) == len(c.kept) == c.completion_tokens
        for tok, lp, kept, (ref, ref_kept) in zip(
            c.token_ids, c.logprobs, c.kept, reference_logprobs(engine, c, temperature, top_p), strict=True
        ):
            assert tok in ref
            assert math.isclose(lp, ref[tok], abs_tol=2e-4)
            if top_p >= 1.0:
                assert kept is None
                assert len(ref_kept) == engine.model.config.vocab_size
            else:
                assert kept == ref_kept


def test_seeded_sampling_is_reproducible_across_batches(engine):
    req = ask("def add(a, b):", max_tokens=16, temperature=1.0, top_p=0.95, seed=7)
    alone = engine.generate([req])[0]
    mixed = engine.generate([ask("x", max_tokens=5, seed=1), req, ask("class Stack: " * 5, max_tokens=20)])[1]
    assert alone.token_ids == mixed.token_ids
    other = engine.generate([ask("def add(a, b):", max_tokens=16, temperature=1.0, top_p=0.95, seed=8)])[0]
    assert other.token_ids != alone.token_ids


def test_stop_string_cuts_text_and_keeps_tokens(engine):
    base = engine.generate([ask("print", max_tokens=24, temperature=0.0)])[0]
    full = engine.tokenizer.decode(base.token_ids, skip_special_tokens=True)
    stop = full[6:9]
    assert len(stop) == 3 and base.finish_reason == "length"
    got = engine.generate([ask("print", max_tokens=24, temperature=0.0, stop=[stop, "\x00never"])])[0]
    assert got.finish_reason == "stop"
    assert got.text == full[: full.index(stop)]
    n = len(got.token_ids)
    assert got.token_ids == base.token_ids[:n]
    assert stop in engine.tokenizer.decode(got.token_ids, skip_special_tokens=True)
    assert stop not in engine.tokenizer.decode(got.token_ids[:-1], skip_special_tokens=True)


def test_eos_stops_and_is_kept_in_tokens_only(model_dir):
    probe = load_torch_model(f"hf:{model_dir}", eos_ids=[])
    base = probe.generate([ask("hi", max_tokens=12, temperature=0.0)])[0]
    eos = base.token_ids[4]
    first = base.token_ids.index(eos)
    eng = load_torch_model(f"hf:{model_dir}", eos_ids=[eos])
    got = eng.generate([ask("hi", max_tokens=12, temperature=0.0)])[0]
    assert got.finish_reason == "stop"
    assert got.token_ids == base.token_ids[: first + 1]
    assert got.text == eng.tokenizer.decode(base.token_ids[:first], skip_special_tokens=True)


def test_context_limit(model_dir):
    plain = load_torch_model(f"hf:{model_dir}", eos_ids=[])
    n_prompt = plain.generate([ask("hi", max_tokens=0)])[0].prompt_tokens
    eng = load_torch_model(f"hf:{model_dir}", eos_ids=[], max_context=n_prompt + 5)
    cut, short, too_long = eng.generate(
        [ask("hi", max_tokens=50), ask("hi", max_tokens=3), ask("hi " * 40, max_tokens=50)]
    )
    assert (cut.finish_reason, cut.completion_tokens) == ("context", 5)
    assert (short.finish_reason, short.completion_tokens) == ("length", 3)
    assert too_long.finish_reason == "context"
    assert too_long.token_ids == [] and too_long.text == "" and too_long.prompt_tokens > n_prompt + 5


def test_errors_are_returned_not_raised(engine):
    bad = [ask("a", top_p=0.0), ask("a", temperature=-1.0), ask("a", max_tokens=-2)]
    bad.append(Request(messages=[None], max_tokens=2))  # type: ignore[list-item]  # a template cannot render it
    out = engine.generate([*bad, ask("fine", max_tokens=3, temperature=0.0)])
    for c in out[:4]:
        assert c.finish_reason == "error" and c.error
    assert out[4].error is None and out[4].completion_tokens == 3


def test_fallback_template_when_tokenizer_has_none(model_dir):
    eng = load_torch_model(f"hf:{model_dir}")
    eng.tokenizer.chat_template = None
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert fallback_template(msgs) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    ids = render_prompt(eng.tokenizer, Request(messages=msgs))
    assert eng.tokenizer.decode(ids) == fallback_template(msgs)
    assert eng.generate([Request(messages=msgs, max_tokens=2)])[0].completion_tokens == 2


def test_unknown_option_and_spec_are_refused(model_dir):
    from flywheel.errors import FlywheelError

    with pytest.raises(FlywheelError, match="unknown torch engine option"):
        load_torch_model(f"hf:{model_dir}", beams=4)
    with pytest.raises(FlywheelError, match="unknown torch model"):
        load_torch_model("gpt-9")


# ------------------------------------------------------------------------------------ sample_step alone


def test_cut_at_stop_takes_the_earliest():
    assert cut_at_stop("abc STOP def END", ["END", "STOP"]) == ("abc ", True)
    assert cut_at_stop("abc", ["x", ""]) == ("abc", False)
