"""The agent harness: tools, action formats, budgets, effort levels, cost and trajectory records."""

from flywheel.harness.actions import TOOLS, Action, FormatError, parse_native, parse_tagged, render_tagged
from flywheel.harness.agent import ENDINGS, EpisodeSpec, HarnessConfig, run_episodes
from flywheel.harness.cost import Pricing, pricing_for
from flywheel.harness.effort import EFFORTS, Effort, get_effort

__all__ = [
    "TOOLS",
    "Action",
    "FormatError",
    "parse_native",
    "parse_tagged",
    "render_tagged",
    "ENDINGS",
    "EpisodeSpec",
    "HarnessConfig",
    "run_episodes",
    "Pricing",
    "pricing_for",
    "EFFORTS",
    "Effort",
    "get_effort",
]
