"""Exact speculative decoding for the in-process engine: a small draft proposes, the target decides.

`TorchEngine(..., draft=..., draft_tokens=k)` generates each request alone through `Speculation`, one
round at a time (speculative sampling: Leviathan et al. 2023, Chen et al. 2023):
1. The draft proposes k tokens d_1..d_k, each drawn from q_i: the draft's next-token distribution after the
   same temperature and top-p transformation the engine applies to the target.
2. The target scores the context's last token and d_1..d_k in one forward over its KV cache, giving
   p_1..p_{k+1}: the distributions the engine samples from at those positions (after temperature and the
   top-p renormalisation).
3. d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)), in order. At the first rejection the token
   is drawn from normalise(max(0, p_i - q_i)) instead and the round ends; when all k are accepted one more
   token is drawn from p_{k+1}. A round emits 1 to k+1 tokens for one target forward (`speculate`, a pure
   function over probability vectors and uniforms).
4. Both caches are rolled back past the rejected positions (`fastllama.truncate`).

Why it is exact: a token reaches position i either as an accepted proposal, with probability
q(x) min(1, p(x)/q(x)) = min(q(x), p(x)), or through a rejection, with probability
(1 - sum_y min(q(y), p(y))) max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y)) = p(x) - min(q(x), p(x)); the
two add up to p(x). So every emitted token is drawn from the target's own distribution at its position,
whatever the draft, and the draft's quality decides only how many tokens a round emits. Where p is zero
(outside the target's nucleus) a proposal is always rejected and the residual never draws it; where q is
zero the residual puts p's mass back.

What the Completion records is the target's: each emitted token's log-prob is log p(x) at its position and
its kept set is the target's nucleus there, both computed from the verification forward by the engine's own
`sampling.distribution` (the same nucleus as `sample_step`), which is what the non-speculative engine
records, up to float rounding (the verify forward runs k+1 positions at once where the plain loop runs
one). q serves only the accept test; the trainer never sees it.

Greedy (temperature 0): p and q are point masses at the argmaxes, so a proposal is accepted exactly when it
is the target's argmax and a rejection emits the target's argmax: the tokens are the non-speculative
engine's (a near tie between two logits could in principle resolve otherwise under the different summation
order of the verify forward).

Random numbers: each round draws 2k+1 uniforms from the request's own generator (seeded with
`Request.seed`, else from a draw of the engine's generator): k for the draft's samples (unused by a lookup,
which may also propose fewer than k), k for the accept tests, one for the final token. A seeded request is
reproducible run to run with the same draft and `draft_tokens`; its tokens differ from the
non-speculative engine's for the same seed (the uniforms are consumed differently), while the
distribution they are drawn from is the same.

Drafts (`draft=`, turned into one by `flywheel.models.loading.load_draft`):
- `layers:N`: `LayerSkip`, the target's first N decoder layers, its final norm and its head
  (self-speculation). It shares the target's weights, so in-place updates reach it; it costs no training
  and no memory beyond its own KV cache.
- `lookup` or `lookup:N`: `Lookup`, no model at all: the tokens that followed the latest earlier occurrence
  of the context's last N tokens (3 by default), proposed with certainty (q a point mass, so a proposal x
  is accepted with probability p(x)). It costs no forward, so on a CPU, where a small model's forward costs
  its per-call overhead, it is the draft that pays: agents repeat what they read and wrote before.
- an HF causal LM (`hf:PATH`, a directory, `smollm2-135m`, a shipped base) whose token ids mean the
  target's: its tokenizer's vocabulary and its `vocab_size` must equal the target's, else one
  `FlywheelError` (`check_vocabulary`). It is loaded in the target's dtype on its device and stays fixed;
  a stale draft costs speed, never exactness.

Batches: a lookup draft decodes a whole batch together (`LookupBatch`: each row proposes its own
tokens, one target forward verifies every row's, each row decides alone); a model draft generates one
request at a time (`Speculation`: batch 1 is where decoding is bound by reading the weights, so verifying
k+1 positions costs about one step; batching a draft model's own cache is not built).

What is not covered: models the fast forward cannot run (`fastllama.unsupported`: families other than
Llama, Mistral, Qwen2 and Qwen3, Gemma among them), as target or draft, are refused; the draft does not
use the prefix store (the target does, as in the plain loop); `k` is fixed, not adapted to the acceptance
rate.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from flywheel.errors import FlywheelError
from flywheel.models.fastllama import (
    FastRunner,
    Packed,
    PrefixStore,
    decode,
    prefill_after,
    reserve,
    row_kv,
    truncate,
)
from flywheel.models.sampling import Dist

# ------------------------------------------------------------------------------------- the decision


def pick(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw from each row of `probs` [..., V] (not necessarily normalised) by inverse CDF at `u` [...] in
    [0, 1): ids [...]. A token of probability zero is never drawn."""
    cdf = torch.cumsum(probs, dim=-1)
    at = (u * cdf[..., -1]).unsqueeze(-1).contiguous()
    return torch.searchsorted(cdf, at, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, p - q)) per row; `p` itself where that has no mass (p == q up to rounding, where a
    rejection has probability zero but for rounding)."""
    r = (p - q).clamp(min=0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp(min=torch.finfo(r.dtype).tiny), p)


def speculate(
    p: torch.Tensor, q: torch.Tensor, proposed: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One round's decision: (accepted, token), batched over any leading dimensions.

    `p` [..., k+1, V]: the target's distributions at the k proposed positions and the one after; `q`
    [..., k, V]: the draft's, from which `proposed` [..., k] were drawn; `u` [..., k+1]: uniforms in [0, 1),
    the first k for the accept tests, the last for the token drawn. `accepted` [...] is j, the number of
    leading proposals kept; `token` [...] follows them: drawn from normalise(max(0, p_j - q_j)) when
    proposal j (0-based) was rejected, from p_k when all k were accepted.
    """
    k = proposed.shape[-1]
    at = proposed.unsqueeze(-1)
    p_at = p[..., :k, :].gather(-1, at).squeeze(-1)
    q_at = q.gather(-1, at).squeeze(-1)
    ok = u[..., :k] * q_at < p_at  # u < p/q: accepted with probability min(1, p/q)
    accepted = ok.long().cumprod(dim=-1).sum(dim=-1)
    q_after = F.pad(q, (0, 0, 0, 1))  # no proposal after the k-th: its residual is p_k itself
    row = accepted[..., None, None].expand(*accepted.shape, 1, p.shape[-1])
    final = residual(p.gather(-2, row).squeeze(-2), q_after.gather(-2, row).squeeze(-2))
    return accepted, pick(final, u[..., k])


# -------------------------------------------------------------------------------------------- drafts


class LayerSkip:
    """The target's first `layers` decoder layers, its final norm and its head, as a draft: a view that
    `fastllama` runs like the target itself (any family it takes), sharing the target's modules (and so
    its weights)."""

    def __init__(self, model, layers: int) -> None:
        total = model.config.num_hidden_layers
        if not 1 <= layers <= total:
            raise FlywheelError(
                f"draft 'layers:{layers}': the target has {total} decoder layers (use 1 to {total})"
            )
        self.model, self.lm_head = model.model, model.lm_head
        self.config = copy.copy(model.config)
        self.config.num_hidden_layers = layers  # `fastllama.forward` runs `model.layers[:num_hidden_layers]`


class Lookup:
    """A draft without a model (prompt lookup): it proposes the tokens that followed the latest earlier
    occurrence of the context's last `ngram` tokens (of fewer, down to one, when there is none), each with
    certainty, so q is a point mass and a proposal x is accepted with probability p(x). Nothing is
    proposed where nothing matches (a plain step). Agents copy much of what they read (file contents,
    commands of earlier turns), which is what it finds; it costs no forward."""

    def __init__(self, ngram: int = 3) -> None:
        if ngram < 1:
            raise FlywheelError(f"draft 'lookup:{ngram}': the n-gram must be at least 1 token")
        self.ngram = ngram


def continuation(ctx: np.ndarray, ngram: int, k: int) -> list[int]:
    """The (up to) `k` tokens after the latest earlier occurrence of `ctx`'s last n tokens, for the largest
    n <= `ngram` that occurs; [] when none does."""
    for n in range(min(ngram, len(ctx) - 1), 0, -1):
        tail = ctx[-n:]
        starts = np.flatnonzero(ctx[: len(ctx) - n] == tail[0])  # earlier starts only, not the tail itself
        for j in range(1, n):
            starts = starts[ctx[starts + j] == tail[j]]
        if starts.size:
            after = int(starts[-1]) + n
            return ctx[after : after + k].tolist()
    return []


def check_vocabulary(spec: str, target, tokenizer, draft, draft_tokenizer) -> None:
    """Refuse a draft whose token ids do not mean what the target's do (tokenizer vocabulary and the
    model's `vocab_size` must both be the target's)."""
    ours, theirs = tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    sizes = (target.config.vocab_size, draft.config.vocab_size)
    if ours == theirs and sizes[0] == sizes[1]:
        return
    differ = len(set(ours.items()) ^ set(theirs.items()))
    raise FlywheelError(
        f"draft '{spec}': its vocabulary is not the target's ({len(theirs)} tokens against {len(ours)}, "
        f"{differ} (token, id) pairs differ; model vocab_size {sizes[1]} against {sizes[0]}): a draft must "
        f"use the target's tokenizer"
    )


# ----------------------------------------------------------------------------------------- one sequence


@dataclass
class Round:
    """What one round emitted, with what the target recorded for each token."""

    tokens: list[int]  # the accepted proposals, then the target's token
    logprobs: list[float]  # log p of each at its position
    kept: list[list[int] | None]  # the target's nucleus at each (None: the full vocabulary)
    proposed: int
    accepted: int


class Speculation:
    """One sequence decoded speculatively: the target's and the draft's KV caches, the context, the uniforms.

    Between rounds the target's cache holds the context without its last token; the draft's holds a prefix
    of that (the tokens it has not seen are fed with its next proposal). `dist` turns logits [n, V] into the
    engine's sampling distributions (`sampling.distribution` at the request's temperature and top-p).
    """

    def __init__(
        self,
        target,
        draft,
        prompt: list[int],
        steps: int,
        dist: Callable[[torch.Tensor], Dist],
        rng: torch.Generator,
        store: PrefixStore | None = None,
        packed: Packed | None = None,
        draft_packed: Packed | None = None,
    ) -> None:
        self.dist, self.rng = dist, rng
        self.context = list(prompt)
        self.target = _prefilled(FastRunner(target, steps + 1, store, packed), prompt)
        self.draft = _prefilled(FastRunner(draft, steps, packed=draft_packed), prompt)

    def round(self, k: int) -> Round:
        """Propose `k` tokens (0: plain decoding; a lookup may find fewer), verify them in one target forward,
        emit 1 to k+1."""
        u = torch.rand(2 * k + 1, generator=self.rng).to(self.target.device)
        proposed, q = self._propose(k, u[:k])
        n = len(self.context)
        last = torch.tensor([self.context[-1]], device=proposed.device)
        p = self.dist(_extend(self.target, torch.cat([last, proposed]), every=True))
        q = p.probs[:0] if q is None else q
        accepted, token = speculate(p.probs, q, proposed, u[k:])
        j, token, *drafted = torch.cat([accepted.view(1), token.view(1), proposed]).tolist()
        tokens = [*drafted[:j], token]
        truncate(self.target.cache, n + j)  # it holds context + proposals: keep the accepted ones
        truncate(self.draft.cache, n + j)
        self.context += tokens
        return Round(tokens, p.logprobs(tokens), [p.kept(i) for i in range(j + 1)], proposed.numel(), j)

    def remember(self, ids: list[int]) -> None:
        """Keep the target's keys and values of `ids` (a prefix of the context) in its prefix store."""
        truncate(self.target.cache, len(ids))
        self.target.remember(0, ids)

    def _propose(self, k: int, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k tokens drawn from the draft, one forward each, and their distributions q [k, V]."""
        device = self.draft.device
        if k == 0:
            return torch.empty(0, dtype=torch.long, device=device), None
        unseen = self.context[self.draft.cache.length :]
        logits = _extend(self.draft, torch.tensor(unseen))
        tokens, qs = [], []
        for i in range(k):
            qs.append(self.dist(logits.unsqueeze(0)).probs[0])
            tokens.append(pick(qs[-1], u[i]))
            if i + 1 < k:
                logits = _extend(self.draft, tokens[-1].view(1))
        return torch.stack(tokens), torch.stack(qs)


# ------------------------------------------------------------------------------------ a batch, lookup


class LookupBatch:
    """Several sequences decoded speculatively with a `Lookup` draft, one target forward a round for all.

    A lookup costs no forward, so nothing stops a batch from speculating together: each round every row
    proposes up to its own k tokens, and one forward of the target verifies all of them, left-padded to the
    longest (`fastllama.prefill_after` with every position's logits). Each row then decides alone, by the
    rule of `speculate`, with its own uniforms (2k+1 a round from its request's generator, as `Speculation`
    draws them), so a row's tokens do not depend on its neighbours. Rejected proposals stay in the target's
    cache as columns masked out of attention (rows of one batch share columns, so one row cannot roll back
    alone); their rotary positions are handed back, so the next token sits where it would have.

    Between rounds row j's cache holds its context without the last token, like `Speculation`'s, except
    right after the prefill: the prompt is prefilled whole, and the first round takes the last prompt
    position's logits from it. `settings[j]` is row j's (temperature, top-p); `dist(logits, temperature,
    top_p)` gives the engine's sampling distributions (`sampling.distribution`).
    """

    def __init__(
        self,
        target,
        lookup: Lookup,
        prompts: list[list[int]],
        steps: int,
        settings: list[tuple[float, float]],
        dist: Callable[[torch.Tensor, float, float], Dist],
        rngs: list[torch.Generator],
        store: PrefixStore | None = None,
        packed: Packed | None = None,
    ) -> None:
        self.lookup, self.dist = lookup, dist
        self.settings, self.rngs = list(settings), list(rngs)
        self.contexts = [list(p) for p in prompts]
        self.vocab = target.config.vocab_size
        self.target = FastRunner(target, steps, store, packed)
        ids, mask = _left_padded(self.contexts)
        self.pending: torch.Tensor | None = self.target.prefill(ids, mask)  # [B, V]: the next position's

    def round(self, ks: list[int]) -> list[Round]:
        """Row j proposes up to `ks[j]` tokens (0: a plain step); one forward verifies them all; each row
        emits 1 to ks[j]+1 tokens."""
        device = self.target.device
        us = [torch.rand(2 * k + 1, generator=g).to(device) for k, g in zip(ks, self.rngs, strict=True)]
        found = [
            continuation(np.asarray(c), self.lookup.ngram, k) if k else []
            for c, k in zip(self.contexts, ks, strict=True)
        ]
        feed = [
            d if self.pending is not None else [c[-1], *d] for c, d in zip(self.contexts, found, strict=True)
        ]
        width = max(map(len, feed))
        logits = self._verify(feed, width) if width else None
        rows = []  # the target's logits at each row's positions: its context's last, then each proposal
        for j, fed in enumerate(feed):
            parts = [] if self.pending is None else [self.pending[j : j + 1]]
            if fed:
                assert logits is not None
                parts.append(logits[j, width - len(fed) :])
            rows.append(torch.cat(parts))
        dists = self._distributions(rows)
        out = []
        for j, (d, p, u, k) in enumerate(zip(found, dists, us, ks, strict=True)):
            proposed = torch.tensor(d, dtype=torch.long, device=device)
            q = F.one_hot(proposed, self.vocab).float() if d else p.probs[:0]
            accepted, token = speculate(p.probs, q, proposed, u[k:])
            n = int(accepted)
            tokens = [*d[:n], int(token)]
            self._reject(j, len(d) - n)
            self.contexts[j] += tokens
            out.append(Round(tokens, p.logprobs(tokens), [p.kept(i) for i in range(n + 1)], len(d), n))
        self.pending = None
        return out

    def select(self, rows: list[int]) -> None:
        """Keep only `rows` (positions in the current batch), in that order."""
        idx = torch.tensor(rows, dtype=torch.long)
        self.contexts = [self.contexts[j] for j in rows]
        self.settings = [self.settings[j] for j in rows]
        self.rngs = [self.rngs[j] for j in rows]
        if self.pending is not None:
            self.pending = self.pending[idx.to(self.pending.device)]
        self.target.select(idx)

    def remember(self, row: int, ids: list[int]) -> None:
        """Keep `row`'s keys and values of `ids` (a prefix of what it was fed) in the target's prefix store."""
        store, cache = self.target.store, self.target.cache
        if store is not None and cache is not None:
            k, v = row_kv(cache, row, len(ids))
            assert k.shape[2] == len(ids), (k.shape, len(ids))
            store.add(ids, k, v)

    def _verify(self, feed: list[list[int]], width: int) -> torch.Tensor:
        """Every row's fed tokens, left-padded to `width`, through the target: logits [B, width, V]."""
        runner = self.target
        assert runner.cache is not None
        runner.cache = reserve(runner.cache, width)
        ids, mask = _left_padded(feed, width)
        return prefill_after(
            runner.model, runner.cache, ids.to(runner.device), mask.to(runner.device), True, runner.packed
        )

    def _distributions(self, rows: list[torch.Tensor]) -> list[Dist]:
        """`dist` over each row's logits, one call for all rows that share their sampling settings."""
        out: list[Dist | None] = [None] * len(rows)
        for setting in dict.fromkeys(self.settings):
            members = [j for j, s in enumerate(self.settings) if s == setting]
            d = self.dist(torch.cat([rows[j] for j in members]), *setting)
            at = 0
            for j in members:
                n = rows[j].shape[0]
                out[j] = Dist(d.probs[at : at + n], None if d.keep is None else d.keep[at : at + n])
                at += n
        return [d for d in out if d is not None]

    def _reject(self, row: int, count: int) -> None:
        """Mask out `row`'s last `count` fed columns (its rejected proposals) and hand back their positions."""
        cache = self.target.cache
        if count and cache is not None:
            cache.valid[row, cache.length - count : cache.length] = False
            cache.next_pos[row] -= count


def _left_padded(rows: list[list[int]], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` of token ids right-aligned in [B, width] (ids, mask 1 on real tokens)."""
    width = max(map(len, rows)) if width is None else width
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, r in enumerate(rows):
        if r:
            ids[j, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[j, width - len(r) :] = 1
    return ids, mask


def _prefilled(runner: FastRunner, prompt: list[int]) -> FastRunner:
    """`runner` with the prompt's keys and values but its last token's (fed with the first round)."""
    ids = torch.tensor([prompt])
    runner.prefill(ids, torch.ones_like(ids))
    assert runner.cache is not None
    truncate(runner.cache, runner.cache.length - 1)
    return runner


def _extend(runner: FastRunner, ids: torch.Tensor, every: bool = False) -> torch.Tensor:
    """Feed `ids` [S] after what `runner`'s one row holds: the last position's logits [V] (`every`: each
    position's, [S, V])."""
    assert runner.cache is not None
    runner.cache = reserve(runner.cache, ids.numel())
    ids = ids.to(runner.device).unsqueeze(0)
    if ids.shape[1] == 1 and not every:
        return decode(runner.model, runner.cache, ids[0], runner.packed)[0]
    return prefill_after(
        runner.model, runner.cache, ids, torch.ones_like(ids), every=every, packed=runner.packed
    )[0]
