"""A custom scale is a number multiplied into the scores, whatever its sign.

``scores = q @ k.transpose(-2, -1) * scale`` (003) multiplies; a negative scale turns the scores
around (softmax of -QK^T / 2 for scale = -0.5), which a kernel built on ``sqrt(scale)`` applied to
Q and to K (to keep both inside float16's range), or on a head dim d = 1 / scale^2 standing in for
the scale, cannot represent: it returns NaN, or the scale's absolute value. The drawn case space and
the scale clauses use scales >= 0 only, so such kernels passed every other clause.

The allowance is the error model's for the case itself. Its bound depends on |scale| only
(tests/test_error_model.py checks that (Q, -c) and (-Q, +c), the same scores, get equal bounds):
it once multiplied its |q||k| terms by the signed scale, allowed less than the rounding of the
scaled product on a negative scale, and failed correct kernels here.
"""

from __future__ import annotations

from conformance.clauses.common import cross_dims
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

SCORES_TIMES_SCALE = Source("003", "问题与基线", "scores = q @ k.transpose(-2, -1) * scale")


@clause(
    "SCALE-NEGATIVE-05",
    "a negative custom scale (-0.5) multiplies the scores like any other: the output is the oracle's "
    "softmax(-QK^T / 2) V",
    SCORES_TIMES_SCALE,
    requires=["custom_scale"],
    kills=["scale_split_sqrt_qk", "scale_magnitude_only"],
)
def test_negative_scale(impl, dtype):
    case = random_case(1320, dtype=dtype, scale=-0.5, magnitude=1.5, label="scale = -0.5", **cross_dims(impl))
    impl.require(case)
    compare.assert_output_matches(impl, case)
