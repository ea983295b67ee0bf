"""The families people start RL from, on tiny random models built from each family's `transformers` config
(`flywheel.models.tiny_families`): which forward the engine takes and why, greedy tokens against
`generate`, logits and log-probs against the HF forward, the prefix store and speculative decoding, the
trainer's replay against the engine, one RL step.

Bounds, measured on these models (largest difference over 12 sampled and 6 greedy requests per family,
1 thread, x86-64 CPU) and kept with a margin:
- fast forward against the HF forward, float32 logits: 1.8e-6 (LOGIT_ATOL 1e-4, the Llama path's bound);
- engine log-probs against one HF forward over prompt and tokens, float32: 1.9e-6 (F32_GAP 1e-4);
  bfloat16 (both sides bfloat16): 0.025 on the fast path, as much as the HF fallback's own (0.024, Mistral
  with a narrow window), where logits of a few units carry a bfloat16 step of 0.016 (BF16_GAP 0.1);
- the trainer's packed replay against the engine's log-probs at the same weights, float32: 1.9e-6
  (REPLAY_F32 1e-4); a bfloat16 engine against the bfloat16-autocast replay of the float32 master weights:
  0.047 (REPLAY_BF16 0.1).
Greedy tokens equal `generate`'s in float32; in bfloat16 the two round differently and part ways at near
ties, as the HF fallback does too (Mistral with a narrow window: 3 of 6 prompts agree with `generate`), so
they are not compared.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from test_fastllama import hf_last_logits, left_padded

from flywheel.errors import FlywheelError
from flywheel.models import fastllama
from flywheel.models.hf import load_hf, mixed
from flywheel.models.tiny_families import LLAMA3_ORIGINAL, build_family_model
from flywheel.models.torch_engine import TorchEngine
from flywheel.protocols import Completion, Request, Verdict
from flywheel.record import Trajectory
from flywheel.rl.config import RunConfig
from flywheel.rl.trainer import Trainer

TEXTS = ["<run_tests/>", '<view path="a.py"/>', "def f(x):\n    return x + 1\n", "1 failed, 2 passed"] * 10
PROMPTS = ["Fix the failing test in clamp.py", "hi", "Run the tests, then view the file. " * 3]
FAST = ["llama3", "mistral", "qwen2", "qwen2-untied", "qwen3"]
VARIANTS = {  # name: (family, config fields beyond the family's own)
    "qwen2-untied": ("qwen2", {"tie": False}),
    "mistral-window": ("mistral", {"sliding_window": 16}),  # narrower than the context: falls back
    "gemma2-wide": ("gemma2", {"sliding_window": 4096}),  # covers every turn: the replay may pack
    "gemma3-wide": ("gemma3", {"sliding_window": 4096}),
}
FALLBACK = {
    "gemma2": fastllama.NOT_TAKEN["Gemma2ForCausalLM"],
    "gemma3": fastllama.NOT_TAKEN["Gemma3ForCausalLM"],
    "mistral-window": "sliding window 16 < context 2048",
}
LOGIT_ATOL = F32_GAP = REPLAY_F32 = 1e-4
BF16_GAP = REPLAY_BF16 = 0.1


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    """`get(name)`: the directory of the tiny model `name` (a family, or a `VARIANTS` name), built once."""
    built = {}

    def get(name: str):
        if name not in built:
            family, fields = VARIANTS.get(name, (name, {}))
            built[name] = build_family_model(tmp_path_factory.mktemp(name) / "m", family, TEXTS, **fields)
        return built[name]

    return get


def ask(text: str, **kw) -> Request:
    return Request(messages=[{"role": "user", "content": text}], **kw)


def sampled(n: int = 6, max_tokens: int = 24) -> list[Request]:
    """Requests sampled at temperature 1 over the whole vocabulary: a log-prob is then the model's own."""
    return [ask(PROMPTS[i % 3] * (1 + i // 3), max_tokens=max_tokens, seed=i) for i in range(n)]


def forward_log_probs(model, c: Completion) -> torch.Tensor:
    """Log-probs of a completion's tokens from one HF forward over its prompt and tokens."""
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)]


# ---------------------------------------------------------------------------------------- which path


@pytest.mark.parametrize("name", FAST + list(FALLBACK))
def test_the_engine_says_which_path_each_family_takes(name, family_dir):
    model, tokenizer = load_hf(family_dir(name))
    engine = TorchEngine(model, tokenizer)
    assert engine.path == ("fast" if name in FAST else f"hf: {FALLBACK[name]}")
    assert (engine.prefix_store is not None) == (name in FAST)
    if name == "mistral-window":  # a window that covers the context the engine serves is taken
        assert TorchEngine(model, tokenizer, max_context=16).path == "fast"
    assert TorchEngine(model, tokenizer, fast=False).path == "hf: disabled"


def test_other_architectures_fall_back_naming_the_ones_taken(family_dir):
    model, _ = load_hf(family_dir("qwen3"))
    why = fastllama.unsupported(model.model)
    assert (
        why == "Qwen3Model is not LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM"
    )


def test_a_draft_is_refused_with_the_reason_the_fast_path_is_not_taken(family_dir):
    model, tokenizer = load_hf(family_dir("gemma2"))
    with pytest.raises(FlywheelError, match="needs the fast Llama forward \\(Gemma 2: soft-capped"):
        TorchEngine(model, tokenizer, draft="layers:1")


def test_the_llama3_rope_scaling_is_in_effect(family_dir):
    """The frequencies the fast forward reads are the scaled ones: below, logits are checked past the
    scaling's original context."""
    model, _ = load_hf(family_dir("llama3"))
    rope = model.model.rotary_emb
    d = model.model.layers[0].self_attn.head_dim
    plain = 1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d))
    assert rope.rope_type == "llama3" and fastllama.unsupported(model) is None
    scaled = ~torch.isclose(rope.inv_freq, plain)
    assert scaled.any() and not scaled.all()  # the low frequencies scaled, the highest kept


# ---------------------------------------------------------------------------------- against HF itself


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("name", FAST)
def test_prefill_and_decode_logits_match_the_hf_forward(name, packed, family_dir):
    model, _ = load_hf(family_dir(name))
    mats = fastllama.pack_weights(model) if packed else None
    lengths = [LLAMA3_ORIGINAL + 20, 40, LLAMA3_ORIGINAL + 5]  # past the llama3 scaling's original context
    ids, mask = left_padded(lengths, model.config.vocab_size, shared=6)
    cache = fastllama.new_cache(model, ids.shape[0], capacity=ids.shape[1] + 1)  # grows below
    with torch.inference_mode():
        got = fastllama.prefill(model, cache, ids, mask, mats)
        torch.testing.assert_close(got, hf_last_logits(model, ids, mask), atol=LOGIT_ATOL, rtol=0)
        g = torch.Generator().manual_seed(3)
        for _ in range(4):
            new = torch.randint(3, model.config.vocab_size, (ids.shape[0],), generator=g)
            cache = fastllama.reserve(cache, 1)
            got = fastllama.decode(model, cache, new, mats)
            ids = torch.cat([ids, new[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            torch.testing.assert_close(got, hf_last_logits(model, ids, mask), atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("name", FAST + list(FALLBACK))
def test_greedy_tokens_equal_generate(name, family_dir):
    """One batch whose rows end at different steps (the engine drops each from its cache), each against
    `generate` alone."""
    model, tokenizer = load_hf(family_dir(name))
    engine = TorchEngine(model, tokenizer, eos_ids=[])
    lengths = [20, 6, 13]
    reqs = [ask(p, max_tokens=n, temperature=0.0) for p, n in zip(PROMPTS, lengths, strict=True)]
    for c, n in zip(engine.generate(reqs), lengths, strict=True):
        ids = torch.tensor([c.prompt_ids])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                eos_token_id=None,
                pad_token_id=engine.pad_id,
            )
        assert c.finish_reason == "length" and c.token_ids == out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("dtype,bound", [("float32", F32_GAP), ("bfloat16", BF16_GAP)])
@pytest.mark.parametrize("name", FAST + list(FALLBACK))
def test_log_probs_match_the_hf_forward(name, dtype, bound, family_dir):
    model, tokenizer = load_hf(family_dir(name), dtype=getattr(torch, dtype))
    engine = TorchEngine(model, tokenizer, eos_ids=[], seed=0)
    gaps = [
        (forward_log_probs(model, c) - torch.tensor(c.logprobs)).abs() for c in engine.generate(sampled())
    ]
    assert float(torch.cat(gaps).max()) < bound


# ------------------------------------------------------------------------ prefix store, speculation


def next_turns(first: list[Request], answers: list[Completion]) -> list[Request]:
    """Each conversation with its answer and an observation: a prompt that starts with the stored sequence."""
    return [
        Request(
            messages=r.messages
            + [{"role": "assistant", "content": a.text}, {"role": "user", "content": "ok " * 4}],
            max_tokens=12,
            seed=50 + i,
        )
        for i, (r, a) in enumerate(zip(first, answers, strict=True))
    ]


@pytest.mark.parametrize("name", FAST)
def test_a_next_turn_through_the_prefix_store_samples_what_a_full_prefill_does(name, family_dir):
    model, tokenizer = load_hf(family_dir(name))
    engine = TorchEngine(model, tokenizer)
    plain = TorchEngine(model, tokenizer, prefix_cache_mb=0)
    first = sampled(4, max_tokens=12)
    second = next_turns(first, engine.generate(first))
    got, want = engine.generate(second), plain.generate(second)
    assert engine.prefix_store.hits == 4
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids and g.kept == w.kept
        assert g.logprobs == pytest.approx(w.logprobs, abs=F32_GAP)


@pytest.mark.parametrize("draft", ["layers:1", "lookup"])
@pytest.mark.parametrize("name", FAST)
def test_speculative_decoding_gives_the_plain_greedy_tokens(name, draft, family_dir):
    model, tokenizer = load_hf(family_dir(name))
    reqs = [ask(p * 2, max_tokens=24, temperature=0.0) for p in PROMPTS]
    want = TorchEngine(model, tokenizer, prefix_cache_mb=0).generate(reqs)
    spec = TorchEngine(model, tokenizer, draft=draft, draft_tokens=3)
    got = spec.generate(reqs)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert spec.spec_stats["proposed"] > 0


# --------------------------------------------------------------------------------------- the trainer


@pytest.mark.parametrize("dtype,bound", [("float32", REPLAY_F32), ("bfloat16", REPLAY_BF16)])
@pytest.mark.parametrize("name", [*FAST, "gemma2-wide", "gemma3-wide"])
def test_the_packed_replay_matches_the_engines_log_probs(name, dtype, bound, family_dir):
    """At the same weights: a float32 engine on the trainer's model, or a bfloat16 engine on a bfloat16
    copy with the replay under bfloat16 autocast (what a `dtype = "bfloat16"` run does)."""
    master, tokenizer = load_hf(family_dir(name))
    served = master if dtype == "float32" else copy.deepcopy(master).to(torch.bfloat16)
    out = TorchEngine(served, tokenizer, eos_ids=[], seed=0).generate(sampled())
    cfg = RunConfig()
    cfg.model.dtype = dtype
    trainer = Trainer(master, tokenizer, cfg, {})
    with torch.no_grad(), mixed(torch.device("cpu"), trainer.dtype):
        logits = trainer._packed_logits([{"prompt_ids": c.prompt_ids, "token_ids": c.token_ids} for c in out])
    tokens = torch.tensor([t for c in out for t in c.token_ids])
    replayed = torch.log_softmax(logits, -1)[torch.arange(len(tokens)), tokens]
    assert float((replayed - torch.tensor([x for c in out for x in c.logprobs])).abs().max()) < bound


def records_from(engine: TorchEngine, successes: list[bool]) -> list[Trajectory]:
    out = []
    for i, (c, ok) in enumerate(zip(engine.generate(sampled(len(successes))), successes, strict=True)):
        turn = {"role": "assistant", "text": c.text, "prompt_ids": c.prompt_ids, "token_ids": c.token_ids}
        turn |= {"logprobs": c.logprobs, "kept": c.kept}
        out.append(
            Trajectory(
                f"t/medium/{i}", "t", "medium", model="hf:x", turns=[turn], n_turns=1,
                completion_tokens=c.completion_tokens, success=ok, verdict=Verdict("t", success=ok),
            )
        )  # fmt: skip
    return out


def step(model, tokenizer, records: list[Trajectory], pack: bool) -> dict[str, float]:
    cfg = RunConfig()
    cfg.optim.kind, cfg.optim.lr, cfg.objective.pack = "adamw", 1e-2, pack
    metrics, _ = Trainer(model, tokenizer, cfg, {"medium": 0.0}).step(records)
    return metrics


def test_one_rl_step_on_qwen3_updates_the_weights_the_fast_engine_serves(family_dir):
    model, tokenizer = load_hf(family_dir("qwen3"))
    engine = TorchEngine(model, tokenizer, eos_ids=[], seed=0)
    records = records_from(engine, [True, False, False, True])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = step(model, tokenizer, records, pack=True)
    assert metrics["grad_norm"] > 0 and metrics["train_tokens"] == 4 * 24
    assert abs(metrics["is_weight_mean"] - 1) < 1e-4  # the replay saw the engine's own log-probs
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("q_norm" in k for k in moved) and any("k_norm" in k for k in moved)
    after = engine.generate(sampled())
    reference = TorchEngine(model, tokenizer, eos_ids=[], seed=0, fast=False).generate(sampled())
    assert engine.path == "fast"
    for a, r in zip(after, reference, strict=True):
        assert a.token_ids == r.token_ids and a.logprobs == pytest.approx(r.logprobs, abs=F32_GAP)


@pytest.mark.parametrize("name", ["mistral-window", "gemma2"])
def test_a_sliding_window_shorter_than_the_turns_is_replayed_as_the_model_masks_it(name, family_dir):
    """The tree mask has no window: with turns longer than the window the step replays padded, so packing
    on and off give the same update; the replay is the engine's (the model's own forward)."""
    model, tokenizer = load_hf(family_dir(name))
    records = records_from(TorchEngine(model, tokenizer, eos_ids=[], seed=0), [True, False, False, True])
    assert min(len(r.turns[0]["prompt_ids"]) for r in records) > fastllama.attention_window(model.config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    runs = []
    for pack in (True, False):
        model.load_state_dict(state)
        runs.append(step(model, tokenizer, records, pack))
    assert runs[0]["loss"] == pytest.approx(runs[1]["loss"], rel=1e-5)
    assert runs[0]["grad_norm"] == pytest.approx(runs[1]["grad_norm"], rel=1e-5)
    assert abs(runs[0]["is_weight_mean"] - 1) < 1e-4


@pytest.mark.parametrize("name", ["qwen3", "gemma2"])
def test_flywheel_eval_prints_which_forward_the_model_takes(name, family_dir, clamp_task, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "eval", "--suite", str(clamp_task.root.parent)]
        + ["--model", f"hf:{family_dir(name)}", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("forward: ")]
    assert lines == ["forward: fast" if name in FAST else f"forward: hf: {FALLBACK[name]}"]
