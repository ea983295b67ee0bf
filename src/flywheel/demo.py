"""`make demo`: the flywheel's ground truth and harness on the embedded default, end to end.

1. build the built-in suites (toybugs train/heldout, humaneval) and count them;
2. run the scripted-noisy oracle through the harness and the real grader on held-out toybugs tasks
   (it shows the loop works: it is an oracle, not a model result);
3. evaluate the real pretrained model smollm2-135m on the same tasks at medium effort;
4. print a table of success (95% interval), mean cost and mean turns.

Run directories go under `runs/demo/`. Set FLYWHEEL_DEMO_TASKS to change the number of tasks (default 12).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from flywheel.errors import FlywheelError


def _row(name: str, s: dict) -> str:
    lo, hi = s["success_ci95"]
    return f"{name:22s} {s['n']:4d}  {s['success_rate']:6.1%}  [{lo:5.1%}, {hi:5.1%}]  ${s['mean_cost']:.5f}  {s['mean_turns']:5.1f}"


def main() -> None:
    from flywheel.eval import run_eval
    from flywheel.harness import HarnessConfig
    from flywheel.models import get_model
    from flywheel.tasks import load_suite

    n = int(os.environ.get("FLYWHEEL_DEMO_TASKS", "12"))
    out = Path("runs/demo")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    train, heldout = load_suite("toybugs", split="train"), load_suite("toybugs", split="heldout")
    humaneval = load_suite("humaneval")
    print(f"suites: toybugs train {len(train)}, heldout {len(heldout)}; humaneval {len(humaneval)}")
    tasks = heldout[:: max(1, len(heldout) // n)][:n]
    rows = []
    for spec, cfg in [("scripted-noisy", HarnessConfig()), ("smollm2-135m", HarnessConfig(temperature=0.7, top_p=0.95))]:
        print(f"evaluating {spec} on {len(tasks)} held-out toybugs tasks ...", flush=True)
        try:
            model = get_model(spec)
        except FlywheelError as e:
            print(f"  skipped: {e}")
            continue
        summary = run_eval(tasks, model, out / spec, effort="medium", cfg=cfg, concurrency=8)
        rows.append(_row(spec, summary))
    print(f"\n{'model':22s} {'n':>4s}  {'success':>6s}  {'95% interval':>16s}  {'cost':>8s}  turns")
    print("\n".join(rows))
    print(f"\n(scripted-noisy is an oracle using the reference solution.) runs in {out}/, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except FlywheelError as e:
        print(f"flywheel: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
