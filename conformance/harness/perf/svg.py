"""A few hundred lines of SVG instead of a plotting dependency: log-log line charts and dot charts.

The charts go into a self-contained HTML certificate, so they must be plain SVG text with no
external reference (no fonts, scripts or stylesheets to fetch), and the suite must not depend on a
plotting library for them. Two kinds are needed: latency and memory against S (log-log lines,
several series, some dashed) and error / allowance per clause (grouped horizontal bars on a log
axis). Every chart carries a title, labelled axes with decade ticks, and a legend.

Slightly over the usual length because it is one job, drawing the two chart kinds from the same
scales, ticks and legend helpers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    color: str = PALETTE[0]
    dash: str | None = None  # an SVG stroke-dasharray, e.g. "6 4"
    width: float = 2.0
    markers: bool = True


@dataclass
class Panel:
    title: str
    series: list[Series] = field(default_factory=list)
    note: str = ""


def _decades(lo: float, hi: float) -> list[float]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0**e for e in range(a, b + 1)]


def _clip(v: float, lo: float, hi: float) -> float:
    """``v`` within [lo, hi]; NaN as ``hi`` (a NaN error is as far off as the chart can show)."""
    return hi if math.isnan(v) else min(max(v, lo), hi)


def _binary_ticks(lo: float, hi: float) -> list[float]:
    """Powers of two (bytes), every 2nd, 4th ... one so that at most about eight are drawn."""
    a, b = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    step = max(1, math.ceil((b - a) / 8))
    return [2.0**e for e in range(a - a % step, b + 1, step)]


def _powers_of_two(lo: float, hi: float) -> list[float]:
    a, b = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    return [2.0**e for e in range(a, b + 1)]


def _fmt(v: float, unit: str = "") -> str:
    if unit == "s":
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
            if v >= scale:
                return f"{v / scale:g} {name}"
        return f"{v:g} s"
    if unit == "B":
        for scale, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if v >= scale:
                return f"{v / scale:.3g} {name}"
        return f"{v:g} B"
    if v >= 1024 and math.log2(v).is_integer():
        return f"{int(v) // 1024}K" if v < 2**20 else f"{int(v) // 2**20}M"
    return f"{v:g}"


def _log_span(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return 1.0, 10.0
    lo, hi = min(vals), max(vals)
    if lo == hi:
        lo, hi = lo / 2, hi * 2
    return lo / 1.3, hi * 1.3


def _panel_svg(panel: Panel, x0: float, y0: float, w: float, h: float, xunit: str, yunit: str, xlabel: str) -> str:
    """One log-log panel at (x0, y0), size w x h, as SVG elements."""
    left, right, top, bottom = 70, 10, 28, 46
    pw, ph = w - left - right, h - top - bottom
    xs = [x for s in panel.series for x, _ in s.points]
    ys = [y for s in panel.series for _, y in s.points]
    xlo, xhi = _log_span(xs)
    ylo, yhi = _log_span(ys)

    def px(x: float) -> float:
        return x0 + left + (math.log(x) - math.log(xlo)) / (math.log(xhi) - math.log(xlo)) * pw

    def py(y: float) -> float:
        return y0 + top + ph - (math.log(y) - math.log(ylo)) / (math.log(yhi) - math.log(ylo)) * ph

    out = [
        f"<text x='{x0 + left + pw / 2:.1f}' y='{y0 + 18}' text-anchor='middle' font-size='14' "
        f"font-weight='bold' {FONT}>{escape(panel.title)}</text>",
        f"<rect x='{x0 + left}' y='{y0 + top}' width='{pw:.1f}' height='{ph:.1f}' fill='#fcfcfc' stroke='#999'/>",
    ]
    for t in _powers_of_two(xlo, xhi) if xunit == "" else _decades(xlo, xhi):
        if xlo <= t <= xhi:
            X = px(t)
            out.append(f"<line x1='{X:.1f}' y1='{y0 + top}' x2='{X:.1f}' y2='{y0 + top + ph:.1f}' stroke='#e4e4e4'/>")
            out.append(
                f"<text x='{X:.1f}' y='{y0 + top + ph + 14:.1f}' text-anchor='middle' font-size='10' {FONT}>"
                f"{escape(_fmt(t, xunit))}</text>"
            )
    # The y ticks: the x loop above on the other axis (the same shape; one helper for both would take
    # the axis, its scale, its ticks and two label placements, more to read than the two loops).
    for t in _binary_ticks(ylo, yhi) if yunit == "B" else _decades(ylo, yhi):
        if ylo <= t <= yhi:
            Y = py(t)
            out.append(f"<line x1='{x0 + left}' y1='{Y:.1f}' x2='{x0 + left + pw:.1f}' y2='{Y:.1f}' stroke='#e4e4e4'/>")
            out.append(
                f"<text x='{x0 + left - 4}' y='{Y + 3:.1f}' text-anchor='end' font-size='10' {FONT}>"
                f"{escape(_fmt(t, yunit))}</text>"
            )
    out.append(
        f"<text x='{x0 + left + pw / 2:.1f}' y='{y0 + h - 8:.1f}' text-anchor='middle' font-size='11' {FONT}>"
        f"{escape(xlabel)}</text>"
    )
    for s in panel.series:
        pts = [(x, y) for x, y in s.points if x and y and x > 0 and y > 0]
        if not pts:
            continue
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = f" stroke-dasharray='{s.dash}'" if s.dash else ""
        out.append(f"<polyline points='{path}' fill='none' stroke='{s.color}' stroke-width='{s.width}'{dash}/>")
        if s.markers:
            for x, y in pts:
                out.append(f"<circle cx='{px(x):.1f}' cy='{py(y):.1f}' r='2.6' fill='{s.color}'/>")
    if panel.note:
        out.append(
            f"<text x='{x0 + left + 4}' y='{y0 + top + 12}' font-size='10' fill='#555' {FONT}>"
            f"{escape(panel.note)}</text>"
        )
    return "\n".join(out)


def _legend(series: list[Series], x0: float, y0: float, width: float) -> tuple[str, float]:
    """Legend entries in rows across ``width``; returns (svg, height used)."""
    out, x, y, row_h = [], x0, y0, 16
    for s in series:
        text_w = 7 * len(s.label) + 34
        if x + text_w > x0 + width and x > x0:
            x, y = x0, y + row_h
        dash = f" stroke-dasharray='{s.dash}'" if s.dash else ""
        out.append(
            f"<line x1='{x:.1f}' y1='{y - 4}' x2='{x + 22:.1f}' y2='{y - 4}' stroke='{s.color}' "
            f"stroke-width='{s.width}'{dash}/>"
        )
        out.append(f"<text x='{x + 27:.1f}' y='{y}' font-size='11' {FONT}>{escape(s.label)}</text>")
        x += text_w
    return "\n".join(out), (y - y0) + row_h + 4


def line_chart(
    title: str, panels: list[Panel], *, xlabel: str, yunit: str, xunit: str = "", panel_w: int = 430, panel_h: int = 300
) -> str:
    """Panels side by side (log-log), one shared legend below them; returns an SVG document."""
    width = max(1, len(panels)) * panel_w
    legend_items: dict[tuple, Series] = {}
    for p in panels:
        for s in p.series:
            legend_items.setdefault((s.label, s.color, s.dash), s)
    legend, lh = _legend(list(legend_items.values()), 12, panel_h + 50, width - 24)
    height = panel_h + 50 + lh
    body = [
        f"<text x='{width / 2:.1f}' y='22' text-anchor='middle' font-size='16' font-weight='bold' {FONT}>"
        f"{escape(title)}</text>"
    ]
    for i, p in enumerate(panels):
        body.append(_panel_svg(p, i * panel_w, 30, panel_w, panel_h, xunit, yunit, xlabel))
    body.append(legend)
    return _document(width, height, "\n".join(body))


def dot_chart(
    title: str,
    groups: list[tuple[str, list[tuple[str, float | None]]]],
    *,
    colors: dict[str, str],
    xlabel: str,
    reference: float | None = 1.0,
    floor: float = 1e-4,
    ceiling: float = 1e12,
    width: int = 860,
) -> str:
    """One row per label, one dot per (key, value) on a log axis, a thin line from the row's least to
    its largest value; ``reference`` draws a vertical line (1.0: where the error reaches the
    allowance). Values under ``floor`` (exact zeros included) sit on the axis's left edge, marked
    as a hollow dot: the chart is about the margin, and below ``floor`` the margin is ample. Values
    above ``ceiling``, inf and NaN (a failing kernel's error against a zero allowance) sit on the
    right edge; each dot's tooltip keeps the value itself."""
    row_h, left, right, top = 13, 200, 20, 40
    plot_h = max(1, len(groups)) * row_h + 6
    values = [_clip(v, floor, ceiling) for _, dots in groups for _, v in dots if v is not None]
    lo = floor
    hi = max(values + [reference or 1.0]) * 1.5
    pw = width - left - right

    def px(v: float) -> float:
        return left + (math.log(_clip(v, lo, ceiling)) - math.log(lo)) / (math.log(hi) - math.log(lo)) * pw

    body = [
        f"<text x='{width / 2:.1f}' y='22' text-anchor='middle' font-size='16' font-weight='bold' {FONT}>"
        f"{escape(title)}</text>",
        f"<rect x='{left}' y='{top}' width='{pw}' height='{plot_h}' fill='#fcfcfc' stroke='#999'/>",
    ]
    for t in _decades(lo, hi):
        if lo <= t <= hi:
            X = px(t)
            body.append(f"<line x1='{X:.1f}' y1='{top}' x2='{X:.1f}' y2='{top + plot_h}' stroke='#e4e4e4'/>")
            label = f"{t:g}" if t > lo else f"<= {t:g}"
            body.append(
                f"<text x='{X:.1f}' y='{top + plot_h + 14}' text-anchor='middle' font-size='10' {FONT}>"
                f"{escape(label)}</text>"
            )
    for i, (label, dots) in enumerate(groups):
        y = top + 3 + i * row_h + row_h / 2
        if i % 2:
            body.append(f"<rect x='{left}' y='{y - row_h / 2:.1f}' width='{pw}' height='{row_h}' fill='#f1f1f1'/>")
        body.append(
            f"<text x='{left - 6}' y='{y + 3.5:.1f}' text-anchor='end' font-size='10' {FONT}>{escape(label)}</text>"
        )
        xs = [px(v) for _, v in dots if v is not None]
        if len(xs) > 1:
            body.append(f"<line x1='{min(xs):.1f}' y1='{y:.1f}' x2='{max(xs):.1f}' y2='{y:.1f}' stroke='#bbb'/>")
        for key, v in dots:
            if v is None:
                continue
            c = colors.get(key, PALETTE[-1])
            fill = c if v >= floor else "white"
            body.append(
                f"<circle cx='{px(v):.1f}' cy='{y:.1f}' r='3.6' fill='{fill}' stroke='{c}' stroke-width='1.4'>"
                f"<title>{escape(f'{label} {key}: {v:.3g}')}</title></circle>"
            )
    if reference:
        X = px(reference)
        body.append(
            f"<line x1='{X:.1f}' y1='{top - 4}' x2='{X:.1f}' y2='{top + plot_h + 4}' stroke='#000' "
            "stroke-width='1.5' stroke-dasharray='5 3'/>"
        )
    body.append(
        f"<text x='{left + pw / 2:.1f}' y='{top + plot_h + 32}' text-anchor='middle' font-size='11' {FONT}>"
        f"{escape(xlabel)}</text>"
    )
    legend, lh = _legend([Series(k, [], color=c, width=8) for k, c in colors.items()], left, top + plot_h + 54, pw)
    body.append(legend)
    return _document(width, top + plot_h + 54 + lh, "\n".join(body))


def _document(width: float, height: float, body: str) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}'>\n<rect width='100%' height='100%' fill='white'/>\n{body}\n</svg>\n"
    )
