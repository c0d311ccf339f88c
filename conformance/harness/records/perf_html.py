"""The performance part of a certificate as HTML: the engineering-claim clauses' measurements
(MEM-SCALING-01, BACKEND-01), the profile's tables and charts (harness.perf.charts), and the worst
error / allowance per clause and dtype.
"""

from __future__ import annotations

from conformance.contract import np_dtype
from conformance.harness.perf import charts as perf_charts
from conformance.harness.records.html_parts import esc, inline_svg, table


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
    return table(head, body, classes, num=set(range(5, 14)))


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
                f"<p><b>MEM-SCALING-01</b>: declared <code>memory_scaling={esc(ms.get('claimed'))}</code>; measured "
                f"<b>{esc(verdict)}</b> (exponent {esc(sc.get('exponent'))} from the smallest to the largest size) in "
                f"{esc(ms.get('dtype'))}.</p>"
            )
            out.append(
                table(
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
                table(
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
        out.append(f"<h2>Performance profile ({esc(perf.get('grid'))} grid)</h2>")
        if perf.get("error"):
            out.append(f"<pre>{esc(perf['error'])}</pre>")
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
                out.append(f"<p>Prefill D={sc['D']}, {esc(sc['dtype'])}{causal}: {esc(sc['sentence'])}.</p>")
            out.append("<h3>Prefill (T = S)</h3>" + _perf_rows_table(rows, "prefill"))
            out.append("<h3>Decode (T = 1)</h3>" + _perf_rows_table(rows, "decode"))
            modes = sorted({r.get("timing_mode") for r in rows if r.get("timing_mode")})
            out.append("<p class='muted'>Timed through: " + "; ".join(esc(m) for m in modes) + ".</p>")
    ratios = perf.get("error_ratios") or {}
    if ratios:
        out.append("<h2>Error against the allowance, per clause and dtype</h2>")
        out.append(
            "<p class='muted'>Worst |kernel &minus; float64 oracle| / allowed over every element each clause compared "
            "(the error model of conformance/harness/judge/tolerance.py). "
            "1 is at the allowance; a pass is at most 1.</p>"
        )
        out.append(f"<div class='chart'>{inline_svg(perf_charts.errors_svg(ratios))}</div>")
    return "\n".join(out)
