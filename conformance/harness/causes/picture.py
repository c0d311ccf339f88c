"""The failing case as numbers a picture can be drawn from: expected, received and |error| / allowed
over one (batch, head) slice of the compared array, with the keys the case blocks.

Why: the bugs users meet most (the mask's sense inverted, causal aligned at the other corner, a mask
broadcast along the wrong axis, a padded key left visible) each have a shape in the weights that is
seen at once beside the expected weights, where the mismatch report has to be read. The record is
taken from the failure itself (``ClauseViolation.compared``, the arrays the clause compared), so it
costs nothing while tests pass and one cached oracle lookup when one fails; it travels with the
clause test's record (``harness.causes.record``) to the certificate and the matrix, xdist workers
included, and is drawn by ``harness.records.heatmap_svg``.

Kept small (JSON, a few kB): at most :data:`MAX_ROWS` x :data:`MAX_COLS` cells, a window around the
worst element when the case is larger, each value to four significant digits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_ROWS = 24
MAX_COLS = 24


def _number(x: float) -> float | str:
    """A JSON value: finite numbers to 4 significant digits, the rest as 'nan', 'inf', '-inf'."""
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(f"{x:.4g}")


def _grid(a: np.ndarray) -> list[list[float | str]]:
    return [[_number(float(x)) for x in row] for row in a]


def _window(n: int, at: int, cap: int) -> tuple[int, int]:
    """[start, stop) of at most ``cap`` indices of ``n`` that contains ``at``, as centred as the edges allow."""
    if n <= cap:
        return 0, n
    start = min(max(at - cap // 2, 0), n - cap)
    return start, start + cap


def _ratio(actual: np.ndarray, expected: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """|error| / allowed per element: 0 where both agree (NaN on NaN included), inf where only one is
    NaN or the allowance is 0 and the error is not."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(actual - expected)
        err = np.where(np.isnan(actual) & np.isnan(expected), 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        return np.where(err == 0, 0.0, err / allowed)


def _slices(a: np.ndarray) -> np.ndarray:
    """``a`` as [slices, rows, cols]: its last two axes per index of the leading ones (a vector: one row)."""
    return a.reshape(-1, *a.shape[-2:]) if a.ndim >= 2 else a.reshape(1, 1, -1)


def _blocked(case: Any, decl: Any) -> np.ndarray | None:
    """[B, Hq, T, S] keys the case blocks under the kernel's conventions (mask, causal, -inf bias)."""
    from conformance.harness.judge.expected import expected

    try:
        return np.asarray(expected(case, decl).blocked, dtype=bool)
    except Exception:  # noqa: BLE001 - a picture without the blocked keys is still a picture
        return None


def record(exc: BaseException | None, decl: Any) -> dict | None:
    """The picture of a failure that carries its comparison (``exc.compared``), or None."""
    try:
        return _record(exc, decl)
    except Exception:  # noqa: BLE001 - the picture is informative; the failure's record must be written
        return None


def _record(exc: BaseException | None, decl: Any) -> dict | None:
    compared = getattr(exc, "compared", None)
    if not compared:
        return None
    actual = np.asarray(compared["actual"], dtype=np.float64)
    expected = np.asarray(compared["expected"], dtype=np.float64)
    if actual.shape != expected.shape or actual.size == 0:
        return None
    allowed = np.broadcast_to(np.asarray(compared["allowed"], dtype=np.float64), expected.shape)
    shape = expected.shape
    ratio = _ratio(actual, expected, allowed)
    r3, a3, e3, l3 = (_slices(x) for x in (ratio, actual, expected, allowed))
    worst = np.unravel_index(int(np.argmax(np.where(np.isnan(r3), np.inf, r3))), r3.shape)
    lead = np.unravel_index(worst[0], shape[:-2]) if len(shape) > 2 else ()
    rows, cols = r3.shape[1:]
    r0, r1 = _window(rows, int(worst[1]), MAX_ROWS)
    c0, c1 = _window(cols, int(worst[2]), MAX_COLS)
    pick = (worst[0], slice(r0, r1), slice(c0, c1))
    case = getattr(exc, "case", None)
    out: dict[str, Any] = {
        "what": str(compared["what"]),
        "shape": [int(n) for n in shape],
        "slice": [int(i) for i in lead],  # the (batch, head) shown
        "rows": [r0, r1],
        "cols": [c0, c1],
        "worst": [int(worst[1]), int(worst[2])],
        "expected": _grid(e3[pick]),
        "received": _grid(a3[pick]),
        "ratio": _grid(r3[pick]),
        "allowed_max": _number(float(np.max(l3[pick]))) if l3[pick].size else None,
        "case": case.describe() if hasattr(case, "describe") else None,
        "case_dtype": getattr(case, "dtype", None),
    }
    blocked = _blocked(case, decl) if case is not None and len(shape) == 4 else None
    if blocked is not None and blocked.ndim == 4 and len(lead) == 2:
        b, h = lead
        keys = blocked[min(b, blocked.shape[0] - 1), min(h, blocked.shape[1] - 1)]
        if "weights" in out["what"] and keys.shape == (rows, cols):  # the weights themselves: marks on the cells
            out["blocked"] = keys[r0:r1, c0:c1].astype(int).tolist()
        elif keys.shape[0] == rows and (out["what"].startswith("output") or out["what"] == "dq"):
            # a row per query (output, dQ): the keys each row may not see, beside it
            k1 = min(keys.shape[1], MAX_COLS)
            out["blocked_keys"] = keys[r0:r1, :k1].astype(int).tolist()
    return out
