"""A failing case as a small self-contained SVG: expected, received and |error| / allowed side by side,
the keys the case blocks marked (harness.causes.picture records the numbers).

Why a picture: a causal mask aligned at the other corner, a mask read along the wrong axis or with
its sense inverted, a padded key left visible: each is a shape in the weights, seen at once beside
the expected weights. Self-contained as every chart of the suite: plain SVG text, no script, font,
image or URL (the namespace declaration aside, which ``html_parts.inline_svg`` drops inside a page);
every text escaped. Small: the colours are a few levels, and the cells of one level are drawn as one
path, a run of equal cells in a row as one rectangle.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from conformance.harness.perf.svg import FONT

# ColorBrewer's Blues (values >= 0) and RdBu (values of both signs), and the error ratio's scale:
# greens within the allowance, reds past it by decades.
BLUES = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")
RDBU = ("#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b")
WITHIN = ("#e5f5e0", "#a1d99b", "#41ab5d")  # ratio <= 0.01, <= 0.1, <= 1
BEYOND = ("#fcbba1", "#fb6a4a", "#ef3b2c", "#cb181d", "#a50f15", "#67000d")  # <= 10, 100, 1e3, 1e4, 1e5, more
NAN, INF, BLOCKED = "#e7298a", "#000000", "#525252"
WHITE = "#ffffff"


def _value(v: Any) -> float:
    """A recorded number ('nan', 'inf' and '-inf' are strings in JSON)."""
    return float(v)


def _value_colour(lo: float, hi: float):
    """value -> colour: Blues from 0 (or the least value) up, RdBu around 0 when values of both signs meet."""
    span = max(abs(lo), abs(hi)) or 1.0

    def colour(v: float) -> str:
        if math.isnan(v):
            return NAN
        if math.isinf(v):
            return INF
        if lo < 0:
            return RDBU[min(int((v / span + 1) / 2 * len(RDBU)), len(RDBU) - 1)]
        base = min(lo, 0.0)
        return BLUES[min(int((v - base) / ((hi - base) or 1.0) * len(BLUES)), len(BLUES) - 1)]

    return colour


def _ratio_colour(r: float) -> str:
    if math.isnan(r) or math.isinf(r):
        return BEYOND[-1]
    if r == 0:
        return WHITE
    if r <= 1:
        return WITHIN[0 if r <= 0.01 else 1 if r <= 0.1 else 2]
    return BEYOND[min(max(math.ceil(math.log10(r)), 1), len(BEYOND)) - 1]


def _cells(grid: list[list[str]], x0: int, y0: int, c: int) -> list[str]:
    """One path per colour; a run of equal colours in a row is one rectangle (white is the background)."""
    runs: dict[str, list[str]] = {}
    for i, row in enumerate(grid):
        j = 0
        while j < len(row):
            k = j
            while k + 1 < len(row) and row[k + 1] == row[j]:
                k += 1
            if row[j] != WHITE:
                w = (k - j + 1) * c
                runs.setdefault(row[j], []).append(f"M{x0 + j * c} {y0 + i * c}h{w}v{c}h{-w}z")
            j = k + 1
    return [f"<path fill='{col}' d='{''.join(d)}'/>" for col, d in runs.items()]


def _marks(blocked: list[list[int]] | None, x0: int, y0: int, c: int) -> list[str]:
    """A diagonal stroke across every blocked cell."""
    if not blocked:
        return []
    d = "".join(
        f"M{x0 + j * c} {y0 + (i + 1) * c}l{c} {-c}" for i, row in enumerate(blocked) for j, b in enumerate(row) if b
    )
    return [f"<path d='{d}' stroke='{BLOCKED}' stroke-width='1' fill='none'/>"] if d else []


def _text(x: float, y: float, s: str, size: int = 11, anchor: str = "start", weight: str = "normal") -> str:
    return (
        f"<text x='{x:.0f}' y='{y:.0f}' font-size='{size}' text-anchor='{anchor}' font-weight='{weight}' {FONT}>"
        f"{escape(s)}</text>"
    )


def _axes(what: str) -> tuple[str, str]:
    """(row axis, column axis) of the compared array."""
    if "weights" in what:
        return "t (query)", "s (key)"
    if what in ("dk", "dv"):
        return "s (key)", "d"
    return "t (query)", "d"


def _width(s: str, size: int) -> float:
    """About how wide ``s`` is drawn at ``size`` px (DejaVu Sans averages 0.6 em a character)."""
    return len(s) * size * 0.6


def render(picture: dict, title: str = "") -> str:
    """The SVG document for one :func:`harness.causes.picture.record` (with its ``dtype``)."""
    exp = [[_value(v) for v in row] for row in picture["expected"]]
    got = [[_value(v) for v in row] for row in picture["received"]]
    ratio = [[_value(v) for v in row] for row in picture["ratio"]]
    rows, cols = len(exp), len(exp[0]) if exp else 0
    finite = [v for grid in (exp, got) for row in grid for v in row if math.isfinite(v)] or [0.0]
    lo, hi = min(finite), max(finite)
    colour = _value_colour(lo, hi)
    c = max(10, min(20, 240 // max(rows, cols, 1)))
    r0, c0 = picture["rows"][0], picture["cols"][0]
    row_axis, col_axis = _axes(picture["what"])
    panels = [
        ("expected (float64 oracle)", [[colour(v) for v in row] for row in exp], picture.get("blocked"), col_axis),
        ("received (the kernel)", [[colour(v) for v in row] for row in got], picture.get("blocked"), col_axis),
        ("|error| / allowed", [[_ratio_colour(v) for v in row] for row in ratio], picture.get("blocked"), col_axis),
    ]
    keys = picture.get("blocked_keys")
    if keys:
        grid = [[BLOCKED if b else WHITE for b in row] for row in keys]
        panels.append(("keys the case blocks", grid, None, "s (key)"))
    left, top, gap = 34, 62, 26
    body, x = [], left
    bottom = top + rows * c
    for name, grid, marks, axis in panels:
        n = len(grid[0]) if grid else 0
        w = n * c
        body.append(_text(x, top - 8, name, 11, weight="bold"))
        body.append(
            f"<rect x='{x - 0.5}' y='{top - 0.5}' width='{w + 1}' height='{rows * c + 1}' fill='white' stroke='#999'/>"
        )
        body += _cells(grid, x, top, c) + _marks(marks, x, top, c)
        body.append(_text(x, bottom + 12, f"{c0 if axis == col_axis else 0}", 9))
        if n > 1:
            body.append(_text(x + w, bottom + 12, f"{(c0 if axis == col_axis else 0) + n - 1}", 9, "end"))
        body.append(_text(x + w / 2, bottom + 24, axis, 9, "middle"))
        x += max(w, _width(name, 11)) + gap
    body.append(_text(left - 4, top + 9, f"{r0}", 9, "end"))
    if rows > 1:
        body.append(_text(left - 4, bottom, f"{r0 + rows - 1}", 9, "end"))
    mid = top + rows * c / 2
    body.append(
        f"<text x='12' y='{mid:.0f}' font-size='9' text-anchor='middle' {FONT} "
        f"transform='rotate(-90 12 {mid:.0f})'>{escape(row_axis)}</text>"
    )
    where = ", ".join(f"{n}={i}" for n, i in zip("bh", picture.get("slice") or []))
    head = title or picture["what"]
    sub = f"{picture['what']} [{where}] of shape {tuple(picture['shape'])}, {picture.get('dtype')}"
    lines = [
        f"values {lo:.3g} .. {hi:.3g}: "
        + ("blue below 0, red above" if lo < 0 else "white low, dark blue high")
        + "; magenta NaN, black inf",
        "|error| / allowed: white 0, green within the allowance, red past it (darker: 10x, 100x, ... 1e5x and more)",
    ]
    if picture.get("blocked") or keys:
        lines.append("grey diagonal (or dark cell): a key the case blocks, whose weight must be exactly 0")
    body.insert(0, _text(10, 18, head, 13, weight="bold"))
    body.insert(1, _text(10, 35, sub, 10))
    y = bottom + 42
    body += [_text(10, y + 12 * i, line, 9) for i, line in enumerate(lines)]
    width = max(x - gap + 10, *(_width(t, 9) + 20 for t in lines), _width(head, 13) + 20, _width(sub, 10) + 20)
    height = y + 12 * len(lines)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}'>\n<rect width='100%' height='100%' fill='white'/>\n"
        + "\n".join(body)
        + "\n</svg>\n"
    )
