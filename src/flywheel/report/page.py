"""The page: `render`, a pure function from a `Report` to one self-contained HTML document (its sections,
charts, styles, script and embedded attempts; what it guarantees is in `flywheel.report`), and
`write_report`, which collects and writes it.
"""

from __future__ import annotations

import json
import math
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from flywheel.report.collect import Curve, Report, collect, effort_key
from flywheel.report.svg import DASHES, Series, chart, color

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
        for effort in sorted((e for p, e in rep.points if p == policy), key=effort_key):
            s = rep.points[policy, effort]
            lo, hi = s.get("success_ci95", (0.0, 1.0))
            edit = s.get("median_steps_to_first_edit")
            rows.append(
                f"<tr><td>{escape(policy)}</td><td>{escape(effort)}</td><td>{s.get('n', '')}</td>"
                f"<td><b>{_pct(s['success_rate'])}</b> [{_pct(lo)}, {_pct(hi)}]</td>"
                f"<td>${_cost(s):.5f}</td><td>{s.get('mean_turns', 0):.1f}</td>"
                f"<td>{'-' if edit is None else f'{edit:g}'}</td><td>{s.get('infra_failures', 0)}</td></tr>"
            )
    return f'<table class="summary">{head}{"".join(rows)}</table>'


def _metric_series(curves: list[Curve], metric: str, per_effort: bool, x: str) -> list[Series]:
    series = []
    for ci, c in enumerate(curves):
        efforts = (
            {k.split("/")[0] for r in c.rows for k in r if k.endswith("/" + metric)} if per_effort else ()
        )
        keys = [metric] + [f"{e}/{metric}" for e in sorted(efforts, key=effort_key)]
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
    for i, (effort, rungs) in enumerate(sorted(ladders.items(), key=lambda kv: effort_key(kv[0]))):
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
    for effort in sorted(data.get("lambdas", {}), key=effort_key):
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
    return resources.files("flywheel.report").joinpath(name).read_text()


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
