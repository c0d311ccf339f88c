"""§3 and §8 of 000_f3dcd408372d9e02.txt: what a mask's values do.

A blocked key gets exactly zero weight whatever its logit (only -inf blocks: a finite fill such as
-1e4 or -1e9 shows once the blocked logits dominate), its K and V are never read, and the additive
float mask M adds its finite values to the scaled scores and blocks with -inf. The kinds and shapes
of boolean masks are test_mask_kinds.py; the cases here use its one shape where they can.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import key_padding
from conformance.clauses.test_mask_kinds import ADDITIVE, SHAPE, shape_case
from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

FINITE_FILL = Source("000", "§3 矩阵形式", "用有限负数替代时，要结合 dtype 和分数范围选择数值；它并不严格等价于屏蔽。")


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
    mask = key_padding((4, 2, 5), SHAPE[3])
    clean = shape_case(210, dtype, "clean K, V", mask=mask)
    rng = rng_for(211)
    blocked_kv = np.broadcast_to(mask[:, :, 0, :, None], clean.key.shape)
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
# `duplicates` pairs the call above and this declaration with the end of GQA-EXPAND-02 and the start of
# GQA-DECODE-03 (test_gqa.py): alike in shape only.
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
        bias[..., 0] = 0.0  # zeros must stay visible, nonzeros must not become blocked
        case = shape_case(220 + i, dtype, f"finite bias {list(bias.shape)}", bias=bias)
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
