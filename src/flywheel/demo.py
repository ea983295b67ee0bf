"""`make demo`: the whole flywheel on the embedded world, on one CPU.

The embedded world is small on purpose: `toybugs`, a suite of Python modules with one planted bug each
and hidden tests, and `toybugs-sweep`, a ~1M-parameter Llama the project trained from scratch (with its own
`flywheel sft configs/sft-sweep.toml`) to imitate a scripted teacher that repairs bugs by sweeping a module
for the inverse of one mutation operator at a time. It is not a general coding model; it is the smallest
policy on which the whole loop, and a measurable gain, can run on two cores in minutes.

1. build the toybugs suite (cached after the first run);
2. load the shipped base (its weights checked against the recorded digest);
3. evaluate the base on held-out tasks at every effort level (the first 100 at max, 48 at medium and high);
4. set λ per effort level from the base's frontier: its three (cost, success) points, one per level;
5. train with RL, all three effort levels in one run, for a few minutes;
6. evaluate the trained policy on the same held-out tasks;
7. print a before/after table with each level's gain and its paired interval (both policies attempt the
   same tasks), and write `runs/demo/pareto.png` (success against cost per effort level) and
   `runs/demo/report.html` (`flywheel report runs/demo`).

Everything measured runs live; only the base's weights are shipped. Everything goes under `runs/demo/`.
Sizes come from `configs/demo.toml`; the environment can shrink them: FLYWHEEL_DEMO_MINUTES (training
time), FLYWHEEL_DEMO_STEPS (training steps), FLYWHEEL_DEMO_TASKS (held-out tasks at max; the other
levels take at most 48 of the same tasks).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from flywheel.errors import FlywheelError

BASE = "toybugs-sweep"
TASKS_AT_MAX, TASKS_OTHERWISE = 100, 48
WORLD = (
    "      the embedded world: toybugs (Python modules with one planted bug each, hidden tests) and\n"
    "      toybugs-sweep, a ~1M-parameter model trained from scratch by imitating a scripted bug-sweeper.\n"
    "      It is not a general coding model: it shows the loop learning, on two cores, in minutes."
)


def configs_dir() -> Path:
    """`configs/` of the checkout (the demo runs from the repository root)."""
    here = Path.cwd() / "configs"
    if not (here / "demo.toml").is_file():
        raise FlywheelError("run the demo from the repository root (configs/demo.toml not found)")
    return here


_START = time.perf_counter()


def stage(n: int, text: str) -> None:
    """`[n/7] text`, stamped with the minutes and seconds since the demo started."""
    elapsed = int(time.perf_counter() - _START)
    print(f"[{n}/7 {elapsed // 60:2d}:{elapsed % 60:02d}] {text}", flush=True)


def row(name: str, effort: str, s: dict) -> str:
    lo, hi = s["success_ci95"]
    edit = s["median_steps_to_first_edit"]
    return (
        f"{name:8s} {effort:7s} {s['n']:4d}  {s['success_rate']:6.1%}  [{lo:5.1%}, {hi:5.1%}]  "
        f"${s['mean_reward_cost']:.5f}  {s['mean_turns']:5.1f}  {'-' if edit is None else f'{edit:g}':>5}"
    )


def plot(before: dict, after: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, data, marker in (("base", before, "o"), ("trained", after, "s")):
        xs = [data[e]["mean_reward_cost"] for e in data]
        ys = [data[e]["success_rate"] for e in data]
        ax.plot(xs, ys, marker=marker, linestyle="--", label=name)
        for e, x, y in zip(data, xs, ys, strict=True):
            ax.annotate(e, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("mean cost per attempt ($)")
    ax.set_ylabel("held-out success rate")
    ax.set_title("toybugs held-out: success against cost, per effort level")
    ax.legend()
    fig.savefig(path)


def paired_gains(out: Path, efforts: list[str]) -> dict[str, dict]:
    """Each level's trained minus base success on the same tasks, paired by task, with its 95% interval
    (`flywheel.eval.paired_gain`), from the two evaluations' trajectories under `out`."""
    from flywheel.eval import paired_gain
    from flywheel.record import read_trajectories

    def records(policy: str, effort: str) -> list:
        return read_trajectories(out / policy / effort / "trajectories.jsonl")

    return {e: paired_gain(records("eval-base", e), records("eval-trained", e)) for e in efforts}


def frontier_lambdas(before: dict, out: Path) -> dict:
    """λ per effort from the base's frontier over its evaluated (cost, success) points; writes
    calibration.json and calibration.png into `out` as `flywheel calibrate` does."""
    from flywheel.rl.calibrate import calibrate, plot_calibration

    operating = {e: (s["mean_reward_cost"], s["success_rate"]) for e, s in before.items()}
    result = calibrate({e: [p] for e, p in operating.items()}, operating)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        **result.to_json(),
        "source": "the base's held-out evaluation, one point per effort level",
        "note": "One point per effort level: the base's held-out success against its mean cost.",
        "tasks": {e: s["n"] for e, s in before.items()},
    }
    (out / "calibration.json").write_text(json.dumps(data, indent=1) + "\n")
    plot_calibration(result, out / "calibration.png")
    return data


def turn(cfg, out: Path, limits: dict[str, int], base: str, *, stages: int = 3) -> tuple[dict, dict, dict]:
    """One turn of the flywheel from `base` (a model spec) under the run config `cfg`: evaluate it on the
    first held-out tasks (`limits` per effort level), set λ per level from its frontier, train, evaluate
    the trained policy on the same tasks. Returns (before, after, calibration); everything goes under
    `out` (eval-base/, calibration/, train/, eval-trained/). With `[fusion]` in `cfg` each policy is
    measured as the sidekick of the config's lead, and λ is the pair's. `stages` numbers the printed
    stages from that one."""
    from flywheel.eval.measure import evaluate_policy
    from flywheel.loop import RunDir
    from flywheel.rl.calibrate import measuring
    from flywheel.rl.train import load_engine, load_heldout, resolve_lambdas, setup_torch, train

    heldout = load_heldout(cfg)[: max(limits.values())]
    sizes = ", ".join(f"{e} {n}" for e, n in limits.items())
    setup_torch(cfg)
    stage(stages, f"evaluating the base on held-out tasks ({sizes}) ...")
    engine = load_engine(cfg, base)
    before = evaluate_policy(engine, heldout, out=out / "eval-base", limits=limits, **measuring(cfg))
    stage(stages + 1, "λ per effort level from the base's frontier (its success against cost at each level):")
    cal = frontier_lambdas(before, out / "calibration")
    cfg.reward.calibration = str(out / "calibration" / "calibration.json")
    print("      λ = " + ", ".join(f"{e}: {v:.1f} per $" for e, v in cal["lambdas"].items()), flush=True)
    cal["used"] = resolve_lambdas(cfg)  # the config's own `[reward] lambdas` stand over the frontier's
    if cal["used"] != cal["lambdas"]:
        used = ", ".join(f"{e}: {v:.1f} per $" for e, v in cal["used"].items())
        print(f"      λ used (the config's [reward] lambdas over the frontier's) = {used}", flush=True)
    budget = f"{cfg.train.max_minutes:g} minutes" if cfg.train.max_minutes else f"{cfg.train.steps} steps"
    stage(stages + 2, f"training all {len(cfg.rollout.efforts)} effort levels in one run, for {budget} ...")
    train(cfg, out / "train")
    latest = RunDir(out / "train").latest_weights()
    stage(stages + 3, "evaluating the trained policy on the same tasks ...")
    engine = load_engine(cfg, f"hf:{latest}")
    after = evaluate_policy(engine, heldout, out=out / "eval-trained", limits=limits, **measuring(cfg))
    for effort, paired in paired_gains(out, list(after)).items():
        after[effort]["paired_gain"] = paired  # over the base, on the same tasks
    (out / "results.json").write_text(json.dumps({"base": before, "trained": after}, indent=1) + "\n")
    return before, after, cal


def print_gains(before: dict, after: dict, cal: dict) -> None:
    """Each level's before/after rows, then its gain on the same tasks with its paired 95% interval (the
    tasks only one policy solved decide it), and its λ."""
    print(
        f"\n[7/7] {'policy':8s} {'effort':7s} {'n':>4s}  {'success':>6s}  {'95% interval':>16s}  {'cost':>8s}  turns  1st-edit"
    )
    for name, data in (("base", before), ("trained", after)):
        for effort, summary in data.items():
            print(row(name, effort, summary))
    print()
    for effort in before:
        g = after[effort]["paired_gain"]
        (lo, hi), split = g["ci95"], f"{g['after_only']} solved only after, {g['before_only']} only before"
        print(
            f"gain    {effort:7s} {g['gain'] * 100:+6.1f} points  paired [{lo * 100:+.1f}, {hi * 100:+.1f}]  "
            f"({split}; λ {cal['used'][effort]:.1f})"
        )


def main() -> None:
    from flywheel.models.shipped import base_dir, describe
    from flywheel.report import write_report
    from flywheel.rl.config import load_config
    from flywheel.tasks import load_suite

    configs = configs_dir()
    out = Path("runs/demo")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stage(1, "toybugs suite (built on first use, a few minutes) ...")
    train_tasks = load_suite("toybugs", split="train")
    stage(
        1, f"toybugs: {len(train_tasks)} train tasks, {len(load_suite('toybugs', split='heldout'))} held-out"
    )
    base = base_dir(BASE)
    built = describe(BASE)
    stage(2, f"base policy: {BASE}, shipped in the package (built by `{built['command']}`)")
    print(WORLD, flush=True)
    cfg = load_config(configs / "demo.toml")
    cfg.model.path = BASE
    cfg.train.steps = int(os.environ.get("FLYWHEEL_DEMO_STEPS", cfg.train.steps))
    cfg.train.max_minutes = float(os.environ.get("FLYWHEEL_DEMO_MINUTES", cfg.train.max_minutes))
    n_max = int(os.environ.get("FLYWHEEL_DEMO_TASKS", TASKS_AT_MAX))
    limits = {e: n_max if e == "max" else min(n_max, TASKS_OTHERWISE) for e in cfg.rollout.efforts}
    before, after, cal = turn(cfg, out, limits, f"hf:{base}")
    plot(before, after, out / "pareto.png")
    print_gains(before, after, cal)
    print(
        f"\nruns/demo/: calibration/, train/ (metrics.jsonl), results.json, pareto.png — {time.perf_counter() - _START:.0f} s"
    )
    report = write_report([out], out / "report.html")
    print(f"report: {report} ({report.stat().st_size / 1024:.0f} KB), open it in a browser")


if __name__ == "__main__":
    try:
        main()
    except FlywheelError as e:
        print(f"flywheel: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
