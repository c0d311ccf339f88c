"""A case with dropout judged against the oracle through the keep-mask its seed replays.

Why: dropout's output is random, so a case with dropout on can be compared with the float64 oracle
only once the mask is known. The contract says ``Case.seed`` seeds anything random in the kernel, so
a second call with the same seed draws the same mask; a V = I probe of that call (same Q, K, mask,
M, seed; V the identity, ``calls.probes``) shows the dropped weights, and a kept weight's position
is the mask. The case is then, row by row, a dropout-free case over the values Z ⊙ V
(``judge.dropout_vjp.lift``), whose output and VJP, with their allowances, are the oracle's own.
This is how a covering row meets dropout with a mask, padding, GQA, B > 1, a decode step and the
backward: on its own values, so that a bug in how the dropped weights meet V (a value head mapped
wrong under dropout) shows, which a V = I probe alone cannot see.

The probe is made *after* the real call, so that a call made right before on purpose (a covering
row's twin, ``harness.covering.admission.twin``) stays right before it.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.contract import Case, Declaration
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.judge import tolerance
from conformance.harness.judge.dropout_vjp import dropout_vjp, lift
from conformance.harness.judge.expected import expected, merged_aliases, output_allowance
from conformance.harness.spec.report import ClauseViolation, mismatch_report

# A row wholly dropped is re-drawn under other seeds; it fails when staying so has probability at most ROW_LEVEL
# (at most ~1 000 rows reach this test in a certification: a false positive under 1e-6 per run). Rows whose
# chance of being wholly dropped is above ROW_LEVEL ** (1 / (1 + MAX_SEEDS)) are not tested.
ROW_LEVEL = 1e-9
MAX_SEEDS = 8
# A kept weight w / (1 - p) the probe still shows: 4 x float16's smallest normal, the lowest precision a switch
# can lower a case to (autocast), so that a flushed or underflowed kept weight is never counted as a key.
SHOWN = 4 * float(np.finfo(np.float16).tiny)


def _wholly_dropped(w: np.ndarray, visible: np.ndarray) -> np.ndarray:
    return visible.any(axis=-1) & ~(visible & (w != 0)).any(axis=-1)


def _check_whole_rows(
    impl: GuardedAdapter, case: Case, w: np.ndarray, weights: np.ndarray, blocked: np.ndarray
) -> None:
    """A query row whose every visible key the probe shows dropped, drawn again under other seeds.

    A kernel that zeroes a row (its output and its V = I probe both 0) reads as a row dropout dropped whole,
    and the replay agrees with it on one draw. Dropout drops a row of n keys whole with probability p**n
    (each key on its own, as 000 §6 and every kernel's Bernoulli mask draw it; n counts the keys whose kept
    weight the probe would show, which only raises the bound), and independently under another seed: a row
    that stays wholly dropped under k + 1 seeds has probability p**(n (k + 1)). It fails once that is at most
    ROW_LEVEL; a row that shows a kept key under any seed is dropout's own."""
    p = case.dropout_p
    if not 0.0 < p < 1.0:
        return
    visible = ~blocked
    if case.bias is not None:  # an M past float16's range is -inf once a switch lowers it (autocast): not visible
        with np.errstate(over="ignore"):
            lowered = np.isneginf(np.asarray(case.bias, dtype=np.float64).astype(np.float16))
        visible = visible & ~np.broadcast_to(lowered, visible.shape)
    keys = (visible & (weights / (1.0 - p) > SHOWN)).sum(axis=-1)
    q = np.power(p, keys.astype(np.float64))
    suspect = _wholly_dropped(w, visible) & (q <= ROW_LEVEL ** (1.0 / (1 + MAX_SEEDS)))
    for draw in range(1, MAX_SEEDS + 1):
        if not suspect.any():
            return
        seed = (case.seed or 0) + 1_000_003 * draw
        suspect &= _wholly_dropped(observe_weights(impl, case.replace(seed=seed)), visible)
        stays = suspect & (q ** (draw + 1) <= ROW_LEVEL)
        if stays.any():
            at = tuple(int(i) for i in np.argwhere(stays)[0])
            raise ClauseViolation(
                f"query row {list(at)} has every one of its {int(keys[at])} visible keys dropped under the case's "
                f"seed and under {draw} other seeds (dropout_p = {p:g}): a Bernoulli mask does so with probability "
                f"{q[at] ** (draw + 1):.3g}; a row the kernel zeroes reads as a row dropout dropped whole",
                case,
            )


def replayed_keep_scale(impl: GuardedAdapter, case: Case) -> np.ndarray:
    """Z of ``case``'s dropout (1/(1 - p) kept, 0 dropped), read from a V = I probe with its seed.

    A visible weight reads as kept when it is not 0; on a row with no visible key the fill's own
    weights (the mean of V's 1/S, or NaN) are dropped by the same mask, so they count too. A row whose
    every visible key reads as dropped is drawn again under other seeds first (:func:`_check_whole_rows`)."""
    w = observe_weights(impl, case)
    plain = expected(case.replace(dropout_p=0.0), impl.declaration)
    _check_whole_rows(impl, case, w, plain.weights, plain.blocked)
    empty = plain.all_blocked[..., None]
    kept = (w != 0) & (~plain.blocked | empty)
    return np.where(kept, 1.0 / (1.0 - case.dropout_p), 0.0)


def _unreadable(impl: GuardedAdapter, case: Case, z: np.ndarray) -> np.ndarray:
    """What the keys the probe cannot read may add to the output, [B, Hq, T, Dv]: a visible key whose kept
    weight w / (1 - p) is below what a float16 probe shows (:data:`SHOWN`) reads as dropped whether it was or
    not, so each such key may add up to twice its kept weight times |v| (twice: the kernel's own weight of it
    may be off by as much again). Found on a float16 row at Dk = 256 with the query as its own key, whose
    off-diagonal weights (~1e-8) underflow in the probe and add one subnormal step to the output."""
    plain = expected(case.replace(dropout_p=0.0), impl.declaration)
    kept = np.nan_to_num(plain.weights, nan=0.0) / (1.0 - case.dropout_p)
    unread = (z == 0) & ~plain.blocked & (kept > 0) & (kept < SHOWN)
    if not unread.any():
        return np.zeros(case.out_shape)
    v = oracle.expand_kv(np.abs(np.asarray(case.value, dtype=np.float64)), case.Hq)
    return (2.0 * np.where(unread, kept, 0.0) @ v).reshape(case.out_shape)


def _rule(decl: Declaration, case: Case, what: str) -> str:
    return "the dropout-free oracle on Z ⊙ V, Z the replayed mask: " + tolerance.describe(
        decl.tolerance_dtype(case), what
    )


Reading = tuple  # (declaration, case, cotangent): one way an answer may be judged (harness.judge.switches.readings)


def assert_output_matches(impl: GuardedAdapter, case: Case, readings: list[Reading] | None = None) -> np.ndarray:
    """The output of ``case`` (dropout on) against the oracle for the mask the same seed replays; under a caller's
    switch, right under one of the ``readings`` it allows (the case at its own precision first)."""
    __tracebackhide__ = True
    out = impl.forward(case)
    z = replayed_keep_scale(impl, case)
    unread = _unreadable(impl, case, z)
    first = None
    for decl, judged, _ in readings or [(impl.declaration, case, None)]:
        lifted = lift(judged, z, decl.causal_alignment)
        want = expected(lifted, decl).out.reshape(case.out_shape)
        allowed = output_allowance(lifted, decl).reshape(case.out_shape) + unread
        allowed = np.where(np.isfinite(allowed), allowed, np.finfo(np.float64).max)
        msg = mismatch_report(
            "output under dropout (the mask its seed replays)", out, want, allowed, _rule(decl, judged, "output")
        )
        if not msg:
            return out
        first = first or msg
    raise ClauseViolation(first, case)


def assert_vjp_matches(
    impl: GuardedAdapter, case: Case, grad_out: np.ndarray, readings: list[Reading] | None = None
) -> tuple[np.ndarray, ...]:
    """dQ, dK, dV of ``case`` (dropout on) against the gradient of the dropped forward for the mask
    the same seed replays (``judge.dropout_vjp``); under a caller's switch, right under one of the ``readings``."""
    __tracebackhide__ = True
    grads = impl.vjp(case, grad_out)
    z = replayed_keep_scale(impl, case)
    first = None
    for decl, judged, g_judged in readings or [(impl.declaration, case, grad_out)]:
        msg = _vjp_mismatch(grads, judged, z, grad_out if g_judged is None else g_judged, decl)
        if not msg:
            return grads
        first = first or msg
    raise ClauseViolation(first, case)


def _vjp_mismatch(grads: tuple, case: Case, z: np.ndarray, g: np.ndarray, decl: Declaration) -> str:
    """Why the gradients are not the dropped forward's for ``case`` read under ``decl``; empty when they are."""
    want, allowed = merged_aliases(case, decl, *dropout_vjp(case, z, g, decl))
    for name, got, exp, allow in zip(("dq", "dk", "dv"), grads, want, allowed):
        if got is None:  # an input that did not ask for its gradient
            continue
        got = np.asarray(got, dtype=np.float64)
        bad = ~np.isfinite(got) & np.isfinite(exp)
        if bad.any():
            return f"{name} has {int(bad.sum())} non-finite elements under dropout"
        allow = np.where(np.isfinite(allow), allow, np.finfo(np.float64).max)
        msg = mismatch_report(
            f"{name} under dropout (the mask its seed replays)", got, exp, allow, _rule(decl, case, name)
        )
        if msg:
            return msg
    return ""
