"""Did a kernel move against its recorded baseline? Output drift and error statistics, as tables.

Thresholds (see harness.run.baseline's docstring for why these sizes): an output element may drift by
``DRIFT * (ATOL[d] + RTOL[d] * |recorded|)``; an error statistic may grow to ``WORSE * recorded +
FLOOR[d]``.

On another machine (harness.calls.machine: another CPU, capability level, BLAS core type or library
build) the same thresholds only report: what moved there is "moved on another machine", and fails only
where the output now lies beyond the error model (:func:`compare_on`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from conformance.harness.records.baseline_grid import METRICS, Run, grid
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


def _moved(meta: dict, recorded: dict[str, np.ndarray], run: Run) -> tuple[list[tuple], list[tuple], list[str]]:
    """(drifted outputs, worse error statistics, notes): the rows of :func:`compare_run`'s tables."""
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
    return drift_rows, stat_rows, notes


def compare_run(meta: dict, recorded: dict[str, np.ndarray], run: Run) -> list[str]:
    """Readable tables of what moved; empty when the run is within the thresholds of the recording."""
    return _parts(*_moved(meta, recorded, run))


def _parts(drift_rows: list[tuple], stat_rows: list[tuple], notes: list[str]) -> list[str]:
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


# -- a baseline recorded on another machine ------------------------------------------------------
@dataclass
class Comparison:
    """A run against its baseline: ``problems`` fail the comparison; ``moved`` are the figures that
    moved on another machine within the error model (reported, not failed); ``machine`` is the line
    that says whose machine the recording is ("another machine: ...", "machine not recorded ...", or
    "" for the same machine)."""

    problems: list[str]
    moved: list[str] = field(default_factory=list)
    machine: str = ""


def machine_line(changes: list[str] | None) -> str:
    if changes is None:
        return "machine not recorded in the baseline: compared as on the same machine"
    return "another machine: " + "; ".join(changes) if changes else ""


def beyond_model(run: Run, decl, keys: set[str]) -> dict[str, str]:
    """Case key -> the first line of the oracle's mismatch report, for each grid case in ``keys``
    whose output lies beyond the error model's allowance (the judgement a conformance clause makes,
    harness.judge.compare.assert_close, under the kernel's declaration)."""
    from conformance.harness.judge import compare
    from conformance.harness.spec.report import ClauseViolation

    out = {}
    for key, case in grid(decl.dtypes):
        if key not in keys or key not in run.outputs:
            continue
        try:
            compare.assert_close(run.outputs[key], compare.expected(case, decl).out, case=case, decl=decl)
        except ClauseViolation as exc:
            out[key] = str(exc).strip().splitlines()[0]
    return out


def compare_on(meta: dict, recorded: dict[str, np.ndarray], run: Run, decl, changes: list[str] | None) -> Comparison:
    """:func:`compare_run`, told whose machine the recording is (``changes``: machine.machine_changes
    of the recorded record and this run's). The same machine, or a recording without the record:
    what moved fails, as :func:`compare_run` says. Another machine (another CPU, capability level,
    BLAS core type or library build): the figures that moved are reported as moved on another
    machine, and fail only for the cases whose output now lies beyond the error model, which fails
    on any machine."""
    drift_rows, stat_rows, notes = _moved(meta, recorded, run)
    line = machine_line(changes)
    if not changes:
        return Comparison(_parts(drift_rows, stat_rows, notes), [], line)
    keys = {r[0] for r in drift_rows}
    worse = {r[0] for r in stat_rows}
    keys |= {k for k in run.outputs if k.rsplit("/", 1)[1] in worse}
    beyond = beyond_model(run, decl, keys)
    problems = []
    if beyond:  # these fail on any machine: the oracle's judgement, then how far they moved
        failed = {k.rsplit("/", 1)[1] for k in beyond}
        problems.append(
            "moved on another machine and beyond the error model (the conformance allowance):\n"
            + _table(("case", "the oracle's judgement"), sorted(beyond.items()))
        )
        problems += _parts([r for r in drift_rows if r[0] in beyond], [r for r in stat_rows if r[0] in failed], [])
        drift_rows = [r for r in drift_rows if r[0] not in beyond]
        stat_rows = [r for r in stat_rows if r[0] not in failed]
    stale = [x for x in notes if "inputs differ" in x]
    if stale:
        problems.append("notes:\n  " + "\n  ".join(stale))
    moved = [f"moved on another machine (within the error model): {p}" for p in _parts(drift_rows, stat_rows, [])]
    rest = [x for x in notes if x not in stale]
    if moved and rest:
        moved.append("notes:\n  " + "\n  ".join(rest))
    return Comparison(problems, moved, line)
