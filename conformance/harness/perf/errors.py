"""How close each clause came to its allowance: worst |error| / allowed per clause and dtype.

While a certificate or a perf report is being written, every comparison a clause makes against the
oracle (harness.judge.compare's observer hook) is reduced to one number, the largest ratio of an
element's error to its allowance (1.0 = exactly at the allowance; a pass is at most 1), and kept per
clause test. The chart of these numbers shows which clauses a kernel passes with room to spare and
which it passes narrowly, per dtype: a margin the pass/fail table cannot show.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_CURRENT: dict[str, Any] = {"key": None, "worst": None}


def begin(key: tuple[str, str, str | None] | None) -> None:
    """Start collecting for the clause test ``key`` = (impl spec, clause id, dtype)."""
    _CURRENT["key"], _CURRENT["worst"] = key, None


def end() -> tuple[tuple[str, str, str | None], float] | None:
    """(key, worst ratio) of the test that just ran, or None when it compared nothing."""
    key, worst = _CURRENT["key"], _CURRENT["worst"]
    _CURRENT["key"], _CURRENT["worst"] = None, None
    return (key, worst) if key is not None and worst is not None else None


def ratio(actual: np.ndarray, want: np.ndarray, allowed: np.ndarray) -> float | None:
    """max |actual - want| / allowed over elements where both are finite; None when there are none."""
    a, w = np.asarray(actual, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if a.shape != w.shape:
        return None
    al = np.broadcast_to(np.asarray(allowed, dtype=np.float64), w.shape)
    ok = np.isfinite(a) & np.isfinite(w) & np.isfinite(al)
    if not ok.any():
        return None
    err = np.abs(a[ok] - w[ok])
    lim = al[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(lim > 0, err / np.where(lim > 0, lim, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(r.max())


def observer(what: str, case: Any, actual: np.ndarray, want: np.ndarray, allowed: np.ndarray) -> None:
    """The hook harness.judge.compare calls on each comparison."""
    if _CURRENT["key"] is None:
        return
    r = ratio(actual, want, allowed)
    if r is not None and (_CURRENT["worst"] is None or r > _CURRENT["worst"]):
        _CURRENT["worst"] = r
