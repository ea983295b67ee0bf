"""Harness overhead per step with the scripted oracle, excluding command and generation time.

    .venv/bin/python benchmarks/bench_harness.py [--suite toybugs] [--split heldout] [--tasks 16]

Runs the scripted oracle on real tasks through the real harness and sandbox. Per episode, overhead =
wall time of the attempt − time in the sandbox (shell, run_tests) − time in the model's generate call,
divided by the number of steps; reported as the median over episodes. Grading is excluded (it happens
after the attempt). Goal: ≤ 20 ms per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from flywheel.harness import EpisodeSpec, get_effort, run_episodes
from flywheel.models.scripted import ScriptedModel
from flywheel.protocols import Verdict
from flywheel.tasks import load_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="toybugs")
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    tasks = load_suite(args.suite, split=args.split)[: args.tasks]
    specs = [EpisodeSpec(t, get_effort("medium")) for t in tasks]
    no_grade = lambda task, ws, traj: Verdict(task.id, False)  # noqa: E731 - grading is not measured here
    recs = run_episodes(specs, ScriptedModel(), grader=no_grade, concurrency=args.concurrency)
    per_step = [(r.wall_s - r.tool_s - r.gen_s) / r.n_turns for r in recs]
    rows = {
        "episodes": len(recs),
        "median_steps": statistics.median(r.n_turns for r in recs),
        "overhead_ms_per_step_median": 1000 * statistics.median(per_step),
        "overhead_ms_per_step_max": 1000 * max(per_step),
        "tool_ms_per_step_median": 1000 * statistics.median(r.tool_s / r.n_turns for r in recs),
    }
    for k, v in rows.items():
        print(f"{k:32s} {v:.2f}" if isinstance(v, float) else f"{k:32s} {v}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
