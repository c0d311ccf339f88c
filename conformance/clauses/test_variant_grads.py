"""Gradients through the variants: the softcap's backward, windows and lengths in the backward.

A softcapped kernel's forward can be right while its backward is wrong: the cap ``c tanh(s/c)``
is a function of the scores, so every score gradient dS reaches Q and K multiplied by its
derivative ``1 - tanh(s/c)^2``. Backward kernels written by hand (FlashAttention's, FlexAttention's
score_mod gradients) drop that factor or take the tanh of the wrong argument; both leave dV right
and put dQ and dK off by up to the whole gradient where scores approach the cap. The expected
gradients are the variant oracle's VJP (:func:`conformance.oracle_variants.vjp`, checked against
finite differences of an independent loop), compared under :mod:`conformance.harness.judge.variant_vjp`.

A flash backward recomputes P from Q and K instead of storing it, so every limit the forward applies
(the sliding window, each sequence's lengths) must be applied again; one forgotten puts gradient on
keys the forward never read. WINDOW-GRAD-03 and VARLEN-GRAD-06 check that, each case in one dtype
for a kernel compiling per shape (buckets.spread: the property does not depend on the dtype).
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_gradients import numpy_cotangent
from conformance.clauses.test_variants import SOFTCAP_DEF, WINDOW_DEF
from conformance.clauses.test_varlen import CU_SEQLENS, ragged
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge.variant_vjp import assert_variant_vjp
from conformance.harness.spec.clause import clause


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
        case = impl.admit(case)
        assert_variant_vjp(
            impl, case, numpy_cotangent(case, 1200 + n), f"softcap {cap:g}{', causal' if causal else ''}"
        )


@clause(
    "WINDOW-GRAD-03",
    "dQ, dK and dV under a sliding window (with and without is_causal) are the oracle's: the backward applies the window the forward applied, no gradient on keys outside it",
    WINDOW_DEF,
    requires=["grad", "window"],
    kills=["grad_window_ignored", "grad_window_top_left"],
)
def test_window_grad(impl, dtype):
    items = [((1, 4, 11), (2, 1), False), ((2, 9, 9), (3, 0), True)]
    for n, ((B, T, S), window, causal) in enumerate(buckets.spread(impl, dtype, items)):
        case = random_case(1220 + n, B=B, Hq=2, T=T, S=S, Dk=16, dtype=dtype, is_causal=causal)
        case = case.replace(window=window, label=f"window {window} gradients")
        case = impl.admit(case)
        assert_variant_vjp(
            impl, case, numpy_cotangent(case, 1220 + n), f"window {window}{', causal' if causal else ''}"
        )


@clause(
    "VARLEN-GRAD-06",
    "dQ, dK and dV of a varlen batch are each sequence's own: no gradient on keys past a sequence's end or on its padded query rows, causal by its own lengths",
    CU_SEQLENS,
    requires=["grad", "varlen"],
    kills=["grad_varlen_ignored"],
)
def test_varlen_grad(impl, dtype):
    items = [
        ragged(1230, dtype, [5, 2, 7, 3], [9, 4, 7, 12], Hq=4, Hkv=2, Dk=16),
        ragged(1231, dtype, [4, 6, 1, 3, 2], [10, 6, 5, 3, 13], Hq=2, Dk=16, is_causal=True),
    ]
    for case in buckets.spread(impl, dtype, items):
        case = impl.admit(case)
        tq, sk = (np.asarray(x).tolist() for x in (case.seqlens_q, case.seqlens_k))
        words = f"varlen seqlens_q={tq} seqlens_k={sk}{', causal' if case.is_causal else ''}"
        assert_variant_vjp(impl, case, numpy_cotangent(case, case.seed), words)
