"""KV caches (FlashAttention's ``flash_attn_with_kvcache``, vLLM's paged attention): one problem, many forms.

A case is per-sequence key lengths with dense queries (decode: T = 1, or a short chunk). A KV-cache
kernel receives it in a form (:class:`conformance.contract.CacheForm`): a contiguous cache or pages
of size 1, odd or large behind a shuffled block table with a null block, the newest keys appended by
the kernel itself, the keys split for flash-decoding. The form never changes the answer, so every
form of a case is held to the same float64 oracle; kernels that do not take a form say so in their
declaration (``paged_kv``, ``page_size_multiple``, ``kv_append``), and the other forms still run.
Bugs caught: reading past a sequence's cache length, ignoring or misreading the block table,
confusing the page size, appended keys invisible or written to the wrong slot, a wrong split merge.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_variants import DECODE, NOT_BITWISE
from conformance.contract import CacheForm, Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.judge.lse import assert_lse_matches
from conformance.harness.judge.variant_forward import assert_variant_output
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.definitions import Definition
from conformance.harness.spec.report import ClauseViolation, mismatch_report

KV_DOC = "flash_attn_with_kvcache docstring"
PAGED = Definition(
    "flash-attn-kvcache",
    KV_DOC,
    (
        "k_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim) if there's no block_table, or (num_blocks, "
        "page_block_size, nheads_k, headdim) if there's a block_table (i.e. paged KV cache)",
        "block_table [optional]: (batch_size, max_num_blocks_per_seq), dtype torch.int32.",
    ),
)
GROWTH = Source("003", "复杂度与资源", "KV Cache：自回归推理中，缓存按层数、KV 头数、序列长度和头维线性增长。")
PAGE_SIZES = (1, 5, 16, 256)


def cache_case(seed: int, dtype: str, T: int, lengths, **kw) -> Case:
    """Dense queries (T per sequence) against per-sequence cache lengths."""
    sk = np.asarray(lengths)
    case = random_case(seed, B=len(sk), T=T, S=int(sk.max()), dtype=dtype, **kw)
    return case.replace(seqlens_k=sk, label=f"KV cache T={T}")


def run_forms(impl, case: Case, forms) -> int:
    """Every form the kernel takes must give the oracle's answer; returns how many ran."""
    ran = 0
    case = impl.admitted(case)
    for form in forms:
        c = case.replace(kv_form=form)
        if impl.supports(c):
            assert_variant_output(impl, c)
            ran += 1
    if not ran:
        impl.require(case.replace(kv_form=forms[0]))  # not applicable, with the declaration's reason
    return ran


@clause(
    "KV-LENGTHS-01",
    "decode (T = 1) and a short chunk (T = 3) against caches of different lengths per sequence (1, long, none): each sequence reads exactly its own cache length, causal bottom-right on it",
    DECODE,
    requires=["kv_lengths"],
    kills=["kv_ignores_cache_seqlens", "varlen_keys_past_end"],
)
def test_kv_lengths(impl, dtype):
    # Four programs for a compiling kernel: in the ci profile each runs in one dtype (buckets.spread).
    for n, T, causal in buckets.spread(impl, dtype, [(0, 1, False), (1, 3, False), (0, 1, True), (1, 3, True)]):
        case = cache_case(1100 + n, dtype, T, [1, 17, 6, 0, 9], Hq=4, Hkv=2, Dk=16)
        if causal:
            case = case.replace(is_causal=True, label=case.label + " causal")
        run_forms(impl, case, [CacheForm(seed=n)])


@clause(
    "KV-PAGED-02",
    "a paged cache gives the contiguous cache's answer for page sizes 1, odd (5), 16 and large (256), blocks at shuffled ids behind a null block",
    PAGED,
    requires=["kv_lengths", "paged_kv"],
    kills=["kv_block_table_ignored", "kv_page_size_confusion", "kv_partial_page_read_whole"],
)
def test_kv_paged(impl, dtype):
    case = cache_case(1110, dtype, 2, [13, 3, 24, 7], Hq=6, Hkv=2, Dk=8, is_causal=True)
    run_forms(impl, case, [CacheForm(page_size=p, seed=1110 + p) for p in PAGE_SIZES])


@clause(
    "KV-APPEND-03",
    "decode after appending to a cache equals the last rows of the full prefill: keys appended by the kernel are read at their positions",
    GROWTH,
    requires=["kv_lengths", "kv_append", "causal"],
    kills=["kv_append_not_visible", "kv_append_wrong_slot"],
)
def test_kv_append_matches_prefill(impl, dtype):
    L, new = 9, 2
    prefill = random_case(1120, B=3, Hq=4, Hkv=2, T=L, S=L, Dk=16, dtype=dtype, is_causal=True, label="prefill")
    prefill = impl.admit(prefill)
    full = compare.assert_output_matches(impl, prefill)
    decode = prefill.replace(
        query=np.ascontiguousarray(prefill.query[:, :, L - new :]), label=f"decode of the last {new} after append"
    )
    forms = [CacheForm(append=new, seed=1), CacheForm(page_size=4, append=new, seed=2), CacheForm(append=1, seed=3)]
    decl = impl.declaration
    for form in forms:
        case = decode.replace(kv_form=form)
        if not impl.supports(case):
            continue
        out = assert_variant_output(impl, case)
        allowed = compare.output_allowance(case, decl) + compare.output_allowance(prefill, decl)[:, :, L - new :]
        msg = mismatch_report(
            f"decode with {form.describe()} vs the last {new} rows of the kernel's own prefill",
            out,
            full[:, :, L - new :],
            allowed,
            "sum of the two cases' allowances",
        )
        if msg:
            raise ClauseViolation(msg, case)


@clause(
    "KV-SPLITS-04",
    "split-KV (flash-decoding) gives the same answer and lse for any number of splits (1, 2, 3, 7), within the error model, not bitwise",
    NOT_BITWISE,
    requires=["kv_lengths"],
    kills=["kv_split_merge_wrong"],
)
def test_kv_splits(impl, dtype):
    case = cache_case(1130, dtype, 1, [29, 7, 16], Hq=4, Hkv=1, Dk=16, magnitude=1.5)
    for splits in (1, 2, 3, 7):
        c = case.replace(kv_form=CacheForm(splits=splits), label=f"{case.label} num_splits={splits}")
        c = impl.admit(c)
        assert_variant_output(impl, c)
        if impl.declaration.returns_lse:
            assert_lse_matches(impl, c)
