"""What one clause test records for ``harness.causes.likely``: the ``case_features`` of a passing test, or
the ``failure`` of a failing one (the failing case's features, the guarded call it went through, the
measured error and the conventions its output matches). Runs in ``runstate.clause_result`` for every
clause test, so a passing test only copies a capped counter and a failing one costs a few oracle
calls (``harness.causes.conventions``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.harness.cases import features as cf

FAILING = ("failed", "expected failure")
MESSAGE_CHARS = 2000  # the start of the failure's message: what a known cause that raises is matched on


def _violation(exc: BaseException | None) -> BaseException | None:
    """The exception that carries the case: a group's first member that has one (hypothesis reports
    several distinct failures as a group; the shrunk example's exception is the one pytest sees)."""
    if isinstance(exc, BaseExceptionGroup):
        members = [_violation(e) for e in exc.exceptions]
        return next((e for e in members if getattr(e, "case", None) is not None), members[0] if members else None)
    return exc


def _output_of(what: str, result: Any) -> np.ndarray | None:
    if what == "vjp" or result is None:
        return None
    return result[0] if isinstance(result, tuple) else result


def _described(case: Any) -> str | None:
    try:
        return None if case is None else str(case.describe())
    except Exception:  # noqa: BLE001 - a malformed case (a bad-input clause's) has no description
        return None


def _json_number(x: Any) -> Any:
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x


def failing_call(impl: Any, exc: BaseException | None) -> tuple | None:
    """The guarded call (``GuardedAdapter.recent_calls`` entry: case, call, features, result) a failure
    judged: the last call when it observed the violation's case through the V = I probe
    (``calls.probes``: the weights a weight check judged), else the last call on the violation's own
    case, else on a probe of it; for a violation without a case, the last call."""
    exc = _violation(exc)
    case = getattr(exc, "case", None)
    recent = list(getattr(impl, "recent_calls", ()))
    if case is None or not recent:
        return recent[-1] if recent else None
    if _probe_of(recent[-1][0], case):
        return recent[-1]
    own = next((e for e in reversed(recent) if e[0] is case), None)
    return own or next((e for e in reversed(recent) if _probe_of(e[0], case)), None)


def _probe_of(called: Any, case: Any) -> bool:
    """Whether ``called`` is a V = I probe of ``case`` (the same Q object, or labelled so)."""
    if called is case:
        return False
    label = str(getattr(called, "label", ""))
    same_q = getattr(called, "query", None) is getattr(case, "query", False)
    return same_q or ("V=I probe" in label and label.startswith(str(getattr(case, "label", ""))))


def failure_record(impl: Any, exc: BaseException | None) -> dict:
    """What a failing clause test tells about its cause (JSON-sized): the failing case's features,
    the call, the measured error and the matching conventions."""
    from conformance.harness.causes import blocked_weight, gross, picture
    from conformance.harness.causes import conventions as conv

    entry = failing_call(impl, exc)
    exc = _violation(exc)
    case = getattr(exc, "case", None)
    if case is None and entry is not None:
        case = entry[0]
    call = entry[1] if entry else (getattr(exc, "call", None) or "forward")
    feats = entry[2] if entry and entry[0] is case and entry[2] else None
    if feats is None and case is not None:
        feats = cf.key(case, call, alignment=impl.declaration.causal_alignment)
    measure = getattr(exc, "measure", None)
    matches: list[str] = []
    checked = False
    out = _output_of(call, entry[3]) if entry else None
    decl = impl.declaration
    leak = None
    if out is not None and conv.checkable(entry[0], out):
        try:
            matches = conv.matching_conventions(entry[0], out, decl)
            checked = True
            if measure is None:
                measure = conv.output_measure(entry[0], out, decl)
            leak = blocked_weight.measure(entry[0], out, decl)
        except Exception:  # noqa: BLE001 - a cause we cannot measure still has its features
            pass
    within = measure is not None and not measure.get("nan") and gross.ratio(measure) <= 1.0
    if within:  # the output is right by the error model: no precision or convention explains what failed
        matches = []
    if leak is not None:  # tested before any precision hypothesis: a small error that this explains is no rounding
        feats = cf.JOIN.join([f for f in (feats or "").split(cf.JOIN) if f] + [blocked_weight.BLOCKED_WEIGHT])
        matches = [m for m in matches if not m.startswith("float64_computed_as")]
    return {
        "features": feats,
        "call": call,
        "case": _described(case),
        "error": type(exc).__name__ if exc is not None else None,
        "message": str(exc)[:MESSAGE_CHARS] if exc is not None else None,
        "dtype": getattr(case, "dtype", None),
        "measure": {k: _json_number(v) for k, v in measure.items()} if measure else None,
        "blocked_weight": leak,
        "matches": matches,
        "checked": checked,
        # The failing output is within the allowance: the clause's own rule failed (a bitwise claim, a count, a
        # structure), not the error model, so no formulation is offered for it (harness.causes.formulations).
        "within_allowance": within,
        "picture": picture.record(exc, decl),  # the failing case drawn in the certificate and the matrix
    }


def record_fields(impl: Any, outcome: str, excinfo: Any = None) -> dict:
    """The ``case_features`` / ``failure`` fields of a ClauseResult (``runstate.clause_result``)."""
    if impl is None or not hasattr(impl, "case_features"):
        return {}
    if outcome == "passed":
        return {"case_features": cf.cap(impl.case_features.items())}
    if outcome in FAILING and excinfo is not None:
        worst = getattr(impl, "worst_failure", None)  # harness.run.worst_case: the worst of its failing cases
        if worst is not None:
            return {"failure": worst}
        try:
            return {"failure": failure_record(impl, getattr(excinfo, "value", None))}
        except Exception as exc:  # noqa: BLE001 - the record is informative; the run must go on
            return {"failure": {"features": None, "call": None, "note": f"not recorded: {type(exc).__name__}: {exc}"}}
    return {}
