"""The backward on the sizes and combinations its other clauses do not reach: one query (decode), a head
dim past 128, grouped heads under a sliding window, a varlen batch with an empty sequence, and the
gradients a caller holds when the next backward of the same shapes runs.

A backward is a separate program with its own dispatch: a rank-1 path for T == 1, templates for head
dims up to 128, a GQA fold written once per feature, a loop over sequences that stops at an empty one,
a per-shape workspace it returns. Each held-out kernel of round 3 (tests/mutants_heldout3.py) with
one of these bugs kept its forward right and passed every clause. The expected gradients are the
oracle's analytic VJP (the variant oracle's under a window or varlen), with its allowance.
"""

from __future__ import annotations

from conformance.clauses.test_gradients import BACKWARD, numpy_cotangent
from conformance.clauses.test_variants import WINDOW_DEF
from conformance.clauses.test_varlen import CU_SEQLENS, ragged
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.judge.variant_vjp import assert_variant_vjp
from conformance.harness.spec.clause import clause


def _assert_vjp(impl, case) -> None:
    """dQ, dK and dV of ``case`` (a cotangent drawn from its seed) against the oracle's VJP."""
    impl.require(case)
    compare.assert_vjp_matches(impl, case, numpy_cotangent(case, case.seed))


@clause(
    "GRAD-DECODE-09",
    "dQ, dK and dV of a single query (T = 1, decode) are the oracle's",
    BACKWARD,
    requires=["grad"],
    kills=["decode_grad_dq_no_scale"],
)
def test_decode_grad(impl, dtype):
    shape = buckets.dims(impl, "decode", B=2, Hq=2, T=1, S=7, Dk=8)
    _assert_vjp(impl, random_case(1510, dtype=dtype, label="decode backward", **shape))


@clause(
    "GRAD-HEAD-DIM-10",
    "dQ, dK and dV at head dim 160 (past the 128 of common backward templates) are the oracle's, for a "
    "kernel declaring that head dim",
    BACKWARD,
    requires=["grad"],
    kills=["grad_head_dim_over_128_zero"],
)
def test_grad_large_head_dim(impl, dtype):
    _assert_vjp(impl, random_case(1511, B=1, Hq=2, T=3, S=5, Dk=160, dtype=dtype, label="head dim 160 backward"))


@clause(
    "WINDOW-GRAD-GQA-04",
    "dQ, dK and dV under a sliding window with grouped heads (4 query heads over 2 kv heads) are the "
    "oracle's: each kv head's gradient sums its own group's query heads",
    WINDOW_DEF,
    requires=["grad", "window", "gqa"],
    kills=["grad_window_gqa_wrong_group"],
)
def test_window_grad_gqa(impl, dtype):
    case = random_case(1514, B=1, Hq=4, Hkv=2, T=5, S=9, Dk=16, dtype=dtype)
    case = case.replace(window=(2, 1), label="window (2, 1) gradients, GQA 4:2")
    impl.require(case)
    assert_variant_vjp(impl, case, numpy_cotangent(case, 1514), "window (2, 1), GQA 4:2")


@clause(
    "VARLEN-GRAD-EMPTY-08",
    "dQ, dK and dV of a varlen batch with an empty sequence (no queries) and a keyless one are each "
    "sequence's own: the sequences after them get their gradients",
    CU_SEQLENS,
    requires=["grad", "varlen"],
    kills=["varlen_grad_breaks_on_empty"],
)
def test_varlen_grad_empty(impl, dtype):
    case = ragged(1515, dtype, [3, 0, 4, 2], [6, 4, 0, 5], Hq=2, Dk=16)
    impl.require(case)
    words = "varlen seqlens_q=[3, 0, 4, 2] seqlens_k=[6, 4, 0, 5]"
    assert_variant_vjp(impl, case, numpy_cotangent(case, 1515), words)
