"""Long horizons, measured: compaction on `toybugs-long`, RL across the compaction boundary, and the
alternating length-budget phases.

    python experiments/long_horizon.py compactions [--model toybugs-sweep] [--tasks 48] [--effort max]
    python experiments/long_horizon.py turn --config experiments/configs/long-rl.toml [--tasks 32] [--minutes 20]
    python experiments/long_horizon.py turn --config experiments/configs/budget-phases.toml [--minutes 20]
    python experiments/long_horizon.py show RUN_DIR [RUN_DIR ...]

`compactions` evaluates one policy on the first `--tasks` held-out tasks of the config's suite (default
`experiments/configs/long-rl.toml`: toybugs-long with the context cut to 1,024 tokens) once per compaction
(`summary`, `elide`, `none`), into OUT/<compaction>/, and prints one row per run. `turn` is one turn of
the flywheel under `--config` (`flywheel.demo.turn`: evaluate the base, set λ from its frontier, train,
evaluate again) and prints the same rows before and after. `show` prints the rows of finished runs.

A row: success, mean turns, mean generated tokens, compactions per attempt (model-written summaries and
elisions apart), the longest context any turn reached against the model's window, the mean summary in
characters, and the endings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flywheel.demo import print_gains, turn  # noqa: E402
from flywheel.models.shipped import base_dir  # noqa: E402
from flywheel.rl.config import load_config  # noqa: E402

LONG = Path("experiments/configs/long-rl.toml")


def records(run: Path) -> dict[str, list[dict]]:
    """Each effort level's records under an evaluation directory (`run/<effort>/trajectories.jsonl`)."""
    out = {}
    for path in sorted(run.glob("*/trajectories.jsonl")):
        with path.open() as f:
            out[path.parent.name] = [json.loads(line) for line in f if line.strip()]
    return out


def row(name: str, effort: str, recs: list[dict], window: int) -> str:
    n = len(recs)
    wins = sum(bool(r.get("success")) for r in recs)
    marks = [t.get("text") for r in recs for t in r["turns"] if t.get("name") == "compaction"]
    summaries = [
        len(t["text"]) for r in recs for t in r["turns"] if t.get("role") == "assistant" and t.get("summary")
    ]
    longest = max((r.get("max_context_tokens") or 0 for r in recs), default=0)
    tokens = statistics.fmean(r["usage"]["completion_tokens"] for r in recs) if n else 0.0
    turns = statistics.fmean(r["n_turns"] for r in recs) if n else 0.0
    endings: dict[str, int] = {}
    for r in recs:
        endings[r["ending"]] = endings.get(r["ending"], 0) + 1
    mean_summary = f"{statistics.fmean(summaries):7.0f}" if summaries else "      -"
    return (
        f"{name:14s} {effort:6s} {n:4d}  {wins / max(n, 1):6.1%}  {turns:5.1f}  {tokens:6.0f}  "
        f"{marks.count('summary') / max(n, 1):5.2f}  {marks.count('elided') / max(n, 1):5.2f}  "
        f"{longest:5d}/{window:<5d} {mean_summary}  {json.dumps(endings, sort_keys=True)}"
    )


HEAD = f"{'run':14s} {'effort':6s} {'n':>4s}  {'success':>7s} {'turns':>5s}  {'tokens':>6s}  {'summ.':>5s}  {'elid.':>5s}  {'longest':>11s} {'summary':>7s}  endings"


def show(runs: dict[str, Path], window: int) -> None:
    print(HEAD)
    for name, run in runs.items():
        for effort, recs in records(run).items():
            print(row(name, effort, recs, window))


def compactions(args: argparse.Namespace) -> None:
    from flywheel.eval.measure import evaluate_policy
    from flywheel.rl.calibrate import measuring
    from flywheel.rl.train import load_engine, load_heldout, setup_torch

    cfg = load_config(args.config)
    cfg.rollout.efforts = [args.effort]
    setup_torch(cfg)
    spec = args.model if ":" in args.model else f"hf:{base_dir(args.model)}"
    engine = load_engine(cfg, spec)
    tasks = load_heldout(cfg)[: args.tasks]
    runs = {}
    for mode in ("summary", "elide", "none"):
        cfg.rollout.compaction = mode
        runs[mode] = args.out / mode
        print(f"{mode}: {len(tasks)} tasks of {cfg.tasks.suite} at {args.effort} ...", flush=True)
        evaluate_policy(engine, tasks, out=runs[mode], **measuring(cfg))
    show(runs, cfg.model.max_context)


def one_turn(args: argparse.Namespace) -> None:
    cfg = load_config(args.config)
    if args.minutes:
        cfg.train.max_minutes = args.minutes
    limits = {e: args.tasks for e in cfg.rollout.efforts}
    args.out.mkdir(parents=True, exist_ok=True)
    before, after, cal = turn(cfg, args.out, limits, f"hf:{base_dir(cfg.model.path)}")
    print_gains(before, after, cal)
    print()
    show({"base": args.out / "eval-base", "trained": args.out / "eval-trained"}, cfg.model.max_context)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compactions", help="one policy under summary, elide and none")
    c.add_argument("--model", default="toybugs-sweep", help="a shipped base's name or a model spec (hf:PATH)")
    c.add_argument("--config", type=Path, default=LONG)
    c.add_argument("--tasks", type=int, default=48)
    c.add_argument("--effort", default="max")
    c.add_argument("--out", type=Path, default=Path("runs/long-compactions"))
    t = sub.add_parser("turn", help="evaluate, calibrate, train, evaluate under a config")
    t.add_argument("--config", type=Path, default=LONG)
    t.add_argument("--tasks", type=int, default=32, help="held-out tasks per effort level")
    t.add_argument("--minutes", type=float, default=0.0, help="training time (0: the config's)")
    t.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("show", help="the rows of finished evaluation directories")
    s.add_argument("runs", type=Path, nargs="+")
    s.add_argument("--window", type=int, default=0, help="the model's context, for the 'longest' column")
    args = ap.parse_args()
    if args.cmd == "compactions":
        compactions(args)
    elif args.cmd == "turn":
        one_turn(args)
    else:
        show({str(r): r for r in args.runs}, args.window)


if __name__ == "__main__":
    main()
