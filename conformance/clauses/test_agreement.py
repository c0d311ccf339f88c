"""§3 of 000_f3dcd408372d9e02.txt: the kernel computes softmax(QK^T/sqrt(d_k) + M) V.

Property-based: hypothesis draws shapes (T != S, Dk != Dv, GQA where declared), masks of every
broadcastable rank, causal flags and custom scales, and shrinks a failure to the smallest case that
still shows it. The expected value is always the float64 oracle in the declared conventions.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import compare
from conformance.harness.cases import random_case, random_mask
from conformance.harness.clause import Source, clause
from conformance.harness.strategies import examples, seeds, shapes

FORMULA = Source(
    "000",
    "§3 矩阵形式",
    "\\operatorname{Attention}(Q,K,V) = \\operatorname{softmax}\\left(\\frac{QK^T}{\\sqrt{d_k}}+M\\right)V",
)

MASK_KINDS = ("none", "[T,S]", "[B,1,T,S]", "[B,H,T,S]", "[B,1,1,S]")


def _mask(kind: str, seed: int, B: int, H: int, T: int, S: int):
    shape = {
        "none": None,
        "[T,S]": (T, S),
        "[B,1,T,S]": (B, 1, T, S),
        "[B,H,T,S]": (B, H, T, S),
        "[B,1,1,S]": (B, 1, 1, S),
    }[kind]
    return None if shape is None else random_mask(seed, shape, p_blocked=0.35)


@clause(
    "ORACLE-AGREE-01",
    "the output agrees with the float64 oracle within the stated tolerance, over random shapes, masks, causal and scale",
    FORMULA,
    kills=["causal_off_by_one", "gqa_wrong_mapping", "batch_mask_mixup", "value_in_similarity"],
)
@examples(25)
@given(data=st.data(), seed=seeds)
def test_agrees_with_oracle(impl, dtype, data, seed):
    decl = impl.declaration
    shp = data.draw(shapes(gqa=decl.gqa, square_dims=decl.requires_dk_eq_dv), label="shape")
    if decl.max_head_dim is not None:
        shp = type(shp)(**{**shp.__dict__, "Dk": min(shp.Dk, decl.max_head_dim), "Dv": min(shp.Dv, decl.max_head_dim)})
    kind = data.draw(st.sampled_from(MASK_KINDS if decl.bool_mask else ("none",)), label="mask")
    is_causal = data.draw(st.booleans(), label="is_causal") if decl.causal else False
    scale = data.draw(st.sampled_from([None, None, 0.5, 0.125]), label="scale") if decl.custom_scale else None
    case = random_case(
        seed,
        B=shp.B,
        Hq=shp.Hq,
        Hkv=shp.Hkv,
        T=shp.T,
        S=shp.S,
        Dk=shp.Dk,
        Dv=shp.Dv,
        dtype=dtype,
        mask=_mask(kind, seed, shp.B, shp.Hq, shp.T, shp.S),
        is_causal=is_causal,
        scale=scale,
    )
    impl.require(case)
    compare.assert_output_matches(impl, case)
