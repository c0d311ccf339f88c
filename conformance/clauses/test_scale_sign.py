"""A custom scale is a number multiplied into the scores, whatever its sign.

``scores = q @ k.transpose(-2, -1) * scale`` (003) multiplies; a negative scale turns the scores
around (softmax of -QK^T / 2 for scale = -0.5), which a kernel built on ``sqrt(scale)`` applied to
Q and to K (to keep both inside float16's range), or on a head dim d = 1 / scale^2 standing in for
the scale, cannot represent: it returns NaN, or the scale's absolute value. The drawn case space and
the scale clauses use scales >= 0 only, so such kernels passed every other clause.

A mask is added to the scaled scores, so the scale never touches it: a kernel that writes -inf into
QK^T for the keys it blocks and multiplies by the scale afterwards (a fused kernel masking its tile
before scaling it) is right for every positive scale and gives -inf * 0 = NaN for a scale of 0 and
+inf at the blocked keys for a negative one. torch 2.13's CPU flash path does this for ``is_causal``
(NaN in every row for scale <= 0, eager and compiled; its math path is right), which a clause with a
mask alone or a positive scale never shows.

The allowance is the error model's for the case itself. Its bound depends on |scale| only
(tests/test_error_model.py checks that (Q, -c) and (-Q, +c), the same scores, get equal bounds):
it once multiplied its |q||k| terms by the signed scale, allowed less than the rounding of the
scaled product on a negative scale, and failed correct kernels here.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import cross_dims, key_padding, supported
from conformance.clauses.test_agreement import FORMULA
from conformance.clauses.test_gradients import CHECK_GRADS, GRAD_RULE, cotangent
from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
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


@clause(
    "SCALE-BEFORE-MASK-06",
    "a scale of 0 or -0.5 multiplies QK^T only: keys blocked by is_causal, by a boolean mask or by -inf in M "
    "still get zero weight and the output is the oracle's softmax(scale QK^T + M) V",
    FORMULA,
    requires=["custom_scale"],
    kills=["causal_before_scale", "mask_before_scale"],
)
def test_scale_before_mask(impl, dtype):
    """Each blocking path the kernel declares, alone, under each non-positive scale (a positive scale
    cannot tell a mask applied before the scale from one applied after)."""
    for case in _scaled_blocking(impl, dtype):
        compare.assert_output_matches(impl, case)


@clause(
    "SCALE-BEFORE-MASK-GRAD-07",
    "the same cases backward: dQ, dK, dV agree with the oracle's VJP (a backward that recomputes the weights "
    "with the mask written before the scale gets NaN where the forward was right)",
    CHECK_GRADS,
    requires=["custom_scale", "grad"],
    kills=["causal_before_scale_backward"],
    tolerance=GRAD_RULE,
)
def test_scale_before_mask_grad(impl, dtype):
    for case in _scaled_blocking(impl, dtype):
        compare.assert_vjp_matches(impl, case, cotangent(case, 1331))


def _scaled_blocking(impl: GuardedAdapter, dtype: str) -> list[Case]:
    """Scale 0 and -0.5, each with is_causal, a key-padding mask and -inf in M alone (those the kernel declares)."""
    dims = cross_dims(impl)
    padding = key_padding([dims["S"] - 1 if b % 2 == 0 else 2 for b in range(dims["B"])], dims["S"])
    bias = np.where(padding, -np.inf, 0.25 * np.cos(np.arange(dims["S"])))
    cases = []
    for scale in (0.0, -0.5):
        base = random_case(1330, dtype=dtype, scale=scale, magnitude=1.5, label=f"scale = {scale}", **dims)
        cases += [
            base.replace(is_causal=True, label=f"scale = {scale}, is_causal"),
            base.replace(mask=padding, label=f"scale = {scale}, key padding mask"),
            base.replace(bias=bias, label=f"scale = {scale}, -inf at padded keys in M"),
        ]
    return supported(impl, cases)
