"""Gradients through the variants that add to the scores without depending on Q and K: ALiBi (alone
and under a softcap) and attention sinks.

SOFTCAP-GRAD-02, WINDOW-GRAD-03 and VARLEN-GRAD-06 check the backward under the softcap, windows and
lengths; no clause ran a backward with ALiBi slopes or sinks, and held-out kernels whose backward
recomputes P without the ALiBi bias or without the sink in the normaliser, or evaluates the cap's
derivative at the ALiBi-biased score, passed every clause. Both enter the backward through P only
(and the cap's derivative at the scaled product q.k * scale, the bias excluded), which the variant
oracle's VJP has (:func:`conformance.oracle_variants.vjp`).

The allowance is ``harness.judge.variant_vjp``'s; for sinks it is computed on the lowered case, whose
last key is the sink (a zero key and value), so dK's and dV's allowances are cut back to the S real
keys here (``variant_vjp.grad_allowance`` does not cut them yet).
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_gradients import numpy_cotangent
from conformance.clauses.test_sinks import SINKS
from conformance.clauses.test_variants import ALIBI_DEF, slopes
from conformance.harness.cases.build import random_case
from conformance.harness.judge import tolerance
from conformance.harness.judge.variant_vjp import assert_variant_vjp, expected_vjp, grad_allowance
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import ClauseViolation, mismatch_report
from conformance.harness.spec.sink_definitions import SINKS_DEF


@clause(
    "ALIBI-GRAD-04",
    "dQ, dK and dV with ALiBi slopes (under GQA and causal), alone and under a softcap, are the oracle's: the "
    "backward's P carries the bias, and the cap's derivative is taken at the scaled product, not the biased score",
    ALIBI_DEF,
    requires=["grad", "alibi"],
    kills=["grad_alibi_ignored", "softcap_grad_at_biased_score"],
)
def test_alibi_grad(impl, dtype):
    base = random_case(1370, B=2, Hq=6, Hkv=2, T=5, S=7, Dk=8, dtype=dtype, magnitude=2.5, is_causal=True)
    cases = [
        base.replace(alibi_slopes=slopes(6), label="ALiBi gradients"),
        base.replace(alibi_slopes=slopes(6), softcap=2.0, label="ALiBi and softcap 2 gradients"),
    ]
    cases = [impl.admitted(c) for c in cases]
    runnable = [c for c in cases if impl.supports(c)]
    if not runnable:
        impl.require(cases[0])
    for n, case in enumerate(runnable):
        assert_variant_vjp(impl, case, numpy_cotangent(case, 1370 + n), case.label.removesuffix(" gradients"))


@clause(
    "SINKS-GRAD-02",
    "dQ, dK and dV with attention sinks (under GQA, and causal) are the oracle's: the backward's P has the sink "
    "in its normaliser, as the forward's",
    SINKS_DEF,
    requires=["grad", "sinks"],
    kills=["grad_sinks_ignored"],
)
def test_sinks_grad(impl, dtype):
    for n, causal in enumerate((False, True)):
        case = random_case(1380 + n, B=2, Hq=6, Hkv=2, T=5, S=9, Dk=8, dtype=dtype, is_causal=causal)
        case = case.replace(sinks=SINKS, label=f"sinks gradients{', causal' if causal else ''}")
        case = impl.admit(case)
        g = numpy_cotangent(case, 1380 + n)
        grads = impl.vjp(case, g)
        decl = impl.declaration
        want = expected_vjp(case, g, decl)
        allowed = [a[..., : case.S, :] if i else a for i, a in enumerate(grad_allowance(case, g, decl))]
        for name, got, exp, allow in zip(("dq", "dk", "dv"), grads, want, allowed):
            allow = np.where(np.isfinite(allow), allow, np.finfo(np.float64).max)
            msg = mismatch_report(
                f"{name} with sinks {SINKS.tolist()}{', causal' if causal else ''}",
                np.asarray(got, dtype=np.float64),
                exp,
                allow,
                tolerance.describe(decl.tolerance_dtype(case), "gradients"),
            )
            if msg:
                raise ClauseViolation(msg, case)
