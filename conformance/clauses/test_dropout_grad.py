"""§8 of 000_f3dcd408372d9e02.txt: the backward pass under dropout is the gradient of the dropped forward.

The article's kernel applies ``weights = F.dropout(weights, ...)`` inside the autograd graph, so its
gradients are those of O = (P ⊙ Z) V for the very keep-scale Z (1/(1 - p) kept, 0 dropped) its
forward drew. Fused kernels recompute instead: the backward regenerates the mask from the seed (FA2
replays its Philox offsets), and the bugs live there: a backward that ignores dropout, draws a fresh
mask (an RNG offset advanced between forward and backward), forgets the 1/(1 - p), masks dV but not
dS, or takes D = rowsum(dO * O) from the undropped output. Each keeps the forward right, so no
forward clause sees it, and the gradient clauses run without dropout.

How: the forward of one call is revealed (its own weights when it returns them, otherwise V = I, so
that O = W up to one rounding); the same seed must reproduce it (else there is no mask to check the
backward against: the contract's Case.seed "seeds anything random in the kernel", as DROPOUT-SEED-04
requires too); then vjp(case, dO) with that seed is compared with the exact gradient for that mask
(``harness.judge.dropout_vjp``: the mask lifted into the values, so the oracle's VJP and the GRAD clauses'
allowance apply unchanged). p = 3/4 makes 1/(1 - p) = 4 exact in every dtype (and 1/p = 4/3 differs
from it); one case in the ci profile, three seeds at p = 3/4 and 1/2 in thorough. No statistical version: with the mask revealed, every backward bug above is a
deterministic mismatch, and the average over seeds would only add false-positive risk.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.clauses.test_dropout import INVERTED, dropout_case
from conformance.clauses.test_gradients import cotangent
from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights, probes
from conformance.harness.cases.build import random_mask
from conformance.harness.cases.profiles import profile_name
from conformance.harness.judge import compare, tolerance
from conformance.harness.judge.dropout_vjp import dropout_vjp, keep_scale_for
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import ClauseViolation, check, fail, mismatch_report

P_DROP = 0.75  # 1/(1 - p) = 4: Z ⊙ V exact in every dtype (harness.judge.dropout_vjp.lift)


def _plan() -> list[tuple[int, float]]:
    """(seed, p) of each case: one in the ci profile; three seeds at p = 3/4 and 1/2 in thorough."""
    if profile_name() == "thorough":
        return [(420 + 10 * i, p) for i in range(3) for p in (P_DROP, 0.5)]
    return [(420, P_DROP)]


def _case(impl: GuardedAdapter, dtype: str, seed: int, p: float = P_DROP) -> Case:
    """One case with what the declaration admits (GQA, a boolean mask, is_causal) and no row blocked
    entirely, magnitude 0.5 so that every weight is far from 0 and a kept weight never reads as
    dropped; V = I (S = 16 = Dv) unless the kernel returns its weights."""
    decl = impl.declaration
    B, T, S = 2, 12, 16
    hq, hkv = (4, 2) if decl.gqa else (2, 2)
    mask = random_mask(seed, (B, 1, T, S), p_blocked=0.25) if decl.bool_mask else None
    if mask is not None:
        mask[..., 0] = False  # key 0 stays visible, causal or not: no row is blocked entirely (its fill is a policy)
    case = dropout_case(dtype, seed, p, B=B, Hq=hq, Hkv=hkv, T=T, S=S, mask=mask, is_causal=decl.causal)
    case = case.replace(label=f"dropout_p={p:g} backward")
    if decl.returns_weights:
        return case
    plan = probes(case, decl)
    if len(plan) > 1:  # the weights take several calls: no one case whose output is W for the backward
        impl.not_applicable(f"V = I takes {len(plan)} calls here (Dk == Dv, no scale argument, max head dim)")
    return plan[0].case


def _revealed_mask(impl: GuardedAdapter, case: Case) -> np.ndarray:
    """Z of the forward of ``case``: revealed twice (the same seed must replay it), and each kept
    weight checked to be the undropped one / (1 - p), so that Z is what the forward applied."""
    decl = impl.declaration
    first = observe_weights(impl, case)
    again = observe_weights(impl, case)
    differ = int(((first == 0) != (again == 0)).sum())
    check(
        differ == 0,
        f"the same seed dropped different weights in {differ} places on two forward calls: the kernel does not "
        "replay its dropout mask (Case.seed seeds anything random in the kernel; DROPOUT-SEED-04), so no mask "
        "is known that its backward could be checked against",
        case,
    )
    if decl.deterministic and decl.layout_invariant:  # each observation builds its V = I probe anew: other memory
        check(
            np.array_equal(first, again, equal_nan=True),
            f"the same seed gave different weights in {int((first != again).sum())} places "
            "(declared deterministic and layout_invariant: bitwise equality expected)",
            case,
        )
    plain = case.replace(dropout_p=0.0)
    want = compare.expected(plain, decl)
    z = keep_scale_for(first, want.blocked, case.dropout_p)
    allowed = compare.weights_allowance(plain, decl) / (1.0 - case.dropout_p)
    bad = (z > 0) & (np.abs(first - want.weights * z) > allowed)
    leaked = want.blocked & (first != 0)
    wrong = [
        f"{int(bad.sum())} kept weights are not the undropped weight / (1 - p)" if bad.any() else "",
        f"{int(leaked.sum())} blocked weights are not 0 (largest {np.abs(first[leaked]).max():.3g})"
        if leaked.any()
        else "",
    ]
    check(
        not (bad.any() or leaked.any()),
        " and ".join(w for w in wrong if w) + ": the forward's dropout is wrong (DROPOUT-VALUES-01 says where), so "
        "its gradient is not checked here",
        case,
    )
    return z


def _hint(impl: GuardedAdapter, case: Case, z: np.ndarray, grads, grad_out: np.ndarray) -> str:
    """Which wrong backward the gradients fit, when one does: the undropped gradient, or the
    revealed mask without its 1/(1 - p). Diagnostic only (the verdict is already a failure)."""
    decl = impl.declaration
    keep = (z > 0).astype(np.float64)
    tries = {
        "the gradient WITHOUT dropout (the backward ignores the forward's mask)": oracle.vjp(
            case.replace(dropout_p=0.0), grad_out, all_blocked=decl.all_blocked, causal_alignment=decl.causal_alignment
        ),
        "the revealed mask WITHOUT the 1/(1 - p) rescale": dropout_vjp(case, keep, grad_out, decl)[0],
    }
    names = ("dq", "dk", "dv")
    for why, want in tries.items():
        fits = [n for n, g, w in zip(names, grads, want) if np.allclose(np.asarray(g, dtype=np.float64), w, 1e-2, 1e-2)]
        if fits:
            return f"\n  hint: {', '.join(fits)} match {why}"
    return ""


@clause(
    "DROPOUT-GRAD-01",
    "under dropout, dQ, dK and dV are the gradients of the dropped forward for the mask that forward drew "
    "(the same seed replays it): dV = (P ⊙ Z)^T dO, dS = P ⊙ (Z ⊙ dO V^T - rowsum(dO ⊙ O))",
    INVERTED,
    requires=["dropout", "grad"],
    kills=[
        "grad_dropout_ignored",
        "grad_dropout_fresh_mask",
        "grad_dropout_no_rescale",
        "grad_dropout_mask_dv_only",
        "grad_dropout_delta_undropped",
        "grad_dropout_delta_double_scaled",
        "grad_dropout_jacobian_dropped_p",
        "dropout_ignores_seed",  # no replay: no mask to check the backward against
        "dropout_causal_grad_shifted",
    ],
    tolerance="the GRAD clauses' allowance (first-order bound of a FlashAttention-style backward, 2 x ensemble "
    "spread) of the mask lifted into the values, one dropout-free row per item; dK and dV add the sum over rows "
    "(gamma(T g) x absolute contributions, one rounding) (harness.judge.dropout_vjp)",
)
def test_dropout_backward(impl, dtype):
    for seed, p in _plan():
        _check_backward(impl, _case(impl, dtype, seed, p), seed + 1)


def _check_backward(impl: GuardedAdapter, case: Case, seed: int) -> None:
    impl.require(case)
    z = _revealed_mask(impl, case)
    grad_out = cotangent(case, seed)
    grads = impl.vjp(case, grad_out)
    decl = impl.declaration
    want, allowed = dropout_vjp(case, z, grad_out, decl)
    rule = "harness.judge.dropout_vjp: " + tolerance.describe(decl.tolerance_dtype(case), "gradient")
    for name, got, exp, allow in zip(("dq", "dk", "dv"), grads, want, allowed):
        g = np.asarray(got, dtype=np.float64)
        if (~np.isfinite(g)).any():
            fail(f"{name} has {int((~np.isfinite(g)).sum())} non-finite elements under dropout", case)
        msg = mismatch_report(f"{name} under dropout (mask of the same seed's forward)", g, exp, allow, rule)
        if msg:
            raise ClauseViolation(msg + _hint(impl, case, z, grads, grad_out), case)
