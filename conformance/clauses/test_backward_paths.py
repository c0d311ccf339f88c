"""Backward paths that the forward clauses never reach: the backward's own reading of memory layouts
(Q, K, V and the output cotangent dO as non-contiguous views) and the backward specialised for a
GQA ratio of 8 with more than one kv head.

A backward kernel is a program of its own: it reloads Q, K and V (with its own stride arguments)
and reads dO, which the forward never sees, and fused backward kernels specialise their dK/dV
reduction over the query heads of a group by the group size. INPUTS-LAYOUT-02 views the inputs of
the forward only, and the drawn gradient cases (GRAD-VJP-SPACE-04) hand over a contiguous dO and
rarely meet 8 query heads per kv head with two kv heads: the held-out kernels of
``tests/mutants_heldout2.py`` that read K or dO as contiguous in the backward only, or sum dK over
a strided group at 8:1, passed every other clause. Each case here is one small shape.
"""

from __future__ import annotations

from conformance.clauses.test_gradients import CHECK_GRADS, GRAD_RULE, cotangent
from conformance.clauses.test_inputs import LAYOUT, projection_view, reversed_view
from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import fail


@clause(
    "GRAD-LAYOUT-07",
    "dQ, dK and dV are the oracle's when Q, K, V and the output cotangent dO are non-contiguous views "
    "([B,T,H,D] storage viewed as [B,H,T,D], a reversed sequence axis): the backward reads strides as the forward does",
    LAYOUT,
    requires=["grad"],
    kills=["grad_key_read_as_contiguous", "grad_out_read_as_contiguous"],
    tolerance=GRAD_RULE,
)
def test_backward_reads_layouts(impl, dtype):
    # GRAD-VJP-01's plain Dk == Dv shape: a kernel compiling per shape has built its backward already.
    case = random_case(1300, B=2, Hq=2, T=5, S=7, Dk=8, dtype=dtype, label="backward layouts")
    impl.require(case)
    d_out = cotangent(case, 1301)
    views = (
        ("projection-layout Q, K, V and dO", projection_view, projection_view),
        ("contiguous Q, K, V with a reversed dO", lambda x: x, reversed_view),
        ("reversed Q, K, V with a projection-layout dO", reversed_view, projection_view),
    )
    # A kernel compiling per shape checks each layout in one dtype (harness.cases.buckets.spread).
    for label, inputs, dout_view in buckets.spread(impl, dtype, views):
        viewed = case.replace(
            query=inputs(case.query), key=inputs(case.key), value=inputs(case.value), label=f"backward: {label}"
        )
        try:
            compare.assert_vjp_matches(impl, viewed, dout_view(d_out))
        except AssertionError as exc:
            fail(f"the backward with {label} disagrees with the oracle:\n{exc}", viewed)


def _group_of_8(dtype: str) -> Case:
    """16 query heads over 2 kv heads (8 per group), causal so that the heads' weights differ in shape too."""
    case = random_case(1310, B=1, Hq=16, Hkv=2, T=3, S=5, Dk=8, dtype=dtype, is_causal=True)
    return case.replace(label="GQA 16:2 (8 query heads per kv head), causal")


@clause(
    "GRAD-GQA-RATIO-08",
    "with 8 query heads per kv head and more than one kv head (16:2), dK and dV of kv head j sum query heads "
    "8j ... 8j + 7 (consecutive heads, not every Hkv-th head)",
    CHECK_GRADS,
    requires=["grad", "gqa"],
    kills=["grad_dk_group8_tiled"],
    tolerance=GRAD_RULE,
)
def test_backward_group_of_8(impl, dtype):
    case = _group_of_8(dtype)
    if not impl.supports(case):  # a causal-free kernel still has a group-of-8 backward to check
        case = case.replace(is_causal=False, label="GQA 16:2 (8 query heads per kv head)")
    impl.require(case)
    compare.assert_vjp_matches(impl, case, cotangent(case, 1311))
