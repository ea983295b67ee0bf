"""A sandboxed `python -m pytest` on a toybugs task: cold (a fresh interpreter) against warm (forked from the
episode's warm parent), interleaved in one process.

    .venv/bin/python benchmarks/bench_warm_pytest.py [--runs 100] [--task 0]

Each run is what the agent's `run_tests` or a sweep line costs: one command through the sandbox, timed from
the caller (`RunResult.wall_s`). The warm side opens one `EpisodeSandbox` for the workspace (its parent's
start is paid once, before the timed runs, as an episode pays it once); the cold side runs the same command
through the plain sandbox. Both must give the same exit code and, durations and addresses aside, the same output.
Prints medians and p95 in milliseconds and the cold/warm ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from flywheel.protocols import Limits
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.warm import EpisodeSandbox
from flywheel.tasks import load_suite

VARIES = re.compile(r" in \d+\.\d+s| at 0x[0-9a-f]+")  # durations and object addresses differ run to run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--task", type=int, default=0, help="which held-out toybugs task")
    args = ap.parse_args()
    task = load_suite("toybugs", split="heldout")[args.task]
    ws = Path(tempfile.mkdtemp(prefix="bench-warm-")) / "ws"
    shutil.copytree(task.repo, ws)
    argv = ["bash", "-c", task.test_command]
    limits = Limits(timeout_s=60)
    sandbox = get_sandbox()
    episode = EpisodeSandbox.open(sandbox, ws)
    assert episode is not None, "the warm parent needs the bwrap backend"
    try:
        first = episode.run(argv, limits=limits)  # starts the parent (waits for it up to READY_S)
        for _ in range(50):
            if episode.ready or episode.broken:
                break
            episode.run(argv, limits=limits)
        assert episode.ready, f"the warm parent did not start: {episode.broken}"
        times: dict[str, list[float]] = {"cold": [], "warm": []}
        warm_before = episode.warm_runs
        for _ in range(args.runs):
            cold = sandbox.run(ws, argv, limits=limits)
            warm = episode.run(argv, limits=limits)
            assert cold.exit_code == warm.exit_code == first.exit_code
            assert VARIES.sub("", cold.output) == VARIES.sub("", warm.output)
            times["cold"].append(cold.wall_s * 1000)
            times["warm"].append(warm.wall_s * 1000)
        served = episode.warm_runs - warm_before
    finally:
        episode.close()
        shutil.rmtree(ws.parent, ignore_errors=True)
    stats = {
        side: {
            "median_ms": round(statistics.median(v), 1),
            "p95_ms": round(sorted(v)[int(0.95 * (len(v) - 1))], 1),
        }
        for side, v in times.items()
    }
    ratio = stats["cold"]["median_ms"] / stats["warm"]["median_ms"]
    print(
        json.dumps(
            {"task": task.id, "runs": args.runs, "warm_served": served, **stats, "cold/warm": round(ratio, 2)}
        )
    )


if __name__ == "__main__":
    main()
