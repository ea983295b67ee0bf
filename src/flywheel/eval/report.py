"""`flywheel report`: run directories in, one self-contained HTML page out.

`collect(paths)` reads what it finds under each run directory, to a depth of three, into a `Report`:

- an evaluation (`flywheel eval --out`: `trajectories.jsonl`, `summary.json`; the demo's
  `eval-<policy>/<effort>/`): one point of success against cost per (policy, effort), and its attempts;
- a training run (`metrics.jsonl`, `timings.jsonl`, `config.json`, `trajectories.jsonl`): learning
  curves and the attempts trained on, each with the trainer's reward;
- a calibration (`calibration.json`): the ladder of budgets per effort level and the λ chosen;
- a `results.json` (`{policy: {effort: summary}}`, as the demo writes): the summaries of its policies'
  points, in place of the ones recomputed from the records.

`render(report)` is a pure function from that data to the page: charts are inline SVG (`flywheel.eval.svg`),
styles and the one script (`report.css`, `report.js`) are inlined, and the attempts are embedded as JSON
(without per-token data) that the script renders with `textContent` only. Nothing in the page loads from
the network; a trajectory's text cannot inject markup (`embed_json` escapes `<`, `>` and `&`).

A policy's name is its directory's path under the run directory, without an effort level's folder and
an `eval-` prefix (`runs/demo/eval-base/medium` is `base`); with several run directories, each name
starts with its run's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.eval import summarize
from flywheel.eval.svg import DASHES, Series, chart, color
from flywheel.harness import EFFORTS
from flywheel.record import Trajectory, read_jsonl, read_trajectories

KNOWN = ("summary.json", "trajectories.jsonl", "metrics.jsonl", "calibration.json", "results.json")
SKIP = {"checkpoints", "tensorboard", "tasks", "weights", "peer", "workspaces"}
MAX_DEPTH = 3
MAX_ATTEMPTS = 2000  # per directory: the last ones are kept, so that a long run's page stays light
DROP_TURN_KEYS = ("token_ids", "logprobs", "kept", "prompt_ids")
# (metric, y label, per effort level): the learning curves, each drawn when metrics.jsonl has it
CURVES = (
    ("reward", "mean reward", True),
    ("success", "success rate", True),
    ("cost", "mean cost per attempt ($)", True),
    ("turns", "mean turns", True),
    ("entropy", "entropy (nats per token)", False),
    ("kl_k3", "KL rollout → trainer (k3)", False),
    ("is_weight_mean", "mean importance weight", False),
    ("is_ratio_max", "max importance ratio", False),
    ("clip_frac", "clipped fraction", False),
    ("loss", "loss", False),
    ("grad_norm", "gradient norm", False),
    ("infra_failures", "attempts lost to infrastructure", False),
)


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


# ---------------------------------------------------------------------------------------- reading runs


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
        efforts = sorted({r.effort for r in records}, key=_effort_key)
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


# ------------------------------------------------------------------------------------------- rendering


def _effort_key(effort: str) -> tuple[int, str]:
    order = list(EFFORTS)
    return (order.index(effort) if effort in order else len(order), effort)


def _cost(summary: dict[str, Any]) -> float:
    return float(summary.get("mean_reward_cost", summary.get("mean_cost", 0.0)))


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def policies(rep: Report) -> list[str]:
    return list(dict.fromkeys(p for p, _ in rep.points))


def score_cost_chart(rep: Report) -> str:
    """Success against mean cost per attempt: one point per (policy, effort), each policy's efforts
    joined in cost order (its frontier), with the 95% interval as error bars."""
    series = []
    for i, policy in enumerate(policies(rep)):
        pts = sorted((_cost(s), e, s) for (p, e), s in rep.points.items() if p == policy)
        series.append(
            Series(
                policy,
                [(c, float(s["success_rate"])) for c, _, s in pts],
                err=[tuple(s.get("success_ci95", (s["success_rate"],) * 2)) for _, _, s in pts],
                names=[e for _, e, _ in pts],
                color=color(i),
                size=4.5,
            )
        )
    return chart(
        "Success against cost, per effort level",
        "mean cost per attempt ($)",
        "success rate",
        series,
        ylim=(0.0, 1.0),
        note="Each point is one policy at one effort level; bars are 95% Wilson intervals. "
        "A line joins a policy's effort levels in cost order.",
    )


def summary_table(rep: Report) -> str:
    head = "<tr><th>policy</th><th>effort</th><th>attempts</th><th>success [95% interval]</th>"
    head += "<th>mean cost</th><th>turns</th><th>1st edit</th><th>infra failures</th></tr>"
    rows = []
    for policy in policies(rep):
        for effort in sorted((e for p, e in rep.points if p == policy), key=_effort_key):
            s = rep.points[policy, effort]
            lo, hi = s.get("success_ci95", (0.0, 1.0))
            edit = s.get("median_steps_to_first_edit")
            rows.append(
                f"<tr><td>{escape(policy)}</td><td>{escape(effort)}</td><td>{s.get('n', '')}</td>"
                f"<td><b>{_pct(s['success_rate'])}</b> [{_pct(lo)}, {_pct(hi)}]</td>"
                f"<td>${_cost(s):.5f}</td><td>{s.get('mean_turns', 0):.1f}</td>"
                f"<td>{'-' if edit is None else edit}</td><td>{s.get('infra_failures', 0)}</td></tr>"
            )
    return f'<table class="summary">{head}{"".join(rows)}</table>'


def _metric_series(curves: list[Curve], metric: str, per_effort: bool, x: str) -> list[Series]:
    series = []
    for ci, c in enumerate(curves):
        efforts = (
            {k.split("/")[0] for r in c.rows for k in r if k.endswith("/" + metric)} if per_effort else ()
        )
        keys = [metric] + [f"{e}/{metric}" for e in sorted(efforts, key=_effort_key)]
        for ki, key in enumerate(keys):
            pts = []
            for r in c.rows:
                step, v = int(r.get("step", 0)), r.get(key)
                xv = step if x == "step" else c.minutes.get(step)
                if isinstance(v, int | float) and xv is not None and math.isfinite(v):
                    pts.append((float(xv), float(v)))
            part = "all" if key == metric else key.split("/")[0]
            label = f"{c.label} · {part}" if len(curves) > 1 else part
            series.append(Series(label, pts, dash=DASHES[ci % len(DASHES)], color=color(ki)))
    return series


def learning_curves(curves: list[Curve], x: str) -> str:
    """The grid of learning curves against `x`, "step" or "minutes"."""
    figs = []
    for metric, ylabel, per_effort in CURVES:
        if not any(metric in r for c in curves for r in c.rows):
            continue
        series = _metric_series(curves, metric, per_effort, x)
        ylim = (0.0, 1.0) if metric in ("success", "clip_frac") else None
        xlabel = "training step" if x == "step" else "minutes since the run started"
        figs.append(chart(metric, xlabel, ylabel, series, ylim=ylim, x_integer=x == "step"))
    return "".join(figs)


def curves_section(rep: Report) -> str:
    if not rep.curves:
        return ""
    timed = any(c.minutes for c in rep.curves)
    toggle = (
        '<p class="toggle">x axis: <label><input type="radio" name="xaxis" value="step" checked> step</label> '
        '<label><input type="radio" name="xaxis" value="minutes"> minutes</label></p>'
        if timed
        else '<p class="note">No timings.jsonl: curves against step only.</p>'
    )
    grids = f'<div class="charts" data-x="step">{learning_curves(rep.curves, "step")}</div>'
    if timed:
        grids += f'<div class="charts" data-x="minutes" hidden>{learning_curves(rep.curves, "minutes")}</div>'
    return f'<section id="curves"><h2>Learning curves</h2>{toggle}{grids}</section>'


def calibration_block(name: str, data: dict[str, Any]) -> str:
    """One calibration: the ladder per effort (cost, success per rung), the frontier, and λ per effort."""
    ladders = data.get("ladders") or {
        e: [[None, c, s] for c, s in pts] for e, pts in (data.get("points") or {}).items()
    }
    series = []
    for i, (effort, rungs) in enumerate(sorted(ladders.items(), key=lambda kv: _effort_key(kv[0]))):
        rungs = sorted(rungs, key=lambda r: r[1])
        series.append(
            Series(
                effort,
                [(float(c), float(s)) for _, c, s in rungs],
                names=[f"×{f:g}" if f is not None else "" for f, _, _ in rungs],
                color=color(i),
                dash="4 3",
            )
        )
    if data.get("hull"):
        series.append(Series("frontier", [tuple(p) for p in data["hull"]], color="#000000", size=2))
    fig = chart(
        f"Calibration ladder: {name}",
        "mean cost per attempt ($)",
        "success rate",
        series,
        ylim=(0.0, 1.0),
        note=data.get("note")
        or "Each rung scales the effort level's turn and token budgets (×0.5, ×1, ×2); "
        "×1 is the level's operating point.",
    )
    rows = []
    for effort in sorted(data.get("lambdas", {}), key=_effort_key):
        rungs = sorted(ladders.get(effort, []), key=lambda r: r[0] if r[0] is not None else r[1])
        cells = "".join(
            f"<td>{'' if f is None else f'×{f:g}: '}${c:.5f}, {_pct(s)}</td>" for f, c, s in rungs
        )
        rows.append(
            f"<tr><td>{escape(effort)}</td><td><b>{data['lambdas'][effort]:.4g}</b></td>"
            f"<td>{escape(str(data.get('position', {}).get(effort, '')))}</td>{cells}</tr>"
        )
    table = (
        '<table class="summary"><tr><th>effort</th><th>λ chosen</th><th>operating point</th>'
        f'<th colspan="3">rungs: cost, success</th></tr>{"".join(rows)}</table>'
    )
    return f'<div class="calibration">{fig}<div>{table}</div></div>'


def calibration_section(rep: Report) -> str:
    if not rep.calibrations:
        return ""
    blocks = "".join(calibration_block(n, d) for n, d in rep.calibrations)
    intro = (
        '<p class="note">λ, the price of a dollar in the reward S − λ·C, is the slope of the base policy\'s '
        "cost/success frontier at each effort level's operating point (0 where the frontier is flat).</p>"
    )
    return f'<section id="calibration"><h2>Calibration</h2>{intro}{blocks}</section>'


def _finite(obj: Any) -> Any:
    """`obj` with NaN and infinities as None: JSON has no such numbers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def embed_json(obj: Any) -> str:
    """JSON safe inside a `<script>` element: no `</script>`, `<!--` or entity can end or bend it."""
    text = json.dumps(_finite(obj), separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(ch, esc)
    return text


def attempts_section(rep: Report) -> str:
    if not rep.attempts:
        return ""
    return (
        '<section id="attempts"><h2>Attempts</h2>'
        '<p class="note">Click a header to sort, type to filter, click a row to read the attempt.</p>'
        '<p><input id="filter" type="search" placeholder="filter: task, effort, ending, …" size="40"> '
        '<span id="count"></span></p>'
        '<div class="tablewrap"><table id="table"><thead></thead><tbody></tbody></table></div>'
        '<div id="trajectory"><p class="note">No attempt selected.</p></div>'
        f'<script type="application/json" id="attempts-data">{embed_json(rep.attempts)}</script>'
        "</section>"
    )


def asset(name: str) -> str:
    return resources.files("flywheel.eval").joinpath(name).read_text()


def runs_list(rep: Report) -> str:
    items = []
    for run in rep.runs:
        found = "".join(f"<li>{escape(line)}</li>" for line in run["found"])
        items.append(f"<li><code>{escape(run['path'])}</code><ul>{found}</ul></li>")
    return f'<ul class="runs">{"".join(items)}</ul>'


def render(rep: Report) -> str:
    """The whole page: a pure function of `rep`."""
    headline = ""
    if rep.points:
        headline = (
            '<section id="score"><h2>Success against cost</h2><div class="calibration">'
            f"{score_cost_chart(rep)}<div>{summary_table(rep)}</div></div></section>"
        )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(rep.title)}</title><style>{asset('report.css')}</style></head><body>"
        f"<header><h1>{escape(rep.title)}</h1>{runs_list(rep)}</header>"
        f"{headline}{curves_section(rep)}{calibration_section(rep)}{attempts_section(rep)}"
        f"<script>{asset('report.js')}</script></body></html>"
    )


def write_report(paths: list[Path], out: Path, title: str = "") -> Path:
    """Read the run directories and write the page to `out` (its folder is created)."""
    html = render(collect([Path(p) for p in paths], title))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html)
    tmp.replace(out)
    return out
