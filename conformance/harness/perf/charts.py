"""The three charts of a performance report, drawn from perf.json's data (harness.perf.report).

* latency.svg: forward p50 against S, log-log; prefill panels (one per head dim) and a decode panel,
  never averaged together; one line per adapter (dashed: causal), and each adapter's two-GEMM floor
  measured in the same run (its best time, the least disturbed) as a thin dotted line of the same colour.
* memory.svg: forward peak extra bytes against S, with the size of one [B, H, T, S] matrix in the
  row's dtype drawn for comparison: a tiled kernel's line stays under it and grows with its
  slope / 2 in prefill.
* errors.svg: worst |error| / allowance per clause and dtype over the run's comparisons (1 = at the
  allowance; below is a pass), from the certificate's observer (harness.perf.errors).
"""

from __future__ import annotations

from conformance.harness.perf.grid import DECODE, PREFILL
from conformance.harness.perf.svg import PALETTE, Panel, Series, dot_chart, line_chart

DTYPE_COLORS = {"float64": "#1f77b4", "float32": "#2ca02c", "float16": "#ff7f0e", "bfloat16": "#d62728"}


def _measured(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "measured"]


def _groups(report: dict) -> list[tuple[str, str, int | None]]:
    """(panel title, kind, head dim) for every panel the report's rows fill."""
    dims = sorted({r["D"] for a in report["adapters"].values() for r in _measured(a["rows"]) if r["kind"] == PREFILL})
    out = [(f"prefill, T = S, D = {d}", PREFILL, d) for d in dims]
    decode = [r for a in report["adapters"].values() for r in _measured(a["rows"]) if r["kind"] == DECODE]
    if decode:
        r0 = decode[0]
        out.append((f"decode, T = 1, Hq={r0['Hq']}, Hkv={r0['Hkv']}, D={r0['D']}", DECODE, None))
    return out


def _variants(rows: list[dict]) -> list[tuple[str, bool]]:
    return sorted({(r["dtype"], r["causal"]) for r in rows})


def _label(spec: str, dtype: str, causal: bool, many_dtypes: bool) -> str:
    return spec + (f" {dtype}" if many_dtypes else "") + (" causal" if causal else "")


def _series_for(report: dict, kind: str, D: int | None, value: str) -> tuple[list[Series], list[Series]]:
    lines, floors = [], []
    many = len({r["dtype"] for a in report["adapters"].values() for r in a["rows"]}) > 1
    for i, (spec, a) in enumerate(report["adapters"].items()):
        color = PALETTE[i % len(PALETTE)]
        rows = [r for r in _measured(a["rows"]) if r["kind"] == kind and (D is None or r["D"] == D)]
        for dtype, causal in _variants(rows):
            sel = sorted((r for r in rows if r["dtype"] == dtype and r["causal"] == causal), key=lambda r: r["S"])
            pts = [(r["S"], r[value]) for r in sel if r.get(value)]
            lines.append(Series(_label(spec, dtype, causal, many), pts, color, "7 4" if causal else None))
            if value == "p50_s" and not causal:
                fl = [(r["S"], r["floor_min_s"]) for r in sel if r.get("floor_min_s")]
                label = f"{spec} floor: 2 GEMMs, best of n ({a.get('framework', '?')})" + (f" {dtype}" if many else "")
                floors.append(Series(label, fl, color, "2 3", width=1.2, markers=False))
    return lines, floors


def latency_svg(report: dict) -> str:
    panels = []
    for title, kind, D in _groups(report):
        lines, floors = _series_for(report, kind, D, "p50_s")
        panels.append(Panel(title, lines + floors))
    return line_chart(
        "Forward latency (p50) against S, with the two-GEMM floor",
        panels or [Panel("no measured rows")],
        xlabel="S (keys; prefill T = S)",
        yunit="s",
    )


def memory_svg(report: dict) -> str:
    panels = []
    for title, kind, D in _groups(report):
        lines, _ = _series_for(report, kind, D, "peak_bytes")
        ref: dict[int, int] = {}
        for a in report["adapters"].values():
            for r in _measured(a["rows"]):
                if r["kind"] == kind and (D is None or r["D"] == D) and r.get("matrix_bytes"):
                    ref[r["S"]] = max(ref.get(r["S"], 0), r["matrix_bytes"])
        if ref:
            lines.append(
                Series("one [B, H, T, S] matrix in the row's dtype", sorted(ref.items()), "#000000", "4 4", 1.4)
            )
        panels.append(Panel(title, lines))
    return line_chart(
        "Peak extra memory of one forward call against S",
        panels or [Panel("no measured rows")],
        xlabel="S (keys; prefill T = S)",
        yunit="B",
    )


def errors_svg(ratios: dict[str, dict[str, float]], title: str = "") -> str:
    """``ratios``: clause -> dtype -> worst |error| / allowance over the clause's comparisons."""
    dtypes = [d for d in DTYPE_COLORS if any(d in v for v in ratios.values())]
    groups = [(cid, [(d, ratios[cid].get(d)) for d in dtypes if d in ratios[cid]]) for cid in sorted(ratios)]
    return dot_chart(
        title or "Worst |error| / allowance per clause and dtype (1 = at the allowance)",
        groups,
        colors={d: DTYPE_COLORS[d] for d in dtypes},
        xlabel="max over the clause's compared elements of |kernel - float64 oracle| / allowed (log scale)",
    )
