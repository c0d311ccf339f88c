"""§7.2 and §9 of 000_f3dcd408372d9e02.txt and 003's decode remark: the causal mask.

The spec fixes the square case (the strict upper triangle is blocked, the diagonal visible) and
leaves T != S open ("带 KV Cache 的非方阵因果屏蔽也需要考虑位置偏移"): torch and jax align the
triangle top-left (query i sees keys j <= i), FlashAttention and KV-cache decoders bottom-right
(j <= i + S - T). A kernel declares its alignment and the oracle follows the declaration; what
fails is a kernel that does something other than what it declared. Decode (T = 1) is where the two
alignments differ most: top-left lets the single query see key 0 only, bottom-right every key.
A kernel that compiles per shape checks, in the ci profile, each of a clause's shapes in one of its
dtypes (``buckets.spread``) rather than every shape in every dtype.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_mask_values import FINITE_FILL
from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import cast, random_case, random_mask, rng_for
from conformance.harness.judge import compare
from conformance.harness.judge.variant_forward import check_blocked_pattern
from conformance.harness.spec.clause import Source, clause

TRIANGLE = Source("000", "§7.2 Causal Mask", "禁止区域是注意力矩阵的严格上三角")
OFFSET = Source("000", "§9 一个最小 Shape 测试", "带 KV Cache 的非方阵因果屏蔽也需要考虑位置偏移。")
DECODE = Source("003", "输入与输出", "自回归 Decode 的单步查询通常 T_q=1，而 T_k 随历史长度增长。")
BOTH = Source(
    "000",
    "§12 常见误区与代码错误",
    "前者限制时间方向，后者忽略填充 token，解决的是两个不同问题，训练 Decoder 时常常需要同时使用。",
)


def _check_causal(impl, case) -> None:
    """Observed weights: exactly zero where the declared causal pattern (and mask) blocks, and equal
    to the oracle's on every row that has a visible key (rows that see none are the output's to
    check: their fill is a declared policy); then the output."""
    check_blocked_pattern(impl, case, empty_rows=False)
    compare.assert_output_matches(impl, case)


def causal_mask_without_empty_rows(seed: int, T: int, S: int) -> np.ndarray:
    """A random [2, 2, T, S] boolean mask whose key 0 stays visible: together with is_causal, under
    either alignment, no query row is blocked entirely."""
    mask = random_mask(seed, (2, 2, T, S), p_blocked=0.35)
    mask[..., 0] = False
    return mask


@clause(
    "CAUSAL-TRIANGLE-01",
    "with T == S, is_causal blocks exactly the strict upper triangle: the diagonal and everything below it stay visible",
    TRIANGLE,
    requires=["causal"],
    kills=["causal_sees_future", "causal_off_by_one"],
)
def test_causal_triangle(impl, dtype):
    case = random_case(300, B=2, Hq=2, T=5, S=5, Dk=8, dtype=dtype, is_causal=True)
    impl.require(case)
    _check_causal(impl, case)


@clause(
    "CAUSAL-ALIGN-02",
    "with T != S (T < S and T > S), is_causal follows the declared alignment (top-left: j <= i; bottom-right: j <= i + S - T)",
    OFFSET,
    requires=["causal"],
    kills=["causal_bottom_right", "declares_bottom_right_runs_top_left", "causal_offset_clamped_at_zero"],
)
def test_causal_alignment(impl, dtype):
    declared = impl.declaration.causal_alignment
    for seed, (T, S) in buckets.spread(impl, dtype, ((310, (3, 7)), (311, (7, 3)))):
        label = f"causal T={T} S={S}, declared {declared}"
        case = random_case(seed, B=1, Hq=2, T=T, S=S, Dk=8, dtype=dtype, is_causal=True, label=label)
        impl.require(case)
        _check_causal(impl, case)


@clause(
    "CAUSAL-DECODE-03",
    "decode with T = 1 against a growing key history: plain attention reads every key; with is_causal the single query follows the declared alignment",
    DECODE,
    kills=[
        "causal_bottom_right",
        "declares_bottom_right_runs_top_left",
        "drop_key_tail_tile32",
        "decode_tail_lanes_read_last_key",
        "decode_causal_noop",
    ],
)
def test_decode_single_query(impl, dtype):
    for seed, S in buckets.spread(impl, dtype, ((320, 1), (322, 40))):
        case = random_case(seed, B=2, Hq=2, T=1, S=S, Dk=16, dtype=dtype, label=f"decode T=1 S={S}")
        impl.require(case)
        compare.assert_output_matches(impl, case)
        if impl.declaration.causal:
            causal = case.replace(
                is_causal=True, label=case.label + f" is_causal ({impl.declaration.causal_alignment})"
            )
            _check_causal(impl, causal)


@clause(
    "CAUSAL-WITH-MASK-04",
    "is_causal together with a boolean mask blocks the union of both, in the declared alignment",
    BOTH,
    requires=["causal", "bool_mask"],
    kills=["mask_ignored_when_causal", "causal_mask_and", "causal_folded_into_mask_in_place"],
)
def test_causal_with_mask(impl, dtype):
    for seed, (T, S) in buckets.spread(impl, dtype, ((330, (6, 6)), (331, (4, 7)))):
        mask = causal_mask_without_empty_rows(seed, T, S)
        case = random_case(seed, B=2, Hq=2, T=T, S=S, Dk=8, dtype=dtype, mask=mask, is_causal=True)
        case = case.replace(label=f"is_causal + [B,H,T,S] mask, T={T} S={S}")
        impl.require(case)
        _check_causal(impl, case)


def dominant_future_case(dtype: str, seed: int, T: int = 8) -> Case:
    """T = S = 8 (any alignment), every query the same vector and key j's score 2e9 * (2j / (S - 1) - 1):
    each key scores far above every key before it (gaps of 5.7e8), so the keys is_causal blocks dominate
    every row they are blocked in. Exactly -inf (or a blocked set) is the only causal fill that leaves
    them weight 0: -1e4 or -1e9 added to them, or -1e9 written over them, still beats the visible keys
    (row 0 sees key 0 alone, at -2e9). The visible keys are well separated too, so each row's weight is
    1 on its last visible key and the output is that key's V, in every dtype (the product needs the
    float32 scores the spec asks for, §8; the inputs stay below float16's largest value)."""
    B, H, S, D = 2, 2, T, 16
    rng = rng_for(seed)
    c = float(np.sqrt(5e8))  # scale 1/4 at D = 16: q.k / 4 = +-c^2 * 16 / 4 = +-2e9 at the ends
    u = np.where(rng.random(D) < 0.5, -1.0, 1.0)
    q = np.tile(c * u, (B, H, T, 1))
    k = np.linspace(-1.0, 1.0, S)[None, None, :, None] * np.tile(c * u, (B, H, S, 1))
    v = rng.standard_normal((B, H, S, D))
    return Case(
        cast(q, dtype), cast(k, dtype), cast(v, dtype), is_causal=True, seed=seed,
        label="causal, future keys dominate (score gaps >= 5.7e8)",
    )  # fmt: skip


@clause(
    "CAUSAL-EXACT-ZERO-06",
    "keys is_causal blocks get exactly zero weight even when their scores exceed every visible one by 5.7e8 or "
    "more (a finite causal fill such as -1e4 or -1e9 is not blocking), alone and together with a boolean or an "
    "additive -inf mask",
    FINITE_FILL,
    requires=["causal"],
    kills=["causal_additive_neg1e4", "causal_replace_neg1e9"],
)
def test_causal_blocked_weight_exactly_zero(impl, dtype):
    case = dominant_future_case(dtype, 340)
    impl.require(case)
    extra = random_mask(341, (case.B, 1, case.T, case.S), p_blocked=0.3)
    extra[..., 0] = False  # key 0 stays visible: every row sees a key
    decl = impl.declaration
    kinds = ["alone"] + ["boolean mask"] * decl.bool_mask + ["additive -inf mask"] * decl.float_mask
    for kind in buckets.spread(impl, dtype, kinds):  # a kernel compiling per shape: each in one dtype (ci)
        if kind == "alone":
            _check_causal(impl, case)
        elif kind == "boolean mask":
            _check_causal(impl, case.replace(mask=extra, label=case.label + " + boolean mask"))
        else:
            _check_causal(impl, case.replace(bias=np.where(extra, -np.inf, 0.0), label=case.label + " + " + kind))
