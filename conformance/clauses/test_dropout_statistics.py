"""§7.3 and §8 of 000_f3dcd408372d9e02.txt: dropout on average. The fraction of dropped weights is p,
and the dropped output averaged over seeds is the undropped output (inverted dropout).

As in test_dropout.py, the weights are observed from outside and the statistics assume what every
dropout kernel promises: each weight is kept independently with probability 1 - p, and different
seeds give independent masks. Each clause states its false-positive rate.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.clauses.test_dropout import ALPHA, INVERTED, ORDER, binomial_tails, check_kept_weights, dropout_case
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases.build import cast
from conformance.harness.judge import compare
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import check


def binomial_two_sided_p(k: int, n: int, p: float) -> float:
    """Exact two-sided tail 2*min(P(X <= k), P(X >= k)) for X ~ Binomial(n, p)."""
    return min(1.0, 2.0 * min(binomial_tails(k, n, p)))


# A low and a high rate: a kernel that caps p (at 1/2, say, against a keep threshold that underflows) or
# that swaps p and 1 - p is right at one of them only. Each test at ALPHA / 2, so the clause's total is ALPHA.
RATES = (0.3, 0.75)


@clause(
    "DROPOUT-RATE-02",
    "the fraction of dropped weights matches p, at p = 0.3 and at p = 0.75 (exact two-sided binomial tests)",
    ORDER,
    requires=["dropout"],
    kills=["dropout_keep_prob_swapped", "dropout_before_softmax", "dropout_rate_capped_half"],
    fpr="1e-6 in total: reject when the exact two-sided binomial tail of the dropped count (n = 2048) is <= 5e-7, "
    "once at p = 0.3 and once at p = 0.75 (Bonferroni)",
)
def test_dropout_rate(impl, dtype):
    for i, p in enumerate(RATES):
        case = dropout_case(dtype, 61 + 1000 * i, p)
        impl.require(case)
        w = observe_weights(impl, case)
        n = w.size
        dropped = int(np.count_nonzero(w == 0))
        tail = binomial_two_sided_p(dropped, n, p)
        level = ALPHA / len(RATES)
        check(
            tail > level,
            f"{dropped} of {n} weights dropped ({dropped / n:.4f}), but dropout_p = {p}: the exact two-sided "
            f"binomial tail is {tail:.3g} <= {level:g} (expected about {n * p:.0f} +- "
            f"{math.sqrt(n * p * (1 - p)):.0f})",
            case,
        )


# Rates across (0, 1), tiny and near 1: a kernel that rounds p to a coarse grid, treats a tiny rate as none,
# clamps a high one or rescales by a constant from a table is right at 0.3 and 0.75 only. Each case holds
# enough weights that the rate's own count of drops (tiny p) or survivors (p near 1) is expected >= 60.
SWEPT_RATES = (0.001, 0.05, 0.9, 0.995)


def _swept_case(dtype: str, i: int, p: float):
    n = math.ceil(60 / min(p, 1 - p))  # weights needed: 60 expected drops (or survivors) at this rate
    S = 256
    T = max(8, math.ceil(n / (2 * S)))
    return dropout_case(dtype, 1900 + 97 * i, p, B=1, Hq=2, T=T, S=S)


@clause(
    "DROPOUT-RATE-SWEEP-12",
    "at tiny and near-1 rates (p = 0.001, 0.05, 0.9, 0.995) the fraction of dropped weights matches p and every kept "
    "weight is its undropped value / (1 - p)",
    ORDER,
    requires=["dropout"],
    kills=["dropout_tiny_rate_ignored", "dropout_high_rate_clamped"],
    fpr="1e-6 in total: each rate's exact two-sided binomial tail of the dropped count is compared at 2.5e-7 "
    "(Bonferroni over the four rates); each case holds enough weights for 60 expected drops or survivors, so a rate "
    "ignored, clamped or rounded to a coarse grid is far in the tail",
)
def test_dropout_rate_sweep(impl, dtype):
    for i, p in enumerate(SWEPT_RATES):
        case = _swept_case(dtype, i, p)
        impl.require(case)
        w = observe_weights(impl, case)
        n = w.size
        dropped = int(np.count_nonzero(w == 0))
        tail = binomial_two_sided_p(dropped, n, p)
        level = ALPHA / len(SWEPT_RATES)
        check(
            tail > level,
            f"{dropped} of {n} weights dropped ({dropped / n:.5f}), but dropout_p = {p}: the exact two-sided "
            f"binomial tail is {tail:.3g} <= {level:g} (expected about {n * p:.0f} +- "
            f"{math.sqrt(n * p * (1 - p)):.0f})",
            case,
        )
        check_kept_weights(impl, case, w, f" at p = {p}")


@clause(
    "DROPOUT-MEAN-05",
    "averaged over seeds, the dropped output equals the undropped output (inverted dropout keeps the expectation)",
    INVERTED,
    requires=["dropout"],
    kills=["dropout_no_rescale", "dropout_keep_prob_swapped"],
    fpr="1e-6: Hoeffding bound on Z = mean over 32 seeds of sum_i sign(E_i) out_i, whose terms are independent "
    "and bounded (one per seed, query row and key); plus a deterministic rounding allowance per element",
)
def test_dropout_mean(impl, dtype):
    p, n_seeds = 0.25, 32
    case = dropout_case(dtype, 67, p, T=4, S=8)
    # V near 1 gives every output the same sign, so a biased kernel's errors add up instead of cancelling.
    v = 1.0 + 0.5 * np.random.default_rng(68).standard_normal(case.value.shape)
    case = case.replace(value=cast(v, dtype))
    impl.require(case)
    undropped = case.replace(dropout_p=0.0)
    want = compare.expected(undropped, impl.declaration)
    E, w = want.out, want.weights
    c = np.sign(E)
    outs = [np.asarray(impl.forward(case.replace(seed=1000 + s)), dtype=np.float64) for s in range(n_seeds)]
    z = float(np.mean([np.sum(c * o) for o in outs]))
    z_want = float(np.sum(c * E))
    # Z = (1/N) sum_{seed, b, h, t, j} keep/(1-p) * w_tj * u_tj with u_tj = sum_d c_td v_jd: Hoeffding.
    ve = np.repeat(np.asarray(case.value, dtype=np.float64), case.Hq // case.Hkv, axis=1)
    u = np.einsum("bhtd,bhsd->bhts", c, ve)
    ranges_sq = float(np.sum((w * u / (1.0 - p)) ** 2))
    t = math.sqrt(ranges_sq * math.log(2.0 / ALPHA) / (2.0 * n_seeds))
    rounding = float(np.sum(compare.output_allowance(undropped, impl.declaration))) / (1.0 - p)
    err = abs(z - z_want)
    check(
        err <= t + rounding,
        f"mean over {n_seeds} seeds of sum(sign(E)*out) = {z:.6g}, undropped {z_want:.6g}: |diff| {err:.4g} > "
        f"allowed {t + rounding:.4g} (Hoeffding {t:.3g} at FPR {ALPHA:g} + rounding {rounding:.3g}); "
        f"ratio {z / z_want:.4f} (1 - p = {1 - p} would mean the 1/(1-p) rescale is missing)",
        case,
    )
