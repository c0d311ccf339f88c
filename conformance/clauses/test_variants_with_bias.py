"""The caller's additive mask M under the variants: added after the softcap, beside ALiBi, counted in
the returned lse.

FlashAttention's reference caps the scaled product first (``scores = tanh(scores / softcap) *
softcap``) and adds masks and biases after; the seed adds M to the scaled scores. No clause gave a
variant kernel a finite M: a kernel that caps ``s + M`` (squeezing the user's bias with the scores),
or whose lse pass sees M's -inf entries but not its finite values, passed every clause. This runs
softcap with a finite M (and with ALiBi), and the lse of a case with a finite M, where the kernel
declares them (``float_mask`` with ``softcap`` / ``alibi`` / ``returns_lse``).
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_variants import SOFTCAP_DEF, slopes
from conformance.contract import Case
from conformance.harness.cases.build import random_case, rng_for
from conformance.harness.judge.lse import assert_lse_matches
from conformance.harness.judge.variant_forward import assert_variant_output
from conformance.harness.spec.clause import clause


def _bias(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """A finite additive M of ordinary size (about +-3, a relative-position bias), one -inf per row 0."""
    m = 1.5 * rng_for(seed).standard_normal(shape)
    m[..., 0, -1] = -np.inf
    return m


def _cases(dtype: str) -> list[Case]:
    base = random_case(1420, B=2, Hq=2, T=5, S=12, Dk=16, dtype=dtype, magnitude=3.0)  # SOFTCAP-01's shape
    m = _bias(1421, (1, 2, 5, 12))
    grouped = random_case(1422, B=2, Hq=6, Hkv=2, T=7, S=7, Dk=8, dtype=dtype, magnitude=2.5)  # ALIBI-01's
    return [
        base.replace(bias=m, softcap=2.0, label="softcap 2 with a finite additive M"),
        grouped.replace(bias=_bias(1423, (7, 7)), softcap=4.0, alibi_slopes=slopes(6), label="softcap, ALiBi and M"),
        base.replace(bias=m, label="lse with a finite additive M"),
    ]


@clause(
    "VARIANTS-BIAS-03",
    "the caller's finite additive M is added after the softcap (the cap squeezes the scaled product only), beside "
    "ALiBi, and counts in the returned lse",
    SOFTCAP_DEF,
    requires=["float_mask"],
    kills=["softcap_after_bias", "lse_ignores_bias"],
)
def test_additive_mask_with_variants(impl, dtype):
    capped, combined, plain = _cases(dtype)
    outputs = [c for c in (capped, combined) if impl.supports(c)]
    lse = impl.declaration.returns_lse and impl.supports(plain)
    if not outputs and not lse:
        impl.not_applicable("; ".join(impl.declaration.not_supported_reasons(capped)) or "declares returns_lse=False")
    for case in outputs:
        assert_variant_output(impl, case)
    if lse:
        assert_lse_matches(impl, plain)
