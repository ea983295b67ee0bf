"""Multi-turn rollouts with and without the engine's prefix store (keys and values of earlier turns reused).

The work: an SFT base on toybugs train tasks (`--tasks` tasks x `--group` samples at `--effort`), rolled out
through the real harness and sandbox twice, alternating, `--repeats` times: once with the default engine and
once with `prefix_cache_mb=0`. Requests are seeded, so both sides sample the same episodes (up to float
rounding) and the difference is the prefill the store saves. Reports the generation seconds (the engine's
share of each episode, summed), the wall time of the rollout, the prompt tokens of all turns and how many of
them the store served.

    .venv/bin/python benchmarks/bench_prefix.py --base runs/base --tasks 4 --group 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="an SFT base directory (flywheel sft --out)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--effort", default="high", choices=["medium", "high", "max"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if not (args.base / "config.json").is_file():
        print(f"bench_prefix: {args.base}: not a model directory", file=sys.stderr)
        return 2

    import torch

    from flywheel.eval.run import make_specs, rollout
    from flywheel.harness import efforts_for
    from flywheel.models.torch_engine import load_torch_model
    from flywheel.rl.config import load_config
    from flywheel.rl.train import harness_config, load_tasks

    torch.set_num_threads(args.threads)
    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "learn.toml")
    cfg.model.path = str(args.base)
    tasks = load_tasks(cfg, limit=0)[::7][: args.tasks]
    [level] = efforts_for([args.effort], cfg.rollout.max_turns, cfg.rollout.max_tokens, False)
    specs = make_specs(tasks, [level], args.group, seed=0)
    runs: dict[str, list[dict]] = {"store": [], "no store": []}
    for _ in range(args.repeats):
        for name, mb in (("store", 512), ("no store", 0)):
            engine = load_torch_model(
                f"hf:{args.base}", max_context=cfg.model.max_context, seed=0, prefix_cache_mb=mb
            )
            t0 = time.perf_counter()
            records = rollout(engine, specs, harness_config(cfg, 0), concurrency=cfg.rollout.concurrency)
            wall = time.perf_counter() - t0
            store = engine.prefix_store
            runs[name].append(
                {
                    "wall_s": wall,
                    "gen_s": sum(r.gen_s for r in records),
                    "prompt_tokens": sum(r.prompt_tokens for r in records),
                    "reused": store.reused if store else 0,
                    "turns": sum(r.n_turns for r in records),
                }
            )
            print(
                f"{name:8s} wall {wall:6.1f} s  gen {runs[name][-1]['gen_s']:6.1f} s  "
                f"turns {runs[name][-1]['turns']}  reused {runs[name][-1]['reused']} of "
                f"{runs[name][-1]['prompt_tokens']} prompt tokens",
                flush=True,
            )
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"\n{len(specs)} episodes at {args.effort}, median of {args.repeats}:")
    print(
        f"  generation: {med['no store']['gen_s']:.1f} s -> {med['store']['gen_s']:.1f} s "
        f"({med['no store']['gen_s'] / med['store']['gen_s']:.2f}x)"
    )
    print(
        f"  rollout wall: {med['no store']['wall_s']:.1f} s -> {med['store']['wall_s']:.1f} s "
        f"({med['no store']['wall_s'] / med['store']['wall_s']:.2f}x)"
    )
    print(
        f"  prompt tokens served from the store: {med['store']['reused'] / med['store']['prompt_tokens']:.0%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
