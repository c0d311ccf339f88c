"""§7.3 and §8 of 000_f3dcd408372d9e02.txt: dropout acts on the softmax weights, before V.

Checked from outside, with no access to the kernel's private keep mask: the weights are observed
(returned by the kernel, or through V = I), and a weight the kernel dropped reads as exactly 0. The
statistical clauses assume what every dropout kernel promises: each weight is kept independently
with probability 1 - p, and different seeds give independent masks. Their false-positive rates are
stated per clause and hold for any correct kernel under that assumption.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases.build import cast, random_case, random_mask
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import check, fail

ORDER = Source("000", "§7.3 Mask 应加在 softmax 之前", "QK^T / sqrt(dk) → 加 Mask → softmax → dropout → 乘 V")
RETURNED = Source(
    "000", "§8 最小 PyTorch 实现", "返回的权重已经经过 dropout；启用训练态 dropout 后，单次计算的行和不保证为 1。"
)
INVERTED = Source("000", "§8 最小 PyTorch 实现", "weights = F.dropout(weights, p=dropout_p, training=training)")
NO_DROPOUT = Source("000", "§12 误区二：softmax 对错维度", "有有效 Key 且未启用 dropout 时，每个 Query 的权重和为 1")

ALPHA = 1e-6  # false-positive rate of every statistical check in this module


def _needs_dropout(impl: GuardedAdapter) -> None:
    if not impl.declaration.dropout:
        impl.not_applicable("declares dropout=False")


def _dropout_case(dtype: str, seed: int, p: float, *, T: int = 32, S: int = 16, mask: bool = False) -> Case:
    """Small logits (magnitude 0.5) keep every weight near 1/S, far above the rounding tolerance, so a
    kept weight can never be mistaken for a dropped one."""
    m = random_mask(seed, (2, 1, T, S), p_blocked=0.25) if mask else None
    return random_case(seed, B=2, Hq=2, T=T, S=S, Dk=8, Dv=8, dtype=dtype, mask=m, dropout_p=p, magnitude=0.5)


def binomial_tails(k: int, n: int, p: float) -> tuple[float, float]:
    """Exact (P(X <= k), P(X >= k)) for X ~ Binomial(n, p), summed in log space (lgamma is accurate
    to ~1e-15 relative, far below the 1e-6 level the clauses decide at)."""
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)
        for i in range(n + 1)
    ]
    top = max(logs)
    pmf = [math.exp(v - top) for v in logs]
    scale = math.exp(top)
    return math.fsum(pmf[: k + 1]) * scale, math.fsum(pmf[k:]) * scale


def binomial_two_sided_p(k: int, n: int, p: float) -> float:
    """Exact two-sided tail 2*min(P(X <= k), P(X >= k)) for X ~ Binomial(n, p)."""
    return min(1.0, 2.0 * min(binomial_tails(k, n, p)))


@clause(
    "DROPOUT-VALUES-01",
    "with dropout each observed weight is exactly 0 (dropped) or its undropped value / (1 - p); blocked keys stay 0; "
    "enough weights survive for the check to have power",
    ORDER,
    requires=["dropout"],
    kills=["dropout_no_rescale", "dropout_before_softmax", "dropout_drops_everything"],
    fpr="1e-6: too few survivors is decided by the exact lower binomial tail of the kept count (1510 visible "
    "weights, keep probability 0.7) at 1e-6",
    tolerance="a kept weight w' must satisfy |w' - w/(1-p)| <= the error model's weight allowance for w, divided by (1-p)",
)
def test_dropout_values(impl, dtype):
    _needs_dropout(impl)
    p = 0.3
    case = _dropout_case(dtype, 60, p, mask=True)
    impl.require(case)
    w = observe_weights(impl, case)
    want = compare.expected(case.replace(dropout_p=0.0), impl.declaration)
    scaled = want.weights / (1.0 - p)
    compare.assert_blocked_zero(w, want.blocked, case, " under dropout (mask before softmax, §7.3)")
    allowed = compare.weights_allowance(case.replace(dropout_p=0.0), impl.declaration) / (1.0 - p)
    kept = (w != 0) & ~want.blocked
    # The value check looks only at survivors: a kernel that drops (nearly) every weight would pass it
    # vacuously, so the survivors must be as many as a keep probability of 1 - p gives (one-sided).
    visible = int((~want.blocked).sum())
    survivors = int(kept.sum())
    lower_tail, _ = binomial_tails(survivors, visible, 1.0 - p)
    check(
        lower_tail > ALPHA,
        f"only {survivors} of {visible} visible weights survived dropout_p = {p} (expected about "
        f"{visible * (1 - p):.0f}; P(kept <= {survivors}) = {lower_tail:.3g} <= {ALPHA:g}): too few survivors "
        "for the kept values to be checked",
        case,
    )
    bad = kept & (np.abs(w - scaled) > allowed)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        ratio = w[idx] / want.weights[idx]
        fail(
            f"{int(bad.sum())} of {int(kept.sum())} kept weights are not undropped/(1-p): first at {list(idx)} "
            f"got {w[idx]:.6g}, undropped {want.weights[idx]:.6g}, expected {scaled[idx]:.6g} "
            f"(ratio {ratio:.4g}, should be 1/(1-p) = {1 / (1 - p):.4g}; allowed |err| {allowed[idx]:.3g})",
            case,
        )


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
    _needs_dropout(impl)
    for i, p in enumerate(RATES):
        case = _dropout_case(dtype, 61 + 1000 * i, p)
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


@clause(
    "DROPOUT-EDGES-03",
    "dropout_p = 0 applies no dropout whatever the seed; dropout_p = 1 gives all-zero weights and output",
    NO_DROPOUT,
    requires=["dropout"],
    kills=["dropout_p1_nan", "dropout_keep_prob_swapped"],
)
def test_dropout_edges(impl, dtype):
    _needs_dropout(impl)
    none = _dropout_case(dtype, 62, 0.0, T=4, S=8)
    impl.require(none)
    first = compare.assert_output_matches(impl, none)
    other = impl.forward(none.replace(seed=63))
    if impl.declaration.deterministic:
        check(
            np.array_equal(first, other),
            "with dropout_p = 0 the seed must not matter, but two seeds gave different "
            "outputs (declared deterministic: bitwise equality expected)",
            none,
        )
    w = observe_weights(impl, none)
    check(bool(np.all(w > 0)), f"dropout_p = 0 dropped {int(np.count_nonzero(w == 0))} weights", none)
    full = _dropout_case(dtype, 64, 1.0, T=4, S=8)
    impl.require(full)
    out = np.asarray(impl.forward(full), dtype=np.float64)
    check(
        bool(np.all(out == 0)),
        f"dropout_p = 1 must give an all-zero output; got {int(np.isnan(out).sum())} NaN, "
        f"max |out| {np.nanmax(np.abs(out)) if np.isfinite(out).any() else float('nan'):.3g}",
        full,
    )
    wf = observe_weights(impl, full)
    check(
        bool(np.all(wf == 0)), f"dropout_p = 1 must drop every weight; {int(np.count_nonzero(wf != 0))} are not 0", full
    )


@clause(
    "DROPOUT-SEED-04",
    "the same seed reproduces the same dropout; a different seed draws a different mask",
    RETURNED,
    requires=["dropout"],
    kills=["dropout_ignores_seed"],
    fpr="< 1e-400: two independent masks over n = 2048 weights agree with probability (p^2+(1-p)^2)^n, p = 0.3",
)
def test_dropout_seed(impl, dtype):
    _needs_dropout(impl)
    case = _dropout_case(dtype, 65, 0.3)
    impl.require(case)
    a = observe_weights(impl, case)
    b = observe_weights(impl, case)
    if impl.declaration.deterministic:
        check(
            np.array_equal(a, b),
            f"the same seed gave different weights in {int((a != b).sum())} places "
            "(declared deterministic: bitwise equality expected)",
            case,
        )
    else:
        check(
            np.array_equal(a == 0, b == 0),
            f"the same seed dropped different weights in {int(((a == 0) != (b == 0)).sum())} places",
            case,
        )
    c = observe_weights(impl, case.replace(seed=66))
    check(
        not np.array_equal(a == 0, c == 0),
        "seeds 65 and 66 dropped exactly the same weights: the seed is ignored",
        case,
    )


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
    _needs_dropout(impl)
    p, n_seeds = 0.25, 32
    case = random_case(67, B=2, Hq=2, T=4, S=8, Dk=8, Dv=8, dtype=dtype, magnitude=0.5, dropout_p=p)
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
