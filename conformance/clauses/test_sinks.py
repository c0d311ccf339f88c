"""Attention sinks: one learned logit per query head in every row's softmax denominator.

gpt-oss's attention, and the kernels that serve it (FlashInfer's and FlashAttention's ``sinks``,
jax's splash attention), give each query head h a logit ``sink_h`` that joins the softmax as a
column with no value: the weights become ``exp(s_j) / (exp(sink_h) + sum_k exp(s_k))`` and sum to
less than 1. The bugs are the ones an extra softmax term invites: the sink forgotten, added without
its exponential, read per kv head under GQA, or added to every score as if it were a bias (which
cancels it). The expected output is the variant oracle's (:func:`conformance.oracle_variants.forward`,
tested against an independent loop); the allowance is that of the lowered case, in which the sink is
one more key with a zero key and value and the sink as its bias.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle_variants
from conformance.contract import Case
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare, tolerance
from conformance.harness.judge.lse import assert_lse_matches
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import ClauseViolation, mismatch_report
from conformance.harness.spec.sink_definitions import SINKS_DEF

# Distinct per head, some below and some above a row's log-sum-exp (about log S here), in float32.
SINKS = np.array([-1.5, 0.5, 2.0, -0.25, 1.0, 3.0], dtype=np.float32)


def assert_sink_output(impl, case: Case) -> np.ndarray:
    """The kernel's output against the variant oracle's (computed here, not through the harness's
    cache, whose key predates sinks), the failure naming the sinks and the heads that differ."""
    decl = impl.declaration
    out = impl.forward(case)
    want = oracle_variants.forward(
        case, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment
    ).out
    allowed = compare.output_allowance(case, decl)
    allowed = np.where(np.isfinite(allowed), allowed, np.finfo(np.float64).max)
    what = f"output with sinks {np.asarray(case.sinks).tolist()} per query head ({decl.causal_alignment}, as declared)"
    msg = mismatch_report(what, out, want, allowed, tolerance.describe(decl.tolerance_dtype(case)))
    if msg:
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(np.asarray(out, dtype=np.float64) - want) <= allowed)
        heads = np.flatnonzero(bad.any(axis=(0, 2, 3))).tolist()
        raise ClauseViolation(f"{msg}\n  query heads that differ: {heads}", case)
    return out


@clause(
    "SINKS-01",
    "an attention sink adds exp(sink_h) of each query head's own logit to every row's softmax denominator and nothing to its numerators (under GQA, causal and a window too); a returned lse includes it",
    SINKS_DEF,
    requires=["sinks"],
    kills=["sinks_ignored", "sinks_not_exponentiated", "sinks_per_kv_head", "sink_added_to_scores", "lse_without_sink"],
)
def test_sinks(impl, dtype):
    for n, (T, S, causal, window) in enumerate(((5, 9, False, None), (6, 6, True, None), (4, 10, False, (3, 0)))):
        case = random_case(1300 + n, B=2, Hq=6, Hkv=2, T=T, S=S, Dk=8, dtype=dtype, is_causal=causal)
        case = impl.admitted(case.replace(sinks=SINKS, window=window, label=f"sinks T={T} S={S}"))
        if n == 0:
            impl.require(case)
        elif not impl.supports(case):
            continue
        assert_sink_output(impl, case)
        if impl.declaration.returns_lse:  # the normaliser the lse logs includes exp(sink_h)
            assert_lse_matches(impl, case)
