"""§5 of 000_f3dcd408372d9e02.txt: dividing by sqrt(d_k) brings the score variance back to about 1.

The kernel's scores are recovered from its weights: with two keys per query,
``log w1 - log w2 = scale * q.(k1 - k2)`` exactly, whatever the kernel does inside. For fixed q and
independent k1, k2 ~ N(0, I), ``q.(k1 - k2) / sqrt(d)`` is N(0, 2|q|^2/d) *exactly*, so under the
spec's scale each standardised difference ``u = x / sqrt(2|q|^2/d)`` is N(0, 1) and ``sum u^2`` over n
independent rows is chi-square with n degrees of freedom. ``mean(u^2)`` estimates
``Var(scale * q.k) / Var(q.k / sqrt(d))``, i.e. the score variance the spec says is ~1; the test
rejects outside the two-sided chi-square acceptance interval.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from conformance.contract import DTYPES, Case
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases import buckets
from conformance.harness.cases.build import cast, random_case, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import fail

ROWS = 4096  # B * H rows, one query and two keys each
DIMS = (16, 64, 128, 256)
TOTAL_FPR = 1e-6


def chi2_interval(n: int, alpha: float) -> tuple[float, float]:
    """Two-sided acceptance interval for chi2(n)/n (Wilson-Hilferty; at n=4096 its quantile error
    is below 1e-4 relative, far inside the interval's width)."""
    z = NormalDist().inv_cdf(1 - alpha / 2)
    c = 2.0 / (9.0 * n)
    lo = (1 - c - z * math.sqrt(c)) ** 3
    hi = (1 - c + z * math.sqrt(c)) ** 3
    return lo, hi


def _dims(max_head_dim: int | None) -> tuple[int, ...]:
    return tuple(d for d in DIMS if max_head_dim is None or d <= max_head_dim)


@clause(
    "SCALE-VAR-01",
    "for q, k with i.i.d. N(0,1) entries the kernel's scaled scores have variance ~1, for every Dk",
    Source(
        "000",
        "§5 为什么要按维度缩放",
        (
            "除以 $\\sqrt{d_k}$ 后，方差重新回到约 1 的量级：",
            "\\operatorname{Var}\\left(\\frac{q\\cdot k}{\\sqrt{d_k}}\\right)\\approx 1",
        ),
    ),
    kills=["no_scaling", "scale_by_dk"],
    fpr="1e-6 in total: exact chi-square test per Dk at 1e-6/len(Dk), Bonferroni; n=4096 rows per Dk",
)
def test_score_variance_near_one(impl):
    decl = impl.declaration
    dtype = next((d for d in DTYPES if d in decl.dtypes), None)
    if dtype is None:
        impl.not_applicable("declares no floating dtype")
    dims = _dims(decl.max_head_dim)
    if not dims:
        impl.not_applicable(f"declares max head dim {decl.max_head_dim} < {DIMS[0]}")
    alpha = TOTAL_FPR / len(dims)
    lo, hi = chi2_interval(ROWS, alpha)
    B, H = 64, ROWS // 64
    for d in dims:
        rng = rng_for(600 + d)
        q = cast(rng.standard_normal((B, H, 1, d)), dtype)
        k = cast(rng.standard_normal((B, H, 2, d)), dtype)
        v = np.zeros((B, H, 2, d), dtype=q.dtype)  # replaced by the identity probe
        case = Case(q, k, v, seed=600 + d, label=f"variance probe Dk={d}")
        impl.require(case)
        w = observe_weights(impl, case)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.log(w[..., 0, 0]) - np.log(w[..., 0, 1])
        q64 = q.astype(np.float64)[..., 0, :]
        sd = np.sqrt(2.0 * (q64**2).sum(axis=-1) / d)
        u2 = (x / sd) ** 2
        est = float(np.mean(u2)) if np.all(np.isfinite(u2)) else float("inf")
        if not (lo <= est <= hi):
            fail(
                f"Dk={d}: estimated variance of the scaled scores is {est:.4g}, outside the acceptance interval "
                f"[{lo:.4f}, {hi:.4f}] (spec: ~1 with scale 1/sqrt(Dk); FPR {alpha:.2g} at this Dk). "
                f"Implied scale: {math.sqrt(est) if math.isfinite(est) else float('inf'):.4g} x 1/sqrt(Dk)",
                case,
            )


@clause(
    "SCALE-DEFAULT-02",
    "the default scale is 1/sqrt(Dk), the key width, not 1/sqrt(Dv) (visible only when Dk != Dv)",
    Source("000", "§2 从单个 Query 到公式", "第二步，除以 $\\sqrt{d_k}$ 并做 softmax"),
    requires=["requires_dk_eq_dv=False"],  # Dk != Dv is what it tests: with Dk == Dv the two scales agree
    kills=["scale_by_sqrt_dv", "no_scaling"],
)
def test_default_scale_uses_dk(impl, dtype):
    # A kernel compiling per shape checks each (Dk, Dv) in one dtype (harness.cases.buckets.spread).
    for seed, (dk, dv) in buckets.spread(impl, dtype, list(enumerate(((16, 4), (4, 32)), start=80))):
        case = random_case(seed, B=1, Hq=2, T=4, S=6, Dk=dk, Dv=dv, dtype=dtype, magnitude=1.5)
        impl.require(case)
        compare.assert_output_matches(impl, case)


@clause(
    "SCALE-CUSTOM-03",
    "a custom scale replaces 1/sqrt(Dk) and is applied once",
    Source("003", "核心机制", "第二步除以 √d 控制分数方差。"),
    requires=["custom_scale"],
    kills=["ignore_custom_scale", "scale_stored_bf16@float32"],
)
def test_custom_scale_honoured(impl, dtype):
    for seed, scale in buckets.spread(impl, dtype, ((90, 0.9), (91, 0.05))):  # compiling per shape: one per dtype
        shape = buckets.dims(impl, "cross", B=1, Hq=2, T=4, S=6, Dk=8)  # the palette's, if compiling per shape
        case = random_case(seed, dtype=dtype, scale=scale, magnitude=1.5, **shape)
        impl.require(case)
        compare.assert_output_matches(impl, case)
