"""Certificates side by side: ``python -m conformance.certificates compare A.json B.json ...``.

Renders a Markdown table, one row per clause and one column per adapter found in the given
certificates (written by ``pytest --certificate=PATH``), so that kernels, or one kernel on two
machines, can be compared at a glance. A clause missing from a certificate shows as "-".
``python -m conformance.certificates html A.json B.json -o compare.html`` draws the same comparison
as a self-contained HTML page, with every adapter's performance profile and error margins in one
set of charts (harness.records.certificate_html).

This module is only the command (its name is the documented ``python -m conformance.certificates``);
the record is ``harness.run.certificate`` and the renderings ``harness.records.certificate_markdown`` and
``harness.records.certificate_html``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from conformance.harness.records.certificate_markdown import render_compare as render_compare_columns


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
    """The Markdown table of the certificates at ``paths`` (harness.records.certificate_markdown)."""
    return render_compare_columns(load(paths))


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
        from conformance.harness.records.certificate_html import render_compare as render_html

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
