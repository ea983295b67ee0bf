"""The in-process rollout engine: batched sampling from an HF causal LM, with what the trainer replays.

`TorchEngine.generate(requests)` renders each conversation with the tokenizer's chat template, groups the
requests into batches (sorted by prompt length, so padding is small), and for each batch runs one
left-padded prefill followed by a decode loop over every still-active sequence. On the fast path the
prefill computes the batch's common prefix once and each distinct prompt once (a group's G samples share
one), copying their keys and values to every row, and a prompt that starts with a sequence an earlier call
generated (an agent's next turn) prefills only what follows it (`fastllama.PrefixStore`, emptied whenever
the weights change; `prefix_cache_mb`, 0 to turn it off). Sequences that finish (EOS,
a stop string, their token budget) are dropped from the batch and from the cache at once, so one long tail
does not carry dead rows through the remaining steps.

The forward behind the loop is a "runner" (`prefill`, `step`, `select`): for the families the fast path
takes (Llama and Llama 3, Mistral, Qwen2 and Qwen2.5, Qwen3 dense: `fastllama.FAST_ARCHITECTURES`, with
a sliding window no narrower than `max_context`), the hand-written forward of `flywheel.models.fastllama`
over a preallocated KV cache; for any other causal LM (Gemma among them, or with `fast=False`),
`HFRunner`, the model's own forward with a `DynamicCache`, without the prefix store or speculative
decoding. Both read the model's parameters at every call, so weights updated in place between `generate`
calls (an optimizer step) are used by the next call; what is derived from weights and kept (the prefix
store, the packed matrices) is remade then.
`engine.path` says which forward a model takes: `"fast"`, or `"hf: <why not the fast one>"`
(`engine.slow_reason` is that reason alone, None on the fast path). On the CPU the fast path multiplies
by a packed copy of the matrices (`fastllama.pack_weights`, remade when the weights change; `pack=False`
turns it off and halves the weights' memory).

Sampling (`flywheel.models.sampling`): each step draws one token per row with `sample_step`, at the row's
temperature and top-p, from its request's own random stream (`Request.seed`; unseeded requests draw from
the engine's generator: `seed=` option, nondeterministic when unset).
- `logprobs[i]` is the log-prob of the sampled token under the distribution actually sampled from: after
  temperature and the top-p renormalisation. `kept[i]` is the sorted list of token ids of that nucleus;
  a `None` entry means the full vocabulary (`top_p >= 1`). Kept sets are gathered as tensors during
  decoding and turned into lists once, at the end.
- A seeded request samples the same tokens whatever else shares its batch (up to float differences
  between batch shapes).

Stopping and what a Completion holds:
- EOS (the tokenizer's and the generation config's ids): `finish_reason="stop"`; the EOS token stays in
  `token_ids` / `logprobs` (it was sampled), and is not part of `text`.
- Stop strings: checked only for requests that set them, on the decoded tail of the generated tokens after
  each step (a window long enough to hold any stop string). `text` is cut before the earliest stop string
  and does NOT include it (the OpenAI convention); `token_ids` run up to and including the token that
  completed the stop string, so they are exactly what the model generated (their decoding may go past the
  cut). `finish_reason="stop"`.
- Tool calls: a request that offers `tools` gets the calls the model wrote in its chat template's own
  syntax (`<tool_call>`, Llama 3's JSON, `[TOOL_CALLS]`: `chat_formats.completion_calls`) in `tool_calls`,
  and `text` is what came before them; history is rendered as the template reads it (`chat_messages`).
- Limits: `max_context` bounds prompt + generation. A prompt that leaves no room (`len >= max_context`)
  returns `finish_reason="context"` with nothing generated; a generation that reaches `max_tokens` ends
  with `"length"`, one cut short by the context limit with `"context"`.
- Failures are data: a request that cannot be rendered or has invalid sampling settings, or a batch whose
  forward pass raises, comes back as `Completion(finish_reason="error", error=...)`.

Device and precision (`load_torch_model`'s `device` and `dtype`): the weights and the KV cache are in the
model's dtype on its device; the logits are cast to float32 before sampling, so log-probs, kept sets and
the token picked are computed in float32 whatever the weights' dtype (recorded log-probs of a bfloat16
engine stay comparable with the trainer's float32 replay). Sampling runs on the logits' device; each
step's tokens, log-probs and kept sets come back to the CPU, where the decode loop keeps its buffers.

Speculative decoding (`draft=`, `draft_tokens=`; `flywheel.models.speculative`, the draft loaded by
`flywheel.models.loading.load_draft`): a draft, `layers:N` (the model's own first N layers) or an HF causal
LM with the same vocabulary, proposes `draft_tokens` tokens; the model verifies them in one forward and
keeps them by rejection sampling, so each emitted token is drawn from the distribution above and its
log-prob and kept set are the model's own, computed by `sampling.distribution` (the same nucleus). A
`lookup` draft decodes whole batches as the plain loop does; with a model draft (`layers:N` or a model),
requests run one at a time (batch 1), both on the fast path;
greedy tokens are the plain loop's, a seeded request's sampled tokens differ from the plain loop's (its
uniforms are consumed differently) but follow the same distribution. `spec_stats` counts target steps
(verify forwards; in a lookup batch, one per row and round), proposed and accepted draft tokens, and
emitted tokens. Without a draft nothing changes.

The fallback template (a tokenizer without a chat template) renders each message as
`<|role|>\\ncontent\\n` and ends with `<|assistant|>\\n`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flywheel.errors import FlywheelError
from flywheel.models.chat_formats import chat_messages, completion_calls, tokenizer_syntax
from flywheel.models.fastllama import FastRunner, PrefixStore, WeightsCache, unsupported
from flywheel.models.hf import load_hf, resolve_device, resolve_dtype
from flywheel.models.loading import load_draft, torch_model_dir
from flywheel.models.sampling import Step, distribution, request_rng, request_uniforms, sample_step
from flywheel.models.speculative import LayerSkip, Lookup, LookupBatch, Round, Speculation
from flywheel.protocols import Completion, Request

ENGINE_OPTIONS = {
    "name",
    "max_context",
    "max_batch",
    "ignore_eos",
    "seed",
    "eos_ids",
    "fast",
    "prefix_cache_mb",
    "draft",
    "draft_tokens",
    "pack",
}
WIDE_NUCLEUS = 2048  # kept sets wider than this are put in id order by marking, not sorting


# --------------------------------------------------------------------------------------------- prompts


def fallback_template(messages: Sequence[dict[str, Any]]) -> str:
    """The prompt for a tokenizer without a chat template: `<|role|>\\ncontent\\n` per message."""
    parts = [f"<|{m.get('role', 'user')}|>\n{m.get('content') or ''}\n" for m in messages]
    return "".join(parts) + "<|assistant|>\n"


def render_prompt(tokenizer, request: Request) -> list[int]:
    """Token ids of the request's conversation, ending with the assistant's generation prompt."""
    if getattr(tokenizer, "chat_template", None):
        kwargs = {"tools": request.tools} if request.tools else {}
        text = tokenizer.apply_chat_template(
            chat_messages(tokenizer, request.messages), add_generation_prompt=True, tokenize=False, **kwargs
        )
    else:
        text = fallback_template(request.messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_request(request: Request) -> str | None:
    """Why a request's sampling settings are invalid, or None."""
    if request.max_tokens < 0:
        return f"max_tokens must be >= 0, got {request.max_tokens}"
    if not request.temperature >= 0 or math.isinf(request.temperature):
        return f"temperature must be finite and >= 0, got {request.temperature}"
    if not 0 < request.top_p <= 1:
        return f"top_p must be in (0, 1], got {request.top_p}"
    return None


# ----------------------------------------------------------------------------------------- stop strings


def stop_window(stops: Sequence[str]) -> int:
    """Tokens of decoded tail that always contain a stop string ending in the newest token."""
    return 4 * max(len(s) for s in stops) + 4


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string (excluded), and whether one was found."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


# --------------------------------------------------------------------------------------------- engine


@dataclass
class _Seq:
    """One request in flight."""

    index: int
    request: Request
    prompt: list[int]
    budget: int  # tokens it may generate
    limit_reason: str  # "length" or "context": why the budget ends
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kept: list[list[int] | None] = field(default_factory=list)
    finish: str | None = None
    n: int = 0  # tokens generated when it finished


class TorchEngine:
    """A `Model` backed by an in-process HF causal LM; see the module docstring for the semantics."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        name: str = "torch",
        max_context: int | None = None,
        max_batch: int = 32,
        ignore_eos: bool = False,
        seed: int | None = None,
        eos_ids: Sequence[int] | None = None,
        fast: bool = True,
        prefix_cache_mb: int = 512,
        draft: str | None = None,
        draft_tokens: int = 4,
        pack: bool = True,
    ) -> None:
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 2048))
        self.max_batch = max(1, max_batch)
        self.ignore_eos = ignore_eos  # benchmarks: generate exactly max_tokens
        self.eos_ids = sorted(_eos_ids(model, tokenizer) if eos_ids is None else set(eos_ids))
        self.cache_kw = _cache_kwarg(model)
        self.slow_reason = "disabled" if not fast else unsupported(model, self.max_context)
        self.fast = self.slow_reason is None  # the hand-written forward (flywheel.models.fastllama)
        self.pad_id = _pad_id(tokenizer, self.eos_ids)
        # keys and values of finished sequences, reused by prompts that start with them (fast path only)
        self.prefix_store = PrefixStore(prefix_cache_mb << 20) if self.fast and prefix_cache_mb > 0 else None
        # the store and, on the CPU, the packed matrices: rebuilt before a batch when the weights changed
        self.weights = WeightsCache(model, self.prefix_store, pack) if self.fast else None
        self.rng = torch.Generator()
        if seed is None:
            self.rng.seed()
        else:
            self.rng.manual_seed(seed)
        # speculative decoding (flywheel.models.speculative): up to `draft_tokens` proposed a round
        self.draft_tokens = draft_tokens
        self.draft = self._load_draft(draft) if draft else None
        self.draft_weights = (
            WeightsCache(self.draft, pack=pack)
            if self.draft is not None and not isinstance(self.draft, LayerSkip | Lookup)
            else None
        )
        self.spec_stats = dict.fromkeys(("target_steps", "proposed", "accepted", "tokens"), 0)

    # -- public

    @property
    def native_tools(self) -> bool:
        """Whether the model has a tool-call syntax of its own (its chat template defines one): then the
        harness's `auto` action format offers it tools natively, in that syntax."""
        return tokenizer_syntax(self.tokenizer) is not None

    @property
    def path(self) -> str:
        """Which forward generates: `"fast"` (`flywheel.models.fastllama`) or `"hf: <why not>"`."""
        return "fast" if self.fast else f"hf: {self.slow_reason}"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        done: dict[int, Completion] = {}
        todo: list[_Seq] = []
        for i, req in enumerate(requests):
            item = self._prepare(i, req)
            if isinstance(item, Completion):
                done[i] = item
            else:
                todo.append(item)
        todo.sort(key=lambda s: len(s.prompt))
        size = 1 if self.draft is not None and not isinstance(self.draft, Lookup) else self.max_batch
        for start in range(0, len(todo), size):
            done.update(self._run_chunk(todo[start : start + size]))
        return [done[i] for i in range(len(requests))]

    # -- preparation and results

    def _prepare(self, index: int, req: Request) -> _Seq | Completion:
        problem = check_request(req)
        if problem:
            return _error(problem)
        try:
            prompt = render_prompt(self.tokenizer, req)
        except Exception as exc:  # a template that rejects these messages: data, not a crash
            return _error(f"cannot render prompt: {type(exc).__name__}: {exc}")
        room = self.max_context - len(prompt)
        if room <= 0:
            return self._completion(_Seq(index, req, prompt, 0, "context", finish="context"))
        reason = "length" if req.max_tokens <= room else "context"
        seq = _Seq(index, req, prompt, min(req.max_tokens, room), reason)
        if seq.budget == 0:
            seq.finish = "length"
            return self._completion(seq)
        return seq

    def _run_chunk(self, chunk: list[_Seq]) -> dict[int, Completion]:
        try:
            with torch.inference_mode():
                if isinstance(self.draft, Lookup):
                    self._decode_lookup(chunk)
                elif self.draft is not None:
                    self._decode_speculative(chunk[0])
                else:
                    self._decode(chunk)
        except Exception as exc:  # e.g. out of memory: every request of the batch records it
            return {s.index: _error(f"generation failed: {type(exc).__name__}: {exc}") for s in chunk}
        return {s.index: self._completion(s) for s in chunk}

    def _completion(self, seq: _Seq) -> Completion:
        body = seq.tokens
        if seq.tokens and seq.tokens[-1] in self.eos_ids and seq.finish == "stop":
            body = seq.tokens[:-1]
        text = self.tokenizer.decode(body, skip_special_tokens=True) if body else ""
        if seq.request.stop:
            text, _ = cut_at_stop(text, seq.request.stop)
        text, calls = completion_calls(self.tokenizer, seq.request.tools, text, body, seq.request.stop)
        return Completion(
            text=text,
            tool_calls=calls,
            finish_reason=seq.finish or seq.limit_reason,
            prompt_tokens=len(seq.prompt),
            completion_tokens=len(seq.tokens),
            prompt_ids=list(seq.prompt),
            token_ids=list(seq.tokens),
            logprobs=list(seq.logprobs),
            kept=list(seq.kept),
        )

    # -- the decode loop

    def _decode(self, seqs: list[_Seq]) -> None:
        batch = _Batch.start(seqs, self.pad_id, self.rng)
        runner = self._runner(int(batch.budget.max()))
        logits = runner.prefill(batch.input_ids, batch.mask)
        eos = torch.tensor(self.eos_ids if not self.ignore_eos else [], dtype=torch.long)
        step = 0
        while True:
            s = sample_step(logits, batch.temperature, batch.top_p, batch.uniforms[:, step]).cpu()
            batch.record(step, s)
            _announce(batch.seqs, s.tokens)
            finished = self._finished(batch, step, s.tokens, eos)
            for j in (j for j, f in enumerate(finished) if f):  # row j holds its prompt and tokens 0..step-1
                runner.remember(j, batch.seqs[j].prompt + batch.token_buf[batch.rows[j], :step].tolist())
            step += 1
            keep = [j for j, f in enumerate(finished) if not f]
            if not keep:
                break
            tokens = s.tokens
            if len(keep) < len(finished):
                idx = torch.tensor(keep)
                runner.select(idx)
                batch.select(idx)
                tokens = tokens[idx]
            logits = runner.step(tokens)
        batch.finish()

    def _runner(self, steps: int):
        """The fast forward when the model allows it, else the model's own forward."""
        if self.weights is not None:
            return FastRunner(self.model, steps, self.prefix_store, self.weights.refresh())
        return HFRunner(self.model, self.cache_kw)

    def _finished(self, batch: _Batch, step: int, tokens: torch.Tensor, eos: torch.Tensor) -> list[bool]:
        hit_eos = torch.isin(tokens, eos).tolist()
        out_of_budget = (batch.budget <= step + 1).tolist()
        flags = []
        for j, seq in enumerate(batch.seqs):
            if hit_eos[j] or (seq.request.stop and self._hit_stop(batch, j, step)):
                seq.finish = "stop"
            elif out_of_budget[j]:
                seq.finish = seq.limit_reason
            if seq.finish is not None:
                seq.n = step + 1
            flags.append(seq.finish is not None)
        return flags

    def _hit_stop(self, batch: _Batch, j: int, step: int) -> bool:
        stops = batch.seqs[j].request.stop
        lo = max(0, step + 1 - stop_window(stops))
        return self._ends_in_stop(batch.token_buf[batch.rows[j], lo : step + 1].tolist(), stops)

    def _ends_in_stop(self, tokens: list[int], stops: Sequence[str]) -> bool:
        """Whether the decoded tail of `tokens` holds one of `stops`."""
        tail = tokens[-stop_window(stops) :]
        return cut_at_stop(self.tokenizer.decode(tail, skip_special_tokens=True), stops)[1]

    # -- speculative decoding (flywheel.models.speculative)

    def _load_draft(self, spec: str):
        if not self.fast:
            raise FlywheelError(
                f"draft '{spec}': speculative decoding needs the fast Llama forward ({self.slow_reason})"
            )
        if self.draft_tokens < 1:
            raise FlywheelError(f"draft_tokens must be >= 1, got {self.draft_tokens}")
        return load_draft(spec, self.model, self.tokenizer, self.max_context)

    def _decode_speculative(self, seq: _Seq) -> None:
        """Generate `seq` alone, a round of up to `draft_tokens` proposals at a time, each round's tokens
        checked one by one for EOS, stop strings and the budget (what follows the end is dropped)."""
        req = seq.request
        assert self.weights is not None
        packed = self.weights.refresh()
        spec = Speculation(
            self.model,
            self.draft,
            seq.prompt,
            seq.budget,
            dist=lambda logits: distribution(logits, req.temperature, req.top_p),
            rng=request_rng(req.seed, self.rng),
            store=self.prefix_store,
            packed=packed,
            draft_packed=packed if self.draft_weights is None else self.draft_weights.refresh(),
        )
        eos = set() if self.ignore_eos else set(self.eos_ids)
        while seq.finish is None:
            # a round emits at most k + 1 tokens: never propose past the budget
            self._emit(seq, spec.round(min(self.draft_tokens, seq.budget - len(seq.tokens) - 1)), eos)
        spec.remember(seq.prompt + seq.tokens[:-1])  # what the target was fed, as the plain loop stores it

    def _decode_lookup(self, seqs: list[_Seq]) -> None:
        """Generate `seqs` together with the lookup draft (`LookupBatch`): each round, every row proposes up
        to `draft_tokens` and one forward verifies them all; a row leaves the batch when it finishes."""
        assert self.weights is not None and isinstance(self.draft, Lookup)
        spec = LookupBatch(
            self.model,
            self.draft,
            [s.prompt for s in seqs],
            max(s.budget for s in seqs) + self.draft_tokens,
            [(float(s.request.temperature), float(s.request.top_p)) for s in seqs],
            dist=distribution,
            rngs=[request_rng(s.request.seed, self.rng) for s in seqs],
            store=self.prefix_store,
            packed=self.weights.refresh(),
        )
        eos = set() if self.ignore_eos else set(self.eos_ids)
        active = list(seqs)
        while active:
            rounds = spec.round([min(self.draft_tokens, s.budget - len(s.tokens) - 1) for s in active])
            keep = []
            for j, (seq, r) in enumerate(zip(active, rounds, strict=True)):
                self._emit(seq, r, eos)
                if seq.finish is None:
                    keep.append(j)
                else:
                    spec.remember(j, seq.prompt + seq.tokens[:-1])
            if len(keep) < len(active):
                active = [active[j] for j in keep]
                if active:
                    spec.select(keep)

    def _emit(self, seq: _Seq, r: Round, eos: set[int]) -> None:
        """Append a round's tokens to `seq`, one by one, up to the first that ends it (EOS, a stop string, the
        budget): what follows is dropped."""
        for token, logprob, kept in zip(r.tokens, r.logprobs, r.kept, strict=True):
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            seq.kept.append(kept)
            _announce([seq], torch.tensor([token]))
            if self._spec_finished(seq, eos):
                seq.n = len(seq.tokens)
                break
        self._count(r)

    def _spec_finished(self, seq: _Seq, eos: set[int]) -> bool:
        if seq.tokens[-1] in eos or (seq.request.stop and self._ends_in_stop(seq.tokens, seq.request.stop)):
            seq.finish = "stop"
        elif len(seq.tokens) >= seq.budget:
            seq.finish = seq.limit_reason
        return seq.finish is not None

    def _count(self, r: Round) -> None:
        stats = self.spec_stats
        stats["target_steps"] += 1
        stats["proposed"] += r.proposed
        stats["accepted"] += r.accepted
        stats["tokens"] += len(r.tokens)


def _announce(seqs: list[_Seq], tokens: torch.Tensor) -> None:
    """Hand each sequence's new token to its request's `on_token`, where it has one; a callback that raises
    (a client gone) is dropped, never the batch's generation."""
    if not any(s.request.on_token for s in seqs):
        return
    for seq, token in zip(seqs, tokens.tolist(), strict=True):
        if seq.request.on_token is not None:
            try:
                seq.request.on_token(token)
            except Exception:
                seq.request.on_token = None


@dataclass
class _Batch:
    """Tensors of one decode batch; `rows[j]` maps active position j to its row in the token buffers."""

    seqs: list[_Seq]
    all_seqs: list[_Seq]
    rows: list[int]
    input_ids: torch.Tensor
    mask: torch.Tensor  # [B, width] 1 on real prompt tokens (prompts are left-padded)
    row_index: torch.Tensor  # tensor of `rows`
    temperature: torch.Tensor
    top_p: torch.Tensor
    budget: torch.Tensor
    uniforms: torch.Tensor
    token_buf: torch.Tensor  # [B, T] sampled ids by original row
    logprob_buf: torch.Tensor
    # (step, rows, kept ids [R, K] most probable first with their sizes, or a [R, V] mask and no sizes)
    kept_log: list[tuple[int, list[int], torch.Tensor, list[int]]] = field(default_factory=list)

    @classmethod
    def start(cls, seqs: list[_Seq], pad_id: int, rng: torch.Generator) -> _Batch:
        width = max(len(s.prompt) for s in seqs)
        steps = max(s.budget for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, width - len(s.prompt) :] = torch.tensor(s.prompt, dtype=torch.long)
            mask[j, width - len(s.prompt) :] = 1
        return cls(
            seqs=list(seqs),
            all_seqs=list(seqs),
            rows=list(range(len(seqs))),
            input_ids=ids,
            mask=mask,
            row_index=torch.arange(len(seqs)),
            temperature=torch.tensor([float(s.request.temperature) for s in seqs]),
            top_p=torch.tensor([float(s.request.top_p) for s in seqs]),
            budget=torch.tensor([s.budget for s in seqs]),
            uniforms=torch.stack([request_uniforms(s.request.seed, steps, rng) for s in seqs]),
            token_buf=torch.zeros((len(seqs), steps), dtype=torch.long),
            logprob_buf=torch.zeros((len(seqs), steps), dtype=torch.float32),
        )

    def record(self, step: int, s: Step) -> None:
        self.token_buf[self.row_index, step] = s.tokens
        self.logprob_buf[self.row_index, step] = s.logprobs
        if s.kept_rows is not None and s.kept_ids is not None and s.kept_n is not None:
            rows = [self.rows[j] for j in s.kept_rows.tolist()]
            self.kept_log.append((step, rows, s.kept_ids, s.kept_n.tolist()))
        if s.wide_rows is not None and s.wide_mask is not None:
            self.kept_log.append((step, [self.rows[j] for j in s.wide_rows.tolist()], s.wide_mask, []))

    def select(self, idx: torch.Tensor) -> None:
        keep = idx.tolist()
        self.seqs = [self.seqs[j] for j in keep]
        self.rows = [self.rows[j] for j in keep]
        self.row_index = self.row_index[idx]
        self.temperature, self.top_p = self.temperature[idx], self.top_p[idx]
        self.budget, self.uniforms = self.budget[idx], self.uniforms[idx]

    def finish(self) -> None:
        """Copy the buffers into each sequence's lists (kept sets sorted by id, None for full vocabulary)."""
        for row, seq in enumerate(self.all_seqs):
            seq.tokens = self.token_buf[row, : seq.n].tolist()
            seq.logprobs = self.logprob_buf[row, : seq.n].tolist()
            seq.kept = [None] * seq.n
        for step, rows, ids, sizes in self.kept_log:
            if ids.dtype != torch.bool:
                n = torch.tensor(sizes).unsqueeze(1)
                inside = torch.arange(ids.shape[1]).unsqueeze(0) < n
            if ids.dtype != torch.bool and ids.shape[1] > WIDE_NUCLEUS:
                # marking the ids and reading them back in order beats a sort
                marks = torch.zeros((len(rows), int(ids.max()) + 1), dtype=torch.bool)
                ids = marks.scatter_(1, torch.where(inside, ids, ids[:, :1]), True)
            if ids.dtype == torch.bool:  # a mask over the vocabulary (`wide_nucleus` gives one directly)
                for j, row in enumerate(rows):
                    self.all_seqs[row].kept[step] = np.flatnonzero(ids[j].numpy()).tolist()
                continue
            by_id = torch.where(inside, ids, torch.iinfo(ids.dtype).max).sort(dim=1).values.tolist()
            for row, size, kept in zip(rows, sizes, by_id, strict=True):
                self.all_seqs[row].kept[step] = kept[:size]


class HFRunner:
    """The engine's stepping interface on the model's own forward and a `DynamicCache` (any causal LM);
    inputs go to the model's device, float32 logits come back."""

    def __init__(self, model, cache_kw: str) -> None:
        from transformers import DynamicCache

        self.model, self.cache_kw, self.device = model, cache_kw, model.device
        self.cache = DynamicCache(config=model.config)
        self.mask = self.positions = torch.empty(0)

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(self.device)
        self.mask, self.positions = mask, (mask.cumsum(-1) - 1).clamp(min=0)
        return self._forward(input_ids.to(self.device), logits_to_keep=1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        self.positions = self.positions[:, -1:] + 1
        return self._forward(tokens.to(self.device).unsqueeze(1))

    def remember(self, row: int, ids: list[int]) -> None:
        """Nothing: only the fast path keeps finished sequences' keys and values."""

    def select(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.device)
        self.cache.batch_select_indices(rows)
        self.mask, self.positions = self.mask[rows], self.positions[rows]

    def _forward(self, input_ids: torch.Tensor, **kw: Any) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=self.positions,
            use_cache=True,
            **{self.cache_kw: self.cache},
            **kw,
        )
        return out.logits[:, -1].float()


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for value in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(model.generation_config, "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def _cache_kwarg(model) -> str:
    """`cache` in transformers >= 5.x forwards that renamed it, else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _pad_id(tokenizer, eos_ids: list[int]) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else (eos_ids[0] if eos_ids else 0)


def _error(message: str) -> Completion:
    return Completion(text="", finish_reason="error", error=message)


# -------------------------------------------------------------------------------------------- factory


def load_torch_model(spec: str, **opts: Any) -> TorchEngine:
    """A `TorchEngine` for `hf:PATH` (an HF-format directory), `smollm2-135m` or a shipped base
    (`loading.torch_model_dir`).

    Options: `dtype` (`"float32"`, the default, or `"bfloat16"`; a torch dtype too), `device` (`"cpu"`,
    the default, `"cuda"` or `"auto"`: CUDA when a GPU is visible), `context` (alias of `max_context`), and
    `TorchEngine`'s `max_context`, `max_batch`, `ignore_eos`, `seed`, `name`, `eos_ids` (replaces the
    tokenizer's and generation config's EOS ids), `fast` (False: always the model's own forward, never
    `fastllama`), `prefix_cache_mb`, `draft` and `draft_tokens` (speculative decoding:
    `loading.load_draft`), `pack` (False: the fast path multiplies by the modules' own weights, never a
    packed copy: `fastllama.pack_weights`).
    """
    dtype = resolve_dtype(opts.pop("dtype", torch.float32))
    device = resolve_device(opts.pop("device", "cpu"))
    if "context" in opts:
        opts["max_context"] = opts.pop("context")
    unknown = sorted(set(opts) - ENGINE_OPTIONS)
    if unknown:
        known = ", ".join(sorted({"dtype", "device", *ENGINE_OPTIONS}))
        raise FlywheelError(f"unknown torch engine option(s) {', '.join(unknown)} (known: {known})")
    model, tokenizer = load_hf(torch_model_dir(spec), dtype=dtype, device=device)
    opts.setdefault("name", spec)
    return TorchEngine(model, tokenizer, **opts)
