"""perf.json and its charts: what ``--perf-report=DIR`` writes, built from the workers' answers.

One JSON document for the run: per ``--impl``, the flat rows (shape, dtype, causal, pass,
first-call and p50/p90/p99 seconds, samples, peak extra bytes, floor ratio, backend that ran,
what each figure includes), prefill and decode kept apart by ``kind``, the memory scaling fitted
on each prefill ladder (harness.perf.scaling), and what the performance clauses measured
(MEM-SCALING-01, BACKEND-01 per dtype). Figures from a shared machine are upper bounds; the
document says so, and names the machine.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from conformance.harness.perf import charts as perf_charts
from conformance.harness.perf.grid import PREFILL
from conformance.harness.perf.scaling import classify

FORMAT = 1
CAVEAT = (
    "Wall-clock figures are upper bounds: other processes may have shared the machine. Each row is a fixed "
    "shape; prefill and decode are separate grids and are never averaged together."
)


def flat_row(rec: dict) -> dict:
    """One row of perf.json from a worker record."""
    row = dict(rec["row"])
    out: dict[str, Any] = {
        "key": rec["key"],
        **row,
        "status": rec["status"],
        "reason": rec.get("reason", ""),
        "pass": rec.get("pass"),
        "check": rec.get("check", ""),
    }
    fwd = rec.get("forward") or {}
    out.update({k: fwd.get(k) for k in ("first_call_s", "p50_s", "p90_s", "p99_s", "min_s", "n")})
    out["quantiles_backed"] = fwd.get("quantiles_backed")
    out["stable"] = fwd.get("stable")
    out["timing_mode"] = rec.get("mode")
    bwd = rec.get("backward")
    if bwd:
        out["backward"] = {k: bwd.get(k) for k in ("first_call_s", "p50_s", "p90_s", "p99_s", "min_s", "n", "stable")}
        out["backward"]["mode"] = rec.get("backward_mode")
        out["backward"]["floor_ratio"] = rec.get("backward_floor_ratio")
    floor = rec.get("floor") or {}
    out["floor_p50_s"] = floor.get("p50_s")
    out["floor_min_s"] = floor.get("min_s")
    out["floor"] = floor.get("what") or floor.get("error")
    out["floor_ratio"] = rec.get("floor_ratio")  # best kernel time / best floor time
    out["floor_ratio_p50"] = rec.get("floor_ratio_p50")
    out["backend"] = rec.get("backend")
    out["backend_evidence"] = rec.get("backend_evidence")
    mem = rec.get("memory") or {}
    mf = mem.get("forward") or {}
    out["peak_bytes"] = mf.get("peak_extra_bytes")
    out["peak_bytes_method"] = mf.get("method")
    out["peak_bytes_readings"] = {k: mf.get(k) for k in ("tracemalloc_bytes", "rss_bytes", "device_bytes")}
    if mem.get("backward"):
        out["peak_bytes_backward"] = mem["backward"].get("peak_extra_bytes")
    if mem.get("error"):
        out["memory_error"] = mem["error"]
    out["memory_mode"] = mem.get("mode")
    from conformance.harness.perf.grid import Row

    out["matrix_bytes"] = Row(**rec["row"]).matrix_bytes()
    return out


def prefill_scaling(rows: list[dict]) -> list[dict]:
    """Memory scaling of every prefill ladder (same D, causal, dtype) from its largest three sizes."""
    ladders: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["kind"] == PREFILL and r.get("peak_bytes") is not None:
            ladders.setdefault((r["D"], r["causal"], r["dtype"]), []).append(r)
    out = []
    for (D, causal, dtype), rs in sorted(ladders.items()):
        rs = sorted(rs, key=lambda r: r["S"])[-3:]
        if len(rs) < 2:
            continue
        sc = classify([r["S"] for r in rs], [r["peak_bytes"] for r in rs], rs[-1]["matrix_bytes"])
        out.append({"D": D, "causal": causal, "dtype": dtype, **sc.as_dict(), "sentence": sc.sentence()})
    return out


def clause_notes(notes: list[dict]) -> dict:
    """The performance clauses' measurements: MEM-SCALING-01 once, BACKEND-01 per dtype."""
    out: dict[str, Any] = {}
    for n in notes:
        if n["clause"] == "MEM-SCALING-01":
            out["MEM-SCALING-01"] = {k: v for k, v in n.items() if k not in ("impl", "clause")}
        elif n["clause"] == "BACKEND-01":
            out.setdefault("BACKEND-01", {})[str(n["dtype"])] = {k: n.get(k) for k in ("declared", "ran", "evidence")}
    return out


def adapter_entry(spec: str, answer: dict | None, error: str | None, decl: Any, notes: list[dict]) -> dict:
    entry: dict[str, Any] = {
        "spec": spec,
        "device": decl.device,
        "declaration": {"memory_scaling": decl.memory_scaling, "backend": decl.backend, "grad": decl.grad},
        "clauses": clause_notes(notes),
    }
    if error is not None or answer is None:  # the profile failed, or did not run (clauses only)
        entry.update(error=error, rows=[], memory_scaling=[])
        return entry
    rows = [flat_row(r) for r in answer["rows"]]
    entry.update(
        framework=answer.get("framework"),
        malloc_pinned=answer.get("malloc_pinned"),
        environment=answer.get("environment"),
        rows=rows,
        memory_scaling=prefill_scaling(rows),
    )
    return entry


def build(grid: str, command: str, adapters: dict[str, dict], errors: dict | None = None) -> dict:
    return {
        "format": FORMAT,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "grid": grid,
        "caveat": CAVEAT,
        "adapters": adapters,
        "error_ratios": errors or {},
    }


def write(report: dict, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "perf.json", directory / "latency.svg", directory / "memory.svg"]
    paths[0].write_text(json.dumps(report, indent=1, default=str) + "\n")
    paths[1].write_text(perf_charts.latency_svg(report))
    paths[2].write_text(perf_charts.memory_svg(report))
    ratios = merged_error_ratios(report)
    if ratios:
        paths.append(directory / "errors.svg")
        paths[-1].write_text(perf_charts.errors_svg(ratios))
    return paths


def merged_error_ratios(report: dict) -> dict[str, dict[str, float]]:
    """clause -> dtype -> worst ratio over every adapter of the report (the chart's input)."""
    out: dict[str, dict[str, float]] = {}
    for spec_ratios in report.get("error_ratios", {}).values():
        for cid, by_dtype in spec_ratios.items():
            for d, r in by_dtype.items():
                out.setdefault(cid, {})[d] = max(r, out.get(cid, {}).get(d, 0.0))
    return out


def summary_lines(entry: dict) -> list[str]:
    """What the terminal summary says about one adapter's profile."""
    spec = entry["spec"]
    if entry.get("error"):
        return [f"{spec}: perf profile failed: {entry['error'].splitlines()[0]}"]
    rows = entry["rows"]
    measured = [r for r in rows if r["status"] == "measured"]
    lines = []
    for kind in ("prefill", "decode"):
        rs = [r for r in measured if r["kind"] == kind]
        if not rs:
            continue
        big = max(rs, key=lambda r: (r["S"], r["causal"] is False))
        bad = [r for r in rs if r.get("pass") is False]
        ratio = f", {big['floor_ratio']:.1f}x floor" if big.get("floor_ratio") else ""
        lines.append(
            f"{spec} {kind}: {len(rs)} rows measured{f', {len(bad)} FAILED the output check' if bad else ''}; "
            f"largest {big['key']}: p50 {big['p50_s'] * 1e3:.2f} ms{ratio}, peak extra "
            f"{(big.get('peak_bytes') or 0) / 2**20:.1f} MiB, backend {big.get('backend') or 'not reported'}"
        )
    skipped = [r for r in rows if r["status"] != "measured"]
    if skipped:
        lines.append(f"{spec}: {len(skipped)} rows not measured (first: {skipped[0]['key']}: {skipped[0]['reason']})")
    for sc in entry.get("memory_scaling", []):
        causal = " causal" if sc["causal"] else ""
        lines.append(f"{spec} memory (prefill D={sc['D']} {sc['dtype']}{causal}): {sc['sentence']}")
    ms = entry.get("clauses", {}).get("MEM-SCALING-01")
    if ms:
        lines.append(
            f"{spec} MEM-SCALING-01: claimed {ms.get('claimed')}, measured {ms['scaling']['verdict']} "
            f"(exponent {ms['scaling']['exponent']})"
        )
    for dtype, b in sorted(entry.get("clauses", {}).get("BACKEND-01", {}).items()):
        lines.append(f"{spec} BACKEND-01 [{dtype}]: declared {b['declared']}, ran {b['ran']} ({b['evidence']})")
    return lines
