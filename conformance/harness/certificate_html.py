"""The certificate as one self-contained HTML page: ``--certificate=cert.html``.

Same content as the JSON and Markdown forms written next to it (harness.certificate), plus the
charts: worst error / allowance per clause and dtype, and, when the performance profile ran,
latency and peak memory against S (harness.perf_charts). Self-contained means the file is the whole
record: styles inline, charts as inline SVG, no script, no font, image or stylesheet fetched from
anywhere, so it can be mailed, archived or attached to a release and still render.

``render_compare`` draws several certificates side by side (``python -m conformance.certificates
html A.json B.json -o compare.html``): one clause table with a column per adapter, and the same
charts with every adapter's lines in one plot.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path
from typing import Any

from conformance.contract import DTYPES, np_dtype
from conformance.harness import perf_charts

_OUTCOME_CLASS = {"pass": "ok", "fail": "bad", "not applicable": "na", "not run": "nr", "not in profile": "nr"}
_VERDICT_CLASS = {"CONFORMS": "ok", "DOES NOT CONFORM": "bad", "PARTIAL": "warn", "NOT RUN": "nr"}

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


def _e(x: Any) -> str:
    return escape("" if x is None else str(x))


def inline_svg(svg: str) -> str:
    """An SVG document as an element of the page: the XML namespace declaration is dropped (HTML
    parses inline <svg> without it), so the page carries no URL at all."""
    return re.sub(r"\s+xmlns='[^']*'", "", svg, count=1)


def _table(
    head: list[str], rows: list[list[Any]], classes: list[str] | None = None, num: set[int] = frozenset()
) -> str:
    out = ["<table>"]
    if any(head):
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for i, row in enumerate(rows):
        cls = f" class='{classes[i]}'" if classes and classes[i] else ""
        cells = "".join(f"<td class='num'>{_e(c)}</td>" if j in num else f"<td>{_e(c)}</td>" for j, c in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x * 1e3:.3g}"


def _mib(x: int | None) -> str:
    return "" if x is None else f"{x / 2**20:.3g}"


def _perf_rows_table(rows: list[dict], kind: str) -> str:
    sel = [r for r in rows if r["kind"] == kind]
    if not sel:
        return ""
    head = [
        "shape (B, Hq/Hkv, T, S, D)",
        "dtype",
        "causal",
        "status",
        "output check",
        "first call ms",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "n",
        "x floor",
        "fwd+bwd p50 ms",
        "peak extra MiB",
        "T x S matrix MiB",
        "backend that ran",
    ]
    body, classes = [], []
    for r in sel:
        bwd = r.get("backward") or {}
        check = "" if r.get("pass") is None else ("pass" if r["pass"] else "FAIL")
        backed = set(r.get("quantiles_backed") or [])
        body.append(
            [
                f"{r['B']}, {r['Hq']}/{r['Hkv']}, {r['T']}, {r['S']}, {r['D']}",
                r["dtype"],
                "yes" if r["causal"] else "no",
                r["status"] if r["status"] == "measured" else f"{r['status']}: {r.get('reason', '')}",
                check,
                _ms(r.get("first_call_s")),
                _ms(r.get("p50_s")),
                _ms(r.get("p90_s")) + ("" if "p90" in backed or r.get("p90_s") is None else " *"),
                _ms(r.get("p99_s")) + ("" if "p99" in backed or r.get("p99_s") is None else " *"),
                r.get("n") or "",
                "" if r.get("floor_ratio") is None else f"{r['floor_ratio']:.2f}",
                _ms(bwd.get("p50_s")),
                _mib(r.get("peak_bytes")),
                _mib(r.get("matrix_bytes")),
                r.get("backend") or "",
            ]
        )
        classes.append("bad" if r.get("pass") is False else ("na" if r["status"] != "measured" else ""))
    return _table(head, body, classes, num=set(range(5, 14)))


def perf_section(perf: dict | None, spec: str) -> str:
    """The performance part of one adapter's certificate (clause measurements, profile, charts)."""
    if not perf:
        return ""
    out = []
    clauses = perf.get("clauses") or {}
    if clauses:
        out.append("<h2>Engineering claims (performance clauses)</h2>")
        ms = clauses.get("MEM-SCALING-01")
        if ms:
            sc = ms["scaling"]
            verdict = sc["verdict"]
            item = np_dtype(str(ms.get("dtype"))).itemsize  # B = H = 1 in the clause's ladder
            out.append(
                f"<p><b>MEM-SCALING-01</b>: declared <code>memory_scaling={_e(ms.get('claimed'))}</code>; measured "
                f"<b>{_e(verdict)}</b> (exponent {_e(sc.get('exponent'))} from the smallest to the largest size) in "
                f"{_e(ms.get('dtype'))}.</p>"
            )
            out.append(
                _table(
                    ["T = S", "peak extra bytes", "tracemalloc", "RSS high-water", "device", "one T x S matrix"],
                    [
                        [s, p, r.get("tracemalloc_bytes"), r.get("rss_bytes"), r.get("device_bytes"), s * s * item]
                        for s, p, r in zip(sc["sizes"], sc["peaks"], ms.get("readings", []))
                    ],
                    num={0, 1, 2, 3, 4, 5},
                )
            )
        be = clauses.get("BACKEND-01")
        if be:
            out.append("<p><b>BACKEND-01</b>: the kernel that actually ran, per dtype.</p>")
            out.append(
                _table(
                    ["dtype", "declared backend", "ran", "evidence"],
                    [
                        [d, b.get("declared") or "(not declared)", b.get("ran") or "(not reported)", b.get("evidence")]
                        for d, b in sorted(be.items())
                    ],
                    [
                        "bad" if b.get("declared") and b.get("ran") != b.get("declared") else ""
                        for _, b in sorted(be.items())
                    ],
                )
            )
    if perf.get("profiled"):
        out.append(f"<h2>Performance profile ({_e(perf.get('grid'))} grid)</h2>")
        if perf.get("error"):
            out.append(f"<pre>{_e(perf['error'])}</pre>")
        rows = perf.get("rows") or []
        if rows:
            report = {"adapters": {spec: perf}}
            out.append(
                "<p class='muted'>Each row is one fixed (B, Hq, Hkv, T, S, D, dtype, is_causal). The first call is "
                "timed on its own (initialisation, compilation); p50/p90/p99 come from the repetitions after it "
                "(* : fewer samples than that quantile needs: p90 10, p99 100). x floor: best time over the best time "
                "of the two GEMMs of the same shapes in the same framework, measured in the same run. Peak extra "
                "memory: one forward call, above what existed before it. Wall-clock figures on a shared machine "
                "are upper bounds.</p>"
            )
            out.append(f"<div class='chart'>{inline_svg(perf_charts.latency_svg(report))}</div>")
            out.append(f"<div class='chart'>{inline_svg(perf_charts.memory_svg(report))}</div>")
            for sc in perf.get("memory_scaling") or []:
                causal = ", causal" if sc["causal"] else ""
                out.append(f"<p>Prefill D={sc['D']}, {_e(sc['dtype'])}{causal}: {_e(sc['sentence'])}.</p>")
            out.append("<h3>Prefill (T = S)</h3>" + _perf_rows_table(rows, "prefill"))
            out.append("<h3>Decode (T = 1)</h3>" + _perf_rows_table(rows, "decode"))
            modes = sorted({r.get("timing_mode") for r in rows if r.get("timing_mode")})
            out.append("<p class='muted'>Timed through: " + "; ".join(_e(m) for m in modes) + ".</p>")
    ratios = perf.get("error_ratios") or {}
    if ratios:
        out.append("<h2>Error against the allowance, per clause and dtype</h2>")
        out.append(
            "<p class='muted'>Worst |kernel &minus; float64 oracle| / allowed over every element each clause compared "
            "(the error model of conformance/harness/tolerance.py). 1 is at the allowance; a pass is at most 1.</p>"
        )
        out.append(f"<div class='chart'>{inline_svg(perf_charts.errors_svg(ratios))}</div>")
    return "\n".join(out)


def render(doc: dict) -> str:
    """The whole certificate (one or more adapters) as an HTML page."""
    parts = []
    for spec, a in doc["adapters"].items():
        parts.append(f"<h1>SDPA conformance certificate: <code>{_e(spec)}</code></h1>")
        word = a.get("verdict", "NOT RUN")
        cov = a.get("coverage") or {}
        parts.append(
            f"<p><span class='badge {_VERDICT_CLASS.get(word, 'nr')}'>{_e(word)}</span> "
            f"{_e(cov.get('summary', a.get('reason', '')))}</p>"
        )
        if cov.get("details"):
            parts.append("<ul>" + "".join(f"<li>{_e(d)}</li>" for d in cov["details"]) + "</ul>")
        if "clauses" not in a:
            continue
        g = doc.get("golden_set", {})
        parts.append(
            _table(
                ["", ""],
                [
                    ["suite", f"sdpa-conformance {doc.get('suite', {}).get('version', '')}"],
                    ["spec revision", doc.get("suite", {}).get("spec_revision", "")],
                    [
                        "golden fixture set (sha256 of manifest)",
                        f"{g.get('sha256')} ({'hashes verified' if g.get('hashes_ok') else 'HASH PROBLEMS'})",
                    ],
                    ["command", doc.get("command", "")],
                    ["hypothesis profile", doc.get("profile", "")],
                    ["date", doc.get("date", "")],
                ],
            )
        )
        parts.append(
            "<p class='muted'>The verdict holds for the declaration below: a clause the declaration rules out is "
            "<i>not applicable</i> (reason given) and says nothing about the kernel.</p>"
        )
        parts.append(perf_section(a.get("perf"), spec))
        env = a.get("environment") or {}
        rows = [[k, env.get(k)] for k in ("platform", "machine", "processor", "python", "device") if k in env]
        rows += [[lib, v] for lib, v in (env.get("libraries") or {}).items()]
        parts.append("<h2>Environment</h2>" + _table(["", ""], rows))
        parts.append("<h2>Declaration</h2>" + _table(["field", "value"], [[k, v] for k, v in a["declaration"].items()]))
        parts.append("<h2>Clauses</h2>")
        clause_rows, classes = [], []
        for cid, cl in a["clauses"].items():
            clause_rows.append([cid, cl["outcome"], cl["detail"], cl["title"]])
            classes.append(_OUTCOME_CLASS.get(cl["outcome"], ""))
        parts.append(_table(["clause", "result", "detail", "what it checks"], clause_rows, classes))
        parts.append("<h2>Error against the float64 oracle, per dtype</h2>")
        parts.append(f"<p class='muted'>Source: {_e(a.get('error_stats_source'))}.</p>")
        stats = a.get("error_stats") or {}
        if stats:
            parts.append(
                _table(
                    ["dtype", "max abs error", "mean abs error", "99th percentile"],
                    [[d, f"{s['max']:.3g}", f"{s['mean']:.3g}", f"{s['p99']:.3g}"] for d, s in stats.items()],
                    num={1, 2, 3},
                )
            )
        b = a.get("baseline")
        if b:
            parts.append("<h2>Regression baseline</h2>")
            if "recorded" in b:
                parts.append(f"<p>Recorded to <code>{_e(b['recorded'])}</code> in this run.</p>")
            else:
                parts.append(
                    f"<p>Compared against <code>{_e(b['directory'])}</code>: "
                    f"<b>{'no drift' if b['passed'] else 'MOVED'}</b>.</p>"
                )
                parts += [f"<pre>{_e(p)}</pre>" for p in b.get("problems", [])]
        parts.append("<h2>Failures</h2>")
        if not a.get("failures"):
            parts.append("<p>None.</p>")
        for f in a.get("failures", []):
            parts.append(
                f"<h3>{_e(f['clause'])} [{_e(f['dtype'])}]</h3><p>Reproduce: <code>{_e(f['reproduce'])}</code></p>"
                f"<pre>{_e(f['message'])}</pre>"
            )
    title = "SDPA conformance certificate: " + ", ".join(doc["adapters"])
    return _page(title, "\n".join(parts))


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{_e(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(doc), encoding="utf-8")
    return path


# -- several certificates side by side ----------------------------------------------------------
def render_compare(columns: list[tuple[str, dict, dict]]) -> str:
    """``columns``: (label, adapter entry, whole certificate), as conformance.certificates.load gives.

    The summary first (verdicts, worst errors, devices), then the charts with every adapter in
    them, then the clause table, a column per adapter."""
    from conformance.harness.perf_svg import PALETTE, dot_chart

    labels = [label for label, _, _ in columns]
    parts = ["<h1>SDPA conformance certificates side by side</h1>"]
    summary = [["verdict"] + [e.get("verdict", "?") for _, e, _ in columns]]
    for d in DTYPES:
        if any(d in e.get("error_stats", {}) for _, e, _ in columns):
            summary.append(
                [f"max error vs oracle, {d}"]
                + [f"{e['error_stats'][d]['max']:.3g}" if d in e.get("error_stats", {}) else "-" for _, e, _ in columns]
            )
    for cid in ("MEM-SCALING-01",):
        cells = [((e.get("perf") or {}).get("clauses") or {}).get(cid) for _, e, _ in columns]
        if any(cells):
            summary.append(
                ["memory scaling measured (MEM-SCALING-01)"]
                + [f"{c['scaling']['verdict']} (claimed {c.get('claimed')})" if c else "-" for c in cells]
            )
    summary.append(["device"] + [(e.get("environment") or {}).get("device", "-") for _, e, _ in columns])
    summary.append(["date"] + [d.get("date", "-") for _, _, d in columns])
    parts.append(_table(["", *labels], summary))
    report = {"adapters": {label: e["perf"] for label, e, _ in columns if (e.get("perf") or {}).get("rows")}}
    if report["adapters"]:
        parts.append("<h2>Performance profiles</h2>")
        parts.append(f"<div class='chart'>{inline_svg(perf_charts.latency_svg(report))}</div>")
        parts.append(f"<div class='chart'>{inline_svg(perf_charts.memory_svg(report))}</div>")
    ratios: dict[str, dict[str, float]] = {}
    colors = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}
    for label, e, _ in columns:
        for cid, by in ((e.get("perf") or {}).get("error_ratios") or {}).items():
            if by:
                ratios.setdefault(cid, {})[label] = max(by.values())
    if ratios:
        groups = [
            (cid, [(lab, ratios[cid].get(lab)) for lab in labels if lab in ratios[cid]]) for cid in sorted(ratios)
        ]
        svg = dot_chart(
            "Worst |error| / allowance per clause (worst dtype), per adapter",
            groups,
            colors=colors,
            xlabel="max |kernel - float64 oracle| / allowed (log scale); 1 = at the allowance",
        )
        parts.append(f"<h2>Error against the allowance</h2><div class='chart'>{inline_svg(svg)}</div>")
    rows, classes = [], []
    for cid in sorted({cid for _, e, _ in columns for cid in e.get("clauses", {})}):
        cells = [(e.get("clauses", {}).get(cid) or {}).get("outcome", "-") for _, e, _ in columns]
        rows.append([cid, *cells])
        classes.append("bad" if "fail" in cells else ("ok" if all(c == "pass" for c in cells) else ""))
    parts.append("<h2>Clauses</h2>" + _table(["clause", *labels], rows, classes))
    return _page("SDPA conformance certificates side by side", "\n".join(parts))
