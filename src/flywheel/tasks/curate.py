"""Difficulty curation: keep the tasks a policy solves only sometimes.

A task the policy always solves teaches it nothing (every attempt gets the same reward, so the advantage
is zero), and neither does one it never solves. Curation keeps tasks with pass rate 0 < p ≤ p_max.

Two layers, as elsewhere in the project:

- Pure functions of trajectory records, which the RL loop calls to re-curate every N steps from its own
  rollouts: `pass_rates(records)` gives (successes, attempts) per task id, `select(rates, p_max,
  task_ids=...)` the eligible task ids. A task never attempted stays eligible (it has not been measured
  yet), so new tasks enter and a task that dropped out can come back: pass `min_policy_version` to
  `pass_rates` to count only recent attempts, and a task the policy never solved — excluded, so no
  longer attempted — becomes "never attempted" in that window once its old records age out, and waits
  only that long. Tasks the policy now always solves drop out at the next re-curation.
- `write_curated(out, tasks, records, settings)`: `select` over the records' pass rates, then the kept task
  directories under `out/tasks/` (a suite directory), and `report.json` with every task's rate and the
  pass-rate histogram before and after curation (and `pass_rates.png`).

The attempts themselves (k per task through the real harness and grader) are run by a policy, which is
evaluation's job: `flywheel.eval.curate.curate`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.record import Trajectory
from flywheel.tasks.format import Task

Rates = dict[str, tuple[int, int]]  # task id -> (successes, attempts)


def pass_rates(records: Iterable[Trajectory], *, min_policy_version: int | None = None) -> Rates:
    """(successes, attempts) per task id from trajectory records (their task, success and policy version).

    With `min_policy_version`, only attempts by that policy version or a later one count. An attempt the
    infrastructure failed (`infra_failure`) says nothing about the task and does not count.
    """
    rates: Rates = {}
    for r in records:
        if r.infra_failure or (min_policy_version is not None and r.policy_version < min_policy_version):
            continue
        s, n = rates.get(r.task_id, (0, 0))
        rates[r.task_id] = (s + r.success, n + 1)
    return rates


def rate(entry: tuple[int, int]) -> float | None:
    """The pass rate of a (successes, attempts) pair; None when never attempted."""
    s, n = entry
    return s / n if n else None


def select(
    rates: Mapping[str, tuple[int, int]],
    p_max: float = 0.75,
    *,
    task_ids: Sequence[str] | None = None,
    p_min: float = 0.0,
    min_attempts: int = 1,
) -> list[str]:
    """Task ids with p_min < p ≤ p_max, plus those with fewer than `min_attempts` attempts (unmeasured).

    `task_ids` is the candidate pool (default: the ids in `rates`); the result keeps its order (sorted
    when `task_ids` is not given).
    """
    if not 0.0 <= p_min < p_max <= 1.0:
        raise FlywheelError(f"need 0 <= p_min < p_max <= 1, got p_min={p_min}, p_max={p_max}")
    pool = list(task_ids) if task_ids is not None else sorted(rates)
    out = []
    for tid in pool:
        s, n = rates.get(tid, (0, 0))
        if n < min_attempts or p_min < s / n <= p_max:
            out.append(tid)
    return out


def histogram(rates: Mapping[str, tuple[int, int]], bins: int = 10) -> dict[str, Any]:
    """Counts of measured tasks per pass-rate bin ([0, 1] in `bins` equal bins, the last one closed),
    plus how many were never solved (p = 0), always solved (p = 1) and not attempted."""
    counts = [0] * bins
    measured = [p for p in (rate(v) for v in rates.values()) if p is not None]
    for p in measured:
        counts[min(int(p * bins), bins - 1)] += 1
    return {
        "edges": [round(i / bins, 6) for i in range(bins + 1)],
        "counts": counts,
        "never_solved": sum(p == 0 for p in measured),
        "always_solved": sum(p == 1 for p in measured),
        "not_attempted": len(rates) - len(measured),
    }


def report(rates: Rates, kept: Sequence[str], **settings: Any) -> dict[str, Any]:
    """report.json's content: settings, counts, histograms before and after curation, every task's rate."""
    after = {t: rates.get(t, (0, 0)) for t in kept}
    return {
        **settings,
        "tasks": len(rates),
        "kept": len(kept),
        "kept_ids": list(kept),
        "histogram_before": histogram(rates),
        "histogram_after": histogram(after),
        "rates": {
            t: {"successes": s, "attempts": n, "p": rate((s, n))} for t, (s, n) in sorted(rates.items())
        },
    }


def plot(rep: Mapping[str, Any], path: Path) -> Path:
    """A bar chart of the pass-rate histogram before and after curation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    edges = rep["histogram_before"]["edges"]
    mids = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    width = (edges[1] - edges[0]) * 0.4
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(
        [m - width / 2 for m in mids], rep["histogram_before"]["counts"], width, label=f"all ({rep['tasks']})"
    )
    ax.bar(
        [m + width / 2 for m in mids], rep["histogram_after"]["counts"], width, label=f"kept ({rep['kept']})"
    )
    ax.set_xlabel(f"pass rate over k={rep.get('k', '?')} attempts")
    ax.set_ylabel("tasks")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{rep.get('model', '')}: keep 0 < p ≤ {rep.get('p_max', '?')}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_curated(
    out: Path, tasks: Sequence[Task], records: Iterable[Trajectory], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """Keep the tasks with 0 < p ≤ `settings["p_max"]` over `records`: their directories in `out/tasks/`
    (a suite), `out/report.json` (`report`, opening with `settings`) and `out/pass_rates.png`."""
    rates = {t.id: (0, 0) for t in tasks} | pass_rates(records)
    kept = select(rates, settings["p_max"], task_ids=[t.id for t in tasks])
    by_id = {t.id: t for t in tasks}
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    for tid in kept:
        dest = out / "tasks" / tid
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(by_id[tid].root, dest)
    rep = report(rates, kept, **settings)
    (out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    plot(rep, out / "pass_rates.png")
    return rep
