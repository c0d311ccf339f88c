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

import numpy as np

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import cast, random_case, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import fail

LAYOUT = Source("003", "工程实现", "若结果异常，先核对实际 backend 和输入布局，再看 kernel 本身。")
CHECK_GRADS = Source(
    "003",
    "工程实现",
    "验证时应固定 B、h、T_q、T_k、d、dtype、is_causal，分别检查输出容差、反向梯度、峰值显存和延迟。",
)
GRAD_RULE = (
    "per element, max(first-order bound of a FlashAttention-style backward, 2 x spread of the "
    "same-precision backward ensemble) (harness.judge.tolerance.grad_bound)"
)


def _needs_grad(impl: GuardedAdapter) -> None:
    if not impl.declaration.grad:
        impl.not_applicable("declares grad=False")


def projection_view(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` [B, H, L, D] as a view of a [B, L, H, D] array (the layout a projection
    writes and a caller transposes): same values, not C-contiguous."""
    view = np.swapaxes(np.ascontiguousarray(np.swapaxes(x, 1, 2)), 1, 2)
    assert np.array_equal(view, x) and not view.flags.c_contiguous
    return view


def reversed_view(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` as a view with a negative stride along the sequence axis."""
    view = np.ascontiguousarray(x[:, :, ::-1])[:, :, ::-1]
    assert np.array_equal(view, x) and not view.flags.c_contiguous
    return view


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
    _needs_grad(impl)
    # GRAD-VJP-01's plain Dk == Dv shape: a kernel compiling per shape has built its backward already.
    case = random_case(1300, B=2, Hq=2, T=5, S=7, Dk=8, dtype=dtype, label="backward layouts")
    impl.require(case)
    grad_out = random_case(1301, dtype=dtype, B=case.B, Hq=case.Hq, T=case.T, S=1, Dk=case.Dv).query
    views = (
        ("projection-layout Q, K, V and dO", projection_view, projection_view),
        ("contiguous Q, K, V with a reversed dO", lambda x: x, reversed_view),
        ("reversed Q, K, V with a projection-layout dO", reversed_view, projection_view),
    )
    for label, inputs, cotangent in views:
        viewed = case.replace(
            query=inputs(case.query), key=inputs(case.key), value=inputs(case.value), label=f"backward: {label}"
        )
        try:
            compare.assert_vjp_matches(impl, viewed, cotangent(grad_out))
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
    _needs_grad(impl)
    case = _group_of_8(dtype)
    if not impl.supports(case):  # a causal-free kernel still has a group-of-8 backward to check
        case = case.replace(is_causal=False, label="GQA 16:2 (8 query heads per kv head)")
    impl.require(case)
    grad_out = cast(rng_for(1311).standard_normal(case.out_shape), dtype)
    compare.assert_vjp_matches(impl, case, grad_out)
