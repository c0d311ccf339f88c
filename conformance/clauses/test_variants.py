"""The variants kernel authors ship (issue 12): sliding windows, softcap, ALiBi, the returned lse.

The seed defines scaled dot-product attention and says nothing of these; where it speaks (the
position offset of a non-square causal mask, decode with T_q = 1, "exact" not meaning bitwise) the
clauses cite it, and otherwise they cite the definition the kernels follow, FlashAttention's, as a
:class:`~conformance.harness.spec.definitions.Definition` (verbatim, never presented as the seed). The
float64 answers come from :mod:`conformance.oracle_variants`; windows and ALiBi slide along the
kernel's declared causal alignment (FlashAttention: bottom-right), and a failure names the variant,
the window or slopes, and the query and key where the kernel went wrong.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle_variants
from conformance.contract import Case
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare, tolerance
from conformance.harness.judge.lse import assert_lse_matches
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.definitions import Definition
from conformance.harness.spec.report import ClauseViolation, fail, mismatch_report

FA_DOC = "flash_attn_func docstring"
WINDOW_DEF = Definition(
    "flash-attn",
    FA_DOC,
    "If window_size != (-1, -1), implements sliding window local attention. Query at position i will only attend "
    "to keys between [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive.",
)
CAUSAL_IN_WINDOW = Definition(
    "flash-attn-ref-causal", "attention_ref, causal as the window (left, 0)", "window_size = (window_size[0], 0)"
)
SOFTCAP_DEF = Definition(
    "flash-attn-ref", "attention_ref, after the scaled product", "scores = torch.tanh(scores / softcap) * softcap"
)
ALIBI_DEF = Definition(
    "flash-attn",
    FA_DOC,
    "alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of (-alibi_slope * |i + seqlen_k - seqlen_q - j|) "
    "is added to the attention score of query i and key j.",
)
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
OFFSET = Source("000", "§9 一个最小 Shape 测试", "带 KV Cache 的非方阵因果屏蔽也需要考虑位置偏移。")
DECODE = Source("003", "输入与输出", "自回归 Decode 的单步查询通常 T_q=1，而 T_k 随历史长度增长。")
NOT_BITWISE = Source(
    "003", "边界与失败方式", "FP16/BF16 下不同融合顺序会产生允许范围内的数值差异；“精确注意力”不表示逐 bit 相同。"
)


def slopes(n_heads: int) -> np.ndarray:
    """The ALiBi paper's slopes, as the fp32 values FlashAttention takes."""
    return oracle_variants.alibi_slopes_for(n_heads).astype(np.float32)


def _variant_words(case: Case, align: str) -> str:
    parts = []
    if case.is_varlen:
        tq, sk = oracle_variants.lengths(case)
        if case.seqlens_q is None:
            parts.append(f"per-sequence key lengths {sk.tolist()} (T={case.T} each)")
        else:
            parts.append(f"varlen seqlens_q={tq.tolist()} seqlens_k={sk.tolist()}")
    if case.kv_form is not None:
        parts.append(case.kv_form.describe())
    if case.window is not None:
        parts.append(f"window {tuple(case.window)}")
    if case.is_causal:
        parts.append("causal")
    if case.softcap:
        parts.append(f"softcap {case.softcap:g}")
    if case.alibi_slopes is not None:
        parts.append(f"ALiBi slopes {list(np.shape(case.alibi_slopes))}")
    return ", ".join(parts) + f" ({align}, as declared)"


def _visible_keys(blocked_row: np.ndarray) -> str:
    vis = np.flatnonzero(~blocked_row)
    if vis.size == 0:
        return "none"
    if vis.size == vis[-1] - vis[0] + 1:
        return f"keys {vis[0]}..{vis[-1]}"
    return f"keys {vis.tolist()}"


def check_blocked_pattern(impl, case: Case) -> np.ndarray:
    """Observed weights: exactly 0 outside the variant's visible set, nonzero inside (where the
    oracle's weight is not negligible), and equal to the oracle's within the error model."""
    decl = impl.declaration
    want = compare.expected(case, decl)
    w = observe_weights(impl, case)
    live = ~want.all_blocked
    words = _variant_words(case, decl.causal_alignment)
    leaked = want.blocked & live[..., None] & (w != 0)
    if leaked.any():
        b, h, t, s = (int(i) for i in np.argwhere(leaked)[0])
        fail(
            f"{words}: {int(leaked.sum())} positions outside the visible set have nonzero weight; first: query {t} "
            f"reads key {s} (b={b}, h={h}, weight {w[b, h, t, s]:.6g}) but may see only "
            f"{_visible_keys(want.blocked[b, h, t])}",
            case,
        )
    starved = ~want.blocked & live[..., None] & (w == 0) & (want.weights > 1e-3)
    if starved.any():
        b, h, t, s = (int(i) for i in np.argwhere(starved)[0])
        fail(
            f"{words}: {int(starved.sum())} visible positions have weight 0; first: query {t} cannot read key {s} "
            f"(b={b}, h={h}), which it may see ({_visible_keys(want.blocked[b, h, t])})",
            case,
        )
    empty_read = want.all_blocked[..., None] & (w != 0) & ~np.isnan(w)
    if decl.all_blocked_policy(case) == "zeros" and empty_read.any():
        b, h, t, _ = (int(i) for i in np.argwhere(empty_read)[0])
        fail(f"{words}: query {t} (b={b}, h={h}) sees no key, yet its weights are not 0", case)
    allowed = compare.weights_allowance(case, decl)
    msg = mismatch_report(
        f"weights under {words}",
        w,
        want.weights,
        np.where(live[..., None], allowed, np.inf),
        tolerance.describe(decl.tolerance_dtype(case), "observed weights"),
    )
    if msg:
        raise ClauseViolation(msg, case)
    return w


def _sequences_off(case: Case, decl, out: np.ndarray) -> str:
    """Which sequences of the batch the kernel got wrong, with their lengths."""
    with np.errstate(invalid="ignore"):
        err = np.abs(np.asarray(out, dtype=np.float64) - compare.expected(case, decl).out)
        bad = ~(err <= compare.output_allowance(case, decl))
    bad &= ~np.isnan(compare.expected(case, decl).out)
    tq, sk = oracle_variants.lengths(case)
    seqs = [f"b={b} (T_b={tq[b]}, S_b={sk[b]})" for b in np.flatnonzero(bad.reshape(case.B, -1).any(axis=1))]
    return f"\n  sequences that differ: {', '.join(seqs)}" if seqs else ""


def assert_variant_output(impl, case: Case) -> np.ndarray:
    """The output of a variant case against the variant oracle, the failure naming the variant (and,
    for a varlen batch, the sequences that differ)."""
    decl = impl.declaration
    out = impl.forward(case)
    try:
        compare.assert_close(out, compare.expected(case, decl).out, case=case, decl=decl)
    except ClauseViolation as exc:
        words = _variant_words(case, decl.causal_alignment)
        seqs = _sequences_off(case, decl, out) if case.is_varlen else ""
        raise ClauseViolation(f"under {words}:\n{exc}{seqs}") from exc
    return out


# -- sliding windows -------------------------------------------------------------------------------
# Head dim 16 >= S: the V = I probe of check_blocked_pattern then has the case's own shapes (V is
# widened to Dk rather than Q and K to S), so a compiling kernel runs probe and case in one program.
SQUARE_WINDOWS = ((2, 0), (0, 0), (1, 3), (3, -1), (-1, 2), (4, 4))


@clause(
    "WINDOW-01",
    "a sliding window (left, right) lets query i see exactly the keys i - left ... i + right (T == S), inclusive at both ends; -1 is unbounded",
    WINDOW_DEF,
    requires=["window"],
    kills=[
        "window_off_by_one",
        "window_as_w_w",
        "window_right_ignored",
        "window_left_zero_unbounded",
        "window_right_exclusive",
    ],
)
def test_window_square(impl, dtype):
    for n, window in enumerate(SQUARE_WINDOWS):
        case = random_case(900 + n, B=2, Hq=2, T=9, S=9, Dk=16, dtype=dtype, label=f"window {window} T=S=9").replace(
            window=window
        )
        impl.require(case)
        check_blocked_pattern(impl, case)
        assert_variant_output(impl, case)


@clause(
    "WINDOW-ALIGN-02",
    "with T != S (T < S, T > S) the window slides along the declared causal alignment: bottom-right centres query i at key i + S - T",
    OFFSET,
    requires=["window"],
    kills=["window_top_left", "window_off_by_one"],
)
def test_window_alignment(impl, dtype):
    # Two shapes (T < S, T > S), shared with WINDOW-CAUSAL-03: a compiling kernel builds each once,
    # and in the ci profile checks each case in one dtype (buckets.spread).
    items = list(enumerate((((4, 11), (2, 0)), ((4, 11), (1, 1)), ((11, 4), (1, 0)), ((11, 4), (0, 2)))))
    for n, ((T, S), window) in buckets.spread(impl, dtype, items):
        case = random_case(
            910 + n, B=1, Hq=2, T=T, S=S, Dk=16, dtype=dtype, label=f"window {window} T={T} S={S}"
        ).replace(window=window)
        impl.require(case)
        check_blocked_pattern(impl, case)
        assert_variant_output(impl, case)


@clause(
    "WINDOW-CAUSAL-03",
    "a window together with is_causal blocks the union of both: keys after the query's position stay hidden whatever the window's right side",
    CAUSAL_IN_WINDOW,
    requires=["window", "causal"],
    kills=["window_drops_causal", "window_ignored_when_causal"],
)
def test_window_with_causal(impl, dtype):
    # The shapes of WINDOW-01 and WINDOW-ALIGN-02 (one compilation each for a compiling kernel,
    # each case in one dtype in the ci profile: buckets.spread).
    items = list(enumerate((((2, 9, 9), (3, 2)), ((1, 4, 11), (2, -1)), ((2, 9, 9), (-1, 3)))))
    for n, ((B, T, S), window) in buckets.spread(impl, dtype, items):
        case = random_case(
            920 + n, B=B, Hq=2, T=T, S=S, Dk=16, dtype=dtype, is_causal=True, label=f"causal + window {window}"
        ).replace(window=window)
        impl.require(case)
        check_blocked_pattern(impl, case)
        assert_variant_output(impl, case)


# -- softcap ---------------------------------------------------------------------------------------
@clause(
    "SOFTCAP-01",
    "softcap c > 0 replaces each scaled score s by c * tanh(s / c) before masks and biases (scores beyond the cap included)",
    SOFTCAP_DEF,
    requires=["softcap"],
    kills=["softcap_s_tanh_s", "softcap_before_scale", "softcap_without_c", "softcap_after_finite_mask"],
)
def test_softcap(impl, dtype):
    for n, (cap, magnitude) in enumerate(((1.0, 2.0), (5.0, 3.0), (30.0, 6.0))):
        case = random_case(
            930 + n, B=2, Hq=2, T=5, S=12, Dk=16, dtype=dtype, magnitude=magnitude, label=f"softcap {cap}"
        ).replace(softcap=cap)
        impl.require(case)
        assert_variant_output(impl, case)
        if impl.supports(case.replace(is_causal=True)):
            assert_variant_output(impl, case.replace(is_causal=True, label=case.label + " causal"))


# -- ALiBi -----------------------------------------------------------------------------------------
@clause(
    "ALIBI-01",
    "ALiBi slopes [H] add -slope_h * abs(i + S - T - j) (declared alignment) per query head, for head counts that are not powers of two and under GQA",
    ALIBI_DEF,
    requires=["alibi"],
    kills=["alibi_pow2_slopes", "alibi_kv_head_slope", "alibi_causal_shortcut", "alibi_reversed_past_8_heads"],
)
def test_alibi_per_head(impl, dtype):
    for n, (hq, hkv, T, S) in enumerate(((6, 6, 5, 9), (6, 2, 7, 7), (5, 5, 4, 6), (12, 4, 3, 10))):
        case = random_case(
            940 + n, B=2, Hq=hq, Hkv=hkv, T=T, S=S, Dk=8, dtype=dtype, label=f"ALiBi H={hq} (Hkv={hkv})"
        ).replace(alibi_slopes=slopes(hq))
        impl.require(case)
        assert_variant_output(impl, case)


@clause(
    "ALIBI-BATCH-02",
    "ALiBi slopes [B, H] give each sequence of the batch its own slopes",
    ALIBI_DEF,
    requires=["alibi"],
    kills=["alibi_first_batch_slopes"],
)
def test_alibi_per_batch(impl, dtype):
    rng = np.random.default_rng(950)
    per_batch = rng.uniform(0.05, 1.0, (3, 6)).astype(np.float32)
    case = random_case(950, B=3, Hq=6, Hkv=3, T=5, S=8, Dk=8, dtype=dtype, label="ALiBi slopes [B, H]").replace(
        alibi_slopes=per_batch
    )
    impl.require(case)
    assert_variant_output(impl, case)


# -- everything together, in half precision too ----------------------------------------------------
@clause(
    "VARIANTS-COMBINED-01",
    "window, softcap and ALiBi together (softcap first, then ALiBi and the window) agree with the oracle within the error model, not bitwise",
    NOT_BITWISE,
    requires=["window", "softcap", "alibi"],
    kills=["softcap_after_alibi", "window_as_w_w"],
)
def test_variants_combined(impl, dtype):
    for n, (T, S, causal) in enumerate(((6, 6, False), (4, 13, True), (8, 5, True))):
        case = random_case(
            960 + n, B=2, Hq=6, Hkv=2, T=T, S=S, Dk=16, dtype=dtype, magnitude=2.5, is_causal=causal
        ).replace(window=(3, 1), softcap=4.0, alibi_slopes=slopes(6), label=f"combined T={T} S={S}")
        impl.require(case)
        assert_variant_output(impl, case)


@clause(
    "VARIANTS-DECODE-02",
    "decode (T = 1) against a growing key history: the single query sits at the last position (bottom-right) or the first (top-left), for window, ALiBi and softcap",
    DECODE,
    requires=["window", "alibi"],
    kills=["window_top_left", "alibi_top_left_distance"],
)
def test_variants_decode(impl, dtype):
    for n, S in enumerate((1, 7, 40)):
        case = random_case(970 + n, B=2, Hq=6, Hkv=2, T=1, S=S, Dk=16, dtype=dtype, label=f"decode S={S}").replace(
            window=(4, 0), alibi_slopes=slopes(6)
        )
        impl.require(case)
        check_blocked_pattern(impl, case.replace(alibi_slopes=None, label=case.label + " window only"))
        assert_variant_output(impl, case)
        capped = case.replace(softcap=3.0, label=case.label + " softcap")
        if impl.supports(capped):
            assert_variant_output(impl, capped)


# -- the log-sum-exp -------------------------------------------------------------------------------
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
