"""A kernel's answer is a function of its inputs alone: no state carried from one call to the next.

The formula (000_f3dcd408372d9e02.txt §3) defines Attention(Q, K, V) from Q, K, V and M only. Kernels
break that through state kept between calls: a workspace reused without being zeroed, a result
memoised by shape, a running statistic not reset. One call in isolation looks right; the second
call of the same shape does not. This clause therefore makes the calls in an order that exposes
both kinds (A, B of one shape, then A and B again) and holds every answer to the oracle, and, for
kernels that declare themselves deterministic, each repeat to be bitwise equal to the first.
"""

from __future__ import annotations

import numpy as np

from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import fail

FUNCTION_OF_INPUTS = Source(
    "000",
    "§3 矩阵形式",
    "\\operatorname{Attention}(Q,K,V) = \\operatorname{softmax}\\left(\\frac{QK^T}{\\sqrt{d_k}}+M\\right)V",
)


@clause(
    "SELF-CONSISTENT-01",
    "calls do not influence each other: in the order A, B, A, B (two inputs of one shape) every result matches the oracle, and a deterministic kernel repeats itself bitwise",
    FUNCTION_OF_INPUTS,
    kills=["reused_accumulator", "stale_result_cache"],
)
def test_calls_are_independent(impl, dtype):
    # A kernel compiling per shape gets the palette's T < S shape in the ci profile (harness.cases.buckets).
    shape = dict(dtype=dtype, **buckets.dims(impl, "cross", B=2, Hq=2, T=5, S=7, Dk=8))
    a = random_case(70, label="call order A, B, A, B: case A", **shape)
    b = random_case(71, label="call order A, B, A, B: case B", **shape)
    impl.require(a)
    decl = impl.declaration
    results = []
    for case in (a, b, a, b):
        out = impl.forward(case)
        results.append(np.array(out, copy=True))
    a1, b1, a2, b2 = results
    if np.array_equal(a1, b1, equal_nan=True):
        fail(
            "the second call, on different inputs of the same shape, returned exactly the first call's result "
            "(a result cached by shape, or a stale output buffer)",
            b,
        )
    for i, (case, out) in enumerate(zip((a, b, a, b), results), start=1):
        try:
            compare.assert_close(out, compare.expected(case, decl).out, case=case, decl=decl)
        except AssertionError as exc:
            why = (
                ""
                if i == 1
                else "; the same input agreed or will be checked on its own, so state carried between calls is the likely cause"
            )
            fail(f"call {i} of 4 (order A, B, A, B) disagrees with the oracle{why}:\n{exc}")
    if decl.deterministic:
        for name, first, again, case in (("A", a1, a2, a), ("B", b1, b2, b)):
            if not np.array_equal(first, again, equal_nan=True):
                diff = np.nanmax(np.abs(np.asarray(first, np.float64) - np.asarray(again, np.float64)))
                fail(
                    f"case {name} gave a different result the second time (max |diff| {diff:.3g}) although the kernel "
                    "declares deterministic=True: its output depends on the calls made before it",
                    case,
                )
