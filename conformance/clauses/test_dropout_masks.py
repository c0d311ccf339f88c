"""§7.3 and §8 of 000_f3dcd408372d9e02.txt: dropout together with is_causal and masks.

test_dropout.py checks each weight's fate on cases where little is blocked; a separate dropout code
path is where dropout with is_causal, with an additive -inf, with an all-blocked row, or with p = 1
under masks breaks. Here blocked weights stay exactly 0 under dropout, kept ones are rescaled, rows
that see no key keep their declared fill, and p = 1 drops everything without a NaN.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_dropout import ORDER, check_kept_weights, dropout_case
from conformance.clauses.test_masks import check_fill
from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases.build import random_mask, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import check


def _empty_rows(impl: GuardedAdapter, case: Case, out: np.ndarray, context: str) -> None:
    """Rows with no visible key keep the declared fill under dropout: zeros or NaN, never a stray NaN."""
    decl = impl.declaration
    want = compare.expected(case.replace(dropout_p=0.0), decl)
    out = np.asarray(out, dtype=np.float64)
    empty = want.all_blocked
    check_fill(
        out[empty], decl.all_blocked_policy(case), f"all-blocked rows under dropout with {context}", "declared ", case
    )
    live = out[~empty]
    check(
        bool(np.all(np.isfinite(live))),
        f"rows with a visible key under dropout with {context} must be finite; "
        f"{int((~np.isfinite(live)).sum())} elements are not",
        case,
    )


def _masked_dropout_case(impl: GuardedAdapter, dtype: str, seed: int, p: float) -> Case:
    """Boolean mask (one query row entirely blocked when the declared fill is zeros or nan) and,
    when declared, an additive M with -inf; T == S = 12 with is_causal when declared."""
    decl = impl.declaration
    B, H, T = 2, 2, 12
    arrays: dict = {}
    if decl.bool_mask:
        mask = random_mask(seed, (B, 1, T, T), p_blocked=0.3)
        mask[..., 0] = False
        if decl.all_blocked in ("zeros", "nan"):
            mask[1, 0, 5, :] = True
        arrays["mask"] = mask
    if decl.float_mask:
        rng = rng_for(seed + 1)
        bias = np.where(rng.random((B, H, T, T)) < 0.25, -np.inf, 0.5 * rng.standard_normal((B, H, T, T)))
        bias[..., 0] = 0.0
        arrays["bias"] = bias
    what = (
        " + ".join(
            k
            for k, v in (("bool mask", "mask" in arrays), ("additive M", "bias" in arrays), ("is_causal", decl.causal))
            if v
        )
        or "nothing blocked"
    )
    case = dropout_case(dtype, seed, p, B=B, Hq=H, T=T, S=T, is_causal=decl.causal, **arrays)
    return case.replace(label=f"dropout_p={p:g} with {what}")


@clause(
    "DROPOUT-BLOCKED-07",
    "under dropout (p = 0.3 and p = 1) with is_causal, a boolean mask and an additive -inf M, blocked weights stay "
    "exactly 0, kept ones are the undropped weights / (1 - p), all-blocked rows keep their declared fill, and p = 1 "
    "gives an all-zero output with no NaN",
    ORDER,
    requires=["dropout"],
    kills=["causal_ignored_under_dropout", "dropout_nan_on_all_blocked", "dropout_p1_nan", "dropout_no_rescale"],
)
def test_dropout_with_masks(impl, dtype):
    decl = impl.declaration
    if not (decl.causal or decl.bool_mask or decl.float_mask):
        impl.not_applicable("declares no is_causal and no mask: nothing can be blocked")
    case = _masked_dropout_case(impl, dtype, 410, 0.3)
    impl.require(case)
    _empty_rows(impl, case, impl.forward(case), case.label)
    kept, _ = check_kept_weights(impl, case, observe_weights(impl, case), f" with {case.label}")
    check(bool(kept.any()), f"dropout_p = {case.dropout_p} with {case.label} dropped every visible weight", case)
    full = _masked_dropout_case(impl, dtype, 411, 1.0)
    out = np.asarray(impl.forward(full), dtype=np.float64)
    _empty_rows(impl, full, out, full.label)
    want = compare.expected(full.replace(dropout_p=0.0), decl)
    live = ~want.all_blocked
    check(
        bool(np.all(out[live] == 0)),
        f"dropout_p = 1 must give an all-zero output (every weight dropped); "
        f"{int(np.count_nonzero(out[live]))} elements are not 0 ({int(np.isnan(out[live]).sum())} NaN)",
        full,
    )
