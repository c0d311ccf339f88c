"""Definitions a clause may rest on where the seed does not speak: the variants' own documents, verbatim.

The seed defines scaled dot-product attention; it says nothing of sliding windows, softcapping, ALiBi
or a returned log-sum-exp. Clauses about those cite the definition the kernels themselves follow,
FlashAttention's, as a :class:`Definition`: the same interface as a seed
:class:`~conformance.harness.spec.clause.Source` (``cite()``, ``file``, ``section``, ``text``), but never
presented as the seed: ``cite()`` says
"definition (not the seed)", ``seed`` is ``"def"``, and tests/test_definitions.py checks that every
quote occurs verbatim (whitespace-normalised) in the excerpt stored here and nowhere in the seeds.

The excerpts are copied unchanged from Dao-AILab/flash-attention (BSD-3-Clause, "Copyright (c) 2022,
the respective contributors"), at the commit named in each :class:`Document`; quoting them is what
lets a reader check the clause against the source.

Long because most of it is verbatim quoted text (the excerpts a clause cites), which cannot be
shortened without ceasing to be a quotation; the code is the two small classes above them.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.harness.spec.clause import Quotation

SEED_KEY = "def"  # what a Definition answers for ``.seed``: no seed file has this key


@dataclass(frozen=True)
class Document:
    """A stored verbatim excerpt and where it comes from."""

    title: str
    repo: str
    commit: str
    path: str
    lines: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.repo}@{self.commit[:10]} {self.path}:{self.lines}"


FLASH_ATTN_FUNC_DOC = Document(
    title="FlashAttention 2, flash_attn_func docstring",
    repo="Dao-AILab/flash-attention",
    commit="0251105a2fb19d2957484b7f023cd8c115286ced",
    path="flash_attn/flash_attn_interface.py",
    lines="1169-1216",
    text="""dropout_p should be set to 0.0 during evaluation
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.
    For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head
    0 of K, V, and head 3, 4, 5 of Q will attention to head 1 of K, V.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix.
    For example, if seqlen_q = 2 and seqlen_k = 5, the causal mask (1 = keep, 0 = masked out) is:
        1 1 1 1 0
        1 1 1 1 1
    If seqlen_q = 5 and seqlen_k = 2, the causal mask is:
        0 0
        0 0
        0 0
        1 0
        1 1
    If the row of the mask is all zero, the output will be zero.

    If window_size != (-1, -1), implements sliding window local attention. Query at position i
    will only attend to keys between
    [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        k: (batch_size, seqlen, nheads_k, headdim)
        v: (batch_size, seqlen, nheads_k, headdim)
        dropout_p: float. Dropout probability.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local attention.
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of
            (-alibi_slope * |i + seqlen_k - seqlen_q - j|)
            is added to the attention score of query i and key j.
        deterministic: bool. Whether to use the deterministic implementation of the backward pass,
            which is slightly slower and uses more memory. The forward pass is always deterministic.
        return_attn_probs: bool. Whether to return the attention probabilities. This option is for
           testing only. The returned probabilities are not guaranteed to be correct
           (they might not have the right scaling).
    Return:
        out: (batch_size, seqlen, nheads, headdim).
        softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen). The
            logsumexp of each row of the matrix QK^T * scaling (e.g., log of the softmax
            normalization factor).
        S_dmask [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen, seqlen).
            The output of softmax (possibly with different scaling). It also encodes the dropout
            pattern (negative means that location was dropped, nonnegative means it was kept).
    """,
)

# Verbatim, like every excerpt here: upstream's varlen docstring repeats most of flash_attn_func's, so
# the two excerpts share lines (a pair the duplicates tool lists); a quotation cannot be factored.
FLASH_ATTN_VARLEN_DOC = Document(
    title="FlashAttention 2, flash_attn_varlen_func docstring",
    repo="Dao-AILab/flash-attention",
    commit="0251105a2fb19d2957484b7f023cd8c115286ced",
    path="flash_attn/flash_attn_interface.py",
    lines="1409-1463",
    text="""dropout_p should be set to 0.0 during evaluation
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in K, V with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.
    For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head
    0 of K, V, and head 3, 4, 5 of Q will attention to head 1 of K, V.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix.
    For example, if seqlen_q = 2 and seqlen_k = 5, the causal mask (1 = keep, 0 = masked out) is:
        1 1 1 1 0
        1 1 1 1 1
    If seqlen_q = 5 and seqlen_k = 2, the causal mask is:
        0 0
        0 0
        0 0
        1 0
        1 1
    If the row of the mask is all zero, the output will be zero.

    If window_size != (-1, -1), implements sliding window local attention. Query at position i
    will only attend to keys between
    [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive.

    Arguments:
        q: (total_q, nheads, headdim), where total_q = total number of query tokens in the batch.
        k: (total_k, nheads_k, headdim), where total_k = total number of key tokens in the batch.
        v: (total_k, nheads_k, headdim), where total_k = total number of key tokens in the batch.
        cu_seqlens_q: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into q.
        cu_seqlens_k: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into kv.
        max_seqlen_q: int. Maximum query sequence length in the batch.
        max_seqlen_k: int. Maximum key sequence length in the batch.
        dropout_p: float. Dropout probability.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local attention.
        softcap: float. Anything > 0 activates softcapping attention.
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of
            (-alibi_slope * |i + seqlen_k - seqlen_q - j|)
            is added to the attention score of query i and key j.
        deterministic: bool. Whether to use the deterministic implementation of the backward pass,
            which is slightly slower and uses more memory. The forward pass is always deterministic.
        return_attn_probs: bool. Whether to return the attention probabilities. This option is for
           testing only. The returned probabilities are not guaranteed to be correct
           (they might not have the right scaling).
    Return:
        out: (total, nheads, headdim).
        softmax_lse [optional, if return_attn_probs=True]: (nheads, total_q_seqlen). The
            logsumexp of each row of the matrix QK^T * scaling (e.g., log of the softmax
            normalization factor).
        S_dmask [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen, seqlen).
            The output of softmax (possibly with different scaling). It also encodes the dropout
            pattern (negative means that location was dropped, nonnegative means it was kept).
    """,
)

FLASH_ATTN_KVCACHE_DOC = Document(
    title="FlashAttention 2, flash_attn_with_kvcache docstring",
    repo="Dao-AILab/flash-attention",
    commit="0251105a2fb19d2957484b7f023cd8c115286ced",
    path="flash_attn/flash_attn_interface.py",
    lines="1506-1592",
    text="""
    If k and v are not None, k_cache and v_cache will be updated *inplace* with the new values from
    k and v. This is useful for incremental decoding: you can pass in the cached keys/values from
    the previous step, and update them with the new keys/values from the current step, and do
    attention with the updated cache, all in 1 kernel.

    If you pass in k / v, you must make sure that the cache is large enough to hold the new values.
    For example, the KV cache could be pre-allocated with the max sequence length, and you can use
    cache_seqlens to keep track of the current sequence lengths of each sequence in the batch.

    Also apply rotary embedding if rotary_cos and rotary_sin are passed in. The key @k will be
    rotated by rotary_cos and rotary_sin at indices cache_seqlens, cache_seqlens + 1, etc.
    If causal or local (i.e., window_size != (-1, -1)), the query @q will be rotated by rotary_cos
    and rotary_sin at indices cache_seqlens, cache_seqlens + 1, etc.
    If not causal and not local, the query @q will be rotated by rotary_cos and rotary_sin at
    indices cache_seqlens only (i.e. we consider all tokens in @q to be at position cache_seqlens).

    See tests/test_flash_attn.py::test_flash_attn_kvcache for examples of how to use this function.

    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.
    For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head
    0 of K, V, and head 3, 4, 5 of Q will attention to head 1 of K, V.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix.
    For example, if seqlen_q = 2 and seqlen_k = 5, the causal mask (1 = keep, 0 = masked out) is:
        1 1 1 1 0
        1 1 1 1 1
    If seqlen_q = 5 and seqlen_k = 2, the causal mask is:
        0 0
        0 0
        0 0
        1 0
        1 1
    If the row of the mask is all zero, the output will be zero.

    If window_size != (-1, -1), implements sliding window local attention. Query at position i
    will only attend to keys between
    [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive.

    Note: Does not support backward pass.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        k_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim) if there's no block_table,
            or (num_blocks, page_block_size, nheads_k, headdim) if there's a block_table (i.e. paged KV cache)
            page_block_size must be a multiple of 256.
        v_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim) if there's no block_table,
            or (num_blocks, page_block_size, nheads_k, headdim) if there's a block_table (i.e. paged KV cache)
        k [optional]: (batch_size, seqlen_new, nheads_k, headdim). If not None, we concatenate
            k with k_cache, starting at the indices specified by cache_seqlens.
        v [optional]: (batch_size, seqlen_new, nheads_k, headdim). Similar to k.
        rotary_cos [optional]: (seqlen_ro, rotary_dim / 2). If not None, we apply rotary embedding
            to k and q. Only applicable if k and v are passed in. rotary_dim must be divisible by 16.
        rotary_sin [optional]: (seqlen_ro, rotary_dim / 2). Similar to rotary_cos.
        cache_seqlens: int, or (batch_size,), dtype torch.int32. The sequence lengths of the
            KV cache.
        cache_batch_idx: (batch_size,), dtype torch.int32. The indices used to index into the KV cache.
            If None, we assume that the batch indices are [0, 1, 2, ..., batch_size - 1].
            If the indices are not distinct, and k and v are provided, the values updated in the cache
                 might come from any of the duplicate indices.
        cache_leftpad: (batch_size,), dtype torch.int32. The index that the KV cache starts. If None, assume 0.
        block_table [optional]: (batch_size, max_num_blocks_per_seq), dtype torch.int32.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local attention.
        softcap: float. Anything > 0 activates softcapping attention.
        rotary_interleaved: bool. Only applicable if rotary_cos and rotary_sin are passed in.
            If True, rotary embedding will combine dimensions 0 & 1, 2 & 3, etc. If False,
            rotary embedding will combine dimensions 0 & rotary_dim / 2, 1 & rotary_dim / 2 + 1
            (i.e. GPT-NeoX style).
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of
            (-alibi_slope * |i + seqlen_k - seqlen_q - j|)
            is added to the attention score of query i and key j.
        num_splits: int. If > 1, split the key/value into this many chunks along the sequence.
           If num_splits == 1, we don't split the key/value. If num_splits == 0, we use a heuristic
           to automatically determine the number of splits.
           Don't change this unless you know what you are doing.
        return_softmax_lse: bool. Whether to return the logsumexp of the attention scores.

    Return:
        out: (batch_size, seqlen, nheads, headdim).
        softmax_lse [optional, if return_softmax_lse=True]: (batch_size, nheads, seqlen). The
            logsumexp of each row of the matrix QK^T * scaling (e.g., log of the softmax
            normalization factor).
    """,
)

FLASH_ATTN_REFERENCE = Document(
    title="FlashAttention, attention_ref (the reference its tests compare kernels with)",
    repo="Dao-AILab/flash-attention",
    commit="0251105a2fb19d2957484b7f023cd8c115286ced",
    path="flash_attn/cute/testing.py",
    lines="391-392",
    text="""
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
""",
)

FLASH_ATTN_REFERENCE_CAUSAL = Document(
    title="FlashAttention, attention_ref (causal as a window)",
    repo="Dao-AILab/flash-attention",
    commit="0251105a2fb19d2957484b7f023cd8c115286ced",
    path="flash_attn/cute/testing.py",
    lines="355-356",
    text="""
    if causal:
        window_size = (window_size[0], 0)
""",
)

DOCUMENTS: dict[str, Document] = {
    "flash-attn": FLASH_ATTN_FUNC_DOC,
    "flash-attn-varlen": FLASH_ATTN_VARLEN_DOC,
    "flash-attn-kvcache": FLASH_ATTN_KVCACHE_DOC,
    "flash-attn-ref": FLASH_ATTN_REFERENCE,
    "flash-attn-ref-causal": FLASH_ATTN_REFERENCE_CAUSAL,
}


@dataclass(frozen=True)
class Definition(Quotation):
    """A clause's authority from a variant's own definition: ``document`` (a key of DOCUMENTS), a
    label of the place in it, and one or more verbatim quotes from it."""

    document: str
    section: str
    sentence: str | tuple[str, ...]

    def __post_init__(self) -> None:
        if self.document not in DOCUMENTS:
            raise ValueError(f"unknown definition document {self.document!r}; known: {', '.join(DOCUMENTS)}")
        self._freeze_sentences(f"Definition({self.document!r}, {self.section!r})")

    seed = SEED_KEY
    is_seed = False

    @property
    def source_document(self) -> Document:
        return DOCUMENTS[self.document]

    @property
    def file(self) -> str:
        return f"definition (not the seed): {self.source_document.where}"

    def cite(self) -> str:
        return f"{self.file} ({self.section}): \u201c{self.text}\u201d"
