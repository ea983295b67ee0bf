"""How much slower generation runs inside an evaluation than alone: the same `generate` calls, timed twice.

An evaluation runs its episodes' sandboxed commands beside the engine (cohorts: one half generates while the
other's commands run), so on a small machine the engine shares the cores. This runs `flywheel eval` in this
process with every `TorchEngine.generate` call recorded (its requests and wall time), then replays the same
calls in order on a fresh engine with nothing else running, and prints both totals and their ratio. The
replay's tokens equal the eval's (seeded requests, same thread count), which the script checks.

    .venv/bin/python benchmarks/bench_eval_generation.py --threads 1
    .venv/bin/python benchmarks/bench_eval_generation.py --threads 2 --limit 16

Measured on 2 cores (the defaults: 32 held-out toybugs tasks, medium effort, two cohorts, one thread):
37.5 s of generation inside the eval against 21.7 s replayed alone (1.73x). An earlier, hand-run version of
the same measurement gave 45.2 against 23.6 s with one thread and 71.1 against 24.6 s with two.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import flywheel.models.torch_engine as te
from flywheel.cli import main as cli_main
from flywheel.protocols import Request


def record_calls(argv: list[str]) -> list[tuple[list[Request], float, int]]:
    """Run `flywheel ARGV` here; every generate call's (requests, wall seconds, tokens generated)."""
    calls = []
    generate = te.TorchEngine.generate

    def timed(self, requests):
        t0 = time.perf_counter()
        out = generate(self, requests)
        calls.append((list(requests), time.perf_counter() - t0, sum(c.completion_tokens for c in out)))
        return out

    te.TorchEngine.generate = timed
    try:
        cli_main(argv)
    except SystemExit as exc:
        if exc.code:
            raise
    finally:
        te.TorchEngine.generate = generate
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="toybugs-sweep")
    ap.add_argument("--limit", type=int, default=32, help="held-out toybugs tasks")
    ap.add_argument("--effort", default="medium")
    ap.add_argument("--cohorts", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, in the eval and the replay")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["eval", "--suite", "toybugs", "--split", "heldout", "--model", args.model]
        argv += ["--effort", args.effort, "--limit", str(args.limit), "--concurrency", str(args.limit)]
        argv += ["--cohorts", str(args.cohorts), "--top-p", "0.95", "--threads", str(args.threads)]
        t0 = time.perf_counter()
        calls = record_calls([*argv, "--out", str(Path(tmp) / "run")])
        wall = time.perf_counter() - t0
    torch.set_num_threads(args.threads)
    engine = te.load_torch_model(args.model)
    alone, same = 0.0, True
    for requests, _, tokens in calls:
        t0 = time.perf_counter()
        out = engine.generate(requests)
        alone += time.perf_counter() - t0
        same &= sum(c.completion_tokens for c in out) == tokens
    inside = sum(c[1] for c in calls)
    print(
        f"eval {wall:.1f} s; {len(calls)} generate calls, {sum(c[2] for c in calls)} tokens: {inside:.1f} s "
        f"inside the eval, {alone:.1f} s alone ({inside / alone:.2f}x); {args.threads} thread(s)"
        + ("" if same else "; the replay's token counts differ")
    )


if __name__ == "__main__":
    main()
