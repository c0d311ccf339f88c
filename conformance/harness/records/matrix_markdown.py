"""The conformance matrix (harness.records.matrix_build) in Markdown: ``matrix.md``.

Verdicts and likely causes first, then one table per spec section (a row per clause, a column per
adapter) with the quoted sentences under it, then every failing or expected-failing cell with its
reason, the kernel's message and the command that reruns it. Text from a kernel or a certificate is
escaped: outside code it is HTML-escaped (a renderer that passes HTML through shows ``<script>`` as
text) and, in a table, its pipes and newlines cannot end a cell or a row; in code it sits in a span
or fence longer than any backtick run it contains.
"""

from __future__ import annotations

import re
from html import escape

from conformance.harness.records.certificate_markdown import outcome_cell
from conformance.harness.records.matrix_build import Cell, Column, Matrix, Row

REASON_CHARS = 90  # a table cell's reason is cut here; the Deviations section has it whole


def text(s: object, limit: int | None = None) -> str:
    """``s`` as Markdown text safe in a table cell: escaped HTML, no pipe or newline that ends the cell."""
    t = " ".join(str(s).split())
    if limit is not None and len(t) > limit:
        t = t[: limit - 1] + "\u2026"
    t = escape(t, quote=False)
    for ch in "\\`*_[]|":  # the backslash first: each later escape adds one
        t = t.replace(ch, "\\" + ch)
    return t


def code(s: object, in_table: bool = False) -> str:
    """``s`` as a code span: fenced by more backticks than it contains; in a table its pipes escaped."""
    t = " ".join(str(s).split())
    if in_table:
        t = t.replace("|", "\\|")
    fence = "`" * (max((len(m) for m in re.findall(r"`+", t)), default=0) + 1)
    pad = " " if t.startswith("`") or t.endswith("`") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def fenced(s: object) -> str:
    """``s`` as a fenced block, the fence longer than any backtick run in it."""
    t = str(s).rstrip()
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", t)), default=0) + 1)
    return f"{fence}text\n{t}\n{fence}"


PICTURES = "failing-cases"  # the folder beside matrix.md that holds the failing cases' SVGs


def picture_path(col: Column, row: Row) -> str:
    """Where the failing case of ``row`` on ``col`` is drawn, relative to matrix.md (a safe file name)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{col.label}--{row.clause}")
    return f"{PICTURES}/{name}.svg"


def pictures(matrix: Matrix) -> dict[str, str]:
    """Relative path -> SVG document, for every failing cell that carries its case's picture."""
    from conformance.harness.records import heatmap_svg

    out = {}
    for row in matrix.rows:
        for col, cell in zip(matrix.columns, row.cells, strict=True):
            if cell.picture and cell.kind in ("bad", "xfail"):
                title = f"{row.clause} [{cell.picture.get('dtype')}] on {col.label}: {cell.word}"
                out[picture_path(col, row)] = heatmap_svg.render(cell.picture, title)
    return out


def libraries(col: Column) -> str:
    return ", ".join(f"{k} {v}" for k, v in col.libraries.items()) or "-"


def cell_text(cell: Cell) -> str:
    """A table cell: the outcome as the certificate's Markdown writes it, and a short reason."""
    shown = outcome_cell(cell.outcome) if cell.word != "-" else "-"
    return f"{shown} ({text(cell.brief, REASON_CHARS)})" if cell.brief and cell.word != "-" else shown


def render(matrix: Matrix, command_line: str = "") -> str:
    out = ["# SDPA conformance matrix\n"]
    if command_line:
        out.append(f"Written by {code(command_line)}.\n")
    out.append(
        "One row per clause (an executable sentence of the spec), grouped by the section of the seed it "
        "enforces; one column per adapter. **pass**: passed in every dtype it applies to; **FAIL** (dtypes); "
        "**expected failure**: failed as a known cause of the adapter's expectations file explains (the "
        "verdict lines name the causes; a stale cause fails the verdict); **n/a**: the adapter's declaration "
        "rules the clause out (reason given); **not run**: no result in this run. Every cell is rerun by the "
        "command under *Reproduce* with the row's clause test.\n"
    )
    out.append("## Verdicts\n")
    out.append("| adapter | library | device | verdict | coverage | likely causes |\n|---|---|---|---|---|---|")
    for col in matrix.columns:
        causes = "<br>".join(text(c, 400) for c in col.likely_causes[:3]) or "-"
        notes = "".join(f"<br>{text(short)}" for short, _ in col.notes)
        out.append(
            f"| {text(col.label)} | {text(libraries(col))} | {text(col.device)} | **{text(col.verdict)}**{notes} | "
            f"{text(col.summary)} | {causes} |"
        )
    deviations = [(col, whole) for col in matrix.columns for short, whole in col.notes if short != whole]
    if deviations:
        out.append("")
        out += [f"- {text(col.label)}: {text(whole)}" for col, whole in deviations]
    if matrix.unavailable:
        out.append(
            "\nUnavailable here (no column): "
            + "; ".join(f"{text(spec)} ({text(why, 160)})" for spec, why in matrix.unavailable)
        )
    out.append("\n## Reproduce\n")
    placeholder = "<clause test>"
    out.append(
        f"A cell reruns with its column's command, {code(placeholder)} being the test under the row's clause id "
        "(the Deviations section below and every cell of matrix.html print the whole command):\n"
    )
    for col in matrix.columns:
        cmd = " ".join(["pytest", placeholder, f"--impl={col.spec}", *col.options])
        out.append(f"- {text(col.label)}: {code(cmd)}")
    for section in matrix.sections:
        out.append(f"\n## {text(section.heading)}\n")
        head = "| clause | " + " | ".join(text(c.label) for c in matrix.columns) + " |"
        out += [head, "|---|" + "---|" * len(matrix.columns)]
        for row in section.rows:
            test = f"<br>{code(row.test, in_table=True)}" if row.test else ""
            first = f"**{text(row.clause)}** {text(row.title)}{test}"
            out.append(f"| {first} | " + " | ".join(cell_text(c) for c in row.cells) + " |")
        sentences: dict[str, list[str]] = {}
        for row in section.rows:
            sentences.setdefault(row.sentence, []).append(row.clause)
        out.append("")
        out += [f"- {', '.join(ids)}: \u201c{text(s)}\u201d" for s, ids in sentences.items() if s]
    out.append("\n## Deviations\n")
    listed = 0
    for row in matrix.rows:
        for col, cell in zip(matrix.columns, row.cells, strict=True):
            if cell.kind not in ("bad", "xfail"):
                continue
            listed += 1
            out.append(f"### {text(col.label)}: {text(row.clause)} ({text(cell.word)})\n")
            out.append(f"{text(cell.reason)}\n")
            if cell.command:
                out.append(f"Reproduce: {code(cell.command)}\n")
            if cell.message:
                out.append(fenced("\n".join(cell.message.splitlines()[:12])) + "\n")
            if cell.picture:
                out.append(f"![{text(col.label)}: {text(row.clause)}, first failing case]({picture_path(col, row)})\n")
    if not listed:
        out.append("None: every clause passed or was not applicable.")
    return "\n".join(out) + "\n"
