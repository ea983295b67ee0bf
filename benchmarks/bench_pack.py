"""Seconds per trainer update: packed replay (one prefix tree per forward) against one padded row per turn.

The work: real multi-turn episodes of an SFT base on toybugs train tasks (`--tasks` tasks x `--group`
samples at `--effort`, rolled out through the harness), then `Trainer.step` on the same records with
`[objective] pack = true` and with `pack = false`, each from the same starting weights, alternating, and
`--repeats` times each. An untrained base rarely succeeds, and a group whose rewards tie carries no
gradient, so the first rollout of every group is marked successful: every rollout then has a non-zero
advantage and both sides replay every turn.

Both sides must compute the same update: the script checks that their losses and gradient norms agree
and prints the tokens each forwards (padded tokens against distinct prefix-tree nodes).

    .venv/bin/python benchmarks/bench_pack.py --base runs/base --tasks 4 --group 4
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="an SFT base directory (flywheel sft --out)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--effort", default="high", choices=["low", "medium", "high", "max"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if not (args.base / "config.json").is_file():
        print(f"bench_pack: {args.base}: not a model directory", file=sys.stderr)
        return 2

    import torch

    from flywheel.eval.run import make_specs, rollout
    from flywheel.harness import efforts_for
    from flywheel.models.hf import load_hf
    from flywheel.models.torch_engine import load_torch_model
    from flywheel.rl.config import load_config
    from flywheel.rl.pack import PrefixPack
    from flywheel.rl.train import harness_config, load_tasks
    from flywheel.rl.trainer import Trainer
    from flywheel.rubric import turns_of

    torch.set_num_threads(args.threads)
    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "learn.toml")
    cfg.model.path = str(args.base)
    cfg.optim.kind = "adamw"
    tasks = load_tasks(cfg, limit=0)[: args.tasks]
    engine = load_torch_model(f"hf:{args.base}", max_context=cfg.model.max_context, seed=0)
    [level] = efforts_for([args.effort], cfg.rollout.max_turns, cfg.rollout.max_tokens, False)
    t0 = time.perf_counter()
    records = rollout(
        engine,
        make_specs(tasks, [level], args.group, seed=0),
        harness_config(cfg, 0),
        concurrency=cfg.rollout.concurrency,
    )
    print(f"rolled out {len(records)} episodes in {time.perf_counter() - t0:.0f} s", flush=True)
    for i, r in enumerate(records):
        r.success = i % args.group == 0
    turns = [t for r in records for t in turns_of(r)]
    padded = sum(len(t["prompt_ids"]) + len(t["token_ids"]) for t in turns)
    pack = PrefixPack()
    for t in turns:
        pack.add(t["prompt_ids"] + t["token_ids"])

    model, tokenizer = load_hf(args.base)
    start = copy.deepcopy(model.state_dict())
    times: dict[bool, list[float]] = {True: [], False: []}
    metrics: dict[bool, dict[str, float]] = {}
    for _ in range(args.repeats):
        for packed in (True, False):
            model.load_state_dict(start)
            run = copy.deepcopy(cfg)
            run.objective.pack = packed
            trainer = Trainer(model, tokenizer, run, {args.effort: 0.0})
            t = time.perf_counter()
            metrics[packed], _ = trainer.step(records)
            times[packed].append(time.perf_counter() - t)
    same = all(
        abs(metrics[True][k] - metrics[False][k]) <= 1e-4 * max(1.0, abs(metrics[False][k]))
        for k in ("loss", "grad_norm")
    )
    print(
        f"{len(records)} episodes, {len(turns)} turns, {metrics[True]['train_tokens']:.0f} generated tokens; "
        f"forwarded tokens: padded rows {padded}, prefix tree {len(pack)} ({padded / len(pack):.2f}x fewer)"
    )
    print(f"{'side':<12}{'s/update':>10}{'best':>8}")
    for packed, name in ((False, "padded"), (True, "packed")):
        print(f"{name:<12}{statistics.fmean(times[packed]):>10.2f}{min(times[packed]):>8.2f}")
    print(
        f"speed-up {statistics.fmean(times[False]) / statistics.fmean(times[True]):.2f}x; "
        f"same loss and grad norm: {same} (loss {metrics[True]['loss']:.6g} vs {metrics[False]['loss']:.6g})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
