"""The four ablations of the RL objective, side by side: one `experiments/learning.py` run each.

    python experiments/ablations.py --base runs/base --config configs/learn.toml --steps 8 --out runs/ablations
    python experiments/ablations.py --base runs/base-sweep6 --config experiments/configs/learn-sweep.toml \
        --steps 10 --eval-tasks 149 --base-eval runs/base-eval6full/results.json \
        --variant 'rollout.efforts=["medium"]' --variant rollout.group_size=8 --out runs/ablations6

Runs, each for the same number of RL steps from the same base:

- `default`: the config as it is, λ calibrated on the base (`flywheel calibrate`), the base evaluated once;
- `mean-baseline`: `objective.baseline = "mean"` instead of the length-weighted baseline;
- `no-replay`: `objective.replay = false` (full softmax instead of the sampler's top-p kept set);
- `adamw`: `optim.kind = "adamw"` instead of Muon for the hidden matrices;
- `lambda-0`: no cost penalty (λ = 0 at every effort) instead of the calibrated λ.

The variants reuse the default run's calibration and base evaluation, so every row differs from `default`
in one setting only. `--variant KEY=VALUE` changes the config of every run alike (the second command
trains medium effort alone); `--base-eval` takes the base evaluation of an earlier `learning.py` run
instead of evaluating the base again. The budget is a number of steps, not minutes. Run them one at a
time on an otherwise idle machine (the default): an attempt's cost counts its measured seconds (unless
the config is `deterministic`), so runs that share the cores pay more for the same work; `--jobs 2` (two
variants at a time) is for trying the script out. Prints one table: success, cost and turns on the
training rollouts (first third of the steps against the last third), and held-out success, cost,
generated tokens and turns per effort level after training, next to the base. Cost counts measured
seconds and moves with the machine's load; tokens and turns do not. Writes `OUT/ablations.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "mean-baseline": ["objective.baseline=mean"],
    "no-replay": ["objective.replay=false"],
    "adamw": ["optim.kind=adamw"],
    "lambda-0": [],  # no calibration file: every λ is 0
}


def say(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write, so lines of concurrent runs do not interleave
    sys.stdout.flush()


def learning_run(args, name: str, extra: list[str]) -> dict:
    out = Path(args.out) / name
    if (out / "results.json").exists():  # a finished run is kept: rerunning the script resumes the set
        return json.loads((out / "results.json").read_text())
    cmd = [
        sys.executable,
        str(ROOT / "experiments" / "learning.py"),
        "--base",
        args.base,
        "--config",
        args.config,
        "--out",
        str(out),
        "--minutes",
        "0",
        "--eval-tasks",
        str(args.eval_tasks),
        "--cal-tasks",
        str(args.cal_tasks),
        "--variant",
        f"train.steps={args.steps}",
        *(x for v in args.variant for x in ("--variant", v)),
        *extra,
    ]
    say(f"[{name}] {' '.join(cmd[1:])}")
    with (Path(args.out) / f"{name}.log").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"[{name}] failed with exit code {rc}; see {Path(args.out) / f'{name}.log'}")
    say(f"[{name}] done")
    return json.loads((out / "results.json").read_text())


def table(results: dict[str, dict]) -> str:
    """Training rollouts (first third → last third of the steps), then held-out success, cost and turns."""
    efforts = list(next(iter(results.values()))["trained"])

    def held(s):
        return " ".join(
            f"{s[e]['success_rate']:6.1%} {s[e]['mean_reward_cost']:.5f} "
            f"{s[e]['mean_completion_tokens']:6.1f} {s[e]['mean_turns']:5.2f}"
            for e in efforts
        )

    lines = [
        f"{'':14s} {'':5s} {'training rollouts, first third → last third':^56s} "
        + " ".join(f"{'held-out ' + e:^29s}" for e in efforts),
        f"{'run':14s} {'steps':>5s} {'success':>15s} {'cost $':>17s} {'turns':>13s}        "
        + " ".join(f"{'success':>6s} {'cost $':>7s} {'tokens':>6s} {'turns':>5s}" for _ in efforts),
    ]
    lines.append(f"{'base':14s} {'':5s} {'':56s} " + held(next(iter(results.values()))["base"]))
    for name, r in results.items():
        f, last = r["training"]["first"], r["training"]["last"]
        lines.append(
            f"{name:14s} {r['steps']:5d} {f['success']:6.1%} → {last['success']:6.1%} "
            f"{f['cost']:.5f} → {last['cost']:.5f} {f['turns']:5.2f} → {last['turns']:5.2f}        "
            + held(r["trained"])
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the base policy directory (from `flywheel sft`)")
    ap.add_argument("--config", default=str(ROOT / "configs" / "learn.toml"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8, help="RL steps of every run (the shared budget)")
    ap.add_argument("--eval-tasks", type=int, default=24)
    ap.add_argument("--cal-tasks", type=int, default=8, help="calibration tasks (train split)")
    ap.add_argument("--jobs", type=int, default=1, help="variants run at once after the default run")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="KEY=VALUE config override for every run, the default included (repeatable)",
    )
    ap.add_argument(
        "--base-eval", help="results.json of an earlier learning.py run: reuse its base evaluation"
    )
    args = ap.parse_args()
    if not Path(args.base, "config.json").is_file():
        ap.exit(
            2,
            f"ablations.py: --base {args.base}: not a model directory (no config.json); build one with `flywheel sft`\n",
        )
    if args.base_eval and not Path(args.base_eval).is_file():
        ap.exit(2, f"ablations.py: --base-eval {args.base_eval}: no such file\n")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = {
        "default": learning_run(args, "default", ["--base-eval", args.base_eval] if args.base_eval else [])
    }
    shared = ["--no-calibrate", "--base-eval", str(Path(args.out) / "default" / "results.json")]
    calibration = str(Path(args.out) / "default" / "calibration" / "calibration.json")
    runs = {
        name: [
            *shared,
            *(["--variant", f"reward.calibration={calibration}"] if name != "lambda-0" else []),
            *(x for v in extra for x in ("--variant", v)),
        ]
        for name, extra in VARIANTS.items()
    }
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = dict(zip(runs, pool.map(lambda item: learning_run(args, *item), runs.items()), strict=True))
    results.update(done)
    (Path(args.out) / "ablations.json").write_text(
        json.dumps(
            {
                name: {k: r[k] for k in ("variant", "steps", "train_minutes", "training", "trained", "goals")}
                for name, r in results.items()
            },
            indent=1,
        )
        + "\n"
    )
    print(table(results))


if __name__ == "__main__":
    main()
