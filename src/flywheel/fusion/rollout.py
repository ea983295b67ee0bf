"""Training the sidekick under its lead: Fusion's attempts with `rollout`'s signature.

`flywheel train` with `[fusion]`: `sidekick_rollout` runs Fusion's attempts with
`flywheel.eval.run.rollout`'s signature and the sidekick as the model, the lead loaded by spec
(`lead_model`, once per process) and frozen, so that the loop's pools (`flywheel.loop.pool.run_items`, by
its `episodes` reference) and calibration run the pair as they run a single policy. The trainer then
replays only the nested sidekick's turns (`flywheel.rl.trainer.turns_of`), each scored with its whole
attempt's reward, the lead's cost included.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace

from flywheel.fusion.pair import Fusion, FusionConfig
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort
from flywheel.models import get_model
from flywheel.protocols import Grader, Model, Sandbox
from flywheel.record import Trajectory


def sidekick_rollout(
    sidekick: Model,
    specs: Sequence[EpisodeSpec],
    cfg: HarnessConfig,
    *,
    lead: str,
    lead_base_url: str = "",
    lead_effort: str = "",
    max_delegations: int = 4,
    concurrency: int = 8,
    sandbox: Sandbox | None = None,
    grader: Grader | None = None,
    on_record: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Fusion's attempts at `specs` with `flywheel.eval.run.rollout`'s signature, `sidekick` as its model:
    the lead (loaded by spec, frozen) runs each spec and delegates to `sidekick` at the spec's level.

    `lead_effort` gives the lead the turn and token budgets and the prompt line of that level; its name
    (so the record's id and effort are the spec's) and its wall-time and dollar budgets stay the spec's.
    (a calibration ladder scales the sidekick's budgets, not the lead's). Both sides run under `cfg`."""
    levels = {s.id: s.effort for s in specs}  # a calibration ladder's rungs share a level's name
    fusion = Fusion(sidekick, cfg, FusionConfig(max_delegations=max_delegations, sidekick_levels=levels))
    if lead_effort:
        top = get_effort(lead_effort)
        specs = [
            replace(s, effort=replace(
                s.effort, marker=top.marker, max_turns=top.max_turns, max_tokens=top.max_tokens,
                turn_tokens=top.turn_tokens,
            ))
            for s in specs
        ]  # fmt: skip
    return fusion.rollout(
        lead_model(lead, lead_base_url),
        specs,
        cfg,
        concurrency=concurrency,
        sandbox=sandbox,
        grader=grader,
        on_record=on_record,
    )


@functools.lru_cache(maxsize=4)
def lead_model(spec: str, base_url: str = "") -> Model:
    """The lead named by `spec` (with its server for `openai:NAME`), loaded once per process."""
    return get_model(spec, **({"base_url": base_url} if base_url else {}))
