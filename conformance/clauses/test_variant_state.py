"""Variant arguments baked into a kernel cached by shape: ALiBi slopes, the window, the softcap.

Kernels that compile per shape take the variants' arguments either as runtime values or as
compile-time constants; as constants, the cache key must hold them. A kernel whose key omits them
answers the first call of a shape right and every later call of that shape with the first call's
slopes, window or cap. STATE-KEYS-01 varies the mask, is_causal and the scale between calls of one
shape; these calls vary the variants' arguments, in an order that puts a stale entry in front of
the next call, and hold each answer to the variant oracle. Shapes are WINDOW-01's and ALIBI-01's
(a kernel that takes the window at run time, as jax does, builds no new program).
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import supported
from conformance.clauses.test_state_between_calls import FUNCTION_OF_INPUTS
from conformance.clauses.test_variants import slopes
from conformance.contract import Case
from conformance.harness.cases.build import random_case
from conformance.harness.judge.variant_forward import assert_variant_output
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import fail


def _calls(dtype: str) -> list[Case]:
    """Pairs of calls of one shape that differ in one variant argument only."""
    square = random_case(1350, B=2, Hq=2, T=9, S=9, Dk=16, dtype=dtype, magnitude=2.0)
    grouped = random_case(1351, B=2, Hq=6, Hkv=2, T=7, S=7, Dk=8, dtype=dtype, magnitude=2.0)
    other = np.linspace(1.0, 0.05, 6).astype(np.float32)  # not the geometric slopes, largest first
    return [
        square.replace(window=(1, 0), label="window (1, 0)"),
        square.replace(window=(4, 2), label="window (4, 2), same shape"),
        grouped.replace(alibi_slopes=slopes(6), label="ALiBi slopes of 6 heads"),
        grouped.replace(alibi_slopes=other, label="other ALiBi slopes, same shape"),
        grouped.replace(softcap=1.5, label="softcap 1.5"),
        grouped.replace(softcap=20.0, label="softcap 20, same shape"),
    ]


@clause(
    "STATE-VARIANTS-04",
    "calls of one shape that differ only in the ALiBi slopes, the window or the softcap each get their own answer "
    "(no kernel cached by shape with the first call's variant arguments baked in)",
    FUNCTION_OF_INPUTS,
    kills=["alibi_slopes_baked_per_head_count", "window_baked_per_shape", "softcap_baked_per_shape"],
)
def test_variant_arguments_not_cached(impl, dtype):
    calls = supported(impl, _calls(dtype))
    for i, case in enumerate(calls):
        try:
            assert_variant_output(impl, case)
        except AssertionError as exc:
            before = ", ".join(c.label for c in calls[:i]) or "nothing"
            fail(f"call {i + 1} ({case.label}) disagrees with the oracle after the calls [{before}]:\n{exc}", case)
