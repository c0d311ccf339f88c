"""The kernel reads its inputs and nothing else: it never writes them, and their memory layout
does not change the answer (003_648455d5abd16778.txt §工程实现: "非连续张量、隐式复制或额外的 transpose
可能吞掉融合收益" — layouts are a performance question, never a correctness one).
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_gradients import cotangent
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case, random_mask, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation, fail, mismatch_report

LAYOUT = Source("003", "工程实现", "若结果异常，先核对实际 backend 和输入布局，再看 kernel 本身。")
# The article computes on converted copies and never writes the caller's tensors.
COPIES = Source("000", "§8 最小 PyTorch 实现", "q = query.to(work_dtype)")


@clause(
    "INPUTS-UNTOUCHED-01",
    "the kernel never modifies its inputs (q, k, v, mask, bias, and the output cotangent of the backward), "
    "during the call or after it returned",
    COPIES,
    kills=["scales_query_in_place", "keeps_input_as_scratch"],
)
def test_inputs_untouched(impl, dtype):
    decl = impl.declaration
    B, H, T, S = 2, 2, 4, 6
    dims = dict(B=B, Hq=H, T=T, S=S, Dk=8, dtype=dtype)
    mask = random_mask(90, (B, 1, T, S)) if decl.bool_mask else None
    bias = rng_for(91).standard_normal((T, S)) if decl.float_mask else None
    case = random_case(90, mask=mask, bias=bias, **dims)
    impl.require(case)
    arrays = {"query": case.query, "key": case.key, "value": case.value, "mask": case.mask, "bias": case.bias}
    before = {n: np.array(a, copy=True) for n, a in arrays.items() if a is not None}
    calls = [("forward", lambda: impl.forward(case))]
    if decl.grad:
        g = cotangent(case, 92)
        before["grad_out"], arrays["grad_out"] = np.array(g, copy=True), g
        calls.append(("vjp", lambda: impl.vjp(case, g)))
    for what, call in calls:
        call()  # the guarded call already fails on a modified input; the check below names the clause's own view
        for name, snap in before.items():
            if not np.array_equal(snap, np.asarray(arrays[name]), equal_nan=True):
                fail(f"{what} modified its input {name!r} in place", case)
    # The guard compares each call's own inputs before and after that call. A kernel can also write
    # an earlier caller's arrays later (a buffer it kept as scratch or cache): one more call, on other
    # arrays of the same shapes, must leave the first call's inputs as they were.
    later = random_case(94, mask=case.mask, bias=case.bias, label="a later call on other arrays", **dims)
    impl.forward(later)
    for name, snap in before.items():
        if not np.array_equal(snap, np.asarray(arrays[name]), equal_nan=True):
            fail(
                f"a later call (on other arrays) modified the earlier call's input {name!r}: the kernel kept the "
                "caller's array and wrote into it after returning",
                case,
            )


def _same_values(view: np.ndarray, x: np.ndarray) -> np.ndarray:
    assert np.array_equal(view, x) and not view.flags.c_contiguous
    return view


def projection_view(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` [B, H, L, D] as a view of a [B, L, H, D] array (the layout a projection
    writes and a caller transposes): same values, not C-contiguous."""
    return _same_values(np.swapaxes(np.ascontiguousarray(np.swapaxes(x, 1, 2)), 1, 2), x)


def every_other_view(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` as every other column of a twice-wide array."""
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype)
    wide[..., ::2] = x
    return _same_values(wide[..., ::2], x)


def reversed_view(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` as a view with a negative stride along the sequence axis."""
    return _same_values(np.ascontiguousarray(x[:, :, ::-1])[:, :, ::-1], x)


VIEWS = {"BTHD": projection_view, "every-other": every_other_view, "reversed": reversed_view}


@clause(
    "INPUTS-LAYOUT-02",
    "non-contiguous views (a [B,T,H,D] array viewed as [B,H,T,D], strided and reversed views) give the "
    "result of their contiguous copies",
    LAYOUT,
    kills=["assumes_c_contiguous"],
    tolerance="|out(view) - out(copy)| <= 2 * the error model's allowance (two honest results of one case)",
)
def test_layout_independent(impl, dtype):
    # A kernel compiling per shape gets the palette's T < S shape in the ci profile (harness.cases.buckets).
    case = random_case(93, dtype=dtype, **buckets.dims(impl, "cross", B=2, Hq=3, T=5, S=7, Dk=8))
    impl.require(case)
    want = impl.forward(case)
    decl = impl.declaration
    allowed = 2 * compare.output_allowance(case, decl)
    # A kernel compiling per shape checks each view in one dtype (harness.cases.buckets.spread): strides
    # are part of its compiled program, and the property does not depend on the dtype.
    for how, strided in buckets.spread(impl, dtype, list(VIEWS.items())):
        view = case.replace(
            query=strided(case.query), key=strided(case.key), value=strided(case.value), label=f"{how} views"
        )
        if not impl.supports(view):  # a layout the declaration rules out (a unit stride along the feature axis)
            continue
        msg = mismatch_report(
            f"output for {how} views vs contiguous copies",
            impl.forward(view),
            want,
            allowed,
            "2 * the error model's allowance (harness.judge.tolerance)",
        )
        if msg:
            raise ClauseViolation(msg, view)
