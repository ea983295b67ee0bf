"""The cost the reward sees: `reward_cost(record, deterministic)` is the C of ``R = S - λ·C``.

Normally it is the harness's cost in dollars (tokens and compute seconds). Seconds are not reproducible,
so a deterministic run prices a modelled time instead: fixed seconds per generated token, per prompt
token and per tool call (`MODELLED_SECONDS`), which keeps the cost's shape (longer and busier attempts
cost more) and makes two runs with the same seed identical. A Fusion attempt costs both sides' usage, each priced by
its own model, in either mode (`cost_parts`).

Running the episodes themselves (`rollout`, `make_specs`, `efforts_for`) is not RL-specific: it lives in
`flywheel.eval.run`.
"""

from __future__ import annotations

from flywheel.harness import pricing_for
from flywheel.record import Trajectory

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
