"""Rollout wall time with the active episodes in one cohort (lockstep) against two or more that take turns.

    .venv/bin/python benchmarks/bench_cohorts.py --base runs/base-sweep6 [--cohorts 1 2] [--rounds 2]

One training step's rollouts as `--config` (default `experiments/configs/learn-sweep.toml`) runs them, at
one effort level (4 train tasks × 8 attempts at max by default, the engine on one thread) through the real
harness, sandbox and grader, once per cohort count and round, alternating, each on a freshly loaded engine
(so no run reuses another's prefix cache). Requests are seeded, so every setting samples the same actions
(up to float differences between batch shapes): the turn counts printed beside each run show it. Reported: wall seconds per run, and the
ratio of each setting's median to the first setting's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from flywheel.eval.run import make_specs, rollout
from flywheel.harness import efforts_for
from flywheel.models.torch_engine import load_torch_model
from flywheel.rl.config import load_config
from flywheel.rl.train import harness_config, model_spec
from flywheel.tasks import load_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the policy directory (from `flywheel sft`)")
    ap.add_argument(
        "--config",
        default="experiments/configs/learn-sweep.toml",
        help="the run config whose rollouts are timed",
    )
    ap.add_argument("--suite", default="toybugs")
    ap.add_argument("--split", default="train")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--effort", default="max")
    ap.add_argument("--cohorts", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    run = load_config(args.config)
    r = run.rollout
    tasks = load_suite(args.suite, split=args.split)[: args.tasks]
    specs = make_specs(tasks, efforts_for([args.effort], r.max_turns, r.max_tokens), args.group, args.seed)
    walls: dict[int, list[float]] = {n: [] for n in args.cohorts}
    for rnd in range(args.rounds):
        for n in args.cohorts:
            engine = load_torch_model(
                model_spec(args.base), max_context=run.model.max_context, seed=args.seed
            )
            cfg = dataclasses.replace(harness_config(run, 0), cohorts=n)
            t0 = time.perf_counter()
            records = rollout(engine, specs, cfg, concurrency=r.concurrency)
            walls[n].append(time.perf_counter() - t0)
            turns = sum(rec.n_turns for rec in records)
            solved = sum(rec.success for rec in records)
            print(
                f"round {rnd + 1}  cohorts {n}  {walls[n][-1]:6.1f} s  turns {turns}  solved {solved}/{len(records)}",
                flush=True,
            )
    first = statistics.median(walls[args.cohorts[0]])
    rows = {
        n: {"median_s": round(statistics.median(w), 2), "ratio": round(statistics.median(w) / first, 3)}
        for n, w in walls.items()
    }
    for n, row in rows.items():
        print(
            f"cohorts {n}: median {row['median_s']:.1f} s, {row['ratio']:.2f}x the time of cohorts {args.cohorts[0]}"
        )
    if args.out:
        args.out.write_text(
            json.dumps({"episodes": len(specs), "walls": walls, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
