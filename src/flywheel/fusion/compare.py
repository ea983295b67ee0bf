"""One comparison of Fusion: the lead alone, the sidekick alone and the pair, on the same tasks.

`flywheel eval --compare --lead M --sidekick M --out OUT` runs the three evaluations (`run_compare`) into
`OUT/lead`, `OUT/sidekick` and `OUT/pair` (each an ordinary eval directory, so `flywheel report OUT` draws
the three as policies on one score-against-cost picture), then `compare_rows` reads their summaries into
one row each, `compare_table` prints them and `OUT/compare.json` keeps them. A single agent's lead and
sidekick costs are its own cost in its own column; delegations and take-overs are the pair's only. The
sidekick alone runs at the level it has in the pair.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from flywheel.eval import EvalSettings, eval_with_progress
from flywheel.fusion.pair import Fusion
from flywheel.harness import HarnessConfig
from flywheel.protocols import Model

POLICIES = ("lead", "sidekick", "pair")


def run_compare(
    settings: EvalSettings,
    lead: tuple[Model, HarnessConfig],
    pair: Fusion,
    out: Path,
    about: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Evaluate the lead alone, `pair`'s sidekick alone and the pair into `out/lead`, `out/sidekick` and
    `out/pair`; write `out/compare.json` (`about`, then the rows) and return the rows."""
    alone = replace(settings, effort=pair.config.sidekick_effort or settings.effort)
    summaries = {
        "lead": eval_with_progress(settings, *lead, out / "lead"),
        "sidekick": eval_with_progress(alone, pair.sidekick, pair.sidekick_cfg, out / "sidekick"),
        "pair": eval_with_progress(settings, *lead, out / "pair", pair.rollout),
    }
    rows = compare_rows(summaries)
    (out / "compare.json").write_text(json.dumps({**about, "policies": rows}, indent=1) + "\n")
    return rows


def compare_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy (in `POLICIES` order) from its eval summary (`flywheel.eval.summarize`)."""
    rows = []
    for name in POLICIES:
        s = summaries[name]
        alone = {"lead": s["mean_cost"], "sidekick": 0.0} if name == "lead" else {}
        alone = {"lead": 0.0, "sidekick": s["mean_cost"]} if name == "sidekick" else alone
        rows.append(
            {
                "policy": name,
                "model": s.get("model_name", ""),
                "n": s["n_valid"],
                "success_rate": s["success_rate"],
                "success_ci95": list(s["success_ci95"]),
                "mean_cost": s["mean_cost"],
                "lead_cost": s.get("mean_lead_cost", alone.get("lead", 0.0)),
                "sidekick_cost": s.get("mean_sidekick_cost", alone.get("sidekick", 0.0)),
                "delegations": s.get("delegations_per_attempt", 0.0),
                "take_overs": s.get("take_overs_per_attempt", 0.0),
            }
        )
    return rows


def compare_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a plain-text table."""
    head = f"{'policy':<9} {'success (95% CI)':<22} {'mean $':>10} {'lead $':>10} {'sidekick $':>10} "
    head += f"{'deleg.':>7} {'take-ov.':>8}"
    lines = [head]
    for r in rows:
        lo, hi = r["success_ci95"]
        success = f"{r['success_rate']:.0%} [{lo:.0%}, {hi:.0%}] n={r['n']}"
        lines.append(
            f"{r['policy']:<9} {success:<22} {r['mean_cost']:>10.6f} {r['lead_cost']:>10.6f} "
            f"{r['sidekick_cost']:>10.6f} {r['delegations']:>7.2f} {r['take_overs']:>8.2f}"
        )
    return "\n".join(lines)
