"""State carried between calls whose cache key is too small: shape-keyed caches of the mask, the
causal flag or the scale, a forward's statistics reused by a later backward, gradient buffers not
zeroed, a workspace typed by the first call, an output buffer handed out twice.

SELF-CONSISTENT-01 alternates two inputs that differ in their values only. Real caches are keyed
by more than the shape and by less than everything: a compiled mask keyed by the mask's shape, a
kernel specialised per (T, S) that forgets is_causal, a scale baked in per head dim. Each of those
answers the *first* call of a key right, and every clause that makes one call per key passes it.
These clauses make calls that share the shapes and differ in exactly what such keys omit, in an
order that puts the stale entry in front of the next call, and hold every answer to the oracle.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_gradients import cotangent
from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import fail

FUNCTION_OF_INPUTS = Source(
    "000",
    "§3 矩阵形式",
    "\\operatorname{Attention}(Q,K,V) = \\operatorname{softmax}\\left(\\frac{QK^T}{\\sqrt{d_k}}+M\\right)V",
)
BACKWARD = Source("003", "逐步推导", "反向传播需要用到 Softmax 输出或等价统计量。")


def _shared_shape_calls(dtype: str) -> list[Case]:
    """Calls of one shape that differ in the mask's contents, is_causal or the scale only."""
    shape = dict(B=2, Hq=2, T=6, S=6, Dk=8, dtype=dtype)
    base = random_case(980, label="state: plain", **shape)
    m1 = random_mask(981, (2, 2, 6, 6), p_blocked=0.5)
    m2 = random_mask(982, (2, 2, 6, 6), p_blocked=0.5)
    return [
        base.replace(mask=m1, label="state: mask 1"),
        base.replace(mask=m2, label="state: mask 2, same shape"),
        base.replace(is_causal=True, label="state: is_causal"),
        base.replace(label="state: plain, after is_causal"),
        base.replace(scale=0.9, label="state: custom scale 0.9"),
        base.replace(scale=0.1, label="state: custom scale 0.1"),
        base.replace(label="state: default scale, after custom"),
        base.replace(mask=m1, label="state: mask 1 again"),
    ]


@clause(
    "STATE-KEYS-01",
    "calls of one shape that differ only in the mask's contents, is_causal or the scale each get their own answer "
    "(no cache keyed by shape; a result a later call changes fails the guarded call, which holds the latest results)",
    FUNCTION_OF_INPUTS,
    kills=[
        "mask_cache_by_shape",
        "causal_flag_cached_by_shape",
        "scale_cached_by_head_dim",
        "returns_persistent_workspace",
        "returns_view_of_arena",
        "call_returns_its_buffer",
    ],
)
def test_cache_keys(impl, dtype):
    cases = [c for c in _shared_shape_calls(dtype) if impl.supports(c)]
    if len(cases) < 2:
        impl.not_applicable("fewer than two of the calls are supported by the declaration")
    for i, case in enumerate(cases, start=1):
        out = impl.forward(case)
        try:
            compare.assert_close(out, compare.expected(case, impl.declaration).out, case=case, decl=impl.declaration)
        except AssertionError as exc:
            before = ", ".join(c.label.removeprefix("state: ") for c in cases[: i - 1]) or "nothing"
            fail(f"call {i} ({case.label}) disagrees with the oracle after the calls [{before}]:\n{exc}")


@clause(
    "STATE-BACKWARD-02",
    "the backward of a case is right whatever ran before it: after the forward of other inputs of the same shape, "
    "and when repeated (no statistics saved by an earlier forward, no gradient buffer left unzeroed)",
    BACKWARD,
    requires=["grad"],
    kills=["backward_uses_saved_forward_stats", "grad_accumulator_not_zeroed", "grad_returns_workspace"],
)
def test_backward_after_other_calls(impl, dtype):
    shape = dict(B=1, Hq=2, T=4, S=5, Dk=8, dtype=dtype)
    a = random_case(985, label="state: case A", **shape)
    b = random_case(986, label="state: case B, same shape", **shape)
    impl.require(a)
    ga, gb = cotangent(a, 987), cotangent(b, 988)
    impl.forward(a)
    impl.forward(b)  # a kernel that saved the last forward's weights now holds B's
    for case, g, when in ((a, ga, "after the forward of B"), (a, ga, "repeated"), (b, gb, "after A's backward")):
        try:
            compare.assert_vjp_matches(impl, case, g)
        except AssertionError as exc:
            fail(f"the backward of {case.label.removeprefix('state: ')} ({when}) disagrees with the oracle:\n{exc}")


def _cross_dtype(impl: GuardedAdapter, order: list[str]) -> None:
    ran = 0
    for i, dtype in enumerate(order):
        case = random_case(990 + i, B=1, Hq=2, T=5, S=7, Dk=8, dtype=dtype, magnitude=1.5, label=f"state: {dtype}")
        if not impl.supports(case):
            continue
        ran += 1
        try:
            compare.assert_output_matches(impl, case)
        except AssertionError as exc:
            fail(f"call {i + 1} ({dtype}, after {order[:i]} of the same shape) disagrees with the oracle:\n{exc}")
    if ran < 2:
        impl.not_applicable("fewer than two dtypes declared")


@clause(
    "STATE-DTYPE-03",
    "calls of one shape in different dtypes, narrow first, are each computed at their own precision "
    "(no workspace typed by an earlier call)",
    FUNCTION_OF_INPUTS,
    kills=["workspace_dtype_of_first_call"],
)
def test_workspace_per_dtype(impl):
    _cross_dtype(impl, ["float16", "float32", "float64", "bfloat16", "float64"])


def _history(impl: GuardedAdapter, dtype: str) -> list[Case]:
    """Calls of other shapes, another dtype, other flags and a backward, each a chance to leave state behind."""
    decl = impl.declaration
    calls = [
        random_case(1601, B=1, Hq=4, T=9, S=3, Dk=16, dtype=dtype, label="history: other shapes"),
        random_case(1602, B=3, Hq=2, T=1, S=11, Dk=8, dtype=dtype, is_causal=True, label="history: causal decode"),
        random_case(1603, B=2, Hq=2, T=6, S=6, Dk=8, dtype=dtype, scale=0.3, label="history: a custom scale"),
    ]
    if decl.bool_mask:
        calls.append(
            random_case(1604, B=2, Hq=2, T=5, S=7, Dk=8, dtype=dtype, label="history: a mask").replace(
                mask=random_mask(1604, (2, 1, 5, 7), p_blocked=0.5)
            )
        )
    other = next((d for d in ("float32", "float64", "float16", "bfloat16") if d != dtype and d in decl.dtypes), None)
    if other is not None:
        calls.append(random_case(1605, B=2, Hq=2, T=5, S=7, Dk=8, dtype=other, label=f"history: {other}"))
    if decl.dropout:
        calls.append(random_case(1606, B=2, Hq=2, T=5, S=7, Dk=8, dtype=dtype, dropout_p=0.5, label="history: dropout"))
    return [c for c in calls if impl.supports(c)]


@clause(
    "STATE-HISTORY-07",
    "a call's answer does not depend on the calls before it: the same case before and after calls of other shapes, "
    "another dtype, causal, a custom scale, a mask, dropout and a backward gets the same answer (bitwise where the "
    "kernel declares itself deterministic)",
    FUNCTION_OF_INPUTS,
    kills=["remembers_last_causal", "remembers_last_scale"],
)
def test_history(impl, dtype):
    first = random_case(1600, B=2, Hq=2, T=5, S=7, Dk=8, dtype=dtype, label="history: the case")
    impl.require(first)
    before = compare.assert_output_matches(impl, first)
    for case in _history(impl, dtype):
        impl.forward(case)
        if impl.declaration.grad and case.dropout_p == 0:
            impl.vjp(case, cotangent(case, 1607))
    again = first.replace(label="history: the case again, after the others")
    after = compare.assert_output_matches(impl, again)
    if impl.declaration.deterministic and not np.array_equal(
        np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64), equal_nan=True
    ):
        fail("the same case, called again after calls of other shapes, flags and dtypes, got other bits", again)
