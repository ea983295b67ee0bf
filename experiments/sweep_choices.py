"""Which sweeps does a policy run? The shell commands of its trajectories, against `scripted-sweep`'s.

A `scripted-sweep` command is one fixed text per inverse operator (`flywheel.models.scripted.sweep_command`).
For each trajectories file (`flywheel eval --out DIR` writes `DIR/trajectories.jsonl`;
`experiments/learning.py` writes `OUT/eval-base/<effort>/` and `OUT/eval-trained/<effort>/`) this prints,
per file: episodes, success, turns, looks (`cat -n`, `run_tests`) per episode, shell commands per
episode, the share that are exactly one of the teacher's sweeps, the share of exact sweeps that repeat one
already run in the episode, how the failed episodes ended (a submit that gives up, or a budget) and at what
turn the failures that submitted did, and the commonest first sweeps with how often a sweep for that pair
printed `fixed`. No model runs.

    .venv/bin/python experiments/sweep_choices.py runs/learn-sweep/eval-base/medium/trajectories.jsonl \\
        runs/learn-sweep/eval-trained/medium/trajectories.jsonl
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    from flywheel.actions import FormatError, parse_tagged, restore_stop
    from flywheel.models.scripted import SEARCH_SHOW, SWEEP_PAIRS, sweep_command

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectories", nargs="+", help="trajectories.jsonl files")
    ap.add_argument("--test-command", default="python -m pytest -q tests")
    ap.add_argument("--top", type=int, default=5, help="first sweeps listed per file")
    args = ap.parse_args()
    missing = [p for p in args.trajectories if not Path(p).is_file()]
    if missing:
        sys.exit(print(f"error: no such trajectories file: {missing[0]}", file=sys.stderr) or 2)
    sweeps = {
        sweep_command(old, new, args.test_command): f"{old.strip()}->{new.strip() or '(none)'}"
        for old, new in SWEEP_PAIRS
    }
    for path in args.trajectories:
        records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        counts, first, fixed = Counter(), Counter(), Counter()
        for rec in records:
            turns = rec["turns"]
            seen: set[str] = set()
            for i, turn in enumerate(turns):
                if turn["role"] != "assistant":
                    continue
                try:
                    text = turn.get("text") or ""  # as the harness read it: a stop string ended it
                    action = parse_tagged(restore_stop(text) if turn.get("finish_reason") == "stop" else text)
                except FormatError:
                    continue
                name = action.name
                command = action.args.get("command", "") if name == "shell" else ""
                counts["looks"] += name == "run_tests" or command == SEARCH_SHOW
                if name != "shell":
                    continue
                counts["shell"] += 1
                pair = sweeps.get(command)
                if pair is None:
                    continue
                counts["exact"] += 1
                counts["repeats"] += pair in seen
                if not seen:
                    first[pair] += 1
                seen.add(pair)
                reply = turns[i + 1]["text"] if i + 1 < len(turns) else ""
                fixed[pair] += reply.endswith("\nfixed")
        n = max(len(records), 1)
        print(
            f"{path}: {len(records)} episodes, success {sum(r['success'] for r in records) / n:.1%}, "
            f"turns {sum(r['n_turns'] for r in records) / n:.2f}, looks {counts['looks'] / n:.2f}, "
            f"shell {counts['shell'] / n:.2f}, exact sweeps {counts['exact'] / max(counts['shell'], 1):.0%}, "
            f"repeats {counts['repeats'] / max(counts['exact'], 1):.0%}"
        )
        failed = [r for r in records if not r["success"]]
        endings = Counter(r.get("ending") for r in failed)
        gave_up = [r["n_turns"] for r in failed if r.get("ending") == "submitted"]
        print(
            f"  failures {len(failed)}: "
            + ", ".join(f"{k} {v}" for k, v in endings.most_common())
            + (
                f"; those that submitted did at turn {sum(gave_up) / len(gave_up):.2f} on average"
                if gave_up
                else ""
            )
        )
        for pair, k in first.most_common(args.top):
            print(f"  first sweep {pair:12s} {k / n:5.1%}   printed fixed {fixed[pair]} times in all")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    main()
