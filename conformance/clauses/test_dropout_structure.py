"""§7.3 and §8 of 000_f3dcd408372d9e02.txt: dropout's structure across the tensor.

test_dropout.py checks each weight's fate (dropped to 0 or scaled by 1/(1-p)), the rate and the
seed. What it cannot see is the *structure* of the keep mask: fused kernels derive each (batch,
head) slice's random numbers from an RNG offset, and an offset that ignores the head or batch
index, or advances too little, gives slices that share their masks (whole or shifted) while every
slice alone still has the right rate. Dropout together with is_causal and masks is
test_dropout_masks.py.

The statistics assume what every dropout kernel promises: each weight is kept independently with
probability 1 - p. At p = 1/2 the keep bits are fair coins, and then the XOR of two distinct bits
is a fair coin independent of any other XOR of distinct pairs along a chain, which makes every
agreement count below an exact Binomial(n, 1/2).
"""

from __future__ import annotations

import math

import numpy as np

from conformance.clauses.test_dropout import RETURNED, dropout_case
from conformance.harness.calls.probes import observe_weights
from conformance.harness.judge import compare
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import check, fail

ALPHA = 1e-6  # total false-positive rate of the clause


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
    # Grouped heads where declared: an RNG offset taken from the kv head index gives the query heads
    # of a group one shared mask, which the head pairs below see at lag 0.
    hkv = IND_H // 2 if impl.declaration.gqa else IND_H
    case = dropout_case(dtype, 400, 0.5, B=IND_B, Hq=IND_H, Hkv=hkv, T=IND_T, S=IND_S)
    case = case.replace(label="dropout structure, p = 1/2")
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
