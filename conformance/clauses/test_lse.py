"""The log-sum-exp a kernel returns beside its output: its base, its value on rows that see no
key, its scale, and its layout under GQA.

FlashAttention returns ``softmax_lse`` [B, Hq, T]; a kernel declares ``returns_lse``, ``lse_base`` and
``lse_empty``, and :mod:`conformance.harness.judge.lse` holds the returned values to the variant
oracle's in the declared conventions. The lse of the final scores (softcap, ALiBi) is
test_lse_scores.py.
"""

from __future__ import annotations

from conformance.clauses.test_variants import FA_DOC
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge.lse import assert_lse_matches
from conformance.harness.spec.clause import clause
from conformance.harness.spec.definitions import Definition

LSE_DEF = Definition(
    "flash-attn",
    FA_DOC,
    "softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen). The logsumexp of each row of "
    "the matrix QK^T * scaling (e.g., log of the softmax normalization factor).",
)
LSE_GQA_DEF = Definition(
    "flash-attn",
    FA_DOC,
    (
        "For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head 0 of K, V, "
        "and head 3, 4, 5 of Q will attention to head 1 of K, V.",
        "softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen).",
    ),
)


# `duplicates` pairs this declaration with SINKS-01's (test_sinks.py): alike in shape only, two clauses.
@clause(
    "LSE-01",
    "the returned lse is log(sum_j exp(s_j)) over each row's visible final scores, in the declared base (e unless declared 2), with the declared value on rows that see no key",
    LSE_DEF,
    requires=["returns_lse"],
    kills=["lse_base2", "lse_empty_zero", "lse_without_scale", "lse_window_ignored", "lse_empty_positive"],
)
def test_lse(impl, dtype):
    cases = [
        random_case(980, B=2, Hq=2, T=5, S=11, Dk=16, dtype=dtype, magnitude=1.5, label="lse plain"),
        random_case(981, B=1, Hq=2, T=7, S=4, Dk=8, dtype=dtype, is_causal=True, label="lse causal T > S"),
        random_case(982, B=2, Hq=3, T=6, S=9, Dk=8, dtype=dtype, scale=0.5, label="lse custom scale"),
        random_case(983, B=1, Hq=2, T=6, S=6, Dk=8, dtype=dtype, label="lse window").replace(window=(2, 0)),
        # rows that see no key whatever the alignment: T > S with the window (0, 0)
        random_case(984, B=1, Hq=2, T=7, S=4, Dk=8, dtype=dtype, label="lse empty rows").replace(window=(0, 0)),
    ]
    runnable = [case for case in cases if impl.supports(case)]
    if not runnable:
        impl.require(cases[0])
    for case in buckets.spread(impl, dtype, runnable):  # each in one dtype for a compiling kernel (ci)
        assert_lse_matches(impl, case)


@clause(
    "LSE-GQA-02",
    "under GQA the lse is laid out [B, Hq, T] by query head, query head h belonging to kv head h // (Hq / Hkv)",
    LSE_GQA_DEF,
    requires=["returns_lse", "gqa"],
    kills=["lse_gqa_kv_major"],
)
def test_lse_gqa_layout(impl, dtype):
    for n, (hq, hkv) in buckets.spread(impl, dtype, list(enumerate(((6, 2), (8, 4))))):
        case = random_case(990 + n, B=2, Hq=hq, Hkv=hkv, T=4, S=9, Dk=8, dtype=dtype, label=f"lse Hq={hq} Hkv={hkv}")
        impl.require(case)
        assert_lse_matches(impl, case)
