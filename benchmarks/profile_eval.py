"""Where an evaluation's time goes: generation, the agent's sandboxed commands, grading, and the rest.

Runs `flywheel eval` in this process with its seams timed (nothing else changes): every
`TorchEngine.generate` call, every sandboxed command (`Sandbox.run`, told apart as the agent's or the
grader's, and as a pytest run or another command) and every grading (`flywheel.verify.grader.grade`). It
prints the wall time, the CPU seconds of this process and of the rest of the machine (on an idle host:
the sandboxed commands), and each seam's total. Episodes run concurrently, so the
seams' totals are thread-seconds: they overlap, and may add up to more than the wall time.

    .venv/bin/python benchmarks/profile_eval.py --model scripted-sweep
    .venv/bin/python benchmarks/profile_eval.py --model toybugs-sweep
    .venv/bin/python benchmarks/profile_eval.py --model toybugs-sweep --cold-pytest   # warm parent off

It measures as the demo does (`configs/demo.toml`: its turn and token limits, concurrency, two cohorts,
one torch thread; `flywheel.rl.calibrate.measuring`), by default at max effort on the first 48 held-out
toybugs tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flywheel.verify.grader as grader_module
from flywheel.sandbox.bwrap import BwrapSandbox
from flywheel.sandbox.fallback import FallbackSandbox
from flywheel.sandbox.warm import EpisodeSandbox

SECONDS: dict[str, list[float]] = defaultdict(list)
GRADING = threading.local()
WARM = {"runs": 0, "cold": 0, "given_up": 0}  # pytest runs served warm, sent cold; parents given up


def timed(name: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, with each call's wall seconds added under `name(*args)`."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[name(*args, **kwargs)].append(time.perf_counter() - t0)

    return wrapper


def command_kind(sandbox: Any, workspace: Path, argv: list[str], **_: Any) -> str:
    return argv_kind(argv)


def episode_command_kind(episode: Any, argv: list[str], **_: Any) -> str:
    return argv_kind(argv)


def argv_kind(argv: list[str]) -> str:
    who = "grader" if getattr(GRADING, "on", False) else "agent"
    what = "pytest" if "pytest" in " ".join(argv) else "other"
    return f"sandbox: {who}, {what}"


def grading(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        GRADING.on = True
        try:
            return fn(*args, **kwargs)
        finally:
            GRADING.on = False

    return wrapper


def instrument() -> None:
    import flywheel.models.torch_engine as te

    te.TorchEngine.generate = timed(lambda *a, **k: "generate", te.TorchEngine.generate)
    for cls in (BwrapSandbox, FallbackSandbox):
        cls.run = timed(command_kind, cls.run)
    EpisodeSandbox.run = timed(episode_command_kind, EpisodeSandbox.run)
    close = EpisodeSandbox.close

    def counted_close(self: EpisodeSandbox) -> None:
        WARM["runs"] += self.warm_runs
        WARM["cold"] += self.cold_runs
        WARM["given_up"] += self.broken is not None
        if self.broken:
            print("given up:", self.broken, file=sys.stderr)
        close(self)

    EpisodeSandbox.close = counted_close
    grader_module.grade = timed(lambda *a, **k: "grade (its commands included)", grading(grader_module.grade))


def cpu() -> tuple[float, float]:
    """CPU seconds so far: this process's, and the whole machine's (from /proc/stat). The sandboxed
    commands run under a supervisor that reaps them, so their time does not reach this process's
    children's rusage; the machine's busy time less this process's is theirs on an otherwise idle host."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    busy = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    machine = (sum(busy) - busy[3] - busy[4]) / ticks  # all but idle and iowait
    return me.ru_utime + me.ru_stime, machine


def evaluate(model: str, effort: str, limit: int, out: Path, warm: bool) -> dict[str, Any]:
    """The demo's evaluation of `model` at `effort` on the first `limit` held-out tasks."""
    from flywheel.eval.measure import evaluate_policy
    from flywheel.models import get_model, is_torch
    from flywheel.rl.calibrate import measuring
    from flywheel.rl.config import load_config
    from flywheel.rl.train import load_engine, load_heldout, model_spec, setup_torch

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "demo.toml")
    cfg.rollout.efforts = [effort]
    cfg.rollout.warm_pytest = warm
    setup_torch(cfg)
    spec = model_spec(model) if model == "toybugs-sweep" else model
    engine = load_engine(cfg, spec) if is_torch(spec) else get_model(spec)
    tasks = load_heldout(cfg)[:limit]
    return evaluate_policy(engine, tasks, out=out, limits={effort: limit}, **measuring(cfg))[effort]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="toybugs-sweep", help="toybugs-sweep, scripted-sweep, hf:DIR, ...")
    ap.add_argument("--effort", default="max")
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--cold-pytest", action="store_true", help="every sandboxed pytest started afresh")
    args = ap.parse_args()
    instrument()
    with tempfile.TemporaryDirectory() as tmp:
        (me0, all0), t0 = cpu(), time.perf_counter()
        summary = evaluate(args.model, args.effort, args.limit, Path(tmp), not args.cold_pytest)
        wall = time.perf_counter() - t0
        me1, all1 = cpu()
    rows: dict[str, Any] = {
        "wall_s": round(wall, 1),
        "cpu_s_flywheel_process": round(me1 - me0, 1),
        "cpu_s_outside_it": round((all1 - all0) - (me1 - me0), 1),  # the sandboxed commands, on an idle host
        "success_rate": round(summary["success_rate"], 3),
        "attempts": summary["n"],
        "warm_pytest_runs": WARM["runs"],
        "pytest_runs_sent_cold": WARM["cold"],
        "warm_parents_given_up": WARM["given_up"],
    }
    for name, seconds in sorted(SECONDS.items()):
        rows[name] = {
            "calls": len(seconds),
            "thread_s": round(sum(seconds), 1),
            "median_ms": round(1000 * statistics.median(seconds), 1),
        }
    head = {
        "model": args.model,
        "effort": args.effort,
        "tasks": args.limit,
        "warm_pytest": not args.cold_pytest,
    }
    print(json.dumps({**head, **rows}, indent=1))


if __name__ == "__main__":
    main()
