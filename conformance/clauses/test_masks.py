"""§7 and §8 of 000_f3dcd408372d9e02.txt: masks enter before softmax; all-blocked rows are defined."""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_gradients import NAN_BACKWARD, numpy_cotangent
from conformance.contract import Case
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import check, fail

BEFORE_SOFTMAX = Source(
    "000",
    "§7.3 Mask 应加在 softmax 之前",
    "如果在 softmax 之后直接把某些权重改成 0，剩余权重之和通常不再等于 1。",
)
ALL_BLOCKED = Source(
    "000",
    "§8 最小 PyTorch 实现",
    "如果某个 Query 的所有 Key 都被禁止，softmax 在数学上没有定义；本实现明确约定该行的权重和输出为 0，避免 NaN。",
)


def check_fill(rows: np.ndarray, policy: str, where: str, declared: str, case: Case) -> None:
    """The outputs ``rows`` of query rows that see no key hold the declared fill: exactly 0 under the
    policy ``zeros``, NaN under ``nan`` (``declared`` introduces the policy's name in a failure)."""
    if policy == "zeros" and not np.all(rows == 0):
        finite = np.abs(rows[np.isfinite(rows)])
        fail(
            f"{where} must be exactly 0 ({declared}zeros); got {int(np.isnan(rows).sum())} NaN, "
            f"max finite |value| {finite.max() if finite.size else 0:.3g}",
            case,
        )
    if policy == "nan":
        check(bool(np.all(np.isnan(rows))), f"{where} must be NaN ({declared}nan)", case)


def _asymmetric_mask_case(impl, dtype: str, seed: int = 40):
    """A [B,1,T,S] mask that differs per batch item and is not symmetric in any axis.

    Asymmetry is what tells True = blocked from True = attend, and per-item masks catch kernels
    that broadcast the wrong axis. A kernel compiling per shape gets the palette's T < S shape in
    the ci profile (harness.cases.buckets), the golden all-blocked fixtures' program.
    """
    shape = buckets.dims(impl, "cross", B=2, Hq=3, T=4, S=6, Dk=8)
    mask = random_mask(seed, (shape["B"], 1, shape["T"], shape["S"]), p_blocked=0.5)
    return random_case(seed, dtype=dtype, mask=mask, **shape)


@clause(
    "MASK-BEFORE-SOFTMAX-01",
    "blocked keys get weight exactly 0 and the visible weights are renormalised (softmax over the visible keys)",
    BEFORE_SOFTMAX,
    requires=["bool_mask"],
    kills=["mask_after_softmax", "mask_sense_inverted"],
)
def test_mask_before_softmax(impl, dtype):
    case = _asymmetric_mask_case(impl, dtype)
    impl.require(case)
    compare.assert_weights_match(impl, case, "visible weights (renormalised over visible keys)")


def _all_blocked_case(dtype: str, seed: int = 50, S: int = 5):
    """The article's §9 padding test plus one fully blocked query row in an otherwise live item (S = 5 is
    the article's; item 0 pads its last two keys, item 1 all of them)."""
    B, H, T = 2, 2, 3
    padding = np.stack([np.arange(S) >= S - 2, np.ones(S, dtype=bool)])
    mask = np.broadcast_to(padding[:, None, None, :], (B, 1, T, S)).copy()
    mask[0, 0, 1, :] = True  # one fully blocked row inside the live batch item
    return random_case(seed, B=B, Hq=H, T=T, S=S, Dk=8, Dv=8, dtype=dtype, mask=mask)


@clause(
    "ALL-BLOCKED-02",
    "a query row whose keys are all blocked yields the declared fill (spec: zero weights, zero output), never a stray NaN",
    ALL_BLOCKED,
    requires=["bool_mask"],
    kills=["nan_on_all_blocked", "mean_v_on_all_blocked"],
)
def test_all_blocked_rows(impl, dtype):
    # S = 8 and 16 too: a fill taken on a tile path (S a multiple of 8 or 16) must be the declared one as well.
    for S in buckets.spread(impl, dtype, (5, 8, 16)):
        _check_all_blocked_rows(impl, _all_blocked_case(dtype, S=S))


def _check_all_blocked_rows(impl, case) -> None:
    impl.require(case)
    decl = impl.declaration
    want = compare.expected(case, decl)
    empty = want.all_blocked
    out = impl.forward(case)
    policy = decl.all_blocked_policy(case)
    check_fill(np.asarray(out, dtype=np.float64)[empty], policy, "all-blocked rows", "declared all_blocked=", case)
    live = ~empty
    if not np.all(np.isfinite(np.asarray(out, dtype=np.float64)[live])):
        fail("rows with visible keys must be finite", case)
    compare.assert_close(out, want.out, case=case, decl=decl)
    w = observe_weights(impl, case)
    if policy == "zeros":
        check(
            bool(np.all(w[empty] == 0)),
            "all-blocked rows must have weights exactly 0 (declared all_blocked=zeros)",
            case,
        )


@clause(
    "ALL-BLOCKED-GRAD-03",
    "the backward pass through all-blocked rows is finite and matches the oracle (those rows contribute no gradient)",
    NAN_BACKWARD,
    requires=["bool_mask", "grad"],
    kills=["nan_backward_all_blocked"],
    tolerance="gradients: the error model (harness.judge.tolerance.grad_bound and the backward ensemble)",
)
def test_all_blocked_backward(impl, dtype):
    case = _all_blocked_case(dtype, seed=51)
    impl.require(case)
    decl = impl.declaration
    if decl.all_blocked == "nan":
        impl.not_applicable("declares all_blocked=nan: its backward through those rows is NaN by declaration")
    compare.assert_vjp_matches(impl, case, numpy_cotangent(case, 52))
