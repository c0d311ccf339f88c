"""Metamorphic properties of softmax(QK^T/sqrt(d_k) + M) V (000_f3dcd408372d9e02.txt §2–§3, 003).

Each clause compares the kernel with itself on two inputs whose exact answers are related (equal,
or linearly related). The inputs are built so that the relation is exact on the numbers the kernel
receives (shifts and combinations stay on a grid the working dtype represents exactly), so the only
slack needed is each output's own rounding: the allowance is the sum of the two outputs' allowances
under the error model (harness.judge.tolerance), by the triangle inequality through the exact answer. The
check itself is ``compare.assert_outputs_agree``, the same one ``compare.assert_equivalent`` ends in.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import cast, random_case, random_mask, rng_for
from conformance.harness.cases.strategies import examples, seeds, shapes, space_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation

WEIGHTED_SUM = Source("000", "§2 从单个 Query 到公式", "o = \\sum_{j=1}^{S}\\alpha_j v_j")
MAX_SHIFT = Source(
    "003", "逐步推导", "减去行最大值不改变 Softmax，因为分子和分母同时乘以 exp(-m_i)；它避免直接计算过大的指数。"
)
ROLES = Source("000", "§1 最小直觉：一次带权检索", "Value：匹配后真正取回的信息。")
SHAPES = Source("000", "§4 完整 Shape 检查", "weights: [B, H, T, S]")
RULE = "|out_a - out_b| <= allowed(a) + allowed(b), each the error model's allowance (harness.judge.tolerance) for its own case"


def _allowance(impl: GuardedAdapter, case: Case) -> np.ndarray:
    return compare.output_allowance(case, impl.declaration)


def _draw_case(
    data, impl: GuardedAdapter, dtype: str, seed: int, *, mask: bool = True, min_s: int = 1, square: bool = False
) -> Case:
    decl = impl.declaration
    sp = space_for(impl, dtype)
    masked = None
    if sp.structures:  # a kernel compiling per shape: one structure, masked when it has a mask (one program)
        one = data.draw(st.sampled_from(sp.structures), label="structure")
        sp, masked = dataclasses.replace(sp, structures=(one,)), one.mask_form != "none"
    shp = data.draw(shapes(gqa=decl.gqa, square_dims=square or decl.requires_dk_eq_dv, sp=sp), label="shape")
    S = max(shp.S, min_s)
    Dk, Dv = shp.Dk, shp.Dv
    if decl.max_head_dim is not None:
        Dk, Dv = min(Dk, decl.max_head_dim), min(Dv, decl.max_head_dim)
    m = None
    if masked is None and mask and decl.bool_mask:
        masked = data.draw(st.booleans(), label="masked")
    if mask and decl.bool_mask and masked:
        m = random_mask(seed, (shp.B, 1, shp.T, S), p_blocked=0.35)
    case = random_case(seed, B=shp.B, Hq=shp.Hq, Hkv=shp.Hkv, T=shp.T, S=S, Dk=Dk, Dv=Dv, dtype=dtype, mask=m)
    impl.require(case)
    return case


@clause(
    "META-PERMUTE-01",
    "permuting keys and values together (and the mask's key axis with them) leaves the output unchanged",
    WEIGHTED_SUM,
    kills=["v_read_transposed_when_square@float64", "online_softmax_no_rescale"],
    tolerance=RULE,
)
@examples(10)
@given(data=st.data(), seed=seeds)
def test_key_permutation(impl, dtype, data, seed):
    case = _draw_case(data, impl, dtype, seed, min_s=2)
    perm = rng_for(seed).permutation(case.S)
    moved = case.replace(
        key=np.ascontiguousarray(case.key[:, :, perm]),
        value=np.ascontiguousarray(case.value[:, :, perm]),
        mask=None if case.mask is None else np.ascontiguousarray(case.mask[..., perm]),
        label=f"keys permuted {perm.tolist()}",
    )
    decl = impl.declaration
    allowed = compare.pair_allowance(case, moved, decl)
    compare.assert_outputs_agree(
        "keys permuted", impl.forward(moved), impl.forward(case), allowed, case=moved, decl=decl
    )


# Shift size per dtype: large enough that exp() of an unshifted score overflows or underflows in the
# working precision (float32 for the low-precision dtypes), small enough that k + c stays exact.
_GAMMA = {"float64": 256.0, "float32": 8.0, "float16": 128.0, "bfloat16": 24.0}


@clause(
    "META-ROW-SHIFT-02",
    "adding the same constant to every score of a row changes nothing (keys shifted by c, so q.(k+c) = q.k + q.c; "
    "and a per-row float bias where declared)",
    MAX_SHIFT,
    kills=["softmax_no_max_subtraction"],
    tolerance=RULE,
)
@examples(8)
@given(data=st.data(), seed=seeds)
def test_row_shift(impl, dtype, data, seed):
    case = _draw_case(data, impl, dtype, seed)
    rng = rng_for(seed + 1)
    # Keys on a 1/8 grid in (-4, 4) and c = gamma * (+-1): k + c is exact in every dtype. Queries lean
    # along the sign pattern so that q.c, the row's shift, is large for most rows.
    u = rng.choice([-1.0, 1.0], size=(case.B, case.Hkv, 1, case.Dk))
    k = np.round(np.clip(rng.standard_normal(case.key.shape), -3.8, 3.8) * 8) / 8
    q_lean = np.repeat(u, case.Hq // case.Hkv, axis=1)
    q = rng.standard_normal(case.query.shape) + 2.0 * q_lean
    base = case.replace(query=cast(q, dtype), key=cast(k, dtype))
    shifted = base.replace(key=cast(k + _GAMMA[dtype] * u, dtype), label=f"keys + {_GAMMA[dtype]:g}*sign pattern")
    assert np.array_equal(np.asarray(shifted.key, np.float64), k + _GAMMA[dtype] * u), "shift must be exact"
    out = impl.forward(base)
    decl = impl.declaration
    allowed = compare.pair_allowance(base, shifted, decl)
    compare.assert_outputs_agree("every key shifted by c", impl.forward(shifted), out, allowed, case=shifted, decl=decl)
    if decl.float_mask:
        rows = rng.choice([-1.0, 1.0], size=(case.B, case.Hq, case.T, 1)) * 4 * _GAMMA[dtype]
        biased = base.replace(bias=rows, label="per-row constant bias")
        allowed = compare.pair_allowance(base, biased, decl)
        compare.assert_outputs_agree(
            "a per-row constant bias", impl.forward(biased), out, allowed, case=biased, decl=decl
        )


@clause(
    "META-LINEAR-V-03",
    "the output is linear in V: out(2 V1 - V2/2) = 2 out(V1) - out(V2)/2",
    ROLES,
    kills=["value_in_similarity"],
    tolerance="|out(V3) - 2 out(V1) + out(V2)/2| <= allowed(V3) + 2 allowed(V1) + allowed(V2)/2 (error model)",
)
@examples(8)
@given(data=st.data(), seed=seeds)
def test_linear_in_value(impl, dtype, data, seed):
    case = _draw_case(data, impl, dtype, seed, square=True)
    rng = rng_for(seed + 2)
    grid = [np.round(np.clip(rng.standard_normal(case.value.shape), -3.8, 3.8) * 8) / 8 for _ in range(2)]
    v3 = 2.0 * grid[0] - 0.5 * grid[1]  # on a 1/16 grid below 10 in magnitude: exact even in bfloat16
    c1, c2, c3 = (case.replace(value=cast(v, dtype)) for v in (grid[0], grid[1], v3))
    o1, o2, o3 = (np.asarray(impl.forward(c), dtype=np.float64) for c in (c1, c2, c3))
    allowed = _allowance(impl, c3) + 2 * _allowance(impl, c1) + 0.5 * _allowance(impl, c2)
    compare.assert_outputs_agree(
        "out(2 V1 - V2/2) vs 2 out(V1) - out(V2)/2",
        o3,
        2 * o1 - 0.5 * o2,
        allowed,
        case=c3,
        decl=impl.declaration,
        how="allowed(V3) + 2 allowed(V1) + allowed(V2)/2",
    )


@clause(
    "META-HULL-04",
    "each output row lies in the convex hull of the visible value rows (per coordinate, between their min and max)",
    WEIGHTED_SUM,
    kills=["mask_after_softmax", "softmax_query_axis"],
    tolerance="slack = the error model's allowance for the output (the oracle's output lies inside the hull exactly)",
)
@examples(8)
@given(data=st.data(), seed=seeds, offset=st.sampled_from([0.0, 3.0]))
def test_convex_hull(impl, dtype, data, seed, offset):
    case = _draw_case(data, impl, dtype, seed, min_s=2)
    if impl.declaration.causal and data.draw(st.booleans(), label="is_causal"):
        case = case.replace(is_causal=True)
    case = case.replace(value=cast(np.asarray(case.value, np.float64) + offset, dtype))
    impl.require(case)
    out = np.asarray(impl.forward(case), dtype=np.float64)
    want = compare.expected(case, impl.declaration)
    v = np.repeat(np.asarray(case.value, np.float64), case.Hq // case.Hkv, axis=1)[:, :, None]  # [B,H,1,S,Dv]
    hidden = want.blocked[..., None]
    lo = np.where(hidden, np.inf, v).min(axis=-2)
    hi = np.where(hidden, -np.inf, v).max(axis=-2)
    slack = _allowance(impl, case)
    live = ~want.all_blocked[..., None]
    below = live & (out < lo - slack)
    above = live & (out > hi + slack)
    bad = below | above
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ClauseViolation(
            f"{int(bad.sum())} output elements lie outside the hull of the visible values; first at {list(idx)}: "
            f"{out[idx]:.6g} not in [{lo[idx]:.6g}, {hi[idx]:.6g}] (slack {slack[idx]:.3g}); "
            f"row sums of weights that would do this are not 1",
            case,
        )


@clause(
    "META-INDEPENDENT-05",
    "batch items and heads are independent: changing one item, one query head or one kv head never changes the others",
    SHAPES,
    kills=["batch_mask_mixup", "gqa_wrong_mapping"],
    tolerance=RULE,
)
@examples(4)
@given(seed=seeds)
def test_independence(impl, dtype, seed):
    decl = impl.declaration
    B, T, S, D = 3, 4, 6, 8
    Hq, Hkv = (4, 2) if decl.gqa else (2, 2)
    mask = random_mask(seed, (B, 1, T, S), p_blocked=0.4) if decl.bool_mask else None
    case = random_case(seed, B=B, Hq=Hq, Hkv=Hkv, T=T, S=S, Dk=D, Dv=D, dtype=dtype, mask=mask)
    impl.require(case)
    out = impl.forward(case)
    other = random_case(seed + 1, B=B, Hq=Hq, Hkv=Hkv, T=T, S=S, Dk=D, Dv=D, dtype=dtype)
    g = Hq // Hkv

    def spliced(name: str, index: tuple) -> np.ndarray:
        a = np.array(getattr(case, name), copy=True)
        a[index] = getattr(other, name)[index]
        return a

    changes = [
        (
            "batch item 0 (q, k, v, mask)",
            (slice(1, None),),
            dict(
                query=spliced("query", (0,)),
                key=spliced("key", (0,)),
                value=spliced("value", (0,)),
                mask=None if mask is None else np.concatenate([~mask[:1], mask[1:]]),
            ),
        ),
        ("query head 0", (slice(None), slice(1, None)), dict(query=spliced("query", (slice(None), 0)))),
        (
            f"kv head 0 (read by query heads 0..{g - 1})",
            (slice(None), slice(g, None)),
            dict(key=spliced("key", (slice(None), 0)), value=spliced("value", (slice(None), 0))),
        ),
    ]
    for what, untouched, change in changes:
        if what.startswith("kv head") and Hkv == 1:
            continue
        changed = case.replace(label=f"changed {what}", **change)
        got = impl.forward(changed)
        allowed = compare.pair_allowance(case, changed, decl)
        compare.assert_outputs_agree(
            f"{untouched} after changing {what}",
            got[untouched],
            out[untouched],
            allowed[untouched],
            case=changed,
            decl=decl,
        )
