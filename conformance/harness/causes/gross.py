"""Wrong values, not rounding: how bad one failing case is, and whether it is past any rounding.

A failure of a few allowances and one of 1e30 are different bugs; a summary that reports the median
of a cause's errors hides the second behind the first. :func:`severity` orders failing cases (error
over allowance, a NaN or infinity where a number was expected counting as infinite), so that a clause
test keeps its worst case (``harness.run.worst_case``); :func:`is_gross` says when an error is past
anything a precision explains: O(1) relative error, a NaN or infinity where a number was expected, or
more than :data:`GROSS_RATIO` times the allowance while also more than :data:`LOWEST_PRECISION_REL`
relative (16 bfloat16 unit roundoffs: float64 computed in float32, or float32 products in TF32 or
bfloat16, are far off their own allowance and still rounding). ``harness.causes.likely`` explains
those failures first, as causes of their own ("wrong values, not rounding").
"""

from __future__ import annotations

import math
from typing import Any

GROSS_REL = 0.5  # relative error from which a wrong output is wrong, whatever the dtype (bfloat16's u is 2^-8)
GROSS_RATIO = 1e3  # error / allowance past which the declared precision does not explain it ...
LOWEST_PRECISION_REL = 2.0**-4  # ... nor, past this relative error, any precision a kernel computes in
WRONG_VALUES = "wrong values, not rounding"


def _num(x: Any) -> float | None:
    """A measure's number (records cross JSON, where inf and NaN travel as strings)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def ratio(measure: dict | None) -> float:
    """Error over allowance at the worst element; infinite for a NaN or infinity where a number was expected."""
    if not measure:
        return 0.0
    if measure.get("nan"):
        return math.inf
    got, err, allowed = (_num(measure.get(k)) for k in ("got", "err", "allowed"))
    if (got is not None and math.isinf(got)) or (err is not None and math.isinf(err)):
        return math.inf
    if err is None or allowed is None:
        return 0.0
    if allowed <= 0:
        return math.inf if err > 0 else 0.0
    return err / allowed


def severity(record: dict) -> tuple[int, float, float]:
    """Sort key of a failing clause test's record (``harness.causes.record``): gross first, then by ratio."""
    m = record.get("measure")
    rel = _num((m or {}).get("rel_err")) or 0.0
    return (int(is_gross(record)), ratio(m), rel)


def non_finite(measure: dict | None) -> bool:
    """A NaN or an infinity in the output where the oracle's answer is a number."""
    if not measure:
        return False
    got = _num(measure.get("got"))
    return bool(measure.get("nan")) or (got is not None and math.isinf(got))


def is_gross(record: dict) -> bool:
    """Whether the record's error is past rounding (see the module docstring)."""
    m = record.get("measure")
    if not m:
        return False
    rel = _num(m.get("rel_err")) or 0.0
    return non_finite(m) or rel >= GROSS_REL or (ratio(m) > GROSS_RATIO and rel > LOWEST_PRECISION_REL)


def describe(record: dict) -> str:
    """One failing case in words: what was compared, got vs expected, relative error and allowances, the case."""
    m = record.get("measure") or {}
    parts = [str(m.get("what", "output"))]
    got, want, rel = (_num(m.get(k)) for k in ("got", "expected", "rel_err"))
    if m.get("nan"):
        parts.append(f"{m['nan']} NaN where a number was expected")
    if got is not None and want is not None:
        parts.append(f"got {got:.4g}, expected {want:.4g}")
    r = ratio(m)
    parts.append(
        (f"relative error {rel:.3g}, " if rel is not None else "")
        + ("a non-finite error" if math.isinf(r) else f"{r:.3g}x allowed")
    )
    text = "; ".join(parts)
    return text + (f"; case: {record['case']}" if record.get("case") else "")
