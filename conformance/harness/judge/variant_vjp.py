"""A variant case's gradients against the variant oracle's VJP (softcap included), under the error model.

The harness's generic gradient comparison (``compare.assert_vjp_matches``) lowers a variant case to
a base case and uses the base oracle's VJP; that is exact for windows, ALiBi and lengths (they do
not depend on Q and K) but not for the softcap, whose derivative ``1 - tanh(s/c)^2`` scales every
score gradient. Here the expected gradients are :func:`conformance.oracle_variants.vjp`'s, and the
allowance is the lowered case's (the softcap's change of each score held as a constant bias),
plus the rounding of the derivative itself:

* the lowered case's first-order bound and ensemble spread size the products with ``|dS|``
  *before* the factor ``1 - t^2``, which lies in (0, 1]: they are at least those of the softcap's
  smaller score gradients;
* the kernel computes ``t = tanh(s/c)`` and ``1 - t^2`` in its working precision: an absolute
  error of at most ``4 u_w`` on the factor (t relative u_w, its square 2 u_w more, the subtraction
  u_w), i.e. ``4 u_w scale |dS| |K|`` more in dQ and ``4 u_w scale |dS|^T |Q|`` in dK (dV does not
  go through it).
"""

from __future__ import annotations

import numpy as np

from conformance import oracle_variants
from conformance.contract import Case, Declaration
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.judge import compare, tolerance
from conformance.harness.spec.report import ClauseViolation, mismatch_report
from conformance.oracle import expand_kv


def expected_vjp(case: Case, grad_out: np.ndarray, decl: Declaration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The variant oracle's (dQ, dK, dV) under ``decl``'s conventions."""
    return oracle_variants.vjp(
        case, grad_out, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment
    )


def grad_allowance(case: Case, grad_out: np.ndarray, decl: Declaration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-element allowances for (dQ, dK, dV) of a variant case (see the module docstring)."""
    low = oracle_variants.lower(case, decl.causal_alignment)
    dq, dk, dv = compare.grad_allowance(low, grad_out, decl)
    if not case.softcap:
        return dq, dk, dv
    u = tolerance.precision(case.dtype, decl.tolerance_dtype(case)).u_w
    fwd = oracle_variants.forward(
        case, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment
    )
    q = np.abs(np.asarray(case.query, dtype=np.float64))
    k = expand_kv(np.abs(np.asarray(case.key, dtype=np.float64)), case.Hq)
    v = expand_kv(np.asarray(case.value, dtype=np.float64), case.Hq)
    do = np.asarray(grad_out, dtype=np.float64)
    p = np.nan_to_num(fwd.weights)
    dp = np.einsum("bhtd,bhsd->bhts", do, v)
    ds = np.abs(p * (dp - (dp * p).sum(axis=-1, keepdims=True)))  # before the factor 1 - t^2
    scale = abs(case.effective_scale)
    extra_q = 4 * u * scale * np.einsum("bhts,bhsd->bhtd", ds, k)
    extra_k = 4 * u * scale * np.einsum("bhts,bhtd->bhsd", ds, q)
    b, _, s, d = extra_k.shape
    extra_k = extra_k.reshape(b, case.Hkv, case.Hq // case.Hkv, s, d).sum(axis=2)
    return dq + extra_q, dk + extra_k, dv


def assert_variant_vjp(impl: GuardedAdapter, case: Case, grad_out: np.ndarray, words: str = "") -> tuple:
    """The kernel's VJP of a variant case against the variant oracle's; the failure names the variant."""
    __tracebackhide__ = True
    grads = impl.vjp(case, grad_out)
    decl = impl.declaration
    want = expected_vjp(case, grad_out, decl)
    allowed = grad_allowance(case, grad_out, decl)
    rule = tolerance.describe(decl.tolerance_dtype(case), "gradients") + (
        " plus 4 u_w scale |dS||K| (|dS|^T|Q|) for the softcap's derivative (harness.judge.variant_vjp)"
        if case.softcap
        else ""
    )
    for name, got, exp, allow in zip(("dq", "dk", "dv"), grads, want, allowed):
        g = np.asarray(got, dtype=np.float64)
        allow = np.where(np.isfinite(allow), allow, np.finfo(np.float64).max)
        msg = mismatch_report(f"{name}{' under ' + words if words else ''}", g, exp, allow, rule)
        if msg:
            raise ClauseViolation(msg, case)
    return grads
