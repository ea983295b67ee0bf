"""`make demo`: the whole flywheel on the embedded default, on one CPU.

1. build the toybugs suite (cached after the first run);
2. SFT the base policy: a tiny Llama imitating scripted-noisy on the train split (cached by config);
3. calibrate λ per effort level from the base policy's cost/success ladder;
4. evaluate the base on held-out tasks at every effort level;
5. train with RL, all three effort levels in one run;
6. evaluate the trained policy on the same held-out tasks;
7. print a before/after table and write `runs/demo/pareto.png` (success against cost per effort level)
   and `runs/demo/report.html` (`flywheel report runs/demo`: every plot, and every attempt to read).

Everything goes under `runs/demo/`. Sizes come from `configs/demo.toml` and `configs/sft.toml`; the
environment can shrink them: FLYWHEEL_DEMO_STEPS (training steps), FLYWHEEL_DEMO_TASKS (held-out tasks).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from flywheel.errors import FlywheelError


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


def cached_base(sft_config: Path) -> Path:
    """The SFT base for `sft_config`, built once into the cache (keyed by the config's bytes and by the
    imitation data's format, so that a changed teacher trains a new base)."""
    from flywheel.rl.config import load_config
    from flywheel.sft import DATA_FORMAT, SftConfig, run_sft
    from flywheel.tasks import cache_dir

    key = hashlib.sha256(sft_config.read_bytes() + f"\ndata format {DATA_FORMAT}".encode()).hexdigest()[:12]
    path = cache_dir() / "bases" / f"sft-{key}"
    if not (path / "sft_config.json").is_file():
        stage(2, f"training the base policy ({sft_config}) into {path} ...")
        run_sft(load_config(sft_config, SftConfig), path)
    else:
        stage(2, f"base policy: {path} (cached)")
    return path


def row(name: str, effort: str, s: dict) -> str:
    lo, hi = s["success_ci95"]
    edit = s["median_steps_to_first_edit"]
    return (
        f"{name:8s} {effort:7s} {s['n']:4d}  {s['success_rate']:6.1%}  [{lo:5.1%}, {hi:5.1%}]  "
        f"${s['mean_reward_cost']:.5f}  {s['mean_turns']:5.1f}  {edit if edit is not None else '-':>5}"
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


def main() -> None:
    from flywheel.eval.measure import evaluate_policy
    from flywheel.eval.report import write_report
    from flywheel.loop import RunDir
    from flywheel.rl.calibrate import measuring, run_calibration
    from flywheel.rl.config import load_config
    from flywheel.rl.train import load_engine, load_heldout, setup_torch, train
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
    base = cached_base(configs / "sft.toml")
    cfg = load_config(configs / "demo.toml")
    cfg.model.path = str(base)
    cfg.train.steps = int(os.environ.get("FLYWHEEL_DEMO_STEPS", cfg.train.steps))
    n_eval = int(os.environ.get("FLYWHEEL_DEMO_TASKS", "16"))
    stage(3, "calibrating λ per effort level ...")
    cal = run_calibration(cfg, out / "calibration", limit=8, samples=1)
    cfg.reward.calibration = str(out / "calibration" / "calibration.json")
    print("      λ = " + ", ".join(f"{e}: {v:.1f}" for e, v in cal["lambdas"].items()), flush=True)
    heldout = load_heldout(cfg)
    heldout = heldout[:: max(1, len(heldout) // n_eval)][:n_eval]
    setup_torch(cfg)
    stage(4, f"evaluating the base on {len(heldout)} held-out tasks ...")
    engine = load_engine(cfg, f"hf:{base}")
    before = evaluate_policy(engine, heldout, out=out / "eval-base", **measuring(cfg))
    stage(5, f"training for {cfg.train.steps} steps ...")
    train(cfg, out / "train")
    latest = RunDir(out / "train").latest_weights()
    stage(6, "evaluating the trained policy ...")
    engine = load_engine(cfg, f"hf:{latest}")
    after = evaluate_policy(engine, heldout, out=out / "eval-trained", **measuring(cfg))
    (out / "results.json").write_text(json.dumps({"base": before, "trained": after}, indent=1) + "\n")
    plot(before, after, out / "pareto.png")
    print(
        f"\n[7/7] {'policy':8s} {'effort':7s} {'n':>4s}  {'success':>6s}  {'95% interval':>16s}  {'cost':>8s}  turns  1st-edit"
    )
    for name, data in (("base", before), ("trained", after)):
        for effort, summary in data.items():
            print(row(name, effort, summary))
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
