"""Sandbox start and grading time against running the same pytest directly, in one run.

    .venv/bin/python benchmarks/bench_grade.py [--suite toybugs] [--repeats 15] [--out bench_grade.json]

Reports medians: a sandboxed `true` against a plain subprocess `true`, and `flywheel.verify.grade` of a
task's reference solution against `python -m pytest -q` of the same files in a temporary copy (copy,
hidden tests restored, run). Goals: sandbox start ≤ 50 ms; grading ≤ 1.5× the direct run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flywheel.protocols import Limits
from flywheel.sandbox import get_sandbox
from flywheel.tasks import load_suite
from flywheel.verify import grade
from flywheel.verify.grader import test_files
from flywheel.verify.qa import workspace_with_patch


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def direct_pytest(task, ws: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "ws"
        shutil.copytree(ws, copy)
        for rel in task.hidden_files():
            shutil.copyfile(task.hidden_tests / rel, copy / rel)
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *test_files(task)],
            cwd=copy,
            capture_output=True,
            check=False,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="toybugs")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tasks", type=int, default=3, help="tasks to grade (each `repeats` times)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty"
        empty.mkdir()
        for name in ("bwrap", "fallback"):
            try:
                box = get_sandbox(name)
                box.run(empty, ["true"], limits=Limits(timeout_s=10))
            except Exception as e:  # a backend this machine cannot run
                print(f"{name}: unavailable ({e})")
                continue
            rows[f"sandbox_start_{name}_ms"] = 1000 * median_time(
                lambda b=box: b.run(empty, ["true"]), args.repeats * 3
            )
        rows["plain_subprocess_true_ms"] = 1000 * median_time(
            lambda: subprocess.run(["true"], check=True), args.repeats * 3
        )

        grade_s, direct_s = [], []
        box = get_sandbox()
        for i, task in enumerate(load_suite(args.suite)[: args.tasks]):
            ws = workspace_with_patch(task, task.solution_patch, Path(tmp) / f"ws{i}")
            assert grade(task, ws, sandbox=box).success, f"reference solution of {task.id} failed"
            grade_s.append(median_time(lambda t=task, w=ws: grade(t, w, sandbox=box), args.repeats))
            direct_s.append(median_time(lambda t=task, w=ws: direct_pytest(t, w), args.repeats))
    rows["grade_ms"] = 1000 * statistics.median(grade_s)
    rows["direct_pytest_ms"] = 1000 * statistics.median(direct_s)
    rows["grade_over_direct"] = rows["grade_ms"] / rows["direct_pytest_ms"]
    rows["sandbox"] = box.name
    for k, v in rows.items():
        print(f"{k:32s} {v:.2f}" if isinstance(v, float) else f"{k:32s} {v}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
