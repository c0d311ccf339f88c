"""The pieces every HTML page of the suite is made of: the inline style, escaping, tables, inline
SVG and the page around them. Nothing is fetched from anywhere (no script, font, image or
stylesheet), so a page is the whole record and renders wherever it is opened.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

# Every page carries this style inline; docs/certificate-numpy.html, a page written by a real run,
# carries it too, and its clause tables repeat row for row (generated output, listed by duplicates).
STYLE = """
body { font-family: 'DejaVu Sans', Arial, sans-serif; margin: 24px auto; max-width: 1320px; color: #222; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 30px;
  border-bottom: 2px solid #ddd; padding-bottom: 3px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 12.5px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 5px 14px; border-radius: 5px; font-weight: bold; color: white; }
.ok { background: #e6f4ea; } .bad { background: #fde7e7; } .na { background: #f3f3f3; color: #666; }
.nr { background: #fff8e1; } .warn { background: #fff3cd; }
.badge.ok { background: #1e8e3e; } .badge.bad { background: #c5221f; } .badge.warn { background: #b06000; }
.badge.nr { background: #777; }
.chart { margin: 10px 0 18px; overflow-x: auto; } pre { background: #f7f7f7; padding: 8px; font-size: 12px;
  white-space: pre-wrap; } .muted { color: #666; font-size: 12.5px; } code { font-size: 12px; }
"""


def esc(x: Any) -> str:
    """``x`` as HTML text (None as nothing)."""
    return escape("" if x is None else str(x))


def inline_svg(svg: str) -> str:
    """An SVG document as an element of the page: the XML namespace declaration is dropped (HTML
    parses inline <svg> without it), so the page carries no URL at all."""
    return re.sub(r"\s+xmlns='[^']*'", "", svg, count=1)


def table(head: list[str], rows: list[list[Any]], classes: list[str] | None = None, num: set[int] = frozenset()) -> str:
    """An HTML table: ``classes`` colour rows (the style's ok / bad / na / nr / warn), ``num`` names
    the right-aligned numeric columns."""
    out = ["<table>"]
    if any(head):
        out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
    for i, row in enumerate(rows):
        cls = f" class='{classes[i]}'" if classes and classes[i] else ""
        cells = "".join(
            f"<td class='num'>{esc(c)}</td>" if j in num else f"<td>{esc(c)}</td>" for j, c in enumerate(row)
        )
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def page(title: str, body: str, style: str = "") -> str:
    """A whole HTML document: ``body`` under ``title``, with the inline style (and a page's own ``style``
    rules after it, still inline)."""
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{esc(title)}</title>\n<style>{STYLE}{style}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
