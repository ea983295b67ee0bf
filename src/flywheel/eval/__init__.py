"""Evaluation: run a policy over tasks and summarise success against cost.

`run_eval` writes each trajectory to `RUN_DIR/trajectories.jsonl` as soon as it is graded (so an
interrupted run keeps every finished attempt) and `summary.json` at the end; every workspace is graded.
`summarize` is a pure function of trajectory records (`flywheel.record.Trajectory`, read back with
`flywheel.record.read_trajectories`).

Modules: `run` (the episode-running primitive every caller shares: specs, effort budgets, `rollout`),
`evaluate` (`run_eval`, and `eval_with_progress` as `flywheel eval` runs it, with progress and Ctrl-C kept),
`summary` (`summarize`, `wilson_interval`, `write_summary`), `measure` (budget ladders and per-effort
evaluations, as training measures a policy), `curate` (difficulty curation's attempts).
"""

from flywheel.eval.evaluate import (
    EvalSettings,
    Interrupted,
    Runner,
    eval_with_progress,
    run_eval,
    run_recorded,
    success_progress,
)
from flywheel.eval.summary import paired_gain, summarize, wilson_interval, write_summary

__all__ = [
    "EvalSettings",
    "Interrupted",
    "Runner",
    "eval_with_progress",
    "run_eval",
    "run_recorded",
    "success_progress",
    "paired_gain",
    "summarize",
    "wilson_interval",
    "write_summary",
]
