"""Variable-length batches (FlashAttention's varlen API): every sequence is its own attention problem.

A varlen kernel receives sequences packed back to back with cumulative lengths; the bugs are index
bugs: positions taken from the batch's longest lengths (``max_seqlen_k - max_seqlen_q``) instead of
the sequence's own, keys read past a sequence's end into the next one, edge sequences (one token,
no keys, no queries) mishandled. The case is defined as per-sequence dense problems (the first
``seqlens_q[b]`` queries and ``seqlens_k[b]`` keys of item b); the adapter lowers it to its form
(packed + cu_seqlens for ``flash-attn-varlen``), and the variant oracle answers each sequence on its
own. A failure names the sequence: ``b`` in the report is the sequence's index, and the case line
lists every sequence's lengths.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle_variants
from conformance.clauses.test_variants import DECODE, OFFSET, slopes
from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.judge.lse import assert_lse_matches
from conformance.harness.judge.variant_forward import assert_variant_output, check_blocked_pattern
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.definitions import Definition
from conformance.harness.spec.report import ClauseViolation

VARLEN_DOC = "flash_attn_varlen_func docstring"
CU_SEQLENS = Definition(
    "flash-attn-varlen",
    VARLEN_DOC,
    (
        "q: (total_q, nheads, headdim), where total_q = total number of query tokens in the batch.",
        "cu_seqlens_k: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths of the sequences in "
        "the batch, used to index into kv.",
    ),
)
VARLEN_WINDOW = Definition(
    "flash-attn-varlen",
    VARLEN_DOC,
    (
        "Query at position i will only attend to keys between [i + seqlen_k - seqlen_q - window_size[0], "
        "i + seqlen_k - seqlen_q + window_size[1]] inclusive.",
        "A bias of (-alibi_slope * |i + seqlen_k - seqlen_q - j|) is added to the attention score of query i and "
        "key j.",
    ),
)


def ragged(seed: int, dtype: str, tq, sk, T: int | None = None, S: int | None = None, **kw):
    """A batch of len(tq) sequences, sequence b with tq[b] queries and sk[b] keys, in a padded buffer
    of T x S (default: the longest; a larger buffer lets clauses share one shape, which a compiling
    kernel then builds once). Clauses use head dims >= S, so the V = I probe keeps the case's shapes."""
    tq, sk = np.asarray(tq), np.asarray(sk)
    T = int(tq.max()) if T is None else T
    S = int(sk.max()) if S is None else S
    case = random_case(seed, B=len(tq), T=T, S=S, dtype=dtype, **kw)
    return case.replace(seqlens_q=tq, seqlens_k=sk, label="varlen")


@clause(
    "VARLEN-01",
    "sequences of different lengths in one batch: each sequence's output (and lse) is that of its own problem, no key read past its end",
    CU_SEQLENS,
    requires=["varlen"],
    kills=["varlen_keys_past_end", "varlen_last_sequence_short"],
)
def test_varlen_sequences(impl, dtype):
    case = impl.admit(ragged(1000, dtype, [5, 2, 7, 3], [9, 4, 7, 12], Hq=4, Hkv=2, Dk=16))
    assert_variant_output(impl, case)
    check_blocked_pattern(impl, case)
    if impl.declaration.returns_lse:
        assert_lse_matches(impl, case)


@clause(
    "VARLEN-CAUSAL-02",
    "causal over a varlen batch aligns each sequence by its own lengths (bottom-right: S_b - T_b), not by the batch's longest",
    OFFSET,
    requires=["varlen", "causal"],
    kills=["varlen_global_offset"],
)
def test_varlen_causal(impl, dtype):
    case = ragged(
        1010, dtype, [4, 6, 1, 3, 2], [10, 6, 5, 3, 13], Hq=2, Dk=16, is_causal=True
    )  # VARLEN-EDGES-04's shape
    impl.require(case)
    check_blocked_pattern(impl, case)
    assert_variant_output(impl, case)


@clause(
    "VARLEN-WINDOW-ALIBI-03",
    "sliding windows (and ALiBi distances, where the kernel takes ALiBi) over a varlen batch use each sequence's own query and key lengths",
    VARLEN_WINDOW,
    requires=["varlen", "window"],
    kills=["varlen_global_offset"],
)
def test_varlen_window_alibi(impl, dtype):
    # Head dim 16 >= S: the V = I probe keeps the case's shapes (one program for a compiling kernel).
    case = impl.admit(ragged(1020, dtype, [3, 7, 5], [11, 7, 6], Hq=6, Hkv=2, Dk=16).replace(window=(2, 1)))
    check_blocked_pattern(impl, case)
    alibi = case.replace(alibi_slopes=slopes(6))
    assert_variant_output(impl, alibi if impl.supports(alibi) else case)


@clause(
    "VARLEN-EDGES-04",
    "edge sequences in a varlen batch: a one-token decode query against a long history, a sequence with no keys (its rows get the declared fill), a sequence with no queries",
    DECODE,
    requires=["varlen"],
    kills=["varlen_keys_past_end", "varlen_global_offset", "varlen_empty_sequence_unwritten"],
)
def test_varlen_edges(impl, dtype):
    case = ragged(1030, dtype, [1, 4, 0, 1, 3], [13, 0, 5, 1, 3], T=6, Hq=2, Dk=16)  # VARLEN-CAUSAL-02's shape
    impl.require(case)
    for causal in buckets.spread(impl, dtype, [False, True]):  # each in one dtype for a compiling kernel (ci)
        if not causal:
            assert_variant_output(impl, case)
            continue
        causal = case.replace(is_causal=True, label=case.label + " causal")
        if impl.supports(causal):
            check_blocked_pattern(impl, causal)
            assert_variant_output(impl, causal)


PADDING = Source("000", "§7.1 Padding Mask", "这些填充位置没有语义，不应被其他 Query 读取。")


def assert_padded_form(impl, case: Case) -> None:
    """``case`` lowered to the dense form (oracle_variants.lower: one padded batch, every key past a
    sequence's end, its causal / window limits and its padded query rows blocked in a boolean mask),
    run through the kernel's own mask argument and held to the base oracle on that form: live rows
    are the sequences' own answers, padded rows (all blocked) get the kernel's declared fill."""
    low = oracle_variants.lower(case, impl.declaration.causal_alignment).replace(label=case.label + " padded + mask")
    try:
        compare.assert_output_matches(impl, low)
    except ClauseViolation as exc:
        tq, sk = oracle_variants.lengths(case)
        raise ClauseViolation(
            f"varlen batch as padded + mask (seqlens_q={tq.tolist()}, seqlens_k={sk.tolist()}"
            f"{', causal' if case.is_causal else ''}, {impl.declaration.causal_alignment} per sequence):\n{exc}",
            low,
        ) from exc


@clause(
    "VARLEN-PADDED-05",
    "a dense kernel given a varlen batch as one padded batch with a boolean mask (keys past each sequence's end, its own causal limits and its padded query rows blocked) answers every sequence's own problem",
    PADDING,
    requires=["bool_mask", "varlen=False"],
    kills=["batch_mask_mixup", "mask_cache_by_shape", "mask_after_softmax"],
)
def test_varlen_as_padded_mask(impl, dtype):
    # VARLEN-01's, VARLEN-CAUSAL-02's and VARLEN-EDGES-04's batches (kernels that take lengths
    # themselves are held to those clauses); the last two share one shape. Each runs where the
    # kernel takes its dense form (the first has grouped heads); at least one must.
    cases = [
        ragged(1010, dtype, [4, 6, 1, 3, 2], [10, 6, 5, 3, 13], Hq=2, Dk=16, is_causal=True),
        ragged(1030, dtype, [1, 4, 0, 1, 3], [13, 0, 5, 1, 3], T=6, Hq=2, Dk=16),
        ragged(1000, dtype, [5, 2, 7, 3], [9, 4, 7, 12], Hq=4, Hkv=2, Dk=16),
    ]
    align = impl.declaration.causal_alignment
    dense = [c for c in cases if impl.supports(oracle_variants.lower(c, align))]
    if not dense:
        impl.require(oracle_variants.lower(cases[0], align))  # not applicable, with the declaration's reason
    for case in dense:
        assert_padded_form(impl, case)
