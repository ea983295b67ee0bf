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

The forward behind the loop is a "runner" (`prefill`, `step`, `select`): for a `LlamaForCausalLM`, the
hand-written forward of `flywheel.models.fastllama` over a preallocated KV cache; for any other causal LM
(or with `fast=False`), `HFRunner`, the model's own forward with a `DynamicCache`. Both read the model's
parameters at every call, so weights updated in place between `generate` calls (an optimizer step) are
used by the next call; what is derived from weights and kept (the prefix store, the packed matrices) is
remade then.
`engine.slow_reason` says why the fast path is off (None when on). On the CPU the fast path multiplies by a
packed copy of the matrices (`fastllama.pack_weights`, remade when the weights change; `pack=False`
turns it off and halves the weights' memory).

Sampling (`sample_step`, a pure function over the whole batch):
- temperature `t > 0` scales the logits by `1/t`; `t == 0` is greedy: the kept set is `[argmax]` and the
  sampled token's log-prob is 0 (the point mass the token was drawn from).
- top-p keeps the smallest prefix of the tokens sorted by probability whose mass reaches `top_p`
  (a token is kept when the mass of the tokens ranked above it is `< top_p`), then renormalises over it.
  The nucleus is found from a `topk` of the first few hundred tokens; a row whose nucleus is wider
  (a flat distribution, such as an untrained model's) is found without sorting the vocabulary: a
  histogram of the logits finds the bin where the mass crosses `top_p`, and only that bin is ranked
  (`wide_nucleus`). Its kept ids come in id order, and the token is picked by inverse CDF in that order.
  Each row takes its own path, so which one a row takes never depends on the other rows of its batch.
- `logprobs[i]` is the log-prob of the sampled token under the distribution actually sampled from: after
  temperature and the top-p renormalisation. `kept[i]` is the sorted list of token ids of that nucleus;
  a `None` entry means the full vocabulary (`top_p >= 1`). Kept sets are gathered as tensors during
  decoding and turned into lists once, at the end.
- Each request's random stream is its own: a `torch.Generator` seeded with `Request.seed` draws all of
  the request's uniforms up front and tokens are picked by inverse CDF, so a seeded request samples the
  same tokens whatever else shares its batch (up to float differences between batch shapes). Unseeded
  requests draw from the engine's generator (`seed=` option; nondeterministic when unset).

Stopping and what a Completion holds:
- EOS (the tokenizer's and the generation config's ids): `finish_reason="stop"`; the EOS token stays in
  `token_ids` / `logprobs` (it was sampled), and is not part of `text`.
- Stop strings: checked only for requests that set them, on the decoded tail of the generated tokens after
  each step (a window long enough to hold any stop string). `text` is cut before the earliest stop string
  and does NOT include it (the OpenAI convention); `token_ids` run up to and including the token that
  completed the stop string, so they are exactly what the model generated (their decoding may go past the
  cut). `finish_reason="stop"`.
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

Speculative decoding (`draft=`, `draft_tokens=`; `flywheel.models.speculative`): a draft, `layers:N` (the
model's own first N layers) or an HF causal LM with the same vocabulary, proposes `draft_tokens` tokens;
the model verifies them in one forward and keeps them by rejection sampling, so each emitted token is
drawn from the distribution above and its log-prob and kept set are the model's own, computed by
`distribution` (the same nucleus). A `lookup` draft decodes whole batches as the plain loop does; with a
model draft (`layers:N` or a model), requests run one at a time (batch 1), both on the fast path;
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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flywheel.errors import FlywheelError
from flywheel.models.fastllama import LlamaRunner, PrefixStore, WeightsCache, unsupported
from flywheel.models.hf import load_hf, resolve_device, resolve_dtype
from flywheel.models.speculative import (
    Dist,
    LayerSkip,
    Lookup,
    LookupBatch,
    Round,
    Speculation,
    check_vocabulary,
)
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
TOPK_FIRST = 256  # nucleus search width before falling back to a full sort
WIDE_NUCLEUS = 2048  # kept sets wider than this are put in id order by marking, not sorting
NUCLEUS_BINS = 1024  # logit bins of `wide_nucleus`


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
            request.messages, add_generation_prompt=True, tokenize=False, **kwargs
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


# -------------------------------------------------------------------------------------------- sampling


@dataclass
class Step:
    """One sampling step over a batch: tokens, their log-probs, and the nucleus per row."""

    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32
    kept_rows: torch.Tensor | None = None  # [R] batch rows whose nucleus came from a top-k
    kept_ids: torch.Tensor | None = None  # [R, K] token ids, most probable first
    kept_n: torch.Tensor | None = None  # [R] size of each row's nucleus (<= K)
    wide_rows: torch.Tensor | None = None  # [W] batch rows whose nucleus is wider than a top-k
    wide_mask: torch.Tensor | None = None  # [W, V] bool: that nucleus (`wide_nucleus`)

    def cpu(self) -> Step:
        """This step with every tensor on the CPU (itself when it is there already)."""
        if self.tokens.device.type == "cpu":
            return self
        parts = (self.tokens, self.logprobs, self.kept_rows, self.kept_ids, self.kept_n)
        return Step(*(None if t is None else t.cpu() for t in (*parts, self.wide_rows, self.wide_mask)))


def sample_step(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor
) -> Step:
    """Sample one token per row of `logits` [B, V] given per-row temperature, top-p and a uniform in [0, 1).

    Computed in float32 on the logits' device; the results stay there (`Step.cpu` brings them back)."""
    dev = logits.device
    temperature, top_p, u = temperature.to(dev), top_p.to(dev), u.to(dev)
    greedy = temperature <= 0
    scaled = logits.float() / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
    logz = torch.logsumexp(scaled, dim=-1)
    p_eff = torch.where(greedy, torch.zeros_like(top_p), top_p)
    full = p_eff >= 1.0
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=dev)
    logprobs = torch.empty(logits.shape[0], dtype=torch.float32, device=dev)
    step = Step(tokens, logprobs)
    if bool(full.any()):
        rows = full.nonzero().squeeze(1)
        tokens[rows], logprobs[rows] = _sample_full(scaled[rows], logz[rows], u[rows])
    if bool(full.all()):
        return step
    rows = (~full).nonzero().squeeze(1)
    scaled, logz, p_eff, u = scaled[rows], logz[rows], p_eff[rows], u[rows]
    vals, ids, n, probs, wide = topk_nucleus(scaled, logz, p_eff)
    if not bool(wide.all()):
        sel = (~wide).nonzero().squeeze(1)
        width = int(n[sel].max())
        tok, lp = _pick_sorted(ids[sel, :width], probs[sel, :width], n[sel], u[sel])
        tokens[rows[sel]], logprobs[rows[sel]] = tok, lp
        # a copy, not a view: the kept ids outlive the step and must not pin the top-k of the vocabulary
        step.kept_rows, step.kept_ids, step.kept_n = rows[sel], ids[sel, :width].to(torch.int32), n[sel]
    if bool(wide.any()):
        sel = wide.nonzero().squeeze(1)
        keep, wide_probs = wide_nucleus(scaled[sel], logz[sel], p_eff[sel])
        tok, lp = _pick_in_id_order(keep, wide_probs, u[sel])
        tokens[rows[sel]], logprobs[rows[sel]] = tok, lp
        step.wide_rows, step.wide_mask = rows[sel], keep
    return step


def _sample_full(scaled: torch.Tensor, logz: torch.Tensor, u: torch.Tensor):
    cdf = torch.cumsum(torch.exp(scaled - logz.unsqueeze(1)), dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(1)
    tok = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=scaled.shape[1] - 1)
    return tok, scaled.gather(1, tok.unsqueeze(1)).squeeze(1) - logz


def topk_nucleus(scaled: torch.Tensor, logz: torch.Tensor, top_p: torch.Tensor):
    """(sorted logits [n, K], their ids, nucleus sizes [n], probabilities [n, K], wide [n]) per row, from
    one top-k: `wide` marks the rows whose nucleus is wider than the top-k of a large vocabulary (their
    sizes are meaningless: `wide_nucleus` finds theirs). top_p 0 keeps exactly the top token (greedy)."""
    k = min(TOPK_FIRST, scaled.shape[1])
    if 2 * k >= scaled.shape[1]:  # a vocabulary this small: one sort is as cheap as a top-k
        k = scaled.shape[1]
    vals, ids = (
        torch.topk(scaled, k, dim=-1) if k < scaled.shape[1] else torch.sort(scaled, dim=-1, descending=True)
    )
    probs = torch.exp(vals - logz.unsqueeze(1))
    before = torch.cumsum(probs, dim=-1) - probs
    n = (before < top_p.unsqueeze(1)).sum(dim=-1).clamp(min=1)
    if k < scaled.shape[1]:
        wide = before[:, -1] + probs[:, -1] < top_p
    else:
        wide = torch.zeros_like(n, dtype=torch.bool)
    return vals, ids, n, probs, wide


def wide_nucleus(scaled: torch.Tensor, logz: torch.Tensor, top_p: torch.Tensor, bins: int = NUCLEUS_BINS):
    """(kept mask [R, V], probabilities [R, V]): the nucleus of rows whose nucleus is wider than a top-k,
    without sorting the vocabulary.

    Each row's logits are cut into `bins` equal bins from its maximum down (logits more than 100 below it,
    probability under e^-100, share the last bin); one scatter-add gives each bin's probability mass. Bins
    whose mass, with all bins above, stays within `top_p` are kept whole; the tokens of the one bin where
    the running mass crosses `top_p` (a few dozen) are ranked by a top-k over that bin alone, and kept up to
    the token whose mass above is still below `top_p`, the rule the full sort applies.
    """
    rows = scaled.shape[0]
    probs = torch.exp(scaled - logz.unsqueeze(1))
    top = scaled.max(dim=-1, keepdim=True).values
    low = torch.maximum(scaled.min(dim=-1, keepdim=True).values, top - 100.0)
    scale = bins / (top - low).clamp(min=1e-30)
    level = (top - scaled).mul_(scale).clamp_(max=bins - 1).long()
    wide = probs.double()  # masses summed in float64: the boundary token is decided on exact sums
    mass = torch.zeros((rows, bins), dtype=torch.float64, device=scaled.device).scatter_add_(1, level, wide)
    above = torch.cumsum(mass, dim=-1) - mass  # mass of the bins above each bin
    edge = (above < top_p.unsqueeze(1)).sum(dim=-1) - 1  # the bin where the running mass crosses top_p
    keep = level < edge.unsqueeze(1)
    crossing = level == edge.unsqueeze(1)
    count = crossing.sum(dim=-1)
    p, order = torch.topk(torch.where(crossing, wide, -1.0), int(count.max()), dim=-1)  # the bin, ranked
    ranked = torch.arange(p.shape[1], device=p.device).unsqueeze(0)
    inside = above.gather(1, edge.unsqueeze(1)) + torch.cumsum(p.clamp(min=0), dim=-1) - p < top_p.unsqueeze(
        1
    )
    inside = (inside | (ranked == 0)) & (ranked < count.unsqueeze(1))  # the first reaches top_p: kept
    return keep | torch.zeros_like(keep).scatter_(1, order, inside), probs


def _pick_sorted(ids: torch.Tensor, probs: torch.Tensor, n: torch.Tensor, u: torch.Tensor):
    """(tokens, log-probs) by inverse CDF over each row's first `n` tokens, most probable first."""
    inside = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < n.unsqueeze(1)
    cdf = torch.cumsum(torch.where(inside, probs, torch.zeros_like(probs)), dim=-1)
    mass = cdf.gather(1, (n - 1).unsqueeze(1))
    pick = torch.searchsorted(cdf, u.unsqueeze(1) * mass, right=True).squeeze(1)
    pick = torch.minimum(pick, n - 1)
    tok = ids.gather(1, pick.unsqueeze(1)).squeeze(1).long()
    return tok, torch.log(probs.gather(1, pick.unsqueeze(1)) / mass).squeeze(1)


def _pick_in_id_order(keep: torch.Tensor, probs: torch.Tensor, u: torch.Tensor):
    """(tokens, log-probs) by inverse CDF over each row's kept tokens in id order."""
    cdf = torch.cumsum(torch.where(keep, probs, torch.zeros_like(probs)), dim=-1)
    mass = cdf[:, -1:]
    tok = torch.searchsorted(cdf, u.unsqueeze(1) * mass, right=True).squeeze(1).clamp(max=keep.shape[1] - 1)
    return tok, torch.log(probs.gather(1, tok.unsqueeze(1)) / mass).squeeze(1)


def distribution(logits: torch.Tensor, temperature: float, top_p: float) -> Dist:
    """The distributions `sample_step` draws from, whole, for the rows of `logits` [n, V] at one request's
    temperature and top-p: probabilities zero outside the nucleus and renormalised over it, and the nucleus
    (speculative decoding's p and q). A token's log-prob is the log of its probability here: 0 for greedy,
    `log(p / nucleus mass)` as `sample_step` records it."""
    rows, greedy = logits.shape[0], temperature <= 0
    temp = torch.full((rows, 1), 1.0 if greedy else float(temperature), device=logits.device)
    scaled = logits.float() / temp
    logz = torch.logsumexp(scaled, dim=-1)
    if not greedy and top_p >= 1.0:
        return Dist(torch.exp(scaled - logz.unsqueeze(1)), None)
    keep = nucleus_mask(
        scaled, logz, torch.full((rows,), 0.0 if greedy else float(top_p), device=logits.device)
    )
    probs = torch.where(keep, torch.exp(scaled - logz.unsqueeze(1)), 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return Dist(probs, keep)


def nucleus_mask(scaled: torch.Tensor, logz: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The nucleus of each row as a [n, V] boolean mask (a top-k, else `wide_nucleus` for that row)."""
    _, ids, n, _, wide = topk_nucleus(scaled, logz, top_p)
    inside = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < n.unsqueeze(1)
    mask = torch.zeros_like(scaled, dtype=torch.bool).scatter_(1, ids, inside)
    if bool(wide.any()):
        sel = wide.nonzero().squeeze(1)
        mask[sel] = wide_nucleus(scaled[sel], logz[sel], top_p[sel])[0]
    return mask


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
        self.slow_reason = "disabled" if not fast else unsupported(model)
        self.fast = self.slow_reason is None  # the hand-written Llama forward (flywheel.models.fastllama)
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
        return Completion(
            text=text,
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
        """The fast Llama forward when the model allows it, else the model's own forward."""
        if self.weights is not None:
            return LlamaRunner(self.model, steps, self.prefix_store, self.weights.refresh())
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
        return load_draft(spec, self.model, self.tokenizer)

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
            rng=_request_rng(req.seed, self.rng),
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
            rngs=[_request_rng(s.request.seed, self.rng) for s in seqs],
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
            uniforms=torch.stack([_uniforms(s.request.seed, steps, rng) for s in seqs]),
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


def _request_rng(seed: int | None, rng: torch.Generator) -> torch.Generator:
    """A request's own generator: seeded with `seed`, else with a draw from the engine's `rng`."""
    if seed is None:
        seed = int(torch.randint(2**62, (1,), generator=rng))
    return torch.Generator().manual_seed(int(seed))


def _uniforms(seed: int | None, steps: int, rng: torch.Generator) -> torch.Tensor:
    if seed is None:
        return torch.rand(steps, generator=rng)
    return torch.rand(steps, generator=torch.Generator().manual_seed(int(seed)))


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


def torch_model_dir(spec: str):
    """The HF-format directory behind `hf:PATH`, `smollm2-135m` or a shipped base."""
    from flywheel.models.hf import SMOLLM2, smollm2_dir
    from flywheel.models.shipped import BASES, base_dir

    if spec.startswith("hf:") and spec[3:]:
        return spec[3:]
    if spec == SMOLLM2:
        return smollm2_dir()
    if spec in BASES:
        return base_dir(spec)
    raise FlywheelError(f"unknown torch model '{spec}' (use hf:PATH, {SMOLLM2} or {', '.join(BASES)})")


def load_draft(spec: str, model, tokenizer):
    """The draft `spec` names for speculative decoding of `model`: `layers:N` (`LayerSkip`: the model's own
    first N layers), `lookup` or `lookup:N` (`Lookup`: the context's own continuations of its last N tokens,
    3 by default), or an HF causal LM (`hf:PATH`, a directory, `smollm2-135m`, a shipped base) with
    `tokenizer`'s vocabulary, loaded in `model`'s dtype on its device."""
    if spec == "lookup" or spec.startswith("lookup:"):
        if spec != "lookup" and not spec[7:].isdigit():
            raise FlywheelError(f"draft '{spec}': use lookup or lookup:N with N a number of tokens")
        return Lookup(int(spec[7:]) if spec != "lookup" else 3)
    if spec.startswith("layers:"):
        if not spec[7:].isdigit():
            raise FlywheelError(f"draft '{spec}': use layers:N with N a number of decoder layers")
        return LayerSkip(model, int(spec[7:]))
    path = spec if Path(spec).is_dir() else torch_model_dir(spec)
    draft, draft_tokenizer = load_hf(path, dtype=model.dtype, device=model.device)
    check_vocabulary(spec, model, tokenizer, draft, draft_tokenizer)
    why = unsupported(draft)
    if why:
        raise FlywheelError(f"draft '{spec}': speculative decoding needs the fast Llama forward ({why})")
    return draft


def load_torch_model(spec: str, **opts: Any) -> TorchEngine:
    """A `TorchEngine` for `hf:PATH` (an HF-format directory), `smollm2-135m` or a shipped base.

    Options: `dtype` (`"float32"`, the default, or `"bfloat16"`; a torch dtype too), `device` (`"cpu"`,
    the default, `"cuda"` or `"auto"`: CUDA when a GPU is visible), `context` (alias of `max_context`), and
    `TorchEngine`'s `max_context`, `max_batch`, `ignore_eos`, `seed`, `name`, `eos_ids` (replaces the
    tokenizer's and generation config's EOS ids), `fast` (False: always the model's own forward, never
    `fastllama`), `prefix_cache_mb`, `draft` and `draft_tokens` (speculative decoding: `load_draft`), `pack`
    (False: the fast path multiplies by the modules' own weights, never a packed copy: `fastllama.pack_weights`).
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
