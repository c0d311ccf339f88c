"""Varlen batches whose longest query and key lengths are equal although no sequence is square.

A varlen kernel given ``max_seqlen_q == max_seqlen_k`` may take a self-attention path, and the bug
that path ships is indexing the keys with ``cu_seqlens_q`` (the query offsets passed twice): right
whenever every sequence has as many keys as queries. The varlen clauses' batches have different
longest lengths, so a held-out kernel with that path passed every clause. The batch here has the
longest query and key lengths equal (7 and 7) and no square sequence; it uses VARLEN-WINDOW-ALIBI-03's
buffer shape (a compiling kernel builds no new program).
"""

from __future__ import annotations

from conformance.clauses.test_varlen import CU_SEQLENS, ragged
from conformance.harness.cases import buckets
from conformance.harness.judge.variant_forward import assert_variant_output, check_blocked_pattern
from conformance.harness.spec.clause import clause


@clause(
    "VARLEN-EQUAL-MAX-07",
    "a varlen batch whose longest query and key lengths are equal (7) but whose sequences are not square "
    "(seqlens_q [3, 7, 2], seqlens_k [7, 4, 5]): each sequence reads its own keys, plain and causal",
    CU_SEQLENS,
    requires=["varlen"],
    kills=["varlen_keys_use_query_lengths"],
)
def test_equal_longest_lengths(impl, dtype):
    case = impl.admit(ragged(1340, dtype, [3, 7, 2], [7, 4, 5], T=7, S=11, Hq=6, Hkv=2, Dk=16))
    for causal in buckets.spread(impl, dtype, [False, True]):  # each in one dtype for a compiling kernel (ci)
        run = case.replace(is_causal=True, label=case.label + " causal") if causal else case
        if impl.supports(run):
            check_blocked_pattern(impl, run)
            assert_variant_output(impl, run)
