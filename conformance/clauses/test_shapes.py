"""§4 of 000_f3dcd408372d9e02.txt: the shape contract, with T != S and Dk != Dv on purpose.

Every guarded call already fails a result of the wrong shape or dtype (``GuardedAdapter._check_array``), so a
clause that only compared shapes would repeat the guard and could never fail on its own. These
clauses instead run *witnesses* that the rest of the suite does not use, where a kernel can return
the right shape with the wrong rows: the decode shape with grouped heads and Dk != Dv (latent
attention's T = 1, Hq > Hkv, Dk > Dv), weights of grouped heads with more queries than keys, and
values at a magnitude only the working dtype can hold. Each is compared with the oracle, row by row.
"""

from __future__ import annotations

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases import buckets
from conformance.harness.cases.build import cast, random_case, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

OUT_SHAPE_SOURCE = Source("000", "§4 完整 Shape 检查", ("output:  [B, H, T, Dv]", "输出长度由 Query 的长度 $T$ 决定。"))
WEIGHTS_SHAPE_SOURCE = Source(
    "000", "§4 完整 Shape 检查", ("weights: [B, H, T, S]", "注意力权重最后两维是 Query 长度 × Key 长度；")
)

# §9 of the article uses exactly these sizes: T != S and Dk != Dv expose kernels that confuse them.
ARTICLE_SHAPES = dict(B=2, Hq=4, T=3, S=5, Dk=8, Dv=6)
SWAPPED_SHAPES = dict(B=2, Hq=4, T=5, S=3, Dk=6, Dv=8)
# Latent-attention decode: one query row, grouped heads, a key head dim wider than the value's.
DECODE_SHAPES = dict(B=2, Hq=4, Hkv=2, T=1, S=5, Dk=16, Dv=8)


def _variants(shape: dict) -> list[dict]:
    """``shape``, then the same with each feature a kernel may not declare (GQA, Dk != Dv) removed."""
    out = [shape]
    if shape.get("Dv", shape["Dk"]) != shape["Dk"]:
        out.append({**shape, "Dv": shape["Dk"]})
    if shape.get("Hkv", shape["Hq"]) != shape["Hq"]:
        out += [{**s, "Hkv": s["Hq"]} for s in list(out)]
    return out


def _first_supported(impl: GuardedAdapter, seed: int, shape: dict, dtype: str, label: str) -> Case:
    cases = [random_case(seed, dtype=dtype, label=f"{label} {s}", **s) for s in _variants(shape)]
    for case in cases:
        if impl.supports(case):
            return case
    impl.require(cases[-1])  # not applicable, with the reasons of the plainest variant
    return cases[-1]


@clause(
    "SHAPE-OUT-01",
    "output is [B, H, T, Dv]: its length follows the queries, its width the values; every row equals the oracle's "
    "on T != S both ways and on the decode shape with grouped heads and Dk > Dv",
    OUT_SHAPE_SOURCE,
    kills=[
        "batch_head_flat_index_swapped@float64",
        "output_length_s",
        "decode_gqa_scale_from_dv",
        "kv_seqlens_off_after_first",
    ],
)
def test_output_shape(impl, dtype):
    witnesses = (
        (ARTICLE_SHAPES, "§9 sizes"),
        (SWAPPED_SHAPES, "T > S, Dk < Dv"),
        (DECODE_SHAPES, "decode T=1, GQA, Dk > Dv"),
    )
    # A kernel compiling per shape checks each witness in one dtype per ci run (buckets.spread).
    for i, (shape, label) in buckets.spread(impl, dtype, list(enumerate(witnesses))):
        case = _first_supported(impl, i, shape, dtype, label)
        compare.assert_output_matches(impl, case)  # the guarded call checks the shape [B,H,T,Dv] and dtype


@clause(
    "SHAPE-WEIGHTS-02",
    "attention weights are [B, H, T, S] (observed directly, or through V = I): row t is query t's distribution "
    "over the keys, for every query head of a group, with T != S both ways",
    WEIGHTS_SHAPE_SOURCE,
    kills=["weights_transposed", "output_length_s", "gqa_weights_of_first_head", "v_channel_scale_nan"],
)
def test_weights_shape(impl, dtype):
    witnesses = (dict(B=2, Hq=4, Hkv=2, T=3, S=5, Dk=8), dict(B=2, Hq=4, Hkv=2, T=7, S=3, Dk=8))
    for i, shape in buckets.spread(impl, dtype, list(enumerate(witnesses))):
        case = _first_supported(impl, 10 + i, shape, dtype, "weights")
        compare.assert_weights_match(impl, case)


# The magnitude of V per working dtype: beyond the range of every narrower type a kernel might
# route the output through (float16 for the 32-bit types and bfloat16, float32 for float64).
_HOLDS = {"float64": 2.0**200, "float32": 2.0**100, "bfloat16": 2.0**100, "float16": 2.0**14}


@clause(
    "DTYPE-OUT-03",
    "the output has the input's dtype and carries values only that dtype can hold (V beyond the range of any "
    "narrower type), equal to the oracle's",
    Source("000", "§8 为什么在点积之前提高精度", "返回时恢复输入 dtype。"),
    kills=[
        "lse_fp16_exp_normaliser@float16",
        "output_float32@float16",
        "output_float32@bfloat16",
        "half_output_cast@bfloat16",
        "float64_in_float32@float64",
    ],
    tolerance="the default rule; V's magnitude follows the declared computation dtype (float64_computed_as)",
)
def test_output_dtype(impl, dtype):
    base = _first_supported(impl, 20, ARTICLE_SHAPES, dtype, "values only this dtype holds")
    magnitude = _HOLDS[impl.declaration.tolerance_dtype(base)]
    v = magnitude * rng_for(21).uniform(-1.0, 1.0, base.value.shape)  # bounded: no partial sum can overflow
    case = base.replace(value=cast(v, dtype), label=f"{base.label}, |V| up to {magnitude:g}")
    compare.assert_output_matches(impl, case)  # an inf where the oracle is finite is an infinite error
