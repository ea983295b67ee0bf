"""Sidekick RL inside Fusion, measured: the pair (scripted-lead with the shipped base as its sidekick)
before and after training the sidekick under its lead with `configs/fusion.toml`.

    python experiments/fusion_rl.py [--tasks 32] [--minutes 30] [--out runs/fusion-rl]

The pair is evaluated on the first `--tasks` held-out toybugs tasks at each effort level, λ per level is
set from the pair's frontier, the sidekick is trained for `--minutes`, and the pair is evaluated again on
the same tasks. Prints the before/after table (success, cost, delegations and take-overs per attempt, the
lead's and the sidekick's cost) and each level's gain.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flywheel.demo import print_gains, turn
from flywheel.models.shipped import base_dir
from flywheel.rl.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=32, help="held-out tasks per effort level")
    ap.add_argument("--minutes", type=float, default=30.0, help="training time")
    ap.add_argument("--out", type=Path, default=Path("runs/fusion-rl"))
    args = ap.parse_args()
    cfg = load_config(Path("configs/fusion.toml"))
    cfg.train.max_minutes = args.minutes
    limits = {e: args.tasks for e in cfg.rollout.efforts}
    args.out.mkdir(parents=True, exist_ok=True)
    before, after, cal = turn(cfg, args.out, limits, f"hf:{base_dir(cfg.model.path)}")
    print_gains(before, after, cal)
    print(f"\n{'policy':8s} {'effort':7s} {'deleg.':>6s} {'takeov.':>7s} {'lead $':>9s} {'sidekick $':>10s}")
    for name, data in (("base", before), ("trained", after)):
        for effort, s in data.items():
            print(
                f"{name:8s} {effort:7s} {s.get('delegations_per_attempt', 0):6.2f} "
                f"{s.get('take_overs_per_attempt', 0):7.2f} {s.get('mean_lead_cost', 0):9.5f} "
                f"{s.get('mean_sidekick_cost', 0):10.5f}"
            )


if __name__ == "__main__":
    main()
