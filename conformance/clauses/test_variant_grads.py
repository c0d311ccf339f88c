"""Gradients through the variants (issue 12): the softcap's backward.

A softcapped kernel's forward can be right while its backward is wrong: the cap ``c tanh(s/c)``
is a function of the scores, so every score gradient dS reaches Q and K multiplied by its
derivative ``1 - tanh(s/c)^2``. Backward kernels written by hand (FlashAttention's, FlexAttention's
score_mod gradients) drop that factor or take the tanh of the wrong argument; both leave dV right
and put dQ and dK off by up to the whole gradient where scores approach the cap. The expected
gradients are the variant oracle's VJP (:func:`conformance.oracle_variants.vjp`, checked against
finite differences of an independent loop), compared under :mod:`conformance.harness.variant_vjp`.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_variants import SOFTCAP_DEF
from conformance.contract import np_dtype
from conformance.harness.cases import random_case
from conformance.harness.clause import clause
from conformance.harness.variant_vjp import assert_variant_vjp


@clause(
    "SOFTCAP-GRAD-02",
    "the gradients of a softcapped attention carry the cap's derivative: dS reaches Q and K times 1 - tanh(s/c)^2, s the scaled score",
    SOFTCAP_DEF,
    requires=["softcap", "grad"],
    kills=["softcap_grad_no_derivative", "softcap_grad_without_c"],
)
def test_softcap_grad(impl, dtype):
    # |s / c| around 1 and beyond: the derivative ranges over (0, 1) instead of staying near 1.
    for n, (cap, magnitude, hkv, causal) in enumerate(((2.0, 2.5, 2, False), (5.0, 4.0, 1, True))):
        case = random_case(
            1200 + n, B=2, Hq=2, Hkv=hkv, T=5, S=7, Dk=8, dtype=dtype, magnitude=magnitude, is_causal=causal
        ).replace(softcap=cap, label=f"softcap {cap} gradients")
        impl.require(case)
        g = np.random.default_rng(1200 + n).standard_normal(case.out_shape).astype(np_dtype(dtype))
        assert_variant_vjp(impl, case, g, f"softcap {cap:g}{', causal' if causal else ''}")
