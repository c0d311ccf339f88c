"""A custom scale is a number multiplied into the scores, whatever its sign.

``scores = q @ k.transpose(-2, -1) * scale`` (003) multiplies; a negative scale turns the scores
around (softmax of -QK^T / 2 for scale = -0.5), which a kernel built on ``sqrt(scale)`` applied to
Q and to K (to keep both inside float16's range), or on a head dim d = 1 / scale^2 standing in for
the scale, cannot represent: it returns NaN, or the scale's absolute value. The drawn case space and
the scale clauses use scales >= 0 only, so such kernels passed every other clause.

The allowance is the error model's on the mirrored case (-Q with scale +0.5): the same scores
exactly (negating Q and the scale is exact in floating point), and a bound that depends on
|scale| only. (``harness.tolerance`` multiplies its |q||k| bounds by the signed scale, so on a
negative scale it allowed less than the rounding of the scaled product; see the report of
``tests/mutants_heldout2.py``'s round.)
"""

from __future__ import annotations

from conformance.harness import buckets, compare
from conformance.harness.cases import random_case
from conformance.harness.clause import Source, clause

SCORES_TIMES_SCALE = Source("003", "问题与基线", "scores = q @ k.transpose(-2, -1) * scale")


@clause(
    "SCALE-NEGATIVE-05",
    "a negative custom scale (-0.5) multiplies the scores like any other: the output is the oracle's "
    "softmax(-QK^T / 2) V",
    SCORES_TIMES_SCALE,
    requires=["custom_scale"],
    kills=["scale_split_sqrt_qk", "scale_magnitude_only"],
    tolerance="the error model's allowance (harness.tolerance) of the mirrored case -Q, scale +0.5: the same scores",
)
def test_negative_scale(impl, dtype):
    # The palette's T < S shape for a kernel compiling per shape (ci); its own sizes otherwise.
    shape = buckets.dims(impl, "cross", B=2, Hq=2, T=4, S=6, Dk=8)
    case = random_case(1320, dtype=dtype, scale=-0.5, magnitude=1.5, label="scale = -0.5", **shape)
    impl.require(case)
    mirror = case.replace(query=-case.query, scale=0.5, label="mirror: -Q, scale = +0.5")
    out = impl.forward(case)
    decl = impl.declaration
    compare.assert_close(out, compare.expected(case, decl).out, case=mirror, decl=decl)
