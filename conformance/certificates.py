"""Certificates side by side: ``python -m conformance.certificates compare A.json B.json ...``.

Renders a Markdown table, one row per clause and one column per adapter found in the given
certificates (written by ``pytest --certificate=PATH``), so that kernels, or one kernel on two
machines, can be compared at a glance. A clause missing from a certificate shows as "-".
``python -m conformance.certificates html A.json B.json -o compare.html`` draws the same comparison
as a self-contained HTML page, with every adapter's performance profile and error margins in one
set of charts (harness.certificate_html).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_CELL = {"pass": "pass", "fail": "**FAIL**", "not applicable": "n/a", "skipped": "skipped", "not run": "not run"}


def load(paths: list[Path]) -> list[tuple[str, dict, dict]]:
    """(column label, adapter entry, whole certificate) for every adapter in every file."""
    columns = []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        for spec, entry in doc.get("adapters", {}).items():
            label = spec if len(paths) == 1 else f"{spec} ({Path(p).stem})"
            columns.append((label, entry, doc))
    return columns


def render_compare(paths: list[Path]) -> str:
    cols = load(paths)
    if not cols:
        return "no adapters in the given certificates\n"
    clauses = sorted({cid for _, e, _ in cols for cid in e.get("clauses", {})})
    head = "| clause | " + " | ".join(c for c, _, _ in cols) + " |"
    lines = [head, "|---|" + "---|" * len(cols)]
    lines.append("| **verdict** | " + " | ".join(f"**{e.get('verdict', '?')}**" for _, e, _ in cols) + " |")
    for cid in clauses:
        cells = []
        for _, e, _ in cols:
            cl = e.get("clauses", {}).get(cid)
            if cl is None:
                cells.append("-")
                continue
            cell = _CELL.get(cl["outcome"], cl["outcome"])
            if cl["outcome"] == "fail":
                cell += " (" + cl["detail"].removeprefix("failed: ") + ")"
            cells.append(cell)
        lines.append(f"| {cid} | " + " | ".join(cells) + " |")
    dtypes = [
        d
        for d in ("float64", "float32", "float16", "bfloat16")
        if any(d in e.get("error_stats", {}) for _, e, _ in cols)
    ]
    for d in dtypes:
        cells = [f"{e['error_stats'][d]['max']:.3g}" if d in e.get("error_stats", {}) else "-" for _, e, _ in cols]
        lines.append(f"| max error vs oracle, {d} | " + " | ".join(cells) + " |")
    lines.append("| device | " + " | ".join(e.get("environment", {}).get("device", "-") for _, e, _ in cols) + " |")
    lines.append(
        "| golden set | " + " | ".join(f"`{(d['golden_set']['sha256'] or '-')[:12]}`" for _, _, d in cols) + " |"
    )
    lines.append("| date | " + " | ".join(d.get("date", "-") for _, _, d in cols) + " |")
    legend = (
        "\npass: passed in every dtype it applies to; **FAIL** (dtypes): failed there; n/a: the declaration "
        "rules the clause out (reasons in each certificate); -: not in that certificate.\n"
    )
    return "\n".join(lines) + "\n" + legend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.certificates", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp_ = sub.add_parser("compare", help="side-by-side Markdown table, clause x adapter")
    cmp_.add_argument("certificates", nargs="+", type=Path)
    cmp_.add_argument("-o", "--output", type=Path, default=None, help="write the table here instead of stdout")
    html = sub.add_parser("html", help="side-by-side self-contained HTML page: the table and the charts")
    html.add_argument("certificates", nargs="+", type=Path)
    html.add_argument("-o", "--output", type=Path, default=None, help="write the page here instead of stdout")
    args = parser.parse_args(argv)
    if args.command == "html":
        from conformance.harness.certificate_html import render_compare as render_html

        text = render_html(load(args.certificates))
    else:
        text = render_compare(args.certificates)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
