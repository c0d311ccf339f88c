"""Did a kernel move against its recorded baseline? Output drift and error statistics, as tables.

Thresholds (see harness.run.baseline's docstring for why these sizes): an output element may drift by
``DRIFT * (ATOL[d] + RTOL[d] * |recorded|)``; an error statistic may grow to ``WORSE * recorded +
FLOOR[d]``.
"""

from __future__ import annotations

import numpy as np

from conformance.harness.records.baseline_grid import METRICS, Run
from conformance.harness.spec.report import abs_error

DRIFT = 1.0
WORSE = 2.0
# Drift thresholds per dtype (a baseline's own table: the conformance allowance is per case, harness.judge.tolerance).
ATOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
RTOL = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
FLOOR = {d: 0.1 * a for d, a in ATOL.items()}


def thresholds() -> dict:
    return {
        "output_drift": f"|now - recorded| <= {DRIFT:g} * (ATOL[d] + RTOL[d] * |recorded|)",
        "ATOL": ATOL,
        "RTOL": RTOL,
        "error_statistics": f"now <= {WORSE:g} * recorded + FLOOR[d] for max, mean, p99 per dtype",
        "FLOOR": FLOOR,
    }


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        return "  ".join(c.ljust(w) for c, w in zip(r, widths))

    return "\n".join([line(cells[0]), line(tuple("-" * w for w in widths))] + [line(r) for r in cells[1:]])


def compare_run(meta: dict, recorded: dict[str, np.ndarray], run: Run) -> list[str]:
    """Readable tables of what moved; empty when the run is within the thresholds of the recording."""
    drift_rows, stat_rows, notes = [], [], []
    for key, old in sorted(recorded.items()):
        if key not in run.outputs:
            notes.append(f"{key}: recorded, but not run now ({run.skipped.get(key, 'not in the grid')})")
            continue
        if meta["inputs"].get(key) != run.inputs[key]:
            notes.append(f"{key}: the grid's inputs differ from the recorded ones (case builder changed); re-record")
            continue
        d = key.rsplit("/", 1)[1]
        o = np.asarray(old, dtype=np.float64)
        n = np.asarray(run.outputs[key], dtype=np.float64)
        allowed = DRIFT * (ATOL[d] + RTOL[d] * np.abs(np.nan_to_num(o)))
        diff = abs_error(n, o)
        moved = diff > allowed
        if moved.any():
            i = np.unravel_index(int(np.argmax(diff / allowed)), o.shape)
            drift_rows.append(
                (
                    key,
                    f"{int(moved.sum())}/{o.size}",
                    f"{diff.max():.3g}",
                    f"{diff[i]:.3g} > {allowed[i]:.3g}",
                    f"{o[i]:.6g} -> {n[i]:.6g}",
                )
            )
    for key in sorted(set(run.outputs) - set(recorded)):
        notes.append(f"{key}: run now, but not in the recording (declaration changed?)")
    for d, old in sorted(meta["per_dtype"].items()):
        now = run.per_dtype.get(d)
        if now is None:
            continue
        for m in METRICS:
            limit = WORSE * old[m] + FLOOR[d]
            if now[m] > limit:
                ratio = now[m] / old[m] if old[m] else float("inf")
                stat_rows.append((d, m, f"{old[m]:.3g}", f"{now[m]:.3g}", f"{ratio:.3g}x", f"{limit:.3g}"))
    parts = []
    if drift_rows:
        parts.append(
            "outputs that drifted beyond |now - recorded| <= ATOL[d] + RTOL[d]*|recorded|:\n"
            + _table(("case", "moved", "max |diff|", "worst (diff > allowed)", "value there"), drift_rows)
        )
    if stat_rows:
        parts.append(
            f"error statistics vs the float64 oracle that got worse than {WORSE:g}x + floor:\n"
            + _table(("dtype", "metric", "recorded", "now", "ratio", "limit"), stat_rows)
        )
    if parts and notes:
        parts.append("notes:\n  " + "\n  ".join(notes))
    if not parts and any("inputs differ" in x for x in notes):
        parts.append("notes:\n  " + "\n  ".join(notes))
    return parts
