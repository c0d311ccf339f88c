"""Failure messages: one format for every clause, so a failure reads the same everywhere.

The clause reports *what* it measured; the pytest plugin adds the clause id, the spec sentence and
the reproduce command around it. A message always carries the case (shapes, dtype, seed), the
measured and the allowed error, and where the worst element is.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from conformance.contract import Case

# The words that mark a clause the kernel refused as a measured capability (a transform it has no rule for):
# the verdict lists such clauses apart from those not applicable by declaration (harness.records.verdict).
MEASURED_CAPABILITY = "a measured capability"


class ClauseViolation(AssertionError):
    """A kernel did not do what a clause requires. ``case`` is the input that shows it.

    ``measure`` holds the numbers of the mismatch report the message carries (``mismatch_report``):
    part of what ``harness.causes.likely`` groups failures by. None for a violation that is not a numeric
    comparison. ``compared`` holds the arrays of that comparison (``what``, ``actual``, ``expected``,
    ``allowed``), from which the certificate draws the failing case (``harness.causes.picture``); a
    violation raised without a mismatch report may pass its own, and one whose message quotes an
    earlier violation or report (a clause summing up several) takes the arrays of the first it quotes.
    ``call`` names the guarded call that showed it ("forward", "vjp", ...) where the clause knows it and
    the call may no longer be among the adapter's recent ones (a clause that checks many cases before it
    reports); None: the last call on ``case`` says.
    """

    def __init__(
        self, message: str, case: Case | None = None, compared: dict | None = None, *, call: str | None = None
    ):
        self.case = case
        self.call = call
        self.measure, claimed = _claim_measure(str(message))
        self.compared = compared if compared is not None else claimed or _quoted(str(message))
        if compared is not None:
            _SEEN.append((str(message).split("\n", 1)[0], compared))
        text = message if case is None else f"{message}\n  case: {case.describe()}"
        super().__init__(text)


class AdapterError(ClauseViolation):
    """The adapter misbehaved (raised, hung, returned garbage, touched its inputs)."""


# The last mismatch report's (first line, numbers, arrays compared): a violation whose message carries
# that report claims them, so every clause that raises with a report gets them without passing them.
_LAST: list[tuple[str, dict, dict]] = []


def _claim_measure(message: str) -> tuple[dict | None, dict | None]:
    if _LAST and _LAST[0][0] in message:
        _, measure, compared = _LAST.pop()
        return measure, compared
    return None, None


# The arrays of the last few failed comparisons, by the first line of their report or violation: a
# clause that sums up several failures in one message (the covering array's rows, the golden
# fixtures) quotes those lines, and its violation is drawn from the first one quoted.
_SEEN: deque[tuple[str, dict]] = deque(maxlen=16)


def _quoted(message: str) -> dict | None:
    found = [(message.find(line), compared) for line, compared in _SEEN if line and line in message]
    return min(found, key=lambda f: f[0])[1] if found else None


def fail(message: str, case: Case | None = None) -> None:
    raise ClauseViolation(message, case)


def check(condition: bool, message: str, case: Case | None = None) -> None:
    if not condition:
        raise ClauseViolation(message, case)


def _fmt_index(idx: tuple[int, ...]) -> str:
    return "[" + ",".join(str(int(i)) for i in idx) + "]"


def abs_error(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|actual - expected| in float64, NaN-aware: 0 where both are NaN (NaN matches NaN), inf where
    only one is (or where inf meets inf of the other sign). The one definition of "how far apart"
    for every comparison: clause failures, baseline drift, hypothesis' targeting."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
    err = np.where(np.isnan(a) & np.isnan(e), 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def mismatch_report(
    what: str,
    actual: np.ndarray,
    expected: np.ndarray,
    allowed: np.ndarray,
    rule: str,
) -> str | None:
    """None when every |actual - expected| <= allowed (NaN matches NaN); else a readable report.

    The report counts mismatches, and gives the worst absolute and relative error with its index,
    the values there, and the allowance there: enough to tell a rounding slip from a wrong formula.
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    allowed = np.broadcast_to(np.asarray(allowed, dtype=np.float64), e.shape)
    if a.shape != e.shape:
        return f"{what}.shape={a.shape}, but should be {e.shape}"
    err = abs_error(a, e)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = err > allowed
        if not bad.any():
            return None
        rel = err / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
    n_bad = int(bad.sum())
    worst = np.unravel_index(int(np.argmax(np.where(bad, err / np.maximum(allowed, 1e-300), -1))), e.shape)
    worst_abs = np.unravel_index(int(np.argmax(err)), e.shape)
    lines = [
        f"{what}: {n_bad} of {e.size} elements ({100.0 * n_bad / e.size:.3g}%) exceed the allowed error",
        f"  worst (by ratio) at {_fmt_index(worst)}: got {float(a[worst])!r}, expected {float(e[worst])!r}, "
        f"|err|={err[worst]:.3g} > allowed {allowed[worst]:.3g}",
        f"  greatest absolute error {float(err[worst_abs]):.3g} at {_fmt_index(worst_abs)}; "
        f"greatest relative error {float(np.max(np.where(np.isfinite(rel), rel, np.inf))):.3g}",
    ]
    n_nan = int((np.isnan(a) & ~np.isnan(e)).sum())
    if n_nan:
        lines.append(f"  {n_nan} NaN where a number was expected")
    lines.append(f"  rule: {rule}")
    scale = float(np.mean(np.abs(e[np.isfinite(e)]))) if np.isfinite(e).any() else 0.0
    at = max(abs(float(e[worst])), scale) if np.isfinite(e[worst]) else scale
    measure = {
        "what": what,
        "bad": n_bad,
        "size": int(e.size),
        "nan": n_nan,
        "err": float(err[worst]),
        "expected": float(e[worst]),
        "got": float(a[worst]),
        "allowed": float(allowed[worst]),
        "rel_err": float(err[worst]) / at if at > 0 else None,
        "max_abs_err": float(err[worst_abs]),
    }
    compared = {"what": what, "actual": a, "expected": e, "allowed": allowed}
    _LAST[:] = [(lines[0], measure, compared)]
    _SEEN.append((lines[0], compared))
    return "\n".join(lines)
