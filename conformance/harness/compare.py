"""Comparisons against the oracle, in the conventions the kernel declared.

The oracle's answer depends on the case *and* on the declared conventions (all-blocked policy,
causal alignment); both are part of the cache key. Caching matters because many clauses (and every
adapter in a matrix run) ask the same case: the float64 forward and the emulated reference are
computed once per process.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from conformance import oracle
from conformance.contract import Case, Declaration
from conformance.harness import tolerance
from conformance.harness.impl import Impl
from conformance.harness.probes import observe_weights
from conformance.harness.report import ClauseViolation, mismatch_report

_CACHE: OrderedDict[tuple, object] = OrderedDict()
_CACHE_SIZE = 512


def case_key(case: Case) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in (case.query, case.key, case.value, case.mask, case.bias):
        if a is None:
            h.update(b"-")
        else:
            a = np.ascontiguousarray(a)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
    h.update(repr((case.is_causal, case.scale, case.dropout_p)).encode())
    return h.hexdigest()


def _cached(kind: str, case: Case, decl: Declaration, compute):
    key = (kind, case_key(case), decl.all_blocked_policy(case), decl.causal_alignment, decl.tolerance_dtype(case))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    value = compute()
    _CACHE[key] = value
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def expected(case: Case, decl: Declaration) -> oracle.Forward:
    """The oracle's forward for ``case`` under ``decl``'s conventions."""
    return _cached(
        "fwd", case, decl,
        lambda: oracle.forward(case, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment),
    )


def reference(case: Case, decl: Declaration) -> np.ndarray:
    return _cached(
        "ref", case, decl,
        lambda: oracle.emulate(case, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment,
                               work_dtype="float32" if decl.tolerance_dtype(case) == "float32" else None),
    )


def assert_close(
    what: str,
    actual: np.ndarray,
    want: np.ndarray,
    case: Case,
    ref: np.ndarray | None = None,
    decl: Declaration | None = None,
) -> None:
    """Fail with a mismatch report unless ``actual`` is within the tolerance rule of ``want``.

    ``decl`` selects the rule's dtype (see ``Declaration.tolerance_dtype``); without it, the case's.
    """
    rule_dtype = decl.tolerance_dtype(case) if decl is not None else case.dtype
    allowed, ref_err = tolerance.allowed(want, ref, rule_dtype)
    rule = tolerance.describe(rule_dtype) + f"; ref_err={ref_err:.3g}"
    if rule_dtype != case.dtype:
        rule += f" (the kernel declares float64 computed as {rule_dtype})"
    msg = mismatch_report(what, actual, want, allowed, rule)
    if msg:
        raise ClauseViolation(msg, case)


def assert_output_matches(impl: Impl, case: Case) -> np.ndarray:
    """Run the kernel on ``case`` and compare its output with the oracle; returns the output."""
    out = impl.forward(case)
    decl = impl.declaration
    assert_close("output", out, expected(case, decl).out, case, reference(case, decl), decl)
    return out


def assert_blocked_zero(w: np.ndarray, blocked: np.ndarray, case: Case, context: str = "") -> None:
    """Blocked positions carry weight exactly 0: what -inf gives, and what no finite fill does."""
    leaked = blocked & (w != 0)
    if leaked.any():
        idx = tuple(int(i) for i in np.argwhere(leaked)[0])
        raise ClauseViolation(
            f"{int(leaked.sum())} blocked positions have nonzero weight{context} (True = blocked); "
            f"first at [b,h,t,s]={list(idx)}: weight {w[idx]:.6g}, should be exactly 0",
            case,
        )


def assert_weights_match(impl: Impl, case: Case, what: str = "weights") -> np.ndarray:
    """Observed weights equal the oracle's: exactly zero where blocked, renormalised elsewhere.

    Rows whose keys are all blocked are left to ALL-BLOCKED-02 (their fill is a declared policy).
    """
    w = observe_weights(impl, case)
    want = expected(case, impl.declaration)
    live = ~want.all_blocked
    assert_blocked_zero(w, want.blocked & live[..., None], case)
    rule = impl.declaration.tolerance_dtype(case)
    allowed, _ = tolerance.allowed(want.weights, None, rule)
    allowed = np.where(live[..., None], allowed, np.inf)
    msg = mismatch_report(what, w, want.weights, allowed, tolerance.describe(rule))
    if msg:
        sums = w[live].sum(axis=-1)
        raise ClauseViolation(f"{msg}\n  row sums: min {sums.min():.6g}, max {sums.max():.6g} (should be 1)", case)
    return w


def assert_equivalent(impl: Impl, case: Case, other: Case, why: str) -> tuple[np.ndarray, np.ndarray]:
    """Two cases that must mean the same thing: each output matches the oracle, and the two outputs
    match each other within twice the rule's allowance (each may carry one allowance of error)."""
    out = assert_output_matches(impl, case)
    out_other = assert_output_matches(impl, other)
    decl = impl.declaration
    rule = decl.tolerance_dtype(case)
    allowed, ref_err = tolerance.allowed(expected(case, decl).out, reference(case, decl), rule)
    msg = mismatch_report(f"output ({why})", out, out_other, 2 * allowed,
                          "2 x " + tolerance.describe(rule) + f"; ref_err={ref_err:.3g}")
    if msg:
        raise ClauseViolation(msg + f"\n  the other case: {other.describe()}", case)
    return out, out_other


def assert_vjp_matches(impl: Impl, case: Case, grad_out: np.ndarray) -> tuple[np.ndarray, ...]:
    """Run the kernel's VJP and compare dQ, dK, dV with the oracle's analytic VJP.

    Non-finite gradients are reported as such first: NaN leaking through the backward pass is the
    failure the spec warns about (000 §8), and it deserves its own sentence.
    """
    grads = impl.vjp(case, grad_out)
    decl = impl.declaration
    want = _cached(
        "vjp:" + hashlib.blake2b(np.ascontiguousarray(grad_out).tobytes(), digest_size=16).hexdigest(), case, decl,
        lambda: oracle.vjp(case, grad_out, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment),
    )
    reductions = (case.S, case.T * (case.Hq // case.Hkv), case.T * (case.Hq // case.Hkv))
    for name, got, exp, n in zip(("dq", "dk", "dv"), grads, want, reductions):
        g = np.asarray(got, dtype=np.float64)
        bad = ~np.isfinite(g) & np.isfinite(exp)
        if bad.any():
            raise ClauseViolation(
                f"{name} has {int(bad.sum())} non-finite elements where the oracle's gradient is finite "
                "(NaN or inf leaked through the backward pass)", case)
        rule_dtype = decl.tolerance_dtype(case)
        msg = mismatch_report(name, g, exp, tolerance.grad_allowed(exp, rule_dtype, n),
                              f"gradient rule for {rule_dtype}, reduction length {n} (harness.tolerance.grad_allowed)")
        if msg:
            raise ClauseViolation(msg, case)
    return grads
