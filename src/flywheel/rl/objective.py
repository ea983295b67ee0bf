"""The RL objective: reward, baselines, advantages, replay log-probabilities and the policy loss.

Everything here is a pure function of tensors or numbers; the training loop is a thin shell on top.

Reward
------
``R = S - λ_e · C``: ``S`` is 1 for a verified success, ``C`` is the rollout's cost (inference spend and
time, in whatever unit λ was calibrated in, see ``flywheel.rl.calibrate``) and ``λ_e`` the cost price of
the rollout's effort level. A cheating attempt scores like a failure of the same cost: the grader alone
decides cheating, and a cheat is never a success there (`flywheel.verify.grader`), whether or not the
tests passed. This is the one place the reward is computed; the trainer's score (`flywheel.rl.trainer`)
calls it and the loop stores it once, in the record's `rl`.

An alternating length penalty (SWE-1.7's, off by default) subtracts ``Σ_q μ_q · max(0, u_q - B_e,q)``
in penalised phases (`budget_penalty`): for each quantity ``q`` that effort e's budget names (`QUANTITIES`:
model turns, generated tokens, compute seconds), ``μ_q`` per unit the attempt used over it. The original
form is the one-quantity case, ``μ · max(0, turns - B_e)`` (`over_budget`). Phases of ``K`` steps
alternate, success only first, then penalised (``length_penalty_on``), so attempts that can finish within
the budget learn to, while in the success-only phases whatever solves the task is rewarded however long
it runs.

Baseline and advantages
-----------------------
Rollouts are grouped by (task, effort): same prompt, same price of cost. Within a group the advantage is
``A_i = R_i - b``. The default baseline is length-weighted, ``b = Σ R_i L_i / Σ L_i`` with ``L_i`` the
number of tokens the policy generated in rollout ``i`` (tool output and prompts excluded). Why: the
policy-gradient estimate of one rollout is ``(R_i - b) g_i`` with ``g_i = Σ_t ∇ log π(token_t)``, and
the ``b`` minimising ``E‖(R - b) g‖²`` is ``E[R‖g‖²] / E[‖g‖²]``. When ``‖g_i‖² ∝ L_i`` (a sum of ``L_i``
roughly independent token gradients) that is the length-weighted mean (the "optimal baseline" of OPO).
A group whose lengths are all zero carries no gradient at all; its baseline falls back to the plain mean
so that advantages stay finite and meaningful for logging. A group of one has advantage 0: with no peer
there is nothing to compare against. An attempt the infrastructure ended (`Trajectory.infra_failure`: the
model server, the sandbox or the grader failed) is masked (`advantages_flat`'s `valid`): its advantage
is 0 and its group's baseline is taken over the other attempts, so an outage neither pushes the policy
away from what it did nor shifts its peers' advantages; a group left with fewer than two valid attempts
trains nothing. Advantages are not divided by the group's standard deviation:
that would re-weight tasks by how noisy they are (Dr. GRPO), which is not part of the objective.

Sampling-distribution replay
----------------------------
The sampler draws each token from a top-p truncated, temperature-scaled distribution and records the
kept set. ``replay_log_probs`` recomputes the token's log-probability under the *same* distribution on the
trainer's logits: logits are divided by the temperature, everything outside the kept set is set to
``-inf``, and the softmax renormalises over the kept set. Tokens outside the kept set receive exactly
zero gradient, so low-probability tail tokens (which the sampler could never have produced) do not sharpen
the distribution and drain entropy.

Loss and its normalisation
--------------------------
``loss = -Σ_tokens w · A · log π_replay(token) / N`` with the truncated importance weight
``w = min(π_replay / π_rollout, c)`` (``c = 2`` by default, as in truncated importance sampling and
IMPALA's truncated ratios). ``w`` is detached: it corrects for the rollout policy being a few steps stale
(and for numerical mismatch between inference and training kernels) but it is a weight, not something
to differentiate. On-policy, ``w = 1`` and the loss is plain REINFORCE with a baseline.

``N`` is a *constant* token budget by default (``normalise="token_sum/constant"``: e.g. rollouts per
batch × max generated tokens, as in Dr. GRPO). Each token then counts the same, in every sequence and in
every batch, which is what the length-weighted baseline assumes: a sequence's gradient is the sum of its
token gradients. A per-sequence mean (``"seq_mean"``, the original GRPO) divides each sequence's gradient
by its length, which up-weights short sequences, changes ``‖g_i‖²`` to ``∝ 1/L_i`` and so breaks the
variance argument above; it is offered for comparison only. ``"token_mean"`` (divide by the batch's
token count, as in DAPO) keeps the within-batch weighting but lets the step size drift with batch length.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal, TypeVar

import numpy as np
import torch

K = TypeVar("K", bound=Hashable)
Baseline = Literal["length_weighted", "mean"]
Normalise = Literal["token_sum/constant", "token_mean", "seq_mean"]

# ------------------------------------------------------------------------------------------------ reward


def reward(success: bool, cost: float, lam: float) -> float:
    """``S - λ·C`` with ``S = 1`` for a success (the grader's: never a cheat). ``cost`` and ``lam`` must be
    finite, ``lam >= 0``."""
    if not (math.isfinite(cost) and math.isfinite(lam)):
        raise ValueError(f"cost and lambda must be finite (cost={cost}, lambda={lam})")
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    return (1.0 if success else 0.0) - lam * cost


def length_penalty_on(step: int, phase: int) -> bool:
    """Whether RL step `step` (1-based) is in a penalised phase: phases of `phase` steps alternate, success
    only first; `phase = 0` penalises every step."""
    return phase == 0 or (step - 1) // phase % 2 == 1


# what a length budget may name: model calls, generated tokens, compute seconds (`flywheel.rl.trainer.usage`)
QUANTITIES = ("turns", "tokens", "seconds")


def as_budget(budget: float | Mapping[str, float] | None) -> dict[str, float]:
    """One effort's budget per quantity: a plain number is a turn budget (the original form), None none."""
    if budget is None:
        return {}
    if isinstance(budget, Mapping):
        return {q: float(b) for q, b in budget.items()}
    return {"turns": float(budget)}


def as_prices(price: float | Mapping[str, float]) -> dict[str, float]:
    """Reward lost per unit over budget, per quantity: a plain number prices turns (the original form)."""
    return {q: float(p) for q, p in price.items()} if isinstance(price, Mapping) else {"turns": float(price)}


def overruns(usage: Mapping[str, float], budget: Mapping[str, float]) -> dict[str, float]:
    """``max(0, used - budget)`` for each quantity `budget` names (`usage` must hold each of them)."""
    return {q: max(0.0, float(usage[q]) - b) for q, b in budget.items()}


def budget_penalty(
    usage: Mapping[str, float], budget: Mapping[str, float], prices: Mapping[str, float]
) -> float:
    """The length penalty ``Σ_q price_q · max(0, used_q - budget_q)`` over the quantities `budget` names; a
    quantity without a price costs nothing. Example: 5 turns and 1000 tokens against ``{turns: 3, tokens:
    800}`` at ``{turns: 0.1, tokens: 0.0005}`` lose ``0.1·2 + 0.0005·200 = 0.3``."""
    return sum((prices.get(q, 0.0) * over for q, over in overruns(usage, budget).items()), 0.0)


def over_budget(turns: int, budget: int | None, price: float) -> float:
    """The turn-only length penalty ``price · max(0, turns - budget)``; no budget, no penalty."""
    return budget_penalty({"turns": turns}, as_budget(budget), {"turns": price})


# --------------------------------------------------------------------------------- baselines, advantages


def group_mean_baseline(rewards: Sequence[float]) -> float:
    """The group's mean reward."""
    if not rewards:
        raise ValueError("a baseline needs at least one reward")
    return float(sum(rewards)) / len(rewards)


def length_weighted_baseline(rewards: Sequence[float], lengths: Sequence[int]) -> float:
    """``Σ R_i·L_i / Σ L_i`` over one group; the plain mean when every length is zero.

    ``lengths`` are generated-token counts (non-negative). Example: rewards ``[1, 0]`` with lengths
    ``[10, 30]`` give ``(1·10 + 0·30) / 40 = 0.25``: the long failure pulls the baseline down.
    """
    if len(rewards) != len(lengths):
        raise ValueError(f"{len(rewards)} rewards but {len(lengths)} lengths")
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be >= 0, got {list(lengths)}")
    total = sum(lengths)
    if total == 0:
        return group_mean_baseline(rewards)
    return float(sum(r * n for r, n in zip(rewards, lengths, strict=True))) / total


BASELINES = ("length_weighted", "mean")


def _baseline(group: Sequence[tuple[float, int]], kind: Baseline) -> float:
    rewards = [r for r, _ in group]
    if kind == "length_weighted":
        return length_weighted_baseline(rewards, [n for _, n in group])
    return group_mean_baseline(rewards)


def advantages(
    groups: Mapping[K, Sequence[tuple[float, int]]], baseline: Baseline = "length_weighted"
) -> dict[K, list[float]]:
    """Per-rollout ``A_i = R_i - b`` for each group of ``(reward, generated_tokens)`` pairs.

    Keys are whatever identifies a group, typically ``(task_id, effort)``; the result keeps the keys and
    the order of rollouts inside each group. A group of one has advantage exactly 0 (no peer).
    """
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; expected 'length_weighted' or 'mean'")
    out: dict[K, list[float]] = {}
    for key, group in groups.items():
        if len(group) < 2:
            out[key] = [0.0] * len(group)
            continue
        b = _baseline(group, baseline)
        out[key] = [r - b for r, _ in group]
    return out


def advantages_flat(
    rewards: Sequence[float],
    lengths: Sequence[int],
    keys: Sequence[Hashable],
    baseline: Baseline = "length_weighted",
    valid: Sequence[bool] | None = None,
) -> list[float]:
    """`advantages` for flat, aligned lists: rollout ``i`` belongs to group ``keys[i]``.

    ``valid[i]`` False masks rollout ``i`` (an infrastructure failure): its advantage is 0 and its group's
    baseline is over the valid rollouts only. None: every rollout is valid.
    """
    valid = [True] * len(rewards) if valid is None else valid
    if not len(rewards) == len(lengths) == len(keys) == len(valid):
        raise ValueError(
            f"lengths differ: {len(rewards)} rewards, {len(lengths)} lengths, {len(keys)} keys, "
            f"{len(valid)} valid flags"
        )
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        if valid[i]:
            members.setdefault(key, []).append(i)
    groups = {key: [(rewards[i], lengths[i]) for i in idx] for key, idx in members.items()}
    per_group = advantages(groups, baseline)
    out = [0.0] * len(rewards)
    for key, idx in members.items():
        for i, a in zip(idx, per_group[key], strict=True):
            out[i] = a
    return out


# ------------------------------------------------------------------------------------------------ replay

Kept = Sequence[Sequence[int] | None]


def kept_mask(kept: Kept, vocab: int, device: torch.device | str | None = None) -> torch.Tensor:
    """A ``[T, vocab]`` boolean mask, True where the token was in the position's kept set.

    A ``None`` or empty entry means the sampler kept the full vocabulary at that position (top-p = 1).
    Filled row by row with numpy index assignment (each kept set converted once, never a loop over the
    vocabulary in Python): for the wide kept sets of a flat distribution (tens of thousands of ids a
    position) this is 2.5x faster than one flattened list of every id. It costs one byte per logit:
    replay long sequences of large vocabularies in chunks of positions.
    """
    mask = np.zeros((len(kept), vocab), dtype=bool)
    for row, ids in enumerate(kept):
        if ids is None or len(ids) == 0:
            mask[row] = True
            continue
        cols = np.asarray(ids, dtype=np.int64)
        lo, hi = int(cols.min()), int(cols.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"kept token ids must lie in [0, {vocab}), got [{lo}, {hi}]")
        mask[row, cols] = True
    return torch.from_numpy(mask).to(device) if device is not None else torch.from_numpy(mask)


def _masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits.float() / temperature
    return torch.log_softmax(scaled.masked_fill(~mask, float("-inf")), dim=-1)


def replay_log_probs(
    logits: torch.Tensor,
    kept: Kept | torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probability of ``tokens[t]`` under softmax(``logits[t] / temperature``) restricted to ``kept[t]``.

    ``logits`` is ``[T, V]``, ``tokens`` ``[T]``; ``kept`` is a list of ``T`` kept sets (``None`` or empty:
    the full vocabulary) or a ``[T, V]`` boolean mask from `kept_mask`. Returns ``[T]`` float32, and
    logits outside a position's kept set get exactly zero gradient. A token outside its own kept set means
    the record is corrupt and raises ValueError (its probability under the sampler was zero).
    Greedy decoding replays as ``kept = [[argmax]]`` at each position (log-prob 0).
    """
    if logits.dim() != 2 or tokens.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [T, V] and tokens [T], got {tuple(logits.shape)} and {tuple(tokens.shape)}"
        )
    mask = kept.bool() if isinstance(kept, torch.Tensor) else kept_mask(kept, logits.shape[1], logits.device)
    if mask.shape != logits.shape:
        raise ValueError(f"kept mask shape {tuple(mask.shape)} does not match logits {tuple(logits.shape)}")
    index = tokens.long().unsqueeze(1)
    outside = ~mask.gather(1, index).squeeze(1)
    if bool(outside.any()):
        raise ValueError(
            f"sampled token outside its kept set at positions {outside.nonzero().flatten().tolist()}"
        )
    return _masked_log_softmax(logits, mask, temperature).gather(1, index).squeeze(1)


def replay_entropy(logits: torch.Tensor, kept_mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of each position's replay distribution, over its kept set only. ``[T, V] -> [T]``.

    Differentiable, with zero gradient outside the kept set (no ``0 · -inf`` anywhere).
    """
    mask = kept_mask.bool()
    logp = _masked_log_softmax(logits, mask, temperature)
    safe = logp.masked_fill(~mask, 0.0)
    return -(safe.exp() * safe).masked_fill(~mask, 0.0).sum(dim=-1)


# -------------------------------------------------------------------------------------------------- loss


def importance_weights(
    logp_replay: torch.Tensor, logp_rollout: torch.Tensor, clip_c: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ratio, min(ratio, c))`` with ``ratio = π_replay / π_rollout``, both detached."""
    ratio = torch.exp(logp_replay.detach().float() - logp_rollout.detach().float())
    return ratio, ratio.clamp(max=clip_c)


def _normalised_sum(per_token: torch.Tensor, mask: torch.Tensor, how: Normalise, budget: float | None):
    if how == "token_sum/constant":
        n = float(budget) if budget is not None else float(mask.numel())
        if n <= 0:
            raise ValueError(f"token budget must be > 0, got {n}")
        return per_token.sum() / n
    if how == "token_mean":
        return per_token.sum() / mask.sum().clamp(min=1)
    if how == "seq_mean":
        lengths = mask.reshape(-1, mask.shape[-1]).sum(-1)
        per_seq = per_token.reshape(-1, mask.shape[-1]).sum(-1) / lengths.clamp(min=1)
        return per_seq.sum() / (lengths > 0).sum().clamp(min=1)
    raise ValueError(
        f"unknown normalisation {how!r}; expected 'token_sum/constant', 'token_mean' or 'seq_mean'"
    )


def policy_loss(
    logp_replay: torch.Tensor,
    logp_rollout: torch.Tensor,
    advantages_per_token: torch.Tensor,
    mask: torch.Tensor,
    clip_c: float = 2.0,
    normalise: Normalise = "token_sum/constant",
    token_budget: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated-importance-weighted policy-gradient loss and its diagnostics.

    Tensors are ``[B, T]`` (or ``[T]`` for one sequence); ``advantages_per_token`` may be ``[B, 1]`` to
    broadcast one advantage over a sequence. ``mask`` marks generated tokens (True/1) versus prompt, tool
    output and padding; values at masked-out positions are ignored, even if infinite. ``token_budget`` is
    the constant ``N`` of the default normalisation; left ``None`` it is ``mask.numel()``, which is
    constant when batches are padded to a fixed shape. Stats (Python floats, over generated tokens):
    ``is_weight_mean`` (after truncation), ``is_ratio_max`` (before), ``clip_frac``, ``kl_k1`` and
    ``kl_k3`` (estimates of KL(π_rollout ‖ π_replay) from rollout samples), ``tokens``.
    """
    if not logp_replay.shape == logp_rollout.shape == mask.shape:
        shapes = [tuple(t.shape) for t in (logp_replay, logp_rollout, mask)]
        raise ValueError(f"log-probs and mask must share one shape, got {shapes}")
    if advantages_per_token.dim() != logp_replay.dim():
        raise ValueError(
            "advantages must have one dimension per log-prob dimension (use [B, 1] to broadcast)"
        )
    keep = mask.bool()
    lp = torch.where(keep, logp_replay, torch.zeros_like(logp_replay))
    lr = torch.where(keep, logp_rollout.to(lp.dtype), torch.zeros_like(lp))
    ratio, w = importance_weights(lp, lr, clip_c)
    adv = advantages_per_token.to(lp.dtype).expand_as(lp)
    per_token = torch.where(keep, -(w * adv.detach()) * lp, torch.zeros_like(lp))
    loss = _normalised_sum(per_token, keep, normalise, token_budget)
    return loss, _stats(ratio, w, lp.detach() - lr, keep, clip_c)


def _stats(ratio: torch.Tensor, w: torch.Tensor, log_ratio: torch.Tensor, keep: torch.Tensor, c: float):
    n = int(keep.sum())
    if n == 0:
        return dict.fromkeys(("is_weight_mean", "is_ratio_max", "clip_frac", "kl_k1", "kl_k3", "tokens"), 0.0)
    r, lr = ratio[keep], log_ratio[keep].float()
    return {
        "is_weight_mean": float(w[keep].mean()),
        "is_ratio_max": float(r.max()),
        "clip_frac": float((r > c).float().mean()),
        "kl_k1": float((-lr).mean()),
        "kl_k3": float((r - 1 - lr).mean()),
        "tokens": float(n),
    }
