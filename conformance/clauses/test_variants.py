"""The variants kernel authors ship: sliding windows, softcap, ALiBi (the returned lse: test_lse.py).

The seed defines scaled dot-product attention and says nothing of these; where it speaks (the
position offset of a non-square causal mask, decode with T_q = 1, "exact" not meaning bitwise) the
clauses cite it, and otherwise they cite the definition the kernels follow, FlashAttention's, as a
:class:`~conformance.harness.spec.definitions.Definition` (verbatim, never presented as the seed). The
float64 answers come from :mod:`conformance.oracle_variants`; windows and ALiBi slide along the
kernel's declared causal alignment (FlashAttention: bottom-right), and a failure names the variant,
the window or slopes, and the query and key where the kernel went wrong
(:mod:`conformance.harness.judge.variant_forward`).
"""

from __future__ import annotations

import numpy as np

from conformance import oracle_variants
from conformance.clauses.test_causal import DECODE, OFFSET
from conformance.clauses.test_determinism import NOT_BITWISE
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge.variant_forward import assert_variant_output, check_blocked_pattern
from conformance.harness.spec.clause import clause
from conformance.harness.spec.definitions import Definition

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


def slopes(n_heads: int) -> np.ndarray:
    """The ALiBi paper's slopes, as the fp32 values FlashAttention takes."""
    return oracle_variants.alibi_slopes_for(n_heads).astype(np.float32)


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
        case = impl.admit(case)
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
    case = impl.admit(case)
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
        case = impl.admit(case)
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
        case = impl.admit(case)
        check_blocked_pattern(impl, case.replace(alibi_slopes=None, label=case.label + " window only"))
        assert_variant_output(impl, case)
        capped = case.replace(softcap=3.0, label=case.label + " softcap")
        if impl.supports(capped):
            assert_variant_output(impl, capped)
