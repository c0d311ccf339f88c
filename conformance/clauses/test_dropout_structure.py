"""§7.3 and §8 of 000_f3dcd408372d9e02.txt: dropout's structure across the tensor, and with masks.

test_dropout.py checks each weight's fate (dropped to 0 or scaled by 1/(1-p)), the rate and the
seed. What it cannot see is the *structure* of the keep mask: fused kernels derive each (batch,
head) slice's random numbers from an RNG offset, and an offset that ignores the head or batch
index, or advances too little, gives slices that share their masks (whole or shifted) while every
slice alone still has the right rate. Nor does it combine dropout with is_causal, with an additive
-inf, with an all-blocked row, or with p = 1 under masks; a separate dropout code path is where
such combinations break.

The statistics assume what every dropout kernel promises: each weight is kept independently with
probability 1 - p. At p = 1/2 the keep bits are fair coins, and then the XOR of two distinct bits
is a fair coin independent of any other XOR of distinct pairs along a chain, which makes every
agreement count below an exact Binomial(n, 1/2).
"""

from __future__ import annotations

import math

import numpy as np

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases.build import random_case, random_mask, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import check, fail

ORDER = Source("000", "§7.3 Mask 应加在 softmax 之前", "QK^T / sqrt(dk) → 加 Mask → softmax → dropout → 乘 V")
RETURNED = Source(
    "000", "§8 最小 PyTorch 实现", "返回的权重已经经过 dropout；启用训练态 dropout 后，单次计算的行和不保证为 1。"
)

ALPHA = 1e-6  # total false-positive rate of each clause in this module


def _needs_dropout(impl: GuardedAdapter) -> None:
    if not impl.declaration.dropout:
        impl.not_applicable("declares dropout=False")


def binomial_log_sf_table(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(log P(X <= k), log P(X >= k)) for k = 0..n, X ~ Binomial(n, 1/2), exact up to lgamma's
    ~1e-15 relative error (far below the 1e-11 levels decided at)."""
    logpmf = np.array(
        [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0) for k in range(n + 1)]
    )
    top = logpmf.max()
    pmf = np.exp(logpmf - top)
    lower = np.log(np.cumsum(pmf)) + top
    upper = np.log(np.cumsum(pmf[::-1])[::-1]) + top
    return lower, upper


def agreement_bounds(n: int, level: float) -> tuple[int, int]:
    """(lo, hi): an agreement count k <= lo or k >= hi has two-sided exact tail <= ``level``."""
    lower, upper = binomial_log_sf_table(n)
    half = math.log(level / 2.0)
    lo_ok = np.nonzero(lower <= half)[0]
    hi_ok = np.nonzero(upper <= half)[0]
    return (int(lo_ok.max()) if lo_ok.size else -1), (int(hi_ok.min()) if hi_ok.size else n + 1)


def lagged_agreements(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """a[d] = #{k : x[k] == y[(k + d) mod n]} for every lag d, for 0/1 vectors x and y."""
    n = x.size
    xs = 2.0 * x - 1.0
    ys = 2.0 * y - 1.0
    corr = np.fft.irfft(np.conj(np.fft.rfft(xs)) * np.fft.rfft(ys), n)  # sum_k xs[k] ys[k + d]
    return np.rint((n + corr) / 2.0).astype(np.int64)


# Keep bits of B x H slices of T x S: pairs of slices across heads and across batch items are
# compared at every cyclic lag of their row-major flattening (a shared mask agrees at lag 0, a
# stream read from an offset that advanced too little agrees at the lag of the overlap); the query
# rows of each slice are compared along the chain t, t + 1 at lag 0.
IND_B, IND_H, IND_T, IND_S = 2, 4, 32, 32


def _slice_pairs() -> list[tuple[tuple[int, int], tuple[int, int], str]]:
    pairs = []
    for b in range(IND_B):
        for h in range(IND_H):
            for h2 in range(h + 1, IND_H):
                pairs.append(((b, h), (b, h2), "heads"))
    for h in range(IND_H):
        for b2 in range(1, IND_B):
            pairs.append(((0, h), (b2, h), "batch items"))
    return pairs


N_SLICE = IND_T * IND_S
N_TESTS = len(_slice_pairs()) * N_SLICE + IND_B * IND_H  # 16 pairs x 1024 lags + 8 row chains


@clause(
    "DROPOUT-INDEPENDENT-06",
    "dropout masks are independent across heads, batch items and query rows: no two (b, h) slices share their "
    "keep mask, whole or shifted by an RNG offset, and query rows do not repeat one another; under GQA (4 query "
    "heads over 2 kv heads where declared) the query heads of a group draw their own masks too",
    RETURNED,
    requires=["dropout"],
    kills=[
        "dropout_mask_shared_across_heads",
        "dropout_mask_shared_across_batch",
        "dropout_mask_shared_across_rows",
        "dropout_rng_offset_overlap",
        "dropout_mask_per_kv_head",
    ],
    fpr=f"1e-6 total: p = 1/2 makes each agreement count an exact Binomial(n, 1/2) under independence; {N_TESTS} "
    "two-sided exact tests (16 slice pairs x 1024 cyclic lags, n = 1024; 8 row chains, n = 992), each at 1e-6 / "
    f"{N_TESTS} (Bonferroni)",
)
def test_dropout_masks_independent(impl, dtype):
    _needs_dropout(impl)
    case = random_case(
        400,
        B=IND_B,
        Hq=IND_H,
        # Grouped heads where declared: an RNG offset taken from the kv head index gives the query heads
        # of a group one shared mask, which the head pairs below see at lag 0.
        Hkv=IND_H // 2 if impl.declaration.gqa else IND_H,
        T=IND_T,
        S=IND_S,
        Dk=8,
        Dv=8,
        dtype=dtype,
        magnitude=0.5,
        dropout_p=0.5,
        label="dropout structure, p = 1/2",
    )
    impl.require(case)
    undropped = compare.expected(case.replace(dropout_p=0.0), impl.declaration).weights
    check(bool(np.all(undropped > 1e-3)), "every undropped weight must be far from 0 (a defect of the clause)", case)
    keep = observe_weights(impl, case) != 0
    level = ALPHA / N_TESTS
    # Rows first: a mask repeated down the rows also makes slice pairs agree at some lags, and the
    # row chain says what is wrong more precisely.
    n_rows = (IND_T - 1) * IND_S
    lo_r, hi_r = agreement_bounds(n_rows, level)
    for b in range(IND_B):
        for h in range(IND_H):
            k = keep[b, h]
            agree = int(np.sum(k[1:] == k[:-1]))
            if agree <= lo_r or agree >= hi_r:
                fail(
                    f"dropout masks are not independent across query rows in (b={b}, h={h}): consecutive rows agree "
                    f"on {agree} of {n_rows} keep decisions (Binomial({n_rows}, 1/2) under independence; reject "
                    f"outside ({lo_r}, {hi_r}))",
                    case,
                )
    lo, hi = agreement_bounds(N_SLICE, level)
    for (b, h), (b2, h2), across in _slice_pairs():
        agree = lagged_agreements(keep[b, h].ravel(), keep[b2, h2].ravel())
        bad = np.nonzero((agree <= lo) | (agree >= hi))[0]
        if bad.size:
            d = int(bad[np.argmax(np.abs(agree[bad] - N_SLICE / 2))])
            fail(
                f"dropout masks are not independent across {across}: slices (b={b}, h={h}) and (b={b2}, h={h2}) "
                f"agree on {agree[d]} of {N_SLICE} keep decisions at lag {d} of their row-major flattening "
                f"(independent masks at p = 1/2: Binomial({N_SLICE}, 1/2), mean {N_SLICE // 2}; reject outside "
                f"({lo}, {hi}) at {level:.2g} per test, {ALPHA:g} in total)"
                + (": the same mask" if d == 0 and agree[d] == N_SLICE else ""),
                case,
            )


def _kept_values(impl: GuardedAdapter, case: Case, w: np.ndarray, context: str) -> None:
    """Blocked weights exactly 0; kept visible weights are the undropped ones / (1 - p)."""
    p = case.dropout_p
    decl = impl.declaration
    plain = case.replace(dropout_p=0.0)
    want = compare.expected(plain, decl)
    live = ~want.all_blocked
    compare.assert_blocked_zero(w, want.blocked & live[..., None], case, f" under dropout with {context}")
    allowed = compare.weights_allowance(plain, decl) / (1.0 - p)
    kept = (w != 0) & ~want.blocked & live[..., None]
    check(bool(kept.any()), f"dropout_p = {p} with {context} dropped every visible weight", case)
    bad = kept & (np.abs(w - want.weights / (1.0 - p)) > allowed)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        fail(
            f"{int(bad.sum())} kept weights under dropout with {context} are not undropped / (1 - p): first at "
            f"{list(idx)} got {w[idx]:.6g}, expected {want.weights[idx] / (1 - p):.6g} (allowed |err| "
            f"{allowed[idx]:.3g})",
            case,
        )


def _empty_rows(impl: GuardedAdapter, case: Case, out: np.ndarray, context: str) -> None:
    """Rows with no visible key keep the declared fill under dropout: zeros or NaN, never a stray NaN."""
    decl = impl.declaration
    want = compare.expected(case.replace(dropout_p=0.0), decl)
    out = np.asarray(out, dtype=np.float64)
    empty, policy = want.all_blocked, decl.all_blocked_policy(case)
    if policy == "zeros":
        rows = out[empty]
        check(
            bool(np.all(rows == 0)),
            f"all-blocked rows under dropout with {context} must be exactly 0 (declared "
            f"zeros); got {int(np.isnan(rows).sum())} NaN of {rows.size}",
            case,
        )
    elif policy == "nan":
        check(
            bool(np.all(np.isnan(out[empty]))),
            f"all-blocked rows under dropout with {context} must be NaN (declared nan)",
            case,
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
    return random_case(
        seed,
        B=B,
        Hq=H,
        T=T,
        S=T,
        Dk=8,
        Dv=8,
        dtype=dtype,
        magnitude=0.5,
        dropout_p=p,
        is_causal=decl.causal,
        label=f"dropout_p={p:g} with {what}",
        **arrays,
    )


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
    _needs_dropout(impl)
    decl = impl.declaration
    if not (decl.causal or decl.bool_mask or decl.float_mask):
        impl.not_applicable("declares no is_causal and no mask: nothing can be blocked")
    case = _masked_dropout_case(impl, dtype, 410, 0.3)
    impl.require(case)
    _empty_rows(impl, case, impl.forward(case), case.label)
    _kept_values(impl, case, observe_weights(impl, case), case.label)
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
