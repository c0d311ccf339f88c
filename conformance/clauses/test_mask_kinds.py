"""§3, §4, §7 and §9 of 000_f3dcd408372d9e02.txt: every kind of mask a kernel is handed.

The clauses here cover what the basic mask clauses (test_masks.py) do not: each broadcastable
shape of a boolean mask, a key padding mask expanded as the article writes it, masks that differ
per batch item *and* per head, padding OR causal, an all-False mask, blocked keys whose logits
dominate (so a finite fill shows), garbage at blocked positions, and the additive float mask M.

Where a case is built so that a misbroadcast still broadcasts (B == T for a [B,S] padding mask read
as [T,S]), that is on purpose: §7.1 warns that a wrong broadcast "可能恰好尺寸相同而错误广播", and a
kernel that crashes is easy to catch; one that silently broadcasts the wrong axis is not.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import cast, random_case, random_mask, rng_for
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
FINITE_FILL = Source("000", "§3 矩阵形式", "用有限负数替代时，要结合 dtype 和分数范围选择数值；它并不严格等价于屏蔽。")
SENSE = Source("003", "边界与失败方式", "布尔 Mask 在不同 API 中语义可能相反，迁移代码时必须读当前接口文档。")
PAD_OR_CAUSAL = Source(
    "000",
    "§9 一个最小 Shape 测试",
    "对于等长自注意力，可用 torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1) 构造因果屏蔽，再与展开后的 Padding Mask 做按位或。",
)


# One shape for most clauses here (B == T on purpose, see the module docstring): a jitted kernel
# compiles once per shape, and the suite should spend its time on checks, not on compilations.
SHAPE = (3, 2, 3, 6)


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
    B, H, T, S = SHAPE
    key_padding_mask = np.zeros((B, S), dtype=bool)
    for b, length in enumerate((6, 2, 5)):
        key_padding_mask[b, length:] = True
    case = random_case(
        140,
        B=B,
        Hq=H,
        T=T,
        S=S,
        Dk=8,
        dtype=dtype,
        mask=key_padding_mask[:, None, None, :],
        label="key padding [B,1,1,S]",
    )
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
        mask = random_mask(150 + i, shape, p_blocked=0.45)
        case = random_case(150 + i, B=B, Hq=H, T=T, S=S, Dk=8, dtype=dtype, mask=mask, label=f"mask {name}")
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
    case = random_case(160, B=B, Hq=H, T=T, S=S, Dk=8, dtype=dtype, mask=mask, label="per-item per-head mask")
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
    padding = np.zeros((B, T), dtype=bool)
    padding[0, 4:] = True
    padding[1, 2:] = True  # key 0 stays visible, so no row is fully blocked
    expanded = padding[:, None, None, :]
    both = random_case(
        190, B=B, Hq=H, T=T, S=T, Dk=8, dtype=dtype, mask=expanded, is_causal=True, label="is_causal + padding"
    )
    explicit = both.replace(mask=expanded | causal_blocked(T, T), is_causal=False, label="triu(1) | padding")
    impl.require(both)
    impl.require(explicit)
    compare.assert_equivalent(impl, both, explicit, "is_causal + padding vs explicit OR")
    compare.assert_weights_match(impl, both)


# -- blocked positions are inert ---------------------------------------------------------------------
def dominant_blocked_case(dtype: str, seed: int, *, as_bias: bool = False) -> Case:
    """Per (b, h), a random set of visible keys all scoring about -2e9 (scaled), every blocked key
    scoring about +2e9.

    Exactly -inf is the only fill that gives these blocked keys zero weight: -1e4 or -1e9 added to
    +2e9 still wins, and -1e9 *written* over the blocked scores still beats the visible -2e9. The
    visible keys of a slice share one key vector, so their exact weights are 1/n; but at |s| ~ 2e9 a
    float32 score is only known to within u|s| ~ 128, so a correct kernel that subtracts the lse
    instead of the max, or merges split-KV parts, gets visible weights far from 1/n (exp(s - lse)
    with lse rounded to s gives each weight 1). The clauses using this case therefore assert what
    they state: blocked weights exactly 0, every visible weight and output finite; the accuracy of
    the visible weights is left to the error model, which knows this row is ill-conditioned below
    float64 (its allowance is unbounded there, finite in float64). Inputs stay below float16's
    largest value; the products need the float32 (or wider) scores the spec asks for (§8).
    """
    B, H, T, S, D = 2, 2, 3, 8, 16
    rng = rng_for(seed)
    c = float(np.sqrt(5e8))  # scale 1/4 at D = 16: scaled score = +-c^2 = +-5e8 * 4 = 2e9
    u = np.where(rng.random(D) < 0.5, -1.0, 1.0)
    q = np.tile(c * u, (B, H, T, 1))
    blocked = rng.random((B, H, 1, S)) < 0.6
    for b in range(B):
        for h in range(H):
            blocked[b, h, 0, rng.integers(S)] = False
    k = np.where(blocked[..., 0, :, None], c * u, -c * u)
    v = rng.standard_normal((B, H, S, D))
    case = Case(
        cast(q, dtype), cast(k, dtype), cast(v, dtype), seed=seed, label="blocked keys dominate (|score| ~ 2e9)"
    )
    if as_bias:
        return case.replace(bias=np.where(blocked, -np.inf, 0.0), label=case.label + ", additive M")
    return case.replace(mask=blocked)


@clause(
    "MASK-EXACT-ZERO-10",
    "blocked keys get exactly zero weight even when their logits exceed the visible ones by ~4e9 (a finite fill such as -1e4 or -1e9 is not blocking)",
    FINITE_FILL,
    requires=["bool_mask"],
    kills=["additive_fill_neg1e4", "replace_fill_neg1e9", "mean_v_on_all_blocked"],
)
def test_blocked_weight_exactly_zero(impl, dtype):
    """Blocked weights exactly 0 (a finite fill is caught); visible weights and outputs finite and within
    the error model (unbounded below float64 at |s| ~ 2e9, see :func:`dominant_blocked_case`)."""
    case = dominant_blocked_case(dtype, 200)
    impl.require(case)
    compare.assert_weights_match(impl, case)
    compare.assert_output_matches(impl, case)


@clause(
    "MASK-INERT-KV-11",
    "changing K and V at blocked keys to large finite garbage does not change the output",
    FINITE_FILL,
    requires=["bool_mask"],
    kills=["additive_fill_neg1e4", "mask_after_softmax"],
)
def test_blocked_kv_inert(impl, dtype):
    B, H, T, S = SHAPE
    D = 8
    padding = np.zeros((B, S), dtype=bool)
    padding[0, 4:] = True
    padding[1, 2:] = True
    padding[2, 5:] = True
    mask = padding[:, None, None, :]
    clean = random_case(210, B=B, Hq=H, T=T, S=S, Dk=D, dtype=dtype, mask=mask, label="clean K, V")
    rng = rng_for(211)
    blocked_kv = np.broadcast_to(padding[:, None, :, None], clean.key.shape)
    # Scaled scores of the garbage keys reach ~1e4..1e5: above float16's 65504 only after the
    # product, which the spec forms in float32 (§8); the garbage values stay finite in every dtype.
    k_bad = np.where(
        blocked_kv, 3e4 * np.clip(rng.standard_normal(clean.key.shape), -2, 2), clean.key.astype(np.float64)
    )
    v_bad = np.where(blocked_kv, 6e4 * np.tanh(rng.standard_normal(clean.value.shape)), clean.value.astype(np.float64))
    garbage = clean.replace(key=cast(k_bad, dtype), value=cast(v_bad, dtype), label="garbage K, V at padded keys")
    impl.require(clean)
    compare.assert_equivalent(impl, garbage, clean, "garbage vs clean K, V at blocked keys")


# -- additive float masks ----------------------------------------------------------------------------
@clause(
    "FLOAT-MASK-ADD-12",
    "an additive float mask of finite values is added to the scaled scores: not read as a boolean, not multiplied by the scale",
    ADDITIVE,
    requires=["float_mask"],
    kills=["bias_as_boolean", "bias_scaled", "bias_head0_for_all_heads", "float_mask_row0_key_padding"],
)
def test_float_mask_is_added(impl, dtype):
    B, H, T, S = SHAPE
    rng = rng_for(220)
    biases = [2.0 * rng.standard_normal(shape) for shape in ((B, H, T, S), (T, S))]
    for i, bias in buckets.spread(impl, dtype, list(enumerate(biases))):  # as in MASK-BROADCAST-05
        shape = bias.shape
        bias[..., 0] = 0.0  # zeros must stay visible, nonzeros must not become blocked
        case = random_case(
            220 + i, B=B, Hq=H, T=T, S=S, Dk=8, dtype=dtype, bias=bias, label=f"finite bias {list(shape)}"
        )
        impl.require(case)
        compare.assert_output_matches(impl, case)


@clause(
    "FLOAT-MASK-M-13",
    "the spec's additive M (0 where allowed, -inf where blocked) gives blocked keys exactly zero weight, equal to the boolean mask",
    ADDITIVE,
    requires=["float_mask"],
    kills=["bias_clamped_neg1e4", "bias_neg_inf_clamped_in_place"],
)
def test_float_mask_neg_inf(impl, dtype):
    """As MASK-EXACT-ZERO-10 with the blocking given as -inf in M; the boolean twin must agree within the
    sum of both cases' allowances."""
    case = dominant_blocked_case(dtype, 230, as_bias=True)
    impl.require(case)
    compare.assert_weights_match(impl, case, "weights under additive M")
    compare.assert_output_matches(impl, case)
    if impl.declaration.bool_mask:
        as_bool = case.replace(bias=None, mask=np.isneginf(case.bias), label="same M as a boolean mask")
        compare.assert_equivalent(impl, case, as_bool, "additive M vs boolean mask")
