"""Comparisons against the oracle, in the conventions the kernel declared, under the error model.

The oracle's answer depends on the case *and* on the declared conventions (all-blocked policy,
causal alignment); both are part of the cache key, and so is the rule dtype. Caching matters
because many clauses (and every adapter in a matrix run) ask the same case: the float64 forward,
the same-precision ensemble (``harness.ensemble``) and the first-order bound (``harness.tolerance``)
are computed once per case per process.

The allowances are functions of the *case* (and declaration), never of the kernel's answer:
:func:`output_allowance`, :func:`weights_allowance` and :func:`grad_allowance` give them per
element for clauses that compare something other than a plain output (sums, differences of two
outputs, dropout-scaled weights).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from conformance import oracle, oracle_variants
from conformance.contract import Case, Declaration
from conformance.harness import ensemble, tolerance
from conformance.harness.guarded import GuardedAdapter
from conformance.harness.probes import observe_weights, probe_case
from conformance.harness.report import ClauseViolation, mismatch_report

_CACHE: OrderedDict[tuple, object] = OrderedDict()
_CACHE_SIZE = 512
_DEFAULT = Declaration()
Observer = Callable[[str, Case, np.ndarray, np.ndarray, np.ndarray], None]
_OBSERVERS: list[Observer] = []


@contextmanager
def observing(fn: Observer) -> Iterator[None]:
    """Call ``fn(what, case, actual, want, allowed)`` on every comparison made inside the block.

    For measurement (scripts/tolerance_report.py sizes the model against honest kernels with it);
    clauses never need it.
    """
    _OBSERVERS.append(fn)
    try:
        yield
    finally:
        _OBSERVERS.remove(fn)


def _mismatch(what: str, actual, want, allowed: np.ndarray, rule: str, case: Case) -> str | None:
    for fn in _OBSERVERS:
        fn(what, case, np.asarray(actual, dtype=np.float64), np.asarray(want, dtype=np.float64), allowed)
    return mismatch_report(what, actual, want, allowed, rule)


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
    if case.has_variant:
        slopes = None if case.alibi_slopes is None else np.asarray(case.alibi_slopes, dtype=np.float64)
        lens = [None if x is None else np.asarray(x).tolist() for x in (case.seqlens_q, case.seqlens_k)]
        h.update(repr((case.window, case.softcap, None if slopes is None else slopes.tolist(), lens)).encode())
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


def _conventions(case: Case, decl: Declaration) -> dict:
    return {"all_blocked": decl.all_blocked_policy(case), "causal_alignment": decl.causal_alignment}


def _work_dtype(case: Case, decl: Declaration) -> str | None:
    return "float32" if decl.tolerance_dtype(case) == "float32" else None


def expected(case: Case, decl: Declaration) -> oracle.Forward:
    """The oracle's forward for ``case`` under ``decl``'s conventions (a variant case: the variant
    oracle's, whose result also carries the lse)."""
    fwd = oracle_variants.forward if case.has_variant else oracle.forward
    return _cached("fwd", case, decl, lambda: fwd(case, **_conventions(case, decl)))


def _lowered(case: Case, decl: Declaration) -> Case:
    """A variant case's allowances are those of the base case that means the same in float64
    (oracle_variants.lower: window -> mask, ALiBi and the softcap's change of each score -> bias);
    the model is then conservative where a kernel keeps ALiBi or the cap in float32."""
    return oracle_variants.lower(case, decl.causal_alignment)


def _row_model(case: Case, decl: Declaration) -> tolerance.RowModel:
    def compute():
        prec = tolerance.precision(case.dtype, decl.tolerance_dtype(case))
        return tolerance.row_model(case, expected(case, decl), prec)

    return _cached("rows", case, decl, compute)


def _output_bound(case: Case, decl: Declaration) -> np.ndarray:
    return _cached(
        "obound", case, decl, lambda: tolerance.forward_bound(case, expected(case, decl), _row_model(case, decl))
    )


def output_allowance(case: Case, decl: Declaration | None = None) -> np.ndarray:
    """Per-element allowance for the output of ``case``: max(first-order bound, 2 x ensemble spread)."""
    decl = decl or _DEFAULT
    if case.has_variant:
        return output_allowance(_lowered(case, decl), decl)

    def compute():
        members = ensemble.forward_members(case, work_dtype=_work_dtype(case, decl), **_conventions(case, decl))
        spread = tolerance.ensemble_error(list(members.values()), expected(case, decl).out)
        return tolerance.combine(_output_bound(case, decl), spread)

    return _cached("oallow", case, decl, compute)


def weights_allowance(case: Case, decl: Declaration | None = None) -> np.ndarray:
    """Per-element allowance for the weights of ``case`` as observed (own weights or the V = I probe)."""
    decl = decl or _DEFAULT
    if case.has_variant:
        return weights_allowance(_lowered(case, decl), decl)

    def compute():
        probe = probe_case(case)
        members = ensemble.forward_members(probe, work_dtype=_work_dtype(case, decl), **_conventions(case, decl))
        want = expected(case, decl).weights
        spread = tolerance.ensemble_error([m[..., : case.S] for m in members.values()], want)
        return tolerance.combine(tolerance.weights_bound(_row_model(case, decl)), spread)

    return _cached("wallow", case, decl, compute)


def grad_allowance(
    case: Case, grad_out: np.ndarray, decl: Declaration | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-element allowances for (dQ, dK, dV) of ``case`` with cotangent ``grad_out``."""
    decl = decl or _DEFAULT
    if case.has_variant:
        return grad_allowance(_lowered_for_grad(case, decl), grad_out, decl)

    def compute():
        fwd = expected(case, decl)
        want = expected_vjp(case, grad_out, decl)
        bounds = tolerance.grad_bound(case, fwd, _row_model(case, decl), _output_bound(case, decl), grad_out)
        members = ensemble.backward_members(
            case, grad_out, work_dtype=_work_dtype(case, decl), **_conventions(case, decl)
        )
        return tuple(
            tolerance.combine(b, tolerance.ensemble_error([m[i] for m in members.values()], want[i]))
            for i, b in enumerate(bounds)
        )

    return _cached("gallow:" + _digest(grad_out), case, decl, compute)


def _lowered_for_grad(case: Case, decl: Declaration) -> Case:
    """Window and ALiBi do not depend on Q and K, so the lowered case has the same VJP; the softcap
    does (its derivative 1 - tanh^2 scales dS), and no oracle VJP for it exists yet."""
    if case.softcap:
        raise ValueError(f"no oracle VJP for softcap cases yet: {case.describe()}")
    return _lowered(case, decl)


def _digest(a: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()


def expected_vjp(case: Case, grad_out: np.ndarray, decl: Declaration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The oracle's (dQ, dK, dV) for ``case`` and cotangent ``grad_out`` under ``decl``'s conventions."""
    if case.has_variant:
        return expected_vjp(_lowered_for_grad(case, decl), grad_out, decl)
    return _cached(
        "vjp:" + _digest(grad_out), case, decl, lambda: oracle.vjp(case, grad_out, **_conventions(case, decl))
    )


def _must_be_finite(allowed: np.ndarray) -> np.ndarray:
    """An unbounded allowance (ill-conditioned element) still demands a finite answer where the
    oracle's is finite: inf becomes the largest float, which NaN and inf errors exceed."""
    return np.where(np.isfinite(allowed), allowed, np.finfo(np.float64).max)


def _rule(case: Case, decl: Declaration, what: str) -> str:
    rule_dtype = decl.tolerance_dtype(case)
    rule = tolerance.describe(rule_dtype, what)
    if rule_dtype != case.dtype:
        rule += f" (the kernel declares float64 computed as {rule_dtype})"
    return rule


def assert_close(
    actual: np.ndarray, want: np.ndarray, *, case: Case, decl: Declaration | None = None, what: str = "output"
) -> None:
    """Fail with a mismatch report unless ``actual`` is within the output allowance of ``case``.

    Shaped like ``torch.testing.assert_close(actual, expected, *, ...)``: the two arrays first, the
    context by keyword; hidden from pytest's traceback, so a failure points at the clause's line.

    ``want`` is the float64 answer for ``case`` (the oracle's, a stored fixture's, the blocked
    oracle's); the allowance depends on the case and ``decl`` (its conventions and rule dtype,
    ``Declaration.tolerance_dtype``); without ``decl``, the spec's conventions and the case's dtype.
    """
    __tracebackhide__ = True
    decl = decl or _DEFAULT
    allowed = _must_be_finite(output_allowance(case, decl))
    msg = _mismatch(what, actual, want, allowed, _rule(case, decl, "output"), case)
    if msg:
        raise ClauseViolation(msg, case)


def assert_output_matches(impl: GuardedAdapter, case: Case) -> np.ndarray:
    """Run the kernel on ``case`` and compare its output with the oracle; returns the output."""
    __tracebackhide__ = True
    out = impl.forward(case)
    decl = impl.declaration
    assert_close(out, expected(case, decl).out, case=case, decl=decl)
    return out


def assert_blocked_zero(w: np.ndarray, blocked: np.ndarray, case: Case, context: str = "") -> None:
    """Blocked positions carry weight exactly 0: what -inf gives, and what no finite fill does."""
    __tracebackhide__ = True
    leaked = blocked & (w != 0)
    if leaked.any():
        idx = tuple(int(i) for i in np.argwhere(leaked)[0])
        raise ClauseViolation(
            f"{int(leaked.sum())} blocked positions have nonzero weight{context} (True = blocked); "
            f"first at [b,h,t,s]={list(idx)}: weight {w[idx]:.6g}, should be exactly 0",
            case,
        )


def assert_weights_match(impl: GuardedAdapter, case: Case, what: str = "weights") -> np.ndarray:
    """Observed weights equal the oracle's: exactly zero where blocked, renormalised elsewhere.

    Rows whose keys are all blocked are left to ALL-BLOCKED-02 (their fill is a declared policy).
    Visible weights of an ill-conditioned row (|scores| so large that u*|s| >= 1) have an unbounded
    allowance: the model cannot promise them, but they must still be finite.
    """
    __tracebackhide__ = True
    w = observe_weights(impl, case)
    decl = impl.declaration
    want = expected(case, decl)
    live = ~want.all_blocked
    assert_blocked_zero(w, want.blocked & live[..., None], case)
    allowed = np.where(live[..., None], _must_be_finite(weights_allowance(case, decl)), np.inf)
    msg = _mismatch(what, w, want.weights, allowed, _rule(case, decl, "observed weights"), case)
    if msg:
        sums = w[live].sum(axis=-1)
        raise ClauseViolation(f"{msg}\n  row sums: min {sums.min():.6g}, max {sums.max():.6g} (should be 1)", case)
    return w


def pair_allowance(case: Case, other: Case, decl: Declaration | None = None) -> np.ndarray:
    """The allowance between the kernel's outputs on two cases with the same exact answer: the sum
    of their output allowances (each output may carry one allowance of error, and the triangle
    inequality through the exact answer adds them)."""
    decl = decl or _DEFAULT
    return output_allowance(case, decl) + output_allowance(other, decl)


def assert_outputs_agree(
    why: str,
    out: np.ndarray,
    out_other: np.ndarray,
    allowed: np.ndarray,
    *,
    case: Case,
    decl: Declaration | None = None,
    how: str = "sum of the two cases' allowances",
    other: Case | None = None,
) -> None:
    """Two outputs *of the kernel* that must mean the same agree within ``allowed`` (e.g.
    :func:`pair_allowance`; ``how`` says how it was made). The one check of its kind, for
    :func:`assert_equivalent` and the metamorphic clauses alike: NaN matches NaN, an unbounded
    allowance still demands agreement in finiteness, and the rule is named in the kernel's rule dtype.
    The comparison is reported as ``output (why)``: observers (``observing``) tell it from a
    comparison with the oracle by the parenthesis."""
    __tracebackhide__ = True
    decl = decl or _DEFAULT
    msg = _mismatch(
        f"output ({why})", out, out_other, _must_be_finite(allowed), f"{how}; " + _rule(case, decl, "output"), case
    )
    if msg:
        raise ClauseViolation(msg if other is None else msg + f"\n  the other case: {other.describe()}", case)


def assert_equivalent(impl: GuardedAdapter, case: Case, other: Case, why: str) -> tuple[np.ndarray, np.ndarray]:
    """Two cases that must mean the same thing: each output matches the oracle, and the two outputs
    match each other within the sum of their allowances (each may carry one allowance of error)."""
    __tracebackhide__ = True
    out = assert_output_matches(impl, case)
    out_other = assert_output_matches(impl, other)
    decl = impl.declaration
    assert_outputs_agree(why, out, out_other, pair_allowance(case, other, decl), case=case, decl=decl, other=other)
    return out, out_other


def assert_vjp_matches(impl: GuardedAdapter, case: Case, grad_out: np.ndarray) -> tuple[np.ndarray, ...]:
    """Run the kernel's VJP and compare dQ, dK, dV with the oracle's analytic VJP.

    Non-finite gradients are reported as such first: NaN leaking through the backward pass is the
    failure the spec warns about (000 §8), and it deserves its own sentence.
    """
    __tracebackhide__ = True
    grads = impl.vjp(case, grad_out)
    decl = impl.declaration
    want = expected_vjp(case, grad_out, decl)
    allowances = grad_allowance(case, grad_out, decl)
    for name, got, exp, allowed in zip(("dq", "dk", "dv"), grads, want, allowances):
        g = np.asarray(got, dtype=np.float64)
        bad = ~np.isfinite(g) & np.isfinite(exp)
        if bad.any():
            raise ClauseViolation(
                f"{name} has {int(bad.sum())} non-finite elements where the oracle's gradient is finite "
                "(NaN or inf leaked through the backward pass)",
                case,
            )
        msg = _mismatch(name, g, exp, _must_be_finite(allowed), _rule(case, decl, name), case)
        if msg:
            raise ClauseViolation(msg, case)
    return grads
