"""The agent harness: tools, budgets, effort levels, cost and trajectory records.

The action format the model writes (tagged text or native tool calls) is `flywheel.actions`, which
the models and the harness both speak.
"""

from flywheel.harness.agent import ENDINGS, INFRA_ENDINGS, EpisodeSpec, HarnessConfig, run_episodes
from flywheel.harness.cost import Pricing, pricing_for
from flywheel.harness.effort import EFFORTS, Effort, budget_overrides, efforts_for, get_effort

__all__ = [
    "ENDINGS",
    "INFRA_ENDINGS",
    "EpisodeSpec",
    "HarnessConfig",
    "run_episodes",
    "Pricing",
    "pricing_for",
    "EFFORTS",
    "Effort",
    "get_effort",
    "budget_overrides",
    "efforts_for",
]
