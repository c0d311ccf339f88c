"""Features that are each tested alone elsewhere, here in the combinations real models use.

Bugs live where two features meet: a kernel can handle is_causal and a mask each alone and drop
one of them when both are given (000 §12: "训练 Decoder 时常常需要同时使用"); read a [B,1,1,S]
key padding mask right in cross-attention and wrong in self-attention, where T == S lets the wrong
axis broadcast silently (§7.1); guard the rows a boolean mask empties and not the rows the
additive M empties with -inf (§3, §8). Each clause below builds the combination on purpose.

A plain function with torch's signature gets is_causal and its mask through its own arguments
(implementations/function.py; ``Declaration.causal_with_mask``), so the first clause tests the
function's own handling of both, not an adapter's emulation of it.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import key_padding
from conformance.clauses.test_causal import BOTH, causal_mask_without_empty_rows
from conformance.clauses.test_gradients import numpy_cotangent
from conformance.clauses.test_masks import ALL_BLOCKED, check_fill
from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import check, fail

PADDING = Source(
    "000",
    "§7.1 Padding Mask",
    (
        "这些填充位置没有语义，不应被其他 Query 读取。",
        "具体写法是 key_padding_mask[:, None, None, :]，得到 [B,1,1,S]，沿 head 和 Query 维广播。",
    ),
)

# (T, S): square self-attention, and both non-square directions (the declared alignment decides).
CAUSAL_SHAPES = ((6, 6), (4, 7), (7, 4))


def _finite_bias(seed: int, shape: tuple[int, ...], p_neg_inf: float) -> np.ndarray:
    """Finite N(0, 1) additive values with some -inf; key 0 is never -inf (no row empties)."""
    rng = rng_for(seed)
    bias = rng.standard_normal(shape)
    bias[rng.random(shape) < p_neg_inf] = -np.inf
    bias[..., 0] = np.where(np.isneginf(bias[..., 0]), 0.0, bias[..., 0])
    return bias


def _causal_mask_cases(impl: GuardedAdapter, dtype: str) -> list[Case]:
    """is_causal with a boolean mask, with an additive M, and with both on the square shape; on the
    two non-square ones, with every kind of mask the kernel declares at once.

    Few distinct shapes on purpose: a compiling kernel (jax) pays per shape, and the boolean
    [B,H,T,S] mask of the square shape is the one CAUSAL-WITH-MASK-04 compiles already; in the ci
    profile such a kernel checks each shape in one of its dtypes (``buckets.spread``).
    """
    decl = impl.declaration
    cases = []
    for i, (T, S) in buckets.spread(impl, dtype, list(enumerate(CAUSAL_SHAPES))):
        seed = 340 + 10 * i
        mask = causal_mask_without_empty_rows(seed, T, S)
        bias = _finite_bias(seed + 1, (2, 2, T, S), p_neg_inf=0.25)
        kinds = []
        if decl.bool_mask and decl.float_mask:
            kinds.append(("bool mask [T,S] and additive M [B,H,T,S]", {"mask": mask[0, 0], "bias": bias}))
        if T == S or not kinds:
            if decl.bool_mask:
                kinds.append(("bool mask [B,H,T,S]", {"mask": mask}))
            if decl.float_mask:
                kinds.append(("additive M [B,H,T,S] (finite and -inf)", {"bias": bias}))
        for j, (what, arrays) in enumerate(kinds):
            case = random_case(seed + 2 + j, B=2, Hq=2, T=T, S=S, Dk=8, dtype=dtype, is_causal=True, **arrays)
            cases.append(case.replace(label=f"is_causal + {what}, T={T} S={S}"))
    return cases


@clause(
    "CAUSAL-WITH-MASK-ARGS-05",
    "is_causal together with a boolean mask, an additive M, or both blocks the union of all of them (in the declared "
    "alignment, T == S, T < S, T > S); a plain function gets both through its own arguments",
    BOTH,
    requires=["causal"],
    kills=[
        "bf16_causal_bottom_right@bfloat16",
        "fn_drops_causal_with_mask",
        "fn_drops_mask_with_causal",
        "mask_ignored_when_causal",
        "causal_mask_and",
    ],
)
def test_causal_with_mask_arguments(impl, dtype):
    decl = impl.declaration
    if not (decl.bool_mask or decl.float_mask):
        impl.not_applicable("declares neither a boolean nor an additive float mask")
    for case in _causal_mask_cases(impl, dtype):
        impl.require(case)
        compare.assert_weights_match(impl, case, "weights under is_causal + mask")
        compare.assert_output_matches(impl, case)


def _padding_lengths_case(dtype: str, seed: int, lengths: tuple[int, ...], T: int, *, additive: bool) -> Case:
    B, S = len(lengths), T
    blocked = key_padding(lengths, S)
    arrays = {"bias": np.where(blocked, -np.inf, 0.0)} if additive else {"mask": blocked}
    what = "additive M" if additive else "bool"
    label = f"self-attention T == S = {T}, key padding [B,1,1,S] ({what}), lengths {list(lengths)}"
    return random_case(seed, B=B, Hq=2, T=T, S=S, Dk=8, dtype=dtype, label=label, **arrays)


@clause(
    "MASK-PADDING-SELF-14",
    "in self-attention (T == S) a [B,1,1,S] key padding mask, boolean or additive, blocks the padded keys (columns) "
    "for every query and head, never the query rows",
    PADDING,
    kills=["padding_along_queries_when_square", "batch_mask_mixup"],
)
def test_key_padding_self_attention(impl, dtype):
    """Lengths 7, 4, 1 of 7: one item unpadded, one half padded, one with a single visible key.

    Read along the query axis, the padded positions would empty whole query rows instead; every
    row here keeps key 0, so the declared all-blocked policy never enters.
    """
    decl = impl.declaration
    if not (decl.bool_mask or decl.float_mask):
        impl.not_applicable("declares neither a boolean nor an additive float mask")
    kinds = [False] * decl.bool_mask + [True] * decl.float_mask
    # A kernel compiling per shape checks each kind in one dtype per ci run (harness.cases.buckets.spread).
    for i, additive in buckets.spread(impl, dtype, list(enumerate(kinds))):
        case = _padding_lengths_case(dtype, 360 + i, (7, 4, 1), 7, additive=additive)
        impl.require(case)
        compare.assert_weights_match(impl, case, "weights under key padding")
        compare.assert_output_matches(impl, case)


def _neg_inf_rows_case(dtype: str, seed: int, *, with_bool: bool) -> Case:
    """Additive M with finite values and -inf, three query rows entirely -inf.

    With ``with_bool`` a boolean mask blocks half of one of those rows and M the other half, so that
    row is empty only by the union (its policy is then the boolean one, see
    ``Declaration.all_blocked_policy``).
    """
    B, H, T, S = 2, 2, 4, 6
    bias = _finite_bias(seed, (B, 1, T, S), p_neg_inf=0.2)
    bias[0, 0, 1, :] = -np.inf
    bias[1, 0, 3, :] = -np.inf
    bias[1, 0, 0, :] = -np.inf
    arrays: dict = {"bias": bias}
    label = "additive M with rows entirely -inf"
    if with_bool:
        mask = np.zeros((B, 1, T, S), dtype=bool)
        mask[0, 0, 2, : S // 2] = True
        bias[0, 0, 2, S // 2 :] = -np.inf
        arrays["mask"] = mask
        label += ", one row emptied by bool mask | M"
    return random_case(seed, B=B, Hq=H, T=T, S=S, Dk=8, dtype=dtype, label=label, **arrays)


def _check_empty_rows(impl: GuardedAdapter, case: Case) -> None:
    decl = impl.declaration
    policy = decl.all_blocked_policy(case)
    want = compare.expected(case, decl)
    empty = want.all_blocked
    check(bool(empty.any()), "the case must contain rows blocked entirely (a defect of the clause)", case)
    raw = impl.forward(case)
    out = np.asarray(raw, dtype=np.float64)
    where = f"rows blocked entirely by {'the union of the boolean mask and ' if case.mask is not None else ''}-inf in M"
    check_fill(out[empty], policy, where, "declared all_blocked policy for this case: ", case)
    live = out[~empty]
    if not np.all(np.isfinite(live)):
        fail(f"rows with a visible key must be finite; {int((~np.isfinite(live)).sum())} elements are not", case)
    compare.assert_close(raw, want.out, case=case, decl=decl)
    if policy == "zeros":
        w = observe_weights(impl, case)
        check(bool(np.all(w[empty] == 0)), f"{where} must have weights exactly 0 (declared policy: zeros)", case)
        if decl.grad:
            compare.assert_vjp_matches(impl, case, numpy_cotangent(case, case.seed + 1))


@clause(
    "ALL-BLOCKED-FLOAT-04",
    "a query row blocked entirely by the additive M's -inf (alone, or together with a boolean mask) yields the "
    "declared fill, never a stray NaN; its backward is finite when the fill is zeros",
    ALL_BLOCKED,
    requires=["float_mask"],
    kills=[
        "nan_on_all_blocked_bias",
        "nan_on_all_blocked",
        "bias_cached_by_shape",
        "grad_variant_empty_rows_nan",
        "grad_empty_rows_uniform",
    ],
)
def test_all_blocked_by_neg_inf(impl, dtype):
    """M alone, then M together with a boolean mask. The second runs only where the kernel declares
    one fill for both kinds of blocking: a kernel whose -inf rows differ from its boolean ones
    (``all_blocked_float_mask``) has declared nothing for a row emptied by the two together (jax 0.10
    gives NaN where M alone empties it, and the mean of V over the mask-blocked keys where only the
    union does). An adapter that hands the kernel both as one additive mask (``masks_combined``)
    has: the union reaches the kernel as -inf, so the -inf policy applies."""
    decl = impl.declaration
    one_fill = decl.all_blocked_float_mask in (None, decl.all_blocked) or decl.masks_combined
    variants = [False] + [True] * (decl.bool_mask and one_fill)
    for i, with_bool in enumerate(variants):
        case = _neg_inf_rows_case(dtype, 370 + i, with_bool=with_bool)
        impl.require(case)
        _check_empty_rows(impl, case)
