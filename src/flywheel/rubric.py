"""The rubric: how a graded attempt becomes a number. This is the one place the reward is computed.

The trainer (`flywheel.rl.trainer`), calibration (`flywheel.rl.calibrate`), `flywheel grade` and the
evaluation summaries (`flywheel.eval`) call it and compute none of it themselves. It imports no torch.

Reward
------
``R = S - λ_e · C``: ``S`` is 1 for a verified success, ``C`` is the attempt's cost (`reward_cost`:
inference spend and time, in whatever unit λ was calibrated in) and ``λ_e`` the cost price of the
attempt's effort level (`resolve_lambdas`: explicit values, else a `flywheel calibrate` file's, which
takes them from the base model's frontier). A cheating attempt scores like a failure of the same cost:
the grader alone decides cheating, and a cheat is never a success there (`flywheel.verify.grader`).

Cost. Normally the harness's cost in dollars (tokens and compute seconds). Seconds are not reproducible,
so a deterministic run prices a modelled time instead: fixed seconds per generated token, per prompt
token and per tool call (`MODELLED_SECONDS`), which keeps the cost's shape (longer and busier attempts
cost more) and makes two runs with the same seed identical. A Fusion attempt costs both sides' usage,
each priced by its own model, in either mode (`cost_parts`).

An alternating length penalty (SWE-1.7's, off by default) subtracts ``Σ_q μ_q · max(0, u_q - B_e,q)``
in penalised phases (`budget_penalty`): for each quantity ``q`` that effort e's budget names
(`QUANTITIES`: model turns, generated tokens, compute seconds; `usage`), ``μ_q`` per unit the attempt used
over it. The original form is the one-quantity case, ``μ · max(0, turns - B_e)`` (`over_budget`). Phases
of ``K`` steps alternate, success only first, then penalised (`length_penalty_on`), so attempts that can
finish within the budget learn to, while in the success-only phases whatever solves the task is rewarded
however long it runs.

Baseline and advantages
-----------------------
Attempts are grouped by (task, effort): same prompt, same price of cost. Within a group the advantage is
``A_i = R_i - b``. The default baseline is length-weighted, ``b = Σ R_i L_i / Σ L_i`` with ``L_i`` the
number of tokens the policy generated in attempt ``i`` (`generated_tokens`; tool output and prompts
excluded). Why: the policy-gradient estimate of one attempt is ``(R_i - b) g_i`` with
``g_i = Σ_t ∇ log π(token_t)``, and the ``b`` minimising ``E‖(R - b) g‖²`` is ``E[R‖g‖²] / E[‖g‖²]``.
When ``‖g_i‖² ∝ L_i`` (a sum of ``L_i`` roughly independent token gradients) that is the length-weighted
mean (the "optimal baseline" of OPO). A group whose lengths are all zero carries no gradient at all; its
baseline falls back to the plain mean so that advantages stay finite and meaningful for logging. A group
of one has advantage 0: with no peer there is nothing to compare against. Advantages are not divided by
the group's standard deviation: that would re-weight tasks by how noisy they are (Dr. GRPO), which is not
part of the objective.

The infrastructure mask
-----------------------
An attempt the infrastructure ended (`Trajectory.infra_failure`: the model server, the sandbox or the
grader failed) does not count (`counts`): its advantage is 0 and its group's baseline is taken over the
other attempts, so an outage neither pushes the policy away from what it did nor shifts its peers'
advantages; a group left with fewer than two valid attempts trains nothing. Summaries and metrics leave
such attempts out of their means.

`Rubric` holds one run's prices (λ, the baseline, the length budgets and their phases) and scores a
step's records (`Rubric.score`); `score` is the same as a pure function of its arguments.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from flywheel.errors import FlywheelError
from flywheel.harness import pricing_for
from flywheel.record import Trajectory

K = TypeVar("K", bound=Hashable)
Baseline = Literal["length_weighted", "mean"]

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


# what a length budget may name: model calls, generated tokens, compute seconds (`usage`)
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


# -------------------------------------------------------------------------------------------------- cost

# seconds per completion token, per prompt token, per tool call (a small CPU model and a sandboxed tool)
MODELLED_SECONDS = (0.004, 0.0002, 0.4)


def tool_calls(record: Trajectory) -> int:
    """The tool calls of an attempt (format errors and compactions are not calls)."""
    return sum(
        t["role"] == "tool" and t.get("name") not in ("format_error", "compaction") for t in record.turns
    )


def reward_cost(record: Trajectory, deterministic: bool = False) -> float:
    """The attempt's cost in dollars: the harness's, or with modelled seconds when `deterministic`. A
    Fusion attempt's is the whole pair's, the lead's and every delegation's (`cost_parts`)."""
    return sum(cost_parts(record, deterministic))


def cost_parts(record: Trajectory, deterministic: bool = False) -> tuple[float, float]:
    """(the lead's or single agent's cost, the sidekick's): the second is 0 except for Fusion's attempts."""
    if not deterministic:
        if record.fusion is None:
            return float(record.cost), 0.0
        return float(record.fusion["lead_cost"]), float(record.fusion["sidekick_cost"])
    return modelled_cost(record), sum(modelled_cost(s) for s in record.sidekick or [])


def modelled_cost(record: Trajectory) -> float:
    """One episode's own cost (a Fusion lead's without its sidekick) priced with modelled seconds."""
    per_gen, per_prompt, per_tool = MODELLED_SECONDS
    seconds = (
        record.completion_tokens * per_gen + record.prompt_tokens * per_prompt + tool_calls(record) * per_tool
    )
    return pricing_for(record.model).cost(record.prompt_tokens, record.completion_tokens, seconds)


def resolve_lambdas(
    efforts: Sequence[str], lambdas: Mapping[str, float], calibration: str = ""
) -> dict[str, float]:
    """λ per effort: explicit values, else the calibration file's (`flywheel calibrate`), else 0."""
    from_file: dict[str, float] = {}
    if calibration:
        path = Path(calibration)
        if not path.is_file():
            raise FlywheelError(f"[reward] calibration '{path}': file not found (run `flywheel calibrate`)")
        from_file = json.loads(path.read_text()).get("lambdas", {})
    return {e: float(lambdas.get(e, from_file.get(e, 0.0))) for e in efforts}


# ------------------------------------------------------------------------------ usage, mask, scores


def turns_of(record: Trajectory) -> list[dict[str, Any]]:
    """The assistant turns that carry sampled tokens (in-process models) and are trained: a Fusion
    attempt's (`record.fusion`) are its nested sidekick episodes' only, whatever the lead's turns carry
    (the lead is frozen); they all share the attempt's advantage."""
    episodes = (record.sidekick or []) if record.fusion is not None else [record]
    return [t for e in episodes for t in e.turns if t["role"] == "assistant" and t.get("token_ids")]


def generated_tokens(record: Trajectory) -> int:
    return sum(len(t["token_ids"]) for t in turns_of(record))


def usage(record: Trajectory) -> dict[str, float]:
    """What an attempt used of each quantity a length budget may name (`QUANTITIES`): its model
    calls (`n_turns`), generated tokens (`completion_tokens`) and its own compute seconds (`compute_s`: tool
    calls plus its share of the batched generation; not `wall_s`, which counts waiting on the batch's other
    episodes). A Fusion attempt's are its lead's record's."""
    return {"turns": record.n_turns, "tokens": record.completion_tokens, "seconds": record.compute_s}


def counts(record: Trajectory) -> bool:
    """Whether an attempt counts: the policy ended it, not the infrastructure (`infra_failure`)."""
    return record.infra_failure is None


def score(
    records: Sequence[Trajectory],
    lambdas: dict[str, float],
    baseline: str,
    deterministic: bool,
    length_price: float | Mapping[str, float] = 0.0,
    length_budget: Mapping[str, float | Mapping[str, float]] | None = None,
    length_scope: str = "all",
) -> list[dict[str, float]]:
    """Per record: cost, λ, reward and advantage (pure; the records are not changed). The alternating
    length penalty comes off the reward: `length_budget` per effort is a turn count or a budget per
    quantity (`{"turns": 3, "tokens": 800, "seconds": 20}`), `length_price` a price per turn or per
    quantity, and each unit of a quantity `usage` went over its budget costs its price
    (`budget_penalty`); with `length_scope="solved"` only in (task, effort) groups where some
    attempt solved the task (a success is honest: the grader never lets a cheat succeed). A record the
    infrastructure ended (`infra_failure`) is masked: advantage 0, and left out of its group's baseline
    and of `solved`; a group with fewer than two valid records trains nothing. A Fusion attempt's cost is
    the pair's, and its score adds each side's (`lead_cost`, `sidekick_cost`); its tokens are its
    sidekick's."""
    parts = [cost_parts(r, deterministic) for r in records]
    costs = [lead + side for lead, side in parts]
    lams = [float(lambdas.get(r.effort, 0.0)) for r in records]
    keys = [(r.task_id, r.effort) for r in records]
    valid = [counts(r) for r in records]
    solved_groups = {k for k, r, v in zip(keys, records, valid, strict=True) if r.success and v}
    budget, prices = length_budget or {}, as_prices(length_price)
    over = [
        budget_penalty(usage(r), as_budget(budget.get(r.effort)), prices)
        if length_scope == "all" or k in solved_groups
        else 0.0
        for r, k in zip(records, keys, strict=True)
    ]
    rewards = [reward(r.success, c, lam) - o for r, c, lam, o in zip(records, costs, lams, over, strict=True)]
    lengths = [generated_tokens(r) for r in records]
    adv = advantages_flat(rewards, lengths, keys, baseline, valid)
    out = [
        {"cost": c, "lambda": lam, "length_penalty": o, "reward": rw, "advantage": a, "tokens": n}
        for c, lam, o, rw, a, n in zip(costs, lams, over, rewards, adv, lengths, strict=True)
    ]
    for s, r, (lead, side) in zip(out, records, parts, strict=True):
        if r.fusion is not None:
            s.update(lead_cost=lead, sidekick_cost=side)
    return out


def budget_metrics(
    records: Sequence[Trajectory], budgets: Mapping[str, Mapping[str, float]], penalised: bool
) -> dict[str, float]:
    """With length budgets set: `length_penalised` (1 in a penalised phase, 0 in a success-only one) and, for
    each budgeted quantity q, `over_q`: the share of the step's attempts at the efforts that budget q that
    used more of it, overall and per effort level (`medium/over_tokens`). Measured in both phases and
    whatever `length_scope`, over the attempts the policy ended (as `outcome_metrics`'s means); a quantity
    no such attempt budgets has no rate. No budgets: no keys."""
    if not budgets:
        return {}
    valid = [r for r in records if counts(r)]
    out = {"length_penalised": float(penalised), **_overrun_rates(valid, budgets, "")}
    for e in sorted(budgets):
        out.update(_overrun_rates([r for r in valid if r.effort == e], budgets, f"{e}/"))
    return out


def _overrun_rates(
    records: Sequence[Trajectory], budgets: Mapping[str, Mapping[str, float]], prefix: str
) -> dict[str, float]:
    over = [overruns(usage(r), budgets.get(r.effort, {})) for r in records]
    return {
        f"{prefix}over_{q}": statistics.fmean(o[q] > 0 for o in over if q in o)
        for q in QUANTITIES
        if any(q in o for o in over)
    }


def outcome_metrics(records: Sequence[Trajectory], scores: Sequence[dict[str, float]]) -> dict[str, float]:
    """Reward, success, cost, turns and generated tokens: overall and per effort level (`high/success`).

    The means are over the valid records only, those the policy ended, so that an outage does not read as
    the policy getting worse (none valid: no means); `infra_failures` counts the others and
    `infra/<cause>` each cause (`flywheel.record.INFRA_CAUSES`).
    """
    pairs = [(r, s) for r, s in zip(records, scores, strict=True) if counts(r)]
    out = _means([r for r, _ in pairs], [s for _, s in pairs], "")
    for effort in sorted({r.effort for r, _ in pairs}):
        mine = [(r, s) for r, s in pairs if r.effort == effort]
        out.update(_means([r for r, _ in mine], [s for _, s in mine], f"{effort}/"))
    return {**out, **infra_counts(records)}


def infra_counts(records: Sequence[Trajectory]) -> dict[str, float]:
    """`infra_failures`: records the infrastructure ended; `infra/<cause>`: per cause, those that occur."""
    causes = Counter(r.infra_failure for r in records if r.infra_failure is not None)
    return {"infra_failures": float(sum(causes.values()))} | {
        f"infra/{c}": float(n) for c, n in sorted(causes.items())
    }


def _means(
    records: Sequence[Trajectory], scores: Sequence[dict[str, float]], prefix: str
) -> dict[str, float]:
    if not records:
        return {}
    return {
        f"{prefix}reward": statistics.fmean(s["reward"] for s in scores),
        f"{prefix}success": statistics.fmean(float(r.success) for r in records),
        f"{prefix}cost": statistics.fmean(s["cost"] for s in scores),
        f"{prefix}turns": statistics.fmean(r.n_turns for r in records),
        f"{prefix}tokens": statistics.fmean(s["tokens"] for s in scores),
        f"{prefix}format_errors": statistics.fmean(r.format_errors for r in records),
        **_fusion_means(records, scores, prefix),
    }


def _fusion_means(
    records: Sequence[Trajectory], scores: Sequence[dict[str, float]], prefix: str
) -> dict[str, float]:
    """Fusion's attempts: delegations and take-overs per attempt, each side's mean cost (the reward's)."""
    pairs = [(r.fusion, s) for r, s in zip(records, scores, strict=True) if r.fusion is not None]
    if not pairs:
        return {}
    return {
        f"{prefix}delegations": statistics.fmean(f["delegations"] for f, _ in pairs),
        f"{prefix}take_overs": statistics.fmean(f["take_overs"] for f, _ in pairs),
        f"{prefix}lead_cost": statistics.fmean(s["lead_cost"] for _, s in pairs),
        f"{prefix}sidekick_cost": statistics.fmean(s["sidekick_cost"] for _, s in pairs),
    }


@dataclass(frozen=True)
class Rubric:
    """One run's prices: λ per effort, the baseline, and the length budgets with their phases."""

    lambdas: Mapping[str, float] = field(default_factory=dict)
    baseline: Baseline = "length_weighted"
    deterministic: bool = False  # price modelled seconds, not measured ones
    prices: Mapping[str, float] = field(default_factory=dict)  # reward lost per unit over budget
    budgets: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # per effort, per quantity
    phase: int = 1  # steps per phase: success-only and penalised phases alternate (0: always penalised)
    scope: str = "all"  # "solved": penalise only in groups where some attempt succeeded

    def penalised(self, step: int) -> bool:
        return length_penalty_on(step, self.phase)

    def score(self, records: Sequence[Trajectory], step: int) -> list[dict[str, float]]:
        """`score` of the records of RL step `step` (1-based; it sets the length-penalty phase)."""
        prices = self.prices if self.penalised(step) else {}
        return score(
            records, self.lambdas, self.baseline, self.deterministic, prices, self.budgets, self.scope
        )

    def metrics(
        self, records: Sequence[Trajectory], scores: Sequence[dict[str, float]], step: int
    ) -> dict[str, float]:
        """Step `step`'s `outcome_metrics` and `budget_metrics`."""
        return {
            **outcome_metrics(records, scores),
            **budget_metrics(records, self.budgets, self.penalised(step)),
        }
