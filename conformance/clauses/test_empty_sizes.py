"""Empty sizes: no queries, no batch items, no keys are refused as the article does or answered as torch does.

The article's kernel refuses a dimension of 0 ("各维度必须为正", a ValueError); torch's SDPA answers
it: an empty output for T = 0 or B = 0, zeros for S = 0 (every row sees no key: the spec's fill of a
row whose keys are all blocked), and gradients of the same shapes (zeros where there is anything to
hold). Both are sound; what is not is a third answer: a crash with an error the kernel does not
declare (an IndexError from a reduction over nothing), an output of another shape, or numbers where
there should be none. A batch of prompts that happens to be empty, a decode step before the first
token, a cache with no keys yet: callers meet these sizes without any bug of their own.

S = 0 is judged for kernels whose rows without keys give zeros (``all_blocked="zeros"``): the NaN or
mean-of-V fills of other declarations have no value to take over zero keys.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_gradients import cotangent
from conformance.contract import Case, np_dtype
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import random_case
from conformance.harness.judge import rejection
from conformance.harness.judge.expected import expected, expected_vjp
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import AdapterError, ClauseViolation

POSITIVE = Source("000", "§8 最小 PyTorch 实现", "各维度必须为正")


def _empty_cases(impl: GuardedAdapter, dtype: str) -> list[Case]:
    sizes = [("no queries (T = 0)", dict(B=2, T=0, S=5)), ("no batch items (B = 0)", dict(B=0, T=3, S=5))]
    if impl.declaration.all_blocked == "zeros":
        sizes.append(("no keys (S = 0)", dict(B=2, T=3, S=0)))
    return [random_case(1530 + i, Hq=2, Dk=8, dtype=dtype, label=what, **d) for i, (what, d) in enumerate(sizes)]


def _exact(name: str, got, want: np.ndarray, case: Case) -> None:
    """An empty-size result has no rounding to allow: the shape, the dtype and the oracle's zeros exactly."""
    got = np.asarray(got)
    if got.shape != want.shape:
        raise ClauseViolation(f"{case.label}: {name}.shape={got.shape}, but should be {want.shape}", case)
    if got.dtype != np_dtype(case.dtype):
        raise ClauseViolation(f"{case.label}: {name}.dtype={got.dtype}, but should be {case.dtype}", case)
    if not np.array_equal(got.astype(np.float64), want):
        bad = int(np.count_nonzero(got.astype(np.float64) != want))
        raise ClauseViolation(
            f"{case.label}: {bad} elements of {name} are not the oracle's (zeros: no key, no weight)", case
        )


def _answered(impl: GuardedAdapter, case: Case) -> bool:
    """True when the kernel answered ``case`` (and the answer is right), False when it refused it with a
    declared error. Anything else fails the clause as the guarded call reports it (a crash with an error
    the kernel does not declare, a refusal as not applicable, an output of another shape), so that its
    likely cause and an expectations entry read it as what it is."""
    try:
        result = impl.forward(case)
    except AdapterError as exc:  # a refusal as not applicable is an UndeclaredRefusal: it fails as it is
        if exc.__cause__ is not None and rejection.documented(exc.__cause__, impl.declaration):
            return False
        raise type(exc)(
            f"{case.label}: {exc}\n  an empty size is refused with a declared error (the article) or answered "
            "with empty arrays and zeros (torch)",
            case,
        ) from exc.__cause__
    _exact("output", result, expected(case, impl.declaration).out, case)
    return True


@clause(
    "EMPTY-SIZES-01",
    "a call with no queries (T = 0), no batch items (B = 0) or no keys (S = 0, where rows without keys give zeros) "
    "is refused with a declared error or answered with the oracle's empty output or zeros: no crash, no other shape",
    POSITIVE,
    kills=["empty_sizes_crash", "empty_sizes_wrong_shape", "empty_keys_nan"],
)
def test_empty_sizes(impl, dtype):
    for case in _empty_cases(impl, dtype):
        impl.require(case)
        _answered(impl, case)


@clause(
    "EMPTY-SIZES-GRAD-02",
    "the backward of an empty-size call the kernel answers gives dQ, dK, dV of the inputs' shapes, zeros where "
    "they hold anything (torch's answer)",
    POSITIVE,
    requires=["grad"],
    kills=["empty_sizes_grad_crash"],
)
def test_empty_sizes_grad(impl, dtype):
    ran = 0
    for case in _empty_cases(impl, dtype):
        impl.require(case)
        if not _answered(impl, case):
            continue  # refused as the article refuses it: no backward to ask for
        g = cotangent(case, 1539)
        try:
            grads = impl.vjp(case, g)
        except AdapterError as exc:
            raise ClauseViolation(
                f"{case.label}: the forward was answered, the backward was not: {exc}", case
            ) from None
        for name, got, want in zip(("dq", "dk", "dv"), grads, expected_vjp(case, g, impl.declaration)):
            _exact(name, got, want, case)
        ran += 1
    if not ran:
        impl.not_applicable("the kernel refuses every empty size (the article's answer): no backward to ask for")
