"""Comparisons against the oracle, in the conventions the kernel declared, under the error model.

The assertions a clause makes (``assert_close``, ``assert_output_matches``, ``assert_weights_match``,
``assert_equivalent``, ``assert_outputs_agree``, ``assert_vjp_matches``), each failing with one
mismatch report (``harness.spec.report``). What they compare against, the oracle's answer and the
allowances of the error model, cached per case, is ``harness.judge.expected``; its public names are
re-exported here, where the clauses import them from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from conformance.contract import Case, Declaration
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.judge import tolerance
from conformance.harness.judge.expected import (
    case_key,
    expected,
    expected_bias_grad,
    expected_vjp,
    formulation,
    grad_allowance,
    merged_aliases,
    output_allowance,
    pair_allowance,
    weights_allowance,
)
from conformance.harness.spec.report import ClauseViolation, abs_error, mismatch_report

__all__ = [
    "assert_blocked_zero",
    "assert_close",
    "assert_equivalent",
    "assert_output_matches",
    "assert_outputs_agree",
    "assert_vjp_matches",
    "assert_weights_match",
    "case_key",
    "expected",
    "expected_vjp",
    "formulated",
    "formulation",
    "grad_allowance",
    "observing",
    "output_allowance",
    "pair_allowance",
    "weights_allowance",
]

_DEFAULT = Declaration()
Observer = Callable[[str, Case, np.ndarray, np.ndarray, np.ndarray], None]
_OBSERVERS: list[Observer] = []


@contextmanager
def observing(fn: Observer) -> Iterator[None]:
    """Call ``fn(what, case, actual, want, allowed)`` on every comparison made inside the block.

    For measurement (scripts/tolerance_report.py sizes the model against honest kernels with it)
    and for :func:`aiming`.
    """
    _OBSERVERS.append(fn)
    try:
        yield
    finally:
        _OBSERVERS.remove(fn)


@contextmanager
def aiming(label: str = "error / allowance") -> Iterator[None]:
    """Steer hypothesis towards the largest error/allowance ratio of the comparisons in the block.

    ``target()`` makes the generator mutate the examples that came closest to failing, so a kernel
    whose error grows with some feature is pushed towards the case where it shows.
    """
    from hypothesis import target

    worst = [0.0]

    def observe(what, case, actual, want, allowed) -> None:
        err = abs_error(actual, want)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            ratio = np.where(err == 0, 0.0, err / np.maximum(allowed, 1e-300))
        finite = ratio[np.isfinite(ratio)]
        if finite.size:
            worst[0] = max(worst[0], float(finite.max()))

    with observing(observe):
        yield
    target(min(worst[0], 1e6), label=label)


def _mismatch(what: str, actual, want, allowed: np.ndarray, rule: str, case: Case) -> str | None:
    for fn in _OBSERVERS:
        fn(what, case, np.asarray(actual, dtype=np.float64), np.asarray(want, dtype=np.float64), allowed)
    return mismatch_report(what, actual, want, allowed, rule)


def _must_be_finite(allowed: np.ndarray) -> np.ndarray:
    """An unbounded allowance (ill-conditioned element) still demands a finite answer where the
    oracle's is finite: inf becomes the largest float, which NaN and inf errors exceed. A NaN
    allowance (``pair_allowance`` where a declared formulation's two answers split into NaN and a
    number) stays NaN: that element is not judged."""
    return np.where(np.isinf(allowed), np.finfo(np.float64).max, allowed)


def formulated(case: Case, decl: Declaration) -> bool:
    """True when ``decl`` declares a formulation that changes the oracle's answer for ``case``
    (conformance.oracle_formulations): a clause with an answer of its own (a stored fixture, the
    blocked oracle of a long sequence) then compares with :func:`expected` instead."""
    f = formulation(case, decl)
    return f is not None and f.changes_oracle


def _rule(case: Case, decl: Declaration, what: str) -> str:
    rule_dtype = decl.tolerance_dtype(case)
    rule = tolerance.describe(rule_dtype, what)
    if rule_dtype != case.dtype:
        rule += f" (the kernel declares float64 computed as {rule_dtype})"
    f = formulation(case, decl)
    if f is not None:
        rule += f"; the oracle and the model under the declared formulation ({f.describe()})"
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


def assert_blocked_zero(
    w: np.ndarray, blocked: np.ndarray, case: Case, context: str = "", compared: dict | None = None
) -> None:
    """Blocked positions carry weight exactly 0: what -inf gives, and what no finite fill does.
    ``compared``: the weights comparison this check is part of, kept on the failure for its picture."""
    __tracebackhide__ = True
    leaked = blocked & (w != 0)
    if leaked.any():
        idx = tuple(int(i) for i in np.argwhere(leaked)[0])
        raise ClauseViolation(
            f"{int(leaked.sum())} blocked positions have nonzero weight{context} (True = blocked); "
            f"first at [b,h,t,s]={list(idx)}: weight {w[idx]:.6g}, should be exactly 0",
            case,
            compared,
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
    allowed = np.where(live[..., None], _must_be_finite(weights_allowance(case, decl)), np.inf)
    blocked = want.blocked & live[..., None]
    compared = {"what": what, "actual": w, "expected": want.weights, "allowed": np.where(blocked, 0.0, allowed)}
    assert_blocked_zero(w, blocked, case, compared=compared)
    msg = _mismatch(what, w, want.weights, allowed, _rule(case, decl, "observed weights"), case)
    if msg:
        sums = w[live].sum(axis=-1)
        raise ClauseViolation(f"{msg}\n  row sums: min {sums.min():.6g}, max {sums.max():.6g} (should be 1)", case)
    return w


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
    assert_grads_match(grads, case, grad_out, impl.declaration)
    return grads


def assert_grads_match(grads: tuple, case: Case, grad_out: np.ndarray, decl: Declaration, *, where: str = "") -> None:
    """dQ, dK, dV (and dM fourth, where M asked) a kernel returned for ``case`` and ``grad_out``, against the
    oracle's analytic VJP; ``where`` names how they were asked ("item 1 under vmap")."""
    __tracebackhide__ = True
    want, allowances = merged_aliases(
        case, decl, expected_vjp(case, grad_out, decl), grad_allowance(case, grad_out, decl)
    )
    if len(grads) == 4:  # the additive M asked for its gradient
        exp, allowed = expected_bias_grad(case, grad_out, decl)
        want.append(exp)
        allowances.append(allowed)
    for name, got, exp, allowed in zip(("dq", "dk", "dv", "dbias"), grads, want, allowances):
        if got is None:  # an input that did not ask for its gradient (the guarded call checked who asked)
            continue
        label = f"{name} ({where})" if where else name
        g = np.asarray(got, dtype=np.float64)
        bad = ~np.isfinite(g) & np.isfinite(exp)
        if bad.any():
            raise ClauseViolation(
                f"{label} has {int(bad.sum())} non-finite elements where the oracle's gradient is finite "
                "(NaN or inf leaked through the backward pass)",
                case,
            )
        msg = _mismatch(label, g, exp, _must_be_finite(allowed), _rule(case, decl, name), case)
        if msg:
            raise ClauseViolation(msg, case)
