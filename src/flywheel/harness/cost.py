"""Cost accounting: dollars per attempt from token usage and wall-clock time.

Prices are per model: dollars per million prompt tokens, per million completion tokens, and per second of
the attempt's wall time (sandbox and tool time included: an agent that runs slow commands costs more).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pricing:
    prompt_per_m: float = 0.30
    completion_per_m: float = 1.20
    per_second: float = 0.0001

    def cost(self, prompt_tokens: int, completion_tokens: int, wall_s: float) -> float:
        return (
            prompt_tokens * self.prompt_per_m / 1e6
            + completion_tokens * self.completion_per_m / 1e6
            + wall_s * self.per_second
        )


# Prices by model name prefix; the first match wins. Local models are priced like a small hosted model.
# `scripted-lead` (Fusion's oracle-backed lead, `flywheel.models.scripted_lead`) and `scripted-sweep-lead`
# (its searching lead, `flywheel.models.sweep_lead`) stand in for a frontier model: $3 / $15 per million
# prompt / completion tokens is an assumption, about a frontier model's list price.
PRICES: dict[str, Pricing] = {
    "scripted-lead": Pricing(3.0, 15.0, 0.0001),
    "scripted-sweep-lead": Pricing(3.0, 15.0, 0.0001),
    "scripted": Pricing(0.30, 1.20, 0.0001),
    "smollm2": Pricing(0.05, 0.20, 0.0001),
    "hf:": Pricing(0.05, 0.20, 0.0001),
    "openai:": Pricing(1.25, 10.0, 0.0001),
}


def pricing_for(model_name: str) -> Pricing:
    for prefix, price in PRICES.items():
        if model_name.startswith(prefix):
            return price
    return Pricing()
