"""Does RL make the base policy better and cheaper? Base against trained on toybugs held-out, per effort.

    python experiments/learning.py --base runs/base --config configs/learn.toml --minutes 30 --out runs/learning

1. λ per effort from the base policy's ladder (`flywheel calibrate`), unless --no-calibrate;
2. the base on `--eval-tasks` held-out tasks at every effort level;
3. RL for `--minutes` of wall time (or the config's steps, whichever ends first);
4. the trained policy on the same held-out tasks.

Prints success (95% Wilson interval), mean cost, mean turns and the median steps to the first edit for
both, and the two goals: held-out success up by >= 15 points at some effort level; medium effort with
>= 40% fewer turns than the base at equal or better success. Everything is kept under --out
(results.json, the training run, the trajectories). Rerunning into the same --out resumes: the
calibration, the base evaluation and the training run are reused (training continues from its latest
checkpoint until --minutes of training in all, the time of earlier invocations counted, or the config's steps).
results.json's `train_minutes` is the training steps' wall time over all invocations; `invocation_minutes`
is this invocation's, evaluations included.

`--variant KEY=VALUE` (repeatable) overrides a config field for ablations, e.g.
`--variant objective.baseline=mean`, `--variant objective.replay=false`, `--variant optim.kind=adamw`,
`--variant reward.lambdas.medium=0` (with --no-calibrate and explicit λ). `--base-eval DIR/results.json`
reuses the base evaluation of another run, so ablations share one baseline (`experiments/ablations.py`);
`--base-only` stops after the base evaluation, writing a results.json that holds it alone, for runs that
train a subset of its effort levels to share.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def set_field(cfg, dotted: str, raw: str) -> None:
    """`a.b=value` on the nested config (`value` parsed as JSON when it can be, else a string)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    *path, last = dotted.split(".")
    obj = cfg
    for part in path:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    if isinstance(obj, dict):
        obj[last] = value
    else:
        setattr(
            obj,
            last,
            type(getattr(obj, last))(value) if not isinstance(getattr(obj, last), bool) else bool(value),
        )


def table(before: dict, after: dict) -> str:
    head = f"{'effort':7s} {'policy':8s} {'n':>4s} {'success':>8s} {'95% CI':>15s} {'cost $':>9s} {'turns':>6s} {'1st edit':>8s}"
    lines = [head]
    for effort in after:
        for name, data in (("base", before), ("trained", after)):
            s = data[effort]
            lo, hi = s["success_ci95"]
            edit = s["median_steps_to_first_edit"]
            lines.append(
                f"{effort:7s} {name:8s} {s['n']:4d} {s['success_rate']:8.1%} [{lo:5.1%},{hi:6.1%}] "
                f"{s['mean_reward_cost']:9.5f} {s['mean_turns']:6.2f} {edit if edit is not None else '-':>8}"
            )
    return "\n".join(lines)


def goals(before: dict, after: dict) -> dict:
    gains = {e: after[e]["success_rate"] - before[e]["success_rate"] for e in after}
    out = {
        "success_gain_points": {e: round(100 * g, 1) for e, g in gains.items()},
        "success_goal_met": max(gains.values()) >= 0.15,
    }
    if "medium" in after:
        b, a = before["medium"], after["medium"]
        cut = 1 - a["mean_turns"] / b["mean_turns"] if b["mean_turns"] else 0.0
        out["medium_turns_cut"] = round(cut, 3)
        out["turns_goal_met"] = cut >= 0.40 and a["success_rate"] >= b["success_rate"]
    return out


def training_trend(rows: list[dict]) -> dict:
    """Success, reward, cost and turns on the training rollouts: mean over the first and the last third of
    the steps (the held-out figures alone hide learning on train tasks when held-out success stays 0)."""
    if not rows:
        return {}
    k = max(1, len(rows) // 3)
    keys = ("success", "reward", "cost", "turns")
    mean = lambda part, key: round(sum(r[key] for r in part) / len(part), 6)  # noqa: E731
    return {
        "steps_per_third": k,
        "first": {key: mean(rows[:k], key) for key in keys},
        "last": {key: mean(rows[-k:], key) for key in keys},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the base policy directory (from `flywheel sft`)")
    ap.add_argument("--config", default=str(ROOT / "configs" / "learn.toml"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--eval-tasks", type=int, default=40)
    ap.add_argument("--no-calibrate", action="store_true")
    ap.add_argument("--cal-tasks", type=int, default=12, help="calibration tasks (train split)")
    ap.add_argument("--cal-samples", type=int, default=1, help="attempts per calibration task and rung")
    ap.add_argument("--base-eval", help="results.json of an earlier run: reuse its base evaluation")
    ap.add_argument(
        "--base-only", action="store_true", help="stop after evaluating the base (for --base-eval)"
    )
    ap.add_argument("--variant", action="append", default=[], help="KEY=VALUE config override (repeatable)")
    args = ap.parse_args()

    from flywheel.errors import FlywheelError
    from flywheel.eval.measure import evaluate_policy
    from flywheel.loop import RunDir
    from flywheel.rl.calibrate import measuring, run_calibration
    from flywheel.rl.config import load_config
    from flywheel.rl.train import load_engine, load_heldout, load_tasks, setup_torch, train

    out = Path(args.out)
    try:
        cfg = load_config(args.config)
    except FlywheelError as e:
        ap.exit(2, f"learning.py: {e}\n")
    cfg.model.path = args.base
    cfg.train.max_minutes = args.minutes
    for v in args.variant:
        key, _, value = v.partition("=")
        try:
            set_field(cfg, key, value)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            ap.error(f"--variant {v}: not a config field or not a value for it ({e})")
    if not (Path(args.base) / "config.json").is_file():
        ap.exit(
            2,
            f"learning.py: --base {args.base}: not a model directory (no config.json; make one with `flywheel sft`)\n",
        )
    reused = None
    if args.base_eval:  # checked before anything runs: one line and exit 2 when it cannot serve
        try:
            reused = json.loads(Path(args.base_eval).read_text())["base"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.exit(
                2,
                f"learning.py: --base-eval {args.base_eval}: not a results.json with a base evaluation ({e})\n",
            )
        missing = [effort for effort in cfg.rollout.efforts if effort not in reused]
        if missing:
            ap.exit(
                2,
                f"learning.py: --base-eval {args.base_eval} has no base evaluation at {', '.join(missing)}\n",
            )
    try:  # the training and held-out suites are read before anything runs
        load_tasks(cfg)
        heldout = load_heldout(cfg)
    except FlywheelError as e:
        ap.exit(2, f"learning.py: {e}\n")
    heldout = heldout[:: max(1, len(heldout) // args.eval_tasks)][: args.eval_tasks]
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    calibration = out / "calibration" / "calibration.json"
    if not args.no_calibrate:
        if (
            calibration.is_file()
        ):  # a rerun into the same --out resumes: calibration, base evaluation, training
            cal = json.loads(calibration.read_text())
        else:
            cal = run_calibration(cfg, out / "calibration", limit=args.cal_tasks, samples=args.cal_samples)
        cfg.reward.calibration = str(calibration)
        print("lambdas:", cal["lambdas"], flush=True)
    setup_torch(cfg)
    if reused is not None:
        before = reused
    elif (out / "eval-base" / "summary.json").is_file():
        before = json.loads((out / "eval-base" / "summary.json").read_text())
    else:
        engine = load_engine(cfg, f"hf:{args.base}")
        before = evaluate_policy(engine, heldout, out=out / "eval-base", **measuring(cfg))
        (out / "eval-base" / "summary.json").write_text(json.dumps(before, indent=1) + "\n")
    if args.base_only:
        (out / "results.json").write_text(
            json.dumps({"variant": args.variant, "base": before}, indent=1) + "\n"
        )
        print(json.dumps(before, indent=1))
        return
    train(cfg, out / "train")
    rows = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    latest = RunDir(out / "train").latest_weights()
    engine = load_engine(cfg, f"hf:{latest}")
    after = evaluate_policy(engine, heldout, out=out / "eval-trained", **measuring(cfg))
    result = {
        "variant": args.variant,
        "steps": len(rows),
        "train_minutes": round(sum(RunDir(out / "train").step_seconds()) / 60, 1),
        "invocation_minutes": round((time.perf_counter() - t0) / 60, 1),
        "base": before,
        "trained": after,
        "goals": goals(before, after),
        "training": training_trend(rows),
    }
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(before, after))
    print(
        json.dumps(
            {
                k: result[k]
                for k in ("variant", "steps", "train_minutes", "invocation_minutes", "goals", "training")
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
