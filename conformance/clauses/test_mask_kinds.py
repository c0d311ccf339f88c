"""§3, §4, §7 and §9 of 000_f3dcd408372d9e02.txt: every kind of boolean mask a kernel is handed.

The clauses here cover what the basic mask clauses (test_masks.py) do not: each broadcastable
shape of a boolean mask, a key padding mask expanded as the article writes it, masks that differ
per batch item *and* per head, the mask's sense, padding OR causal, and an all-False mask. What a
mask's values do (blocked keys whose logits dominate, so a finite fill shows; garbage at blocked
positions; the additive float mask M) is test_mask_values.py.

Where a case is built so that a misbroadcast still broadcasts (B == T for a [B,S] padding mask read
as [T,S]), that is on purpose: §7.1 warns that a wrong broadcast "可能恰好尺寸相同而错误广播", and a
kernel that crashes is easy to catch; one that silently broadcasts the wrong axis is not.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import key_padding
from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.oracle import causal_blocked

PADDING = Source(
    "000",
    "§7.1 Padding Mask",
    "具体写法是 key_padding_mask[:, None, None, :]，得到 [B,1,1,S]，沿 head 和 Query 维广播。",
)
MASK_SHAPES = Source("000", "§4 完整 Shape 检查", "Mask:    [T, S]、[B, 1, T, S] 或可广播形状")
BROADCAST = Source("003", "输入与输出", "Mask 必须能广播到分数矩阵，并明确布尔语义。")
ADDITIVE = Source("000", "§3 矩阵形式", "$M$ 是可选的加性 Mask。允许注意的位置加 $0$ ，禁止注意的位置加 $-\\infty$ 。")
SENSE = Source("003", "边界与失败方式", "布尔 Mask 在不同 API 中语义可能相反，迁移代码时必须读当前接口文档。")
PAD_OR_CAUSAL = Source(
    "000",
    "§9 一个最小 Shape 测试",
    "对于等长自注意力，可用 torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1) 构造因果屏蔽，再与展开后的 Padding Mask 做按位或。",
)


# One shape for most clauses here and in test_mask_values.py (B == T on purpose, see the module
# docstring): a jitted kernel compiles once per shape, and the suite should spend its time on checks,
# not on compilations.
SHAPE = (3, 2, 3, 6)


def shape_case(seed: int, dtype: str, label: str, **arrays) -> Case:
    """A case of the one shape (:data:`SHAPE`, head dim 8) with the given mask or bias."""
    B, H, T, S = SHAPE
    return random_case(seed, B=B, Hq=H, T=T, S=S, Dk=8, dtype=dtype, label=label, **arrays)


# -- boolean mask shapes -----------------------------------------------------------------------------
@clause(
    "MASK-PADDING-04",
    "a [B,S] key padding mask expanded to [B,1,1,S] blocks the padded keys of each batch item, for every head and query",
    PADDING,
    requires=["bool_mask"],
    kills=["padding_mask_as_query_rows", "batch_mask_mixup"],
)
def test_key_padding_mask(impl, dtype):
    # B == T: a kernel that reads [B,1,1,S] back as [T,S] broadcasts silently instead of failing.
    case = shape_case(140, dtype, "key padding [B,1,1,S]", mask=key_padding((6, 2, 5), SHAPE[3]))
    impl.require(case)
    compare.assert_weights_match(impl, case)
    compare.assert_output_matches(impl, case)


def _broadcast_shapes(B: int, H: int, T: int, S: int) -> list[tuple[str, tuple[int, ...]]]:
    return [
        ("[T,S]", (T, S)),
        ("[1,1,T,S]", (1, 1, T, S)),
        ("[B,1,T,S]", (B, 1, T, S)),
        ("[1,H,T,S]", (1, H, T, S)),
        ("[B,H,T,S]", (B, H, T, S)),
        ("[B,1,1,S]", (B, 1, 1, S)),
    ]


@clause(
    "MASK-BROADCAST-05",
    "a boolean mask of each broadcastable shape ([T,S], [1,1,T,S], [B,1,T,S], [1,H,T,S], [B,H,T,S], [B,1,1,S]) gives the oracle's output",
    MASK_SHAPES,
    requires=["bool_mask"],
    kills=["mask_2d_as_padding", "mask_head0_for_all_heads", "batch_mask_mixup"],
)
def test_mask_broadcast_shapes(impl, dtype):
    # B == T again, so that a [T,S] mask mistaken for [B,S] padding still broadcasts.
    B, H, T, S = SHAPE
    # A kernel compiling per shape checks each form in one dtype per ci run (harness.cases.buckets.spread).
    for i, (name, shape) in buckets.spread(impl, dtype, list(enumerate(_broadcast_shapes(B, H, T, S)))):
        case = shape_case(150 + i, dtype, f"mask {name}", mask=random_mask(150 + i, shape, p_blocked=0.45))
        impl.require(case)
        compare.assert_output_matches(impl, case)


@clause(
    "MASK-PER-HEAD-06",
    "a [B,H,T,S] mask that differs per batch item and per head is applied to each (b, h) slice separately",
    BROADCAST,
    requires=["bool_mask"],
    kills=["mask_head0_for_all_heads", "batch_mask_mixup"],
)
def test_mask_per_batch_and_head(impl, dtype):
    B, H, T, S = SHAPE
    mask = random_mask(160, (B, H, T, S), p_blocked=0.5)
    # Make every (b, h) slice distinct from every other one, whatever the random draw gave.
    for b in range(B):
        for h in range(H):
            mask[b, h, (b + h) % T, :] = True
            mask[b, h, (b + h) % T, (b * H + h) % S] = False
    case = shape_case(160, dtype, "per-item per-head mask", mask=mask)
    impl.require(case)
    compare.assert_weights_match(impl, case)


@clause(
    "MASK-SENSE-07",
    "the adapter's boolean mask sense is the declared one: an asymmetric square mask blocks exactly its True positions, not their transpose or complement",
    SENSE,
    requires=["bool_mask"],
    kills=["mask_transposed_square", "mask_sense_inverted"],
)
def test_mask_sense_asymmetric(impl, dtype):
    B, H, T = 2, 2, 5
    mask = random_mask(170, (B, 1, T, T), p_blocked=0.5)
    mask[..., 0, T - 1] = True  # rows and columns differ: mask != mask^T for every item
    mask[..., T - 1, 0] = False
    case = random_case(170, B=B, Hq=H, T=T, S=T, Dk=8, dtype=dtype, mask=mask, label="asymmetric square mask")
    impl.require(case)
    compare.assert_weights_match(impl, case)


@clause(
    "MASK-ALL-FALSE-08",
    "an all-False mask (nothing blocked) gives the same output as no mask",
    ADDITIVE,
    requires=["bool_mask"],
    kills=["mask_times_neg_inf", "mask_sense_inverted"],
)
def test_all_false_mask_is_no_mask(impl, dtype):
    # B == T is not needed here: a kernel compiling per shape gets the palette's T < S shape in the
    # ci profile (harness.cases.buckets), whose plain and [B,1,T,S]-mask programs other clauses compile.
    shape = buckets.dims(impl, "cross", B=SHAPE[0], Hq=SHAPE[1], T=SHAPE[2], S=SHAPE[3], Dk=8)
    B, T, S = shape["B"], shape["T"], shape["S"]
    plain = random_case(180, dtype=dtype, **shape)
    for shape in ((B, 1, T, S), (T, S)):
        masked = plain.replace(mask=np.zeros(shape, dtype=bool), label=f"all-False mask {list(shape)}")
        impl.require(masked)
        compare.assert_equivalent(impl, masked, plain, "all-False mask vs no mask")


@clause(
    "MASK-OR-CAUSAL-09",
    "is_causal together with a [B,1,1,S] padding mask equals the explicit mask triu(1) | padding (bitwise OR)",
    PAD_OR_CAUSAL,
    requires=["bool_mask", "causal"],
    kills=["causal_mask_and", "mask_ignored_when_causal"],
)
def test_padding_or_causal(impl, dtype):
    B, H, T = 2, 2, 6
    expanded = key_padding((4, 2), T)  # key 0 stays visible, so no row is fully blocked
    both = random_case(
        190, B=B, Hq=H, T=T, S=T, Dk=8, dtype=dtype, mask=expanded, is_causal=True, label="is_causal + padding"
    )
    explicit = both.replace(mask=expanded | causal_blocked(T, T), is_causal=False, label="triu(1) | padding")
    impl.require(both)
    impl.require(explicit)
    compare.assert_equivalent(impl, both, explicit, "is_causal + padding vs explicit OR")
    compare.assert_weights_match(impl, both)
