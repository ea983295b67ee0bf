"""Sampling for the in-process engine: the top-p nucleus, the distributions drawn from, one batched step.

`sample_step(logits, temperature, top_p, u)` is a pure function over a whole batch [B, V]:
- temperature `t > 0` scales the logits by `1/t`; `t == 0` is greedy: the kept set is `[argmax]` and the
  sampled token's log-prob is 0 (the point mass the token was drawn from).
- top-p keeps the smallest prefix of the tokens sorted by probability whose mass reaches `top_p`
  (a token is kept when the mass of the tokens ranked above it is `< top_p`), then renormalises over it.
  The nucleus is found from a `topk` of the first few hundred tokens (`topk_nucleus`); a row whose nucleus
  is wider (a flat distribution, such as an untrained model's) is found without sorting the vocabulary: a
  histogram of the logits finds the bin where the mass crosses `top_p`, and only that bin is ranked
  (`wide_nucleus`). Its kept ids come in id order, and the token is picked by inverse CDF in that order.
  Each row takes its own path, so which one a row takes never depends on the other rows of its batch.
- A token's log-prob is taken under the distribution actually sampled from: after temperature and the
  top-p renormalisation. The `Step` holds each row's nucleus as tensors (top-k ids and their count, or a
  mask over the vocabulary); a row sampled from the full vocabulary (`top_p >= 1`) has none.
- Everything is computed in float32 on the logits' device; `Step.cpu` brings the results to the CPU.

Random streams: each request's is its own. `request_uniforms` draws all of a request's uniforms up front
from a `torch.Generator` seeded with `Request.seed` (an unseeded request draws from the engine's
generator), and tokens are picked by inverse CDF, so a seeded request samples the same tokens whatever
else shares its batch (up to float differences between batch shapes). `request_rng` is a request's stream
as a generator, for speculative decoding, which draws its uniforms a round at a time.

`distribution(logits, temperature, top_p)` gives the same distributions whole, for rows at one request's
settings (`Dist`: probabilities, zero outside the nucleus, and the nucleus): speculative decoding's p and
q (`flywheel.models.speculative`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOPK_FIRST = 256  # nucleus search width before falling back to a full sort
NUCLEUS_BINS = 1024  # logit bins of `wide_nucleus`


@dataclass
class Dist:
    """Sampling distributions, one per row: what the engine draws the token at each position from."""

    probs: torch.Tensor  # [n, V] float32: zero outside the nucleus, each row sums to 1
    keep: torch.Tensor | None  # [n, V] bool: the nucleus; None: the full vocabulary

    def logprobs(self, tokens: list[int]) -> list[float]:
        """The log-prob of `tokens[i]` under row i: what a token drawn there records."""
        rows, at = torch.arange(len(tokens)), torch.tensor(tokens)
        return self.probs[rows.to(self.probs.device), at.to(self.probs.device)].log().tolist()

    def kept(self, row: int) -> list[int] | None:
        """The nucleus of `row` as token ids in id order (None: the full vocabulary)."""
        return None if self.keep is None else self.keep[row].nonzero().squeeze(1).tolist()


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


def request_rng(seed: int | None, rng: torch.Generator) -> torch.Generator:
    """A request's own generator: seeded with `seed`, else with a draw from the engine's `rng`."""
    if seed is None:
        seed = int(torch.randint(2**62, (1,), generator=rng))
    return torch.Generator().manual_seed(int(seed))


def request_uniforms(seed: int | None, steps: int, rng: torch.Generator) -> torch.Tensor:
    """A request's `steps` uniforms in [0, 1), drawn up front: from a generator seeded with `seed`, else from
    the engine's `rng`."""
    if seed is None:
        return torch.rand(steps, generator=rng)
    return torch.rand(steps, generator=torch.Generator().manual_seed(int(seed)))
