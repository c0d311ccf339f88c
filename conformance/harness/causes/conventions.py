"""Which declared convention would make a failing output right: measured, on the failing case.

A failure that a convention explains (float64 computed in float32, causal aligned bottom-right, a
boolean mask of the other sense, rows blocked entirely filled with the mean of V or NaN) is told
from a bug by asking the oracle for the case under that convention and comparing the kernel's own
output with it, under the allowance of the same declaration: only a match within the error model
suggests the ``--declare``. Rows blocked entirely are compared on those rows alone, so another
error elsewhere in the output does not hide the fill (unless it is NaN or inf: a non-finite value
outside those rows is not the fill's), and only the elements where the convention's
answer differs from the declared one count: a case whose candidates coincide there (V = 0, one key)
is no evidence for either. Runs once per failing clause test, on the last
output the kernel returned (``GuardedAdapter.recent_calls``), so it costs a few oracle calls per
failure and nothing when everything passes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from conformance.contract import ALL_BLOCKED_POLICIES, Case, Declaration
from conformance.harness.judge.expected import expected, output_allowance
from conformance.harness.judge.tolerance import UNIT_ROUNDOFF
from conformance.harness.spec.report import abs_error

_BIG = np.finfo(np.float64).max
FINITE_FILL = "finite fill"  # a finding, not a --declare: rows blocked entirely give the unmasked softmax
CAUSAL_IGNORED = "is_causal ignored"  # a finding, not a --declare: the output is that of the case without causal
# A finding too: blocked keys (a mask's, causal's, a -inf of M) get a finite additive fill, so a key scoring
# far above the visible ones keeps its weight; the fills older code uses (float16-era -1e4, -1e9).
FINITE_ADDITIVE = "finite additive fill"
ADDITIVE_FILLS = (-1e4, -1e9)


def _finite_additive(case: Case, decl: Declaration, fill: float) -> Case:
    """``case`` with every blocked key (mask, causal in the declared alignment, -inf of M) given ``fill``
    added to its score instead of -inf, as one additive mask."""
    from conformance.oracle import causal_blocked

    shape = case.weights_shape
    bias = np.zeros(shape) if case.bias is None else np.broadcast_to(np.asarray(case.bias, dtype=np.float64), shape)
    blocked = np.isneginf(bias)
    if case.mask is not None:
        blocked = blocked | np.broadcast_to(np.asarray(case.mask, dtype=bool), shape)
    if case.is_causal:
        blocked = blocked | causal_blocked(case.T, case.S, decl.causal_alignment)
    finite = np.where(np.isneginf(bias), 0.0, bias)
    return case.replace(mask=None, is_causal=False, bias=np.where(blocked, finite + fill, finite))


def _alternatives(case: Case, decl: Declaration) -> Iterator[tuple[str, Case, Declaration, bool | str]]:
    """(``--declare`` text, case, declaration, rows) for each convention the kernel did not declare
    and the case can tell apart; rows: False compares every row, True the rows blocked entirely of
    the case compared with, a string those rows *of the failing case* (its case differs)."""
    if case.dtype == "float64" and decl.float64_computed_as == "float64":
        yield "float64_computed_as=float32", case, decl.replace(float64_computed_as="float32"), False
    if case.is_causal and case.T != case.S:
        other = "bottom-right" if decl.causal_alignment == "top-left" else "top-left"
        yield f"causal_alignment={other}", case, decl.replace(causal_alignment=other), False
    if case.mask is not None and np.asarray(case.mask).dtype == np.bool_:
        sense = "attend" if decl.mask_sense == "blocked" else "blocked"
        yield f"mask_sense={sense}", case.replace(mask=~np.asarray(case.mask)), decl, False
    float_only = case.bias is not None and case.mask is None
    field = "all_blocked_float_mask" if float_only else "all_blocked"
    for policy in ALL_BLOCKED_POLICIES:
        if policy != decl.all_blocked_policy(case):
            yield f"{field}={policy}", case, decl.replace(**{field: policy}), True
    if case.is_causal:
        yield CAUSAL_IGNORED, case.replace(is_causal=False), decl, False
    if case.mask is not None or case.is_causal:  # a finite fill: blocked rows keep the softmax over every key
        yield FINITE_FILL, case.replace(mask=None, is_causal=False), decl, "failing case's rows"
    if case.mask is not None or case.is_causal or (case.bias is not None and np.isneginf(case.bias).any()):
        for fill in ADDITIVE_FILLS:
            yield FINITE_ADDITIVE, _finite_additive(case, decl, fill), decl, False
    from conformance.harness.causes.formulations import alternatives as formulations

    yield from formulations(case, decl)  # the oracle re-run under each formulation not declared


def _matches(
    out: np.ndarray,
    case: Case,
    decl: Declaration,
    rows: bool | str,
    empty: np.ndarray,
    declared: tuple[np.ndarray, np.ndarray, Case],
    own_allowance: bool = True,
) -> bool:
    """``out`` is right under the alternative, judged only where the alternative's answer differs from
    the declared one (``declared``: its answer, allowance and case) by more than the allowance: where the two
    coincide (V = 0 makes the mean of V and zeros one answer; one key makes every alignment one) the
    output is no evidence; one of the same answer and another allowance (float64 computed in float32) is
    judged on every element, as is the same case under another formulation. Each is judged under its own
    allowance, but for ``own_allowance=False`` under the failing case's (a finite fill of -1e9 in an
    additive mask would widen its own by the fill)."""
    want = expected(case, decl)
    same_answer = np.array_equal(want.out, declared[0], equal_nan=True)
    if same_answer and case is not declared[2]:
        return False  # another case with the same answer: nothing tells the two apart
    own = output_allowance(case, decl) if own_allowance else declared[1]
    allowed = np.where(np.isfinite(own), own, _BIG)
    err = abs_error(out, want.out)
    # The same case under another declaration of its arithmetic (a formulation, float64 in float32) differs from
    # the declared answer by rounding only: it is judged on every element.
    everywhere = same_answer or (case is declared[2] and not rows)
    apart = np.ones(err.shape, dtype=bool) if everywhere else abs_error(want.out, declared[0]) > allowed
    if rows:
        empty = np.asarray(want.all_blocked) if rows is True else empty
        apart = apart & np.broadcast_to(np.asarray(empty)[..., None], apart.shape)
    if not apart.any():
        return False
    if rows and not _finite_elsewhere(out, declared[0], empty):
        return False
    return bool(np.all(err[apart] <= allowed[apart])) and (not rows or bool(np.all(err[empty] <= allowed[empty])))


def _finite_elsewhere(out: np.ndarray, declared: np.ndarray, empty: np.ndarray) -> bool:
    """Whether ``out`` is finite outside the rows blocked entirely wherever the declared answer is: a
    convention about those rows (a fill, NaN) says nothing of the others, so a value error there does not
    hide it, but NaN or inf there is not the fill's (a kernel whose whole output is NaN matches no
    convention about its blocked rows)."""
    outside = ~np.broadcast_to(np.asarray(empty, dtype=bool)[..., None], np.shape(out))
    return bool(np.all(np.isfinite(out[outside]) | ~np.isfinite(np.asarray(declared)[outside])))


def known_convention(text: str) -> bool:
    """Whether ``text`` is one of the conventions :func:`matching_conventions` can name."""
    if text in (FINITE_FILL, FINITE_ADDITIVE, CAUSAL_IGNORED):
        return True
    field, _, value = text.partition("=")
    choices = {
        "float64_computed_as": ("float32",),
        "causal_alignment": ("top-left", "bottom-right"),
        "mask_sense": ("attend", "blocked"),
        "all_blocked": ALL_BLOCKED_POLICIES,
        "all_blocked_float_mask": ALL_BLOCKED_POLICIES,
    }
    return value in choices.get(field, ())


def checkable(case: Case, out: np.ndarray | None) -> bool:
    """Whether an output can be set against conventions at all: a plain forward output of the case's
    shape (not a backward, a dropout draw or a variant, which the oracle here cannot re-ask)."""
    return (
        out is not None and np.shape(out) == tuple(case.out_shape) and not case.has_variant and not case.dropout_p > 0
    )


def matching_conventions(case: Case, out: np.ndarray, decl: Declaration) -> list[str]:
    """The ``--declare`` settings under which ``out`` (the kernel's output for ``case``) is right,
    and :data:`FINITE_FILL` when its rows blocked entirely are the softmax over every key,
    :data:`CAUSAL_IGNORED` when the output is the case's without causal."""
    if not checkable(case, out):
        return []
    out = np.asarray(out, dtype=np.float64)
    found = []
    want = expected(case, decl)
    empty = np.asarray(want.all_blocked)
    declared = (np.asarray(want.out, dtype=np.float64), output_allowance(case, decl), case)
    for text, alt_case, alt_decl, rows in _alternatives(case, decl):
        try:
            own = text != FINITE_ADDITIVE
            if text not in found and _matches(out, alt_case, alt_decl, rows, empty, declared, own):
                found.append(text)
        except Exception:  # noqa: BLE001 - an alternative the oracle cannot take suggests nothing
            continue
    return found


def output_measure(case: Case, out: np.ndarray, decl: Declaration) -> dict | None:
    """The worst error of ``out`` against the declared oracle, in the numbers a mismatch report
    carries (``report.mismatch_report``), for a failure whose clause raised without one."""
    out = np.asarray(out, dtype=np.float64)
    if out.shape != tuple(case.out_shape) or case.has_variant or case.dropout_p > 0:
        return None
    want = expected(case, decl).out
    allowed = output_allowance(case, decl)
    err = abs_error(out, want)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(allowed > 0, err / allowed, np.where(err > 0, np.inf, 0.0))
    i = np.unravel_index(int(np.argmax(ratio)), err.shape)
    finite = np.isfinite(want)
    scale = float(np.mean(np.abs(want[finite]))) if finite.any() else 0.0
    at = max(abs(float(want[i])), scale) if np.isfinite(want[i]) else scale
    return {
        "what": "output (measured again)",
        "bad": int((err > allowed).sum()),
        "size": int(err.size),
        "nan": int((np.isnan(out) & ~np.isnan(want)).sum()),
        "err": float(err[i]),
        "expected": float(want[i]),
        "got": float(out[i]),
        "allowed": float(allowed[i]),
        "rel_err": float(err[i]) / at if at > 0 else None,
        "max_abs_err": float(err.max()) if err.size else 0.0,
    }


def in_units(rel_err: float | None, dtype: str) -> str:
    """A relative error in unit roundoffs of ``dtype`` ("1.2 float32 u (2^-24)")."""
    if rel_err is None or not np.isfinite(rel_err):
        return "non-finite"
    u = UNIT_ROUNDOFF[dtype]
    return f"{rel_err / u:.3g} {dtype} u (2^{int(np.log2(u))})"
