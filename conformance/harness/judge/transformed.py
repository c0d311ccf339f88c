"""A case's forward asked under a transform of the framework's (Presentation.transform), judged by the oracle.

The covering array pairs a transform with every other value class (``harness.covering.table.TRANSFORMS``): a
kernel whose forward-mode rule or batching rule goes wrong only with a transposed key, grouped heads or
T != S is right in TRANSFORM-*'s few bases and wrong there. Under forward-mode AD the output and its tangent
along tangents of Q, K and V (one tangent per array object: a query that is the key carries one) are judged
against the oracle's forward and analytic JVP (``harness.judge.transforms``); under vmap the case and a second
one of the same form with other Q, K, V values are stacked, and each item is judged against the oracle; a
backward row under vmap is the VJP under vmap (per-example gradients), each item's gradients against the
oracle's VJP.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.judge import compare, transforms
from conformance.harness.spec.report import ClauseViolation, mismatch_report

QKV = ("query", "key", "value")


def tangents_for(case: Case, seed: int) -> dict[str, np.ndarray]:
    """A standard normal tangent in the case's dtype for each of Q, K, V: one per array object, so that two
    arguments given as one object carry one tangent, as a caller's dual tensor does; along an axis the array
    is broadcast on (stride 0), one value, as the tangent of a broadcast is."""
    rng = rng_for(seed)
    by_object: dict[int, np.ndarray] = {}
    out = {}
    for n in QKV:
        a = getattr(case, n)
        if id(a) not in by_object:  # constant along a stride-0 axis: the tangent of a broadcast is broadcast
            t = cast(rng.standard_normal(np.shape(a)), case.dtype)
            first = tuple(slice(0, 1) if st == 0 else slice(None) for st in np.asarray(a).strides)
            by_object[id(a)] = np.ascontiguousarray(np.broadcast_to(t[first], t.shape))
        out[n] = by_object[id(a)]
    return out


def assert_jvp_matches(impl: GuardedAdapter, case: Case, seed: int) -> None:
    """The output under forward-mode AD and its tangent against the oracle's."""
    __tracebackhide__ = True
    decl = impl.declaration
    tangents = tangents_for(case, seed)
    out, tangent = impl.jvp(case, tangents)
    _, want, allowed = transforms.expected_jvp(case, tangents, decl)
    want_out = compare.expected(case, decl).out  # the declared formulation's, as for a plain call
    compare.assert_close(out, want_out, case=case, decl=decl, what="output under forward-mode AD")
    msg = mismatch_report("tangent of the output along Q, K, V", tangent, want, allowed, transforms.RULE)
    if msg:
        raise ClauseViolation(msg, case)


def assert_vmap_matches(impl: GuardedAdapter, case: Case, second: Case) -> None:
    """``case`` and ``second`` (the same but for Q, K, V's values) under vmap, each item against the oracle."""
    __tracebackhide__ = True
    decl = impl.declaration
    stacked = impl.vmap_forward([case, second])
    for j, c in enumerate((case, second)):
        compare.assert_close(stacked[j], compare.expected(c, decl).out, case=c, decl=decl, what=f"item {j} under vmap")


def assert_vmap_vjp_matches(
    impl: GuardedAdapter, case: Case, second: Case, grad_out: np.ndarray, second_grad: np.ndarray
) -> None:
    """The VJP of ``case`` and ``second`` under vmap (per-example gradients), each item's dQ, dK, dV against
    the oracle's VJP of that item."""
    __tracebackhide__ = True
    decl = impl.declaration
    stacked = impl.vmap_vjp([case, second], [grad_out, second_grad])
    for j, (c, g) in enumerate(((case, grad_out), (second, second_grad))):
        compare.assert_grads_match(tuple(x[j] for x in stacked), c, g, decl, where=f"item {j} under vmap")
