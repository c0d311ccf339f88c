"""The certificate as one self-contained HTML page: ``--certificate=cert.html``.

Same content as the JSON and Markdown forms written next to it (harness.run.certificate), plus the
charts: worst error / allowance per clause and dtype, and, when the performance profile ran,
latency and peak memory against S (harness.perf.charts). Self-contained means the file is the whole
record: styles inline, charts as inline SVG, no script, no font, image or stylesheet fetched from
anywhere, so it can be mailed, archived or attached to a release and still render.

``render_compare`` draws several certificates side by side (``python -m conformance.certificates
html A.json B.json -o compare.html``): one clause table with a column per adapter, and the same
charts with every adapter's lines in one plot. The performance section is harness.records.perf_html's, the
page's pieces (style, tables, inline SVG) harness.records.html_parts'.
"""

from __future__ import annotations

from pathlib import Path

from conformance.contract import DTYPES
from conformance.harness.calls.machine import summary as machine_summary
from conformance.harness.perf import charts as perf_charts
from conformance.harness.records import heatmap_svg
from conformance.harness.records.certificate_markdown import expectation_run, machine_notes, max_error_cell
from conformance.harness.records.html_parts import esc, inline_svg, page, table
from conformance.harness.records.perf_html import perf_section

_OUTCOME_CLASS = {
    "pass": "ok",
    "fail": "bad",
    "not applicable": "na",
    "not run": "nr",
    "not in profile": "nr",
    "expected failure": "warn",
}
_VERDICT_CLASS = {
    "CONFORMS": "ok",
    "CONFORMS AS DECLARED": "ok",
    "DEVIATES AS EXPECTED": "warn",
    "DOES NOT CONFORM": "bad",
    "PARTIAL": "warn",
    "NOT RUN": "nr",
}


def render(doc: dict) -> str:
    """The whole certificate (one or more adapters) as an HTML page."""
    parts = []
    for spec, a in doc["adapters"].items():
        parts.append(f"<h1>SDPA conformance certificate: <code>{esc(spec)}</code></h1>")
        word = a.get("verdict", "NOT RUN")
        cov = a.get("coverage") or {}
        drift = (a.get("environment") or {}).get("version_drift")  # the kernel's library is not the measured release
        parts.append(
            f"<p><span class='badge {_VERDICT_CLASS.get(word, 'nr')}'>{esc(word)}</span> "
            f"{esc(cov.get('summary', a.get('reason', '')))}{esc(f'; {drift}' if drift else '')}</p>"
        )
        if cov.get("details"):
            parts.append("<ul>" + "".join(f"<li>{esc(d)}</li>" for d in cov["details"]) + "</ul>")
        if "clauses" not in a:
            continue
        parts += _deviations_and_expectations(a)
        parts += failing_cases_drawn(spec, a.get("clauses") or {})
        g = doc.get("golden_set", {})
        parts.append(
            table(
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
        rows.append(["machine (as the libraries see it)", machine_summary(doc.get("machine"))])
        rows += [[lib, v] for lib, v in (env.get("libraries") or {}).items()]
        parts.append("<h2>Environment</h2>" + table(["", ""], rows))
        parts.append("<h2>Declaration</h2>" + table(["field", "value"], [[k, v] for k, v in a["declaration"].items()]))
        parts.append("<h2>Clauses</h2>")
        clause_rows, classes = [], []
        for cid, cl in a["clauses"].items():
            clause_rows.append([cid, cl["outcome"], cl["detail"], cl["title"]])
            classes.append(_OUTCOME_CLASS.get(cl["outcome"], ""))
        parts.append(table(["clause", "result", "detail", "what it checks"], clause_rows, classes))
        parts.append("<h2>Error against the float64 oracle, per dtype</h2>")
        parts.append(f"<p class='muted'>Source: {esc(a.get('error_stats_source'))}.</p>")
        stats = a.get("error_stats") or {}
        if stats:
            parts.append(
                table(
                    ["dtype", "max abs error", "mean abs error", "99th percentile"],
                    [[d, f"{s['max']:.3g}", f"{s['mean']:.3g}", f"{s['p99']:.3g}"] for d, s in stats.items()],
                    num={1, 2, 3},
                )
            )
        b = a.get("baseline")
        if b:  # the same record as certificate_markdown's section, in HTML: two formats, one order of facts
            parts.append("<h2>Regression baseline</h2>")
            if "recorded" in b:
                parts.append(f"<p>Recorded to <code>{esc(b['recorded'])}</code> in this run.</p>")
            else:
                if b.get("machine"):  # "another machine: ..." or "machine not recorded ..."
                    parts.append(f"<p>{esc(b['machine'][0].upper() + b['machine'][1:])}.</p>")
                parts.append(
                    f"<p>Compared against <code>{esc(b['directory'])}</code>: "
                    f"<b>{'no drift' if b['passed'] else 'MOVED'}</b>.</p>"
                )
                parts += [f"<pre>{esc(p)}</pre>" for p in b.get("problems", []) + b.get("moved_on_another_machine", [])]
        parts.append("<h2>Failures</h2>")
        if not a.get("failures"):
            parts.append("<p>None.</p>")
        for f in a.get("failures", []):
            parts.append(
                f"<h3>{esc(f['clause'])} [{esc(f['dtype'])}]</h3><p>Reproduce: <code>{esc(f['reproduce'])}</code></p>"
                f"<pre>{esc(f['message'])}</pre>"
            )
    title = "SDPA conformance certificate: " + ", ".join(doc["adapters"])
    return page(title, "\n".join(parts))


def failing_cases_drawn(spec: str, clauses: dict) -> list[str]:
    """Each failing clause's first failing case as a picture (harness.records.heatmap_svg)."""
    drawn = [(cid, cl) for cid, cl in clauses.items() if cl.get("picture")]
    if not drawn:
        return []
    parts = [
        "<h2>Failing cases, drawn</h2><p class='muted'>Each failing clause's first failing case: what the float64 "
        "oracle expects, what the kernel returned, and the error in units of the allowance, over one (batch, head) "
        "slice (at most 24 x 24 cells, around the worst element).</p>"
    ]
    for cid, cl in drawn:
        pic = cl["picture"]
        title = f"{cid} [{pic.get('dtype')}] on {spec}: {cl.get('outcome')}"
        parts.append(f"<div class='chart'>{inline_svg(heatmap_svg.render(pic, title))}</div>")
        if pic.get("case"):
            parts.append(f"<p class='muted'>case: {esc(pic['case'])}</p>")
    return parts


def _deviations_and_expectations(a: dict) -> list[str]:
    """The declared deviations (each with the spec sentence it departs from) and the expectations file."""
    parts = []
    devs = a.get("deviations") or []
    if devs:
        parts.append("<h2>Declared deviations from the spec</h2>")
        parts.append(
            "<p class='muted'>Declared, and tested as declared; each departs from a rule the spec states, so a run "
            "that passes conforms <i>as declared</i>, not to the spec.</p>"
        )
        rows = [[d["field"], d["value"], d["what"], d["citation"]] for d in devs]
        parts.append(table(["field", "value", "what the kernel does", "departs from"], rows))
    exp = a.get("expectations") or {}
    if exp.get("file"):
        parts.append(
            f"<h2>Known causes (expected failures)</h2><p>Expectations file: <code>{esc(exp['file'])}</code></p>"
        )
        if exp.get("error"):
            parts.append(f"<p class='bad'>Could not be read: {esc(exp['error'])}</p>")
        entries = exp.get("entries", [])
        rows = [
            [e["behaviour"], e["when_text"], e["reason"], e["evidence"], e.get("link") or "", expectation_run(e)]
            for e in entries
        ]
        classes = ["bad" if e.get("status") == "stale" else "" for e in entries]
        parts.append(table(["behaviour", "when", "reason", "evidence", "link", "this run"], rows, classes))
    return parts


def write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(doc), encoding="utf-8")
    return path


# -- several certificates side by side ----------------------------------------------------------
def render_compare(columns: list[tuple[str, dict, dict]]) -> str:
    """``columns``: (label, adapter entry, whole certificate), as conformance.certificates.load gives.

    The summary first (verdicts, worst errors, devices), then the charts with every adapter in
    them, then the clause table, a column per adapter."""
    from conformance.harness.perf.svg import PALETTE, dot_chart

    labels = [label for label, _, _ in columns]
    parts = ["<h1>SDPA conformance certificates side by side</h1>"]
    top, moved = machine_notes(columns)  # certificates from different machines: what differs
    parts += [f"<p><b>{esc(t)}</b></p>" for t in top]
    summary = [["verdict"] + [e.get("verdict", "?") for _, e, _ in columns]]
    summary.append(
        ["declared deviations"]
        + [", ".join(f"{d['field']}={d['value']}" for d in e.get("deviations") or []) or "none" for _, e, _ in columns]
    )
    summary.append(
        ["expected failures"]
        + [
            f"{(e.get('coverage') or {}).get('expected_failures', 0)}"
            + (f", {n} stale" if (n := (e.get("coverage") or {}).get("stale_expectations", 0)) else "")
            for _, e, _ in columns
        ]
    )
    for d in DTYPES:
        if any(d in e.get("error_stats", {}) for _, e, _ in columns):
            summary.append(
                [f"max error vs oracle, {d}"] + [max_error_cell(columns, i, d, moved) for i in range(len(columns))]
            )
    for cid in ("MEM-SCALING-01",):
        cells = [((e.get("perf") or {}).get("clauses") or {}).get(cid) for _, e, _ in columns]
        if any(cells):
            summary.append(
                ["memory scaling measured (MEM-SCALING-01)"]
                + [f"{c['scaling']['verdict']} (claimed {c.get('claimed')})" if c else "-" for c in cells]
            )
    summary.append(["device"] + [(e.get("environment") or {}).get("device", "-") for _, e, _ in columns])
    summary.append(["machine"] + [machine_summary(d.get("machine")) for _, _, d in columns])
    summary.append(["date"] + [d.get("date", "-") for _, _, d in columns])
    parts.append(table(["", *labels], summary))
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
    parts.append("<h2>Clauses</h2>" + table(["clause", *labels], rows, classes))
    return page("SDPA conformance certificates side by side", "\n".join(parts))
