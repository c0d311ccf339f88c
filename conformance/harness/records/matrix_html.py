"""The conformance matrix (harness.records.matrix_build) as one self-contained HTML page: ``matrix.html``.

The verdicts and likely causes per adapter on top, then one table: a row per clause grouped under
its spec section (the quoted sentence on hover and on expanding the clause), a column per adapter
with its library versions, and in every cell the outcome, which expands to the reason, the
kernel's message and the command that reruns the row on that adapter. Self-contained as every page
of the suite (harness.records.html_parts): inline style, no script, nothing fetched. Every string that
comes from a certificate or a kernel goes through ``html_parts.esc``.
"""

from __future__ import annotations

from conformance.harness.records import heatmap_svg
from conformance.harness.records.html_parts import esc, inline_svg, page
from conformance.harness.records.matrix_build import Cell, Column, Matrix, Row

STYLE = """
body { max-width: none; margin: 18px 24px; }
table.matrix { font-size: 12px; } table.matrix td { max-width: 260px; } table.matrix th { font-size: 11.5px; }
table.matrix thead th { position: sticky; top: 0; z-index: 1; }
tr.section th { background: #e8eef7; text-align: left; font-size: 13px; padding-top: 7px; }
table.matrix td.clause { font-size: 11.5px; max-width: none; } td.clause > details { width: 290px; }
table.matrix td, table.matrix th { padding: 2px 4px; } td.clause b { font-family: monospace; }
.xfail { background: #fff0d9; } .badge.xfail { background: #b06000; }
details > summary { cursor: pointer; } details p, details pre, details code { font-size: 11px; }
details pre { max-height: 220px; overflow: auto; margin: 4px 0; }
td code.cmd { display: block; white-space: pre-wrap; word-break: break-all; background: #f7f7f7; padding: 2px; }
blockquote { margin: 4px 0 4px 8px; color: #444; }
.libs { font-weight: normal; font-size: 11px; color: #555; }
ul.causes { list-style: none; padding-left: 2px; margin: 0; } ul.causes li { margin-bottom: 4px; }
div.pic { overflow-x: auto; max-width: 252px; } details[open] div.pic { max-width: none; width: max-content; }
"""


def verdict_class(word: str) -> str:
    """The badge colour of a verdict word, known or new (words are added as the suite grows)."""
    if word.startswith("CONFORMS"):
        return "ok"
    if "EXPECTED" in word:
        return "xfail"
    if word.startswith(("DOES NOT", "DEVIATES")):
        return "bad"
    return "nr" if word == "NOT RUN" else "warn"


def badge(word: str) -> str:
    return f"<span class='badge {verdict_class(word)}'>{esc(word)}</span>"


def libraries(col: Column) -> str:
    return ", ".join(f"{k} {v}" for k, v in col.libraries.items())


def _verdicts(matrix: Matrix) -> str:
    rows = ["<table><tr><th>adapter</th><th>library</th><th>device</th><th>verdict</th><th>likely causes</th></tr>"]
    for col in matrix.columns:
        notes = "".join(f"<br><span class='muted' title='{esc(long)}'>{esc(short)}</span>" for short, long in col.notes)
        causes = "".join(f"<li>{esc(c)}</li>" for c in col.likely_causes)
        causes = f"<ul class='causes'>{causes}</ul>" if causes else "-"
        rows.append(
            f"<tr><td><b>{esc(col.label)}</b></td><td>{esc(libraries(col))}</td><td>{esc(col.device)}</td>"
            f"<td>{badge(col.verdict)} {esc(col.summary)}{notes}</td>"
            f"<td>{causes}</td></tr>"
        )
    rows.append("</table>")
    if matrix.unavailable:
        items = "".join(f"<li><b>{esc(spec)}</b>: {esc(why)}</li>" for spec, why in matrix.unavailable)
        rows.append(f"<p class='muted'>Unavailable here (no column):</p><ul class='muted'>{items}</ul>")
    return "\n".join(rows)


def cell_html(cell: Cell) -> str:
    inner = [f"<p>{esc(cell.reason)}</p>"] if cell.reason else []
    shown = cell.word + (f": {cell.brief}" if cell.brief and cell.kind in ("bad", "xfail") else "")
    if cell.message:
        inner.append(f"<pre>{esc(cell.message)}</pre>")
    if cell.picture:  # the first failing case, drawn; wide, so it scrolls inside the cell
        svg = heatmap_svg.render(cell.picture, f"first failing case [{cell.picture.get('dtype')}]")
        inner.append(f"<div class='pic'>{inline_svg(svg)}</div>")
    if cell.command:
        inner.append(f"<code class='cmd'>{esc(cell.command)}</code>")
    return (
        f"<td class='{cell.kind}' title='{esc(cell.reason)}'><details><summary>{esc(shown)}</summary>"
        + "".join(inner)
        + "</details></td>"
    )


def row_html(row: Row) -> str:
    head = (
        f"<td class='clause' title='{esc(row.citation)}'><details><summary><b>{esc(row.clause)}</b> "
        f"{esc(row.title)}</summary><blockquote>\u201c{esc(row.sentence)}\u201d</blockquote>"
        + (f"<code>{esc(row.test)}</code>" if row.test else "")
        + "</details></td>"
    )
    return "<tr>" + head + "".join(cell_html(c) for c in row.cells) + "</tr>"


def render(matrix: Matrix, command_line: str = "") -> str:
    """The whole page."""
    parts = ["<h1>SDPA conformance matrix</h1>"]
    if command_line:
        parts.append(f"<p class='muted'>Written by <code>{esc(command_line)}</code>.</p>")
    parts.append(_verdicts(matrix))
    parts.append(
        "<p class='muted'>A row per clause (an executable sentence of the spec) under the section of the seed "
        "it enforces; hover or expand a clause for its sentence. A column per adapter. <b>pass</b>: passed in "
        "every dtype it applies to; <b>fail</b>: failed (dtypes in the cell); <b>expected failure</b>: failed "
        "as a known cause of the adapter's expectations file explains (the column's notes name the causes; a stale one "
        "fails the verdict); "
        "<b>n/a</b>: the declaration rules the clause out; <b>not run</b>: no result in this run. Expand a cell "
        "for its reason and the command that reruns the row on that adapter.</p>"
    )
    width = len(matrix.columns) + 1
    head = "".join(
        f"<th>{esc(c.label)}<br><span class='libs'>{esc(libraries(c))}</span><br>{badge(c.verdict)}</th>"
        for c in matrix.columns
    )
    body = [f"<table class='matrix'><thead><tr><th>clause</th>{head}</tr></thead><tbody>"]
    for section in matrix.sections:
        body.append(f"<tr class='section'><th colspan='{width}'>{esc(section.heading)}</th></tr>")
        body += [row_html(r) for r in section.rows]
    body.append("</tbody></table>")
    parts.append("\n".join(body))
    return page("SDPA conformance matrix: " + ", ".join(c.label for c in matrix.columns), "\n".join(parts), STYLE)
