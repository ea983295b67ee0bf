"""How much of a suite can a policy that only runs `scripted-sweep`'s sweeps solve in k of them?

A sweep (`flywheel.models.scripted.sweep_command`) tries one inverse operator on every line of the module
that holds it and keeps the first change that makes the tests pass. This reads each task's
`solution.patch` and counts a sweep as repairing the task when the patch changes one line and that line
with the sweep's first substitution applied is the fixed line. For k sweeps it prints the share of tasks
solved by four policies:

- best order: the sweeps that repair the most tasks first, none twice (greedy cover);
- random, no repeats: k distinct sweeps drawn uniformly (what `scripted-sweep` itself does);
- best memoryless: every sweep drawn afresh from one fixed distribution, which may run one sweep twice, as
  a model that does not condition on its own earlier commands does; the distribution that maximises the
  expected share (the objective is concave; exponentiated-gradient ascent);
- uniform memoryless: every sweep drawn uniformly from all pairs.

The gap between the first and the third is what a policy gains by tracking which sweeps it has run.
With trajectories files (`experiments/learning.py` writes `OUT/eval-*/<effort>/trajectories.jsonl`) it also
checks the patch-based count against what the sweeps printed (how often a sweep predicted to repair its
task printed `fixed`, and how often one predicted not to did), then prints the table again with the
repairs those episodes found another way added: a sweep that printed `fixed` in an episode the verifier
passed. With `--mix`, it prints for each of those files the share its policy's exact sweeps would solve
drawn k times from that policy's own mix (memoryless, on the repairs above): whether RL moved the mix
toward sweeps that pay, apart from how many sweeps an attempt runs. No model runs.

    .venv/bin/python experiments/sweep_ceiling.py --split heldout --sweeps 4 8 12 16 20 \
        --check runs/learn6-max/eval-trained/max/trajectories.jsonl --mix
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def repairing_pairs(patch: str, pairs) -> set[int]:
    """Indices of the `pairs` whose first substitution turns the patch's one removed line into its added one."""
    removed = [line[1:] for line in patch.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if len(removed) != 1 or len(added) != 1:
        return set()
    return {
        i
        for i, (old, new) in enumerate(pairs)
        if old in removed[0] and removed[0].replace(old, new, 1) == added[0]
    }


def best_order(sets: list[set[int]], n_pairs: int, k: int) -> float:
    """Share solved by the greedy order: each next sweep repairs the most tasks not yet solved."""
    left, solved = [s for s in sets if s], 0
    for _ in range(min(k, n_pairs)):
        gain = Counter(i for s in left for i in s)
        if not gain:
            break
        pick = gain.most_common(1)[0][0]
        solved += sum(pick in s for s in left)
        left = [s for s in left if pick not in s]
    return solved / len(sets)


def random_no_repeats(sets: list[set[int]], n_pairs: int, k: int) -> float:
    k = min(k, n_pairs)
    miss = lambda m: math.comb(n_pairs - m, k) / math.comb(n_pairs, k)  # noqa: E731
    return sum(1 - miss(len(s)) for s in sets) / len(sets)


def memoryless(sets: list[set[int]], n_pairs: int, k: int, p: np.ndarray | None = None) -> float:
    """Expected share solved by k i.i.d. draws from `p`; with no `p`, from the best distribution."""
    member = np.zeros((len(sets), n_pairs))
    for t, s in enumerate(sets):
        member[t, list(s)] = 1.0
    value = lambda q: float(np.mean(1 - (1 - member @ q) ** k))  # noqa: E731
    if p is not None:
        return value(p)
    q = np.full(n_pairs, 1 / n_pairs)
    for _ in range(3000):  # exponentiated gradient on the simplex
        grad = member.T @ (k * (1 - member @ q) ** (k - 1)) / len(sets)
        q = q * np.exp(0.5 * grad / max(grad.max(), 1e-12))
        q /= q.sum()
    return value(q)


def observed(
    paths: list[str], commands: dict[str, int]
) -> tuple[list[tuple[str, int, bool]], dict[str, set[int]]]:
    """Every exact sweep in these trajectories as (task, sweep, printed `fixed`), and per task the sweeps that
    printed `fixed` in an episode the verifier passed (they repair it, perhaps otherwise than the patch)."""
    runs, repairs = [], {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            rec = json.loads(line)
            for turn in rec["turns"]:
                if turn["role"] != "tool" or turn.get("name") != "shell":
                    continue
                pair = commands.get((turn.get("arguments") or {}).get("command"))
                if pair is None:
                    continue
                fixed = turn["text"].endswith("fixed")
                runs.append((rec["task_id"], pair, fixed))
                if fixed and rec["success"]:
                    repairs.setdefault(rec["task_id"], set()).add(pair)
    return runs, repairs


def check(runs: list[tuple[str, int, bool]], sets: dict[str, set[int]]) -> str:
    """How often the patch-based prediction and the printed `fixed` agree on these exact sweeps."""
    tally = Counter((pair in sets.get(task, set()), fixed) for task, pair, fixed in runs)
    yes, no = tally[(True, True)] + tally[(True, False)], tally[(False, True)] + tally[(False, False)]
    return (
        f"check on {len(runs)} exact sweeps: {yes} predicted to repair, {tally[(True, True)]} of them printed "
        f"fixed; {no} predicted not to, {tally[(False, True)]} of them printed fixed"
    )


def main() -> None:
    from flywheel.errors import FlywheelError
    from flywheel.models.scripted import SWEEP_PAIRS, sweep_command
    from flywheel.tasks import load_suite

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="toybugs")
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--sweeps", type=int, nargs="+", default=[4, 8, 12, 16, 20], help="values of k")
    ap.add_argument(
        "--check", nargs="*", default=[], help="trajectories.jsonl files to check the prediction on"
    )
    ap.add_argument(
        "--mix", action="store_true", help="the memoryless value of each --check file's sweep mix"
    )
    args = ap.parse_args()
    missing = [p for p in args.check if not Path(p).is_file()]
    if missing:
        sys.exit(print(f"sweep_ceiling.py: no such trajectories file: {missing[0]}", file=sys.stderr) or 2)
    if args.mix and not args.check:
        sys.exit(print("sweep_ceiling.py: --mix needs --check files", file=sys.stderr) or 2)
    if any(k < 1 for k in args.sweeps):
        sys.exit(print("sweep_ceiling.py: --sweeps takes positive counts", file=sys.stderr) or 2)
    try:
        tasks = load_suite(args.suite, split=args.split)
    except FlywheelError as e:
        sys.exit(print(f"sweep_ceiling.py: {e}", file=sys.stderr) or 2)
    by_id = {t.id: repairing_pairs((Path(t.root) / "solution.patch").read_text(), SWEEP_PAIRS) for t in tasks}
    n = len(SWEEP_PAIRS)
    table(
        f"{args.suite}/{args.split}, repairs read off the solution patches",
        list(by_id.values()),
        n,
        args.sweeps,
    )
    if args.check:
        commands = {
            sweep_command(old, new, tasks[0].test_command): i for i, (old, new) in enumerate(SWEEP_PAIRS)
        }
        runs, repairs = observed(args.check, commands)
        print(check(runs, by_id))
        union = {t: by_id[t] | repairs.get(t, set()) for t in by_id}
        table(
            "with the repairs seen in passed episodes of these trajectories added",
            list(union.values()),
            n,
            args.sweeps,
        )
        if args.mix:
            print("each file's mix of exact sweeps, drawn k times (memoryless):")
            for path in args.check:
                draws = Counter(pair for _, pair, _ in observed([path], commands)[0])
                if not draws:
                    print(f"  {path}: no exact sweeps")
                    continue
                q = np.array([draws[i] for i in range(n)], dtype=float) / sum(draws.values())
                shares = "  ".join(
                    f"k={k} {memoryless(list(union.values()), n, k, q):.1%}" for k in args.sweeps
                )
                print(f"  {path}: {shares}")


def table(title: str, sets: list[set[int]], n: int, ks: list[int]) -> None:
    solvable = sum(bool(s) for s in sets)
    print(
        f"{title}: {len(sets)} tasks, {solvable} repaired by some sweep ({solvable / len(sets):.1%}); {n} sweeps"
    )
    print(
        f"{'k':>3s} {'best order':>11s} {'random, no repeats':>19s} {'best memoryless':>16s} {'uniform memoryless':>19s}"
    )
    for k in ks:
        best, uniform = memoryless(sets, n, k), memoryless(sets, n, k, np.full(n, 1 / n))
        print(
            f"{k:3d} {best_order(sets, n, k):11.1%} {random_no_repeats(sets, n, k):19.1%} {best:16.1%} {uniform:19.1%}"
        )


if __name__ == "__main__":
    main()
