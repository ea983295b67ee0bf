"""Charts as inline SVG, drawn in Python so that a report needs no plotting library and no network.

`chart` draws lines, points and error bars on linear axes, and returns an HTML `<figure>` holding the
SVG and its legend. Every piece of text is escaped: run names and task ids come from files on disk.
Points are `<circle class="pt">` elements, each with a `<title>` that a browser shows on hover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

DASHES = ("", "6 3", "2 2", "8 3 2 3")  # one per run compared, so that colour can mean the effort level
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
W, H = 440, 270
LEFT, RIGHT, TOP, BOTTOM = 70, 14, 12, 40


@dataclass
class Series:
    """One line of a chart: its points in drawing order, with optional intervals and point names."""

    label: str
    points: list[tuple[float, float]]
    err: list[tuple[float, float]] | None = None  # (low, high) of y for each point
    names: list[str] | None = None  # a short label written beside each point
    color: str = ""  # "" picks from the palette by position
    dash: str = ""  # an SVG stroke-dasharray ("5 3"); "" draws a solid line
    connect: bool = True  # draw the line through the points
    size: float = 3.5  # the points' radius


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About `n + 1` round values in [lo, hi], spaced by 1, 2, 2.5 or 5 times a power of ten (whole numbers
    only, when `integer`)."""
    mag = 10 ** math.floor(math.log10((hi - lo) / n))
    options = []
    for m in (10, 5, 2.5, 2, 1, 0.5):
        step = max(m * mag, 1.0) if integer else m * mag
        first = math.ceil(lo / step - 1e-9)
        options.append([k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)])
    return min(options, key=lambda ts: abs(len(ts) - n - 1))  # the first (widest) of the closest


def tick_label(v: float, step: float) -> str:
    """`v` with as many decimals as the tick spacing `step` needs."""
    d = max(0, -math.floor(math.log10(step) + 1e-9))
    if abs(round(step, d) - step) > step * 1e-6:
        d += 1
    return f"{v:.{d}f}"


def domain(values: list[float], fixed: tuple[float, float] | None = None) -> tuple[float, float]:
    """The axis range: `fixed` widened to the data, else the data padded by 5%; never empty."""
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if fixed:
        return min(fixed[0], lo), max(fixed[1], hi)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        d = abs(lo) * 0.1 or 1.0
        return lo - d, hi + d
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


def _fmt(v: float) -> str:
    return f"{v:.4g}"


class _Axes:
    """Data to pixel coordinates for one chart."""

    def __init__(self, x: tuple[float, float], y: tuple[float, float]) -> None:
        self.x, self.y = x, y

    def px(self, v: float) -> float:
        return LEFT + (v - self.x[0]) / (self.x[1] - self.x[0]) * (W - LEFT - RIGHT)

    def py(self, v: float) -> float:
        return H - BOTTOM - (v - self.y[0]) / (self.y[1] - self.y[0]) * (H - TOP - BOTTOM)


def _grid(a: _Axes, xlabel: str, ylabel: str, x_integer: bool) -> list[str]:
    out = []
    xt, yt = ticks(*a.x, integer=x_integer), ticks(*a.y, n=4)
    for v in xt:
        x = a.px(v)
        label = tick_label(v, xt[1] - xt[0] if len(xt) > 1 else 1.0)
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}"/>')
        out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">{label}</text>')
    for v in yt:
        y = a.py(v)
        label = tick_label(v, yt[1] - yt[0] if len(yt) > 1 else 1.0)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
        out.append(f'<text x="{LEFT - 5}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(
        f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}"/>'
    )
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">{escape(xlabel)}</text>')
    mid = (TOP + H - BOTTOM) / 2
    out.append(
        f'<text x="12" y="{mid}" text-anchor="middle" transform="rotate(-90 12 {mid})">{escape(ylabel)}</text>'
    )
    return out


def _series(a: _Axes, s: Series, c: str, lift: int = 0) -> list[str]:
    out = []
    pts = [(a.px(x), a.py(y)) for x, y in s.points]
    if s.connect and len(pts) > 1:
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(f'<polyline class="line" points="{coords}" stroke="{c}"{dash}/>')
    for i, ((x, y), (vx, vy)) in enumerate(zip(pts, s.points, strict=True)):
        tip = f"{s.label}: x={_fmt(vx)}, y={_fmt(vy)}"
        if s.err:
            lo, hi = s.err[i]
            y0, y1 = a.py(lo), a.py(hi)
            out.append(f'<path class="err" d="M{x:.1f},{y0:.1f}V{y1:.1f}M{x - 4:.1f},{y0:.1f}h8M{x - 4:.1f},{y1:.1f}h8" stroke="{c}"/>')  # fmt: skip
            tip += f" [{_fmt(lo)}, {_fmt(hi)}]"
        if s.names:
            tip = f"{s.names[i]} · {tip}"
            ty = y - 6 - 11 * lift  # each series' names one line above the last one's, so they do not overlap
            ty = ty if ty > TOP + 10 else y + 14 + 11 * lift  # below the point at the top of the frame
            out.append(
                f'<text class="name" x="{x + 6:.1f}" y="{ty:.1f}" fill="{c}">{escape(s.names[i])}</text>'
            )
        if s.size > 0 and (len(pts) <= 60 or not s.connect):
            out.append(
                f'<circle class="pt" cx="{x:.1f}" cy="{y:.1f}" r="{s.size}" fill="{c}"><title>{escape(tip)}</title></circle>'
            )
    return out


def chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: list[Series],
    *,
    ylim: tuple[float, float] | None = None,
    x_integer: bool = False,
    note: str = "",
) -> str:
    """A `<figure>`: the title, the SVG, a legend of the series and an optional note under it."""
    series = [s for s in series if s.points]
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points] + [v for s in series for e in s.err or [] for v in e]
    a = _Axes(domain(xs), domain(ys, ylim))
    body = _grid(a, xlabel, ylabel, x_integer)
    legend = []
    for i, s in enumerate(series):
        c = s.color or color(i)
        body += _series(a, s, c, lift=sum(bool(t.names) for t in series[:i]))
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        swatch = f'<svg width="20" height="6"><line x1="0" y1="3" x2="20" y2="3" stroke="{c}"{dash}/></svg>'
        legend.append(f"<span>{swatch}{escape(s.label)}</span>")
    if not series:
        body.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text>')
    svg = (
        f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(title)}">{"".join(body)}</svg>'
    )
    caption = f'<p class="note">{escape(note)}</p>' if note else ""
    return (
        f"<figure><figcaption>{escape(title)}</figcaption>{svg}"
        f'<div class="legend">{"".join(legend)}</div>{caption}</figure>'
    )
