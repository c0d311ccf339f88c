"""003 §逐步推导: the scale multiplies the score q_i^T k_j, so it can be moved onto q.

``s_ij = q_i^T k_j * scale`` is bilinear: running the kernel with ``scale = s`` must give what it
gives with ``scale = 1`` on ``q * s``. The factors used (1/4, 2, and 0) are powers of two or zero,
so ``q * s`` is exact in every dtype and the two runs must agree to rounding, whatever order the
kernel applies the scale in. ``s = 0`` is the degenerate edge where all scores are 0 and the
weights uniform: a kernel that writes ``scale or 1/sqrt(d)`` replaces it with the default.
The default scale is checked the same way at Dk = 16, where 1/sqrt(Dk) = 1/4 is exact.
"""

from __future__ import annotations

from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

SCORE = Source("003", "逐步推导", "s_ij = q_iᵀ k_j / √d")
WHY = "scale on the scores vs the same factor on q"


def _prescaled(case: Case, factor: float) -> Case:
    q = (case.query.astype("float64") * factor).astype(case.query.dtype)
    return case.replace(query=q, scale=1.0, label=f"q * {factor:g}, scale=1")


@clause(
    "SCALE-EQUIV-04",
    "scale = s gives the same output as scale = 1 on q * s (s = 1/4, 2, 0), and the default scale equals q * 1/sqrt(Dk) at scale 1",
    SCORE,
    requires=["custom_scale"],
    kills=["scale_zero_means_default", "custom_scale_times_default", "ignore_custom_scale", "scale_one_means_default"],
)
def test_scale_moves_onto_query(impl, dtype):
    base = random_case(500, B=2, Hq=2, T=4, S=6, Dk=16, Dv=16, dtype=dtype, magnitude=1.5)
    for s in buckets.spread(impl, dtype, (0.25, 2.0, 0.0)):  # compiling per shape: one s per dtype (ci)
        case = base.replace(scale=s, label=f"scale={s:g}")
        impl.require(case)
        compare.assert_equivalent(impl, case, _prescaled(base, s), WHY)
    impl.require(base)
    compare.assert_equivalent(impl, base.replace(label="default scale 1/sqrt(16)"), _prescaled(base, 0.25), WHY)
