"""Reading run directories into a `Report`: what `flywheel report` draws.

`collect(paths)` reads what it finds under each run directory, to a depth of three (`run_dirs`): an
evaluation's summary and attempts, a training run's metrics, timings and attempts, a calibration, a
`results.json`. A policy's name is its directory's path under the run directory (`policy_name`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.eval import summarize
from flywheel.harness import EFFORTS
from flywheel.record import Trajectory, read_jsonl, read_trajectories

KNOWN = ("summary.json", "trajectories.jsonl", "metrics.jsonl", "calibration.json", "results.json")
SKIP = {"checkpoints", "tensorboard", "tasks", "weights", "peer", "workspaces"}
MAX_DEPTH = 3
MAX_ATTEMPTS = 2000  # per directory: the last ones are kept, so that a long run's page stays light
DROP_TURN_KEYS = ("token_ids", "logprobs", "kept", "prompt_ids")


@dataclass
class Curve:
    """One training run's metrics rows, and the minutes since its start at the end of each step."""

    label: str
    rows: list[dict[str, Any]]
    minutes: dict[int, float]


@dataclass
class Report:
    """What `collect` found; `render` turns it into the page."""

    title: str
    runs: list[dict[str, Any]] = field(default_factory=list)  # {"path", "found": [lines]} per directory
    points: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (policy, effort): summary
    curves: list[Curve] = field(default_factory=list)
    calibrations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)


def run_dirs(root: Path) -> list[Path]:
    """The directories under `root` (itself included, to depth `MAX_DEPTH`) that hold a known file."""
    found, stack = [], [(root, 0)]
    while stack:
        d, depth = stack.pop()
        if any((d / name).is_file() for name in KNOWN):
            found.append(d)
        if depth < MAX_DEPTH:
            subs = sorted((p for p in d.iterdir() if p.is_dir() and p.name not in SKIP), key=_dir_key)[::-1]
            stack += [(p, depth + 1) for p in subs]
    return found


def _dir_key(p: Path) -> tuple[int, str]:
    """Effort levels' folders in their order (medium, high, max), then the others by name."""
    return (list(EFFORTS).index(p.name), "") if p.name in EFFORTS else (len(EFFORTS), p.name)


def policy_name(root: Path, d: Path, prefix: str) -> str:
    """`runs/demo/eval-base/medium` under `runs/demo` -> "base" (see the module docstring)."""
    parts = list(d.relative_to(root).parts)
    if parts and parts[-1] in EFFORTS:
        parts.pop()
    if parts and parts[-1].startswith("eval-"):
        parts[-1] = parts[-1][len("eval-") :]
    name = "/".join(parts)
    return f"{prefix}/{name}" if prefix and name else (name or prefix or root.resolve().name)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FlywheelError(f"{path}: not readable JSON ({e})") from None


def minutes_per_step(timings: list[dict[str, Any]]) -> dict[int, float]:
    """Minutes since the run started at the end of each step: the sum of the steps' wall seconds (which
    holds across resumes), else `run_s`."""
    out, total = {}, 0.0
    for t in timings:
        total += float(t.get("wall_s", 0.0))
        out[int(t["step"])] = (total if "wall_s" in t else float(t.get("run_s", 0.0))) / 60
    return out


def without_tokens(record: dict[str, Any]) -> dict[str, Any]:
    """A record's JSON without per-token data, in its turns and in any nested (Fusion's sidekick) records."""
    out = {
        **record,
        "turns": [{k: v for k, v in t.items() if k not in DROP_TURN_KEYS} for t in record["turns"]],
    }
    if record.get("sidekick"):
        out["sidekick"] = [without_tokens(s) for s in record["sidekick"]]
    return out


def attempt_row(source: str, kind: str, r: Trajectory) -> dict[str, Any]:
    """One row of the task table, with the record itself minus per-token data."""
    record = without_tokens(r.to_json())
    v = r.verdict
    signatures = ", ".join(v.signatures) if v and v.signatures else ("cheat" if v and v.cheat else "")
    reward = (r.rl or {}).get("reward") if kind == "train" else float(r.success)
    return {
        "source": source,
        "kind": kind,
        "task": r.task_id,
        "effort": r.effort,
        "step": r.step,
        "success": r.success,
        "cost": r.cost,
        "turns": r.n_turns,
        "first_edit": r.steps_to_first_edit,
        "ending": r.ending or "",
        "cheat": signatures,
        "infra": r.infra_failure or "",
        "reward": reward,
        "record": record,
    }


def _kept(records: list[Trajectory], notes: list[str]) -> list[Trajectory]:
    if len(records) > MAX_ATTEMPTS:
        notes.append(f"the task table holds the last {MAX_ATTEMPTS} of {len(records)} attempts")
        return records[-MAX_ATTEMPTS:]
    return records


def _read_eval(
    rep: Report, root: Path, d: Path, prefix: str, notes: list[str]
) -> tuple[str, list[Trajectory]]:
    name = policy_name(root, d, prefix)
    records = read_trajectories(d / "trajectories.jsonl") if (d / "trajectories.jsonl").is_file() else []
    summary = read_json(d / "summary.json") if (d / "summary.json").is_file() else {}
    by_effort: dict[str, list[Trajectory]] = {}
    for r in records:
        by_effort.setdefault(r.effort, []).append(r)
    for effort, rs in by_effort.items():
        rep.points[name, effort] = summarize(rs)
    if "success_rate" in summary and {r.effort for r in records} <= {summary.get("effort", "medium")}:
        rep.points[name, summary.get("effort", "medium")] = summary
    rep.attempts += [attempt_row(name, "eval", r) for r in _kept(records, notes)]
    return name, records


def _read_train(rep: Report, root: Path, d: Path, prefix: str, notes: list[str]) -> None:
    name = policy_name(root, d, prefix)
    rows = read_jsonl(d / "metrics.jsonl")
    rep.curves.append(Curve(name, rows, minutes_per_step(read_jsonl(d / "timings.jsonl"))))
    records = read_trajectories(d / "trajectories.jsonl") if (d / "trajectories.jsonl").is_file() else []
    rep.attempts += [attempt_row(name, "train", r) for r in _kept(records, notes)]
    config = read_json(d / "config.json") if (d / "config.json").is_file() else {}
    model = config.get("model", {}).get("path", "")
    notes.append(
        f"training run {name}: {len(rows)} step{'' if len(rows) == 1 else 's'}, {len(records)} attempts"
        + (f", model {model}" if model else "")
        + (f", λ {_lambdas(config['lambdas'])}" if config.get("lambdas") else "")
    )


def _lambdas(lambdas: dict[str, float]) -> str:
    return ", ".join(f"{e} {v:.4g}" for e, v in lambdas.items())


def _eval_notes(evals: dict[str, list[Trajectory]]) -> list[str]:
    notes = []
    for name, records in evals.items():
        efforts = sorted({r.effort for r in records}, key=effort_key)
        models = ", ".join(dict.fromkeys(r.model for r in records if r.model))
        notes.append(
            f"evaluation {name}: {len(records)} attempts at {', '.join(efforts) or 'no effort level'}"
            + (f", model {models}" if models else "")
        )
    return notes


def read_run(rep: Report, path: Path, prefix: str) -> None:
    """Add everything found under one run directory to `rep`."""
    if not path.is_dir():
        raise FlywheelError(f"{path}: no such run directory")
    dirs = run_dirs(path)
    if not dirs:
        raise FlywheelError(f"{path}: not a run directory (none of {', '.join(KNOWN)} found)")
    notes: list[str] = []
    results: dict[tuple[str, str], dict[str, Any]] = {}
    evals: dict[str, list[Trajectory]] = {}
    for d in dirs:
        if (d / "metrics.jsonl").is_file():
            _read_train(rep, path, d, prefix, notes)
        elif (d / "trajectories.jsonl").is_file() or (d / "summary.json").is_file():
            name, records = _read_eval(rep, path, d, prefix, notes)
            evals.setdefault(name, []).extend(records)
        if (d / "calibration.json").is_file():
            data = read_json(d / "calibration.json")
            rep.calibrations.append((policy_name(path, d, prefix), data))
            where = (d / "calibration.json").relative_to(path)
            notes.append(f"calibration ({where}): λ {_lambdas(data.get('lambdas', {}))}")
        if (d / "results.json").is_file():
            for policy, efforts in read_json(d / "results.json").items():
                for effort, summary in efforts.items():
                    results[policy_name(path, d / f"eval-{policy}", prefix), effort] = summary
    rep.points.update(results)  # the run's own summaries (the demo prices cost as its reward does)
    rep.runs.append({"path": str(path), "found": _eval_notes(evals) + notes})


def collect(paths: list[Path], title: str = "") -> Report:
    """Read every run directory; FlywheelError names one that is missing or holds none of `KNOWN`."""
    names = [Path(p).resolve().name for p in paths]
    prefixes = [n if names.count(n) == 1 else str(p) for n, p in zip(names, paths, strict=True)]
    prefixes = prefixes if len(paths) > 1 else [""]
    rep = Report(title or "Flywheel report: " + ", ".join(str(p) for p in paths))
    for path, prefix in zip(paths, prefixes, strict=True):
        read_run(rep, Path(path), prefix)
    return rep


def effort_key(effort: str) -> tuple[int, str]:
    """Effort levels in their order (medium, high, max), then any other name."""
    order = list(EFFORTS)
    return (order.index(effort) if effort in order else len(order), effort)
