"""§4 of 000_f3dcd408372d9e02.txt: the shape contract, with T != S and Dk != Dv on purpose."""

from __future__ import annotations

from conformance.harness.cases import random_case
from conformance.harness.clause import Source, clause
from conformance.harness.probes import observe_weights
from conformance.harness.report import check

OUT_SHAPE_SOURCE = Source("000", "§4 完整 Shape 检查", ("output:  [B, H, T, Dv]", "输出长度由 Query 的长度 $T$ 决定。"))
WEIGHTS_SHAPE_SOURCE = Source("000", "§4 完整 Shape 检查", ("weights: [B, H, T, S]", "注意力权重最后两维是 Query 长度 × Key 长度；"))

# §9 of the article uses exactly these sizes: T != S and Dk != Dv expose kernels that confuse them.
ARTICLE_SHAPES = dict(B=2, Hq=4, T=3, S=5, Dk=8, Dv=6)
SWAPPED_SHAPES = dict(B=2, Hq=4, T=5, S=3, Dk=6, Dv=8)


@clause(
    "SHAPE-OUT-01",
    "output is [B, H, T, Dv]: its length follows the queries, its width the values",
    OUT_SHAPE_SOURCE,
    kills=["output_length_s"],
)
def test_output_shape(impl, dtype):
    for i, shape in enumerate((ARTICLE_SHAPES, SWAPPED_SHAPES)):
        case = random_case(i, dtype=dtype, **shape)
        impl.require(case)
        out = impl.forward(case)  # the guarded call checks shape [B,H,T,Dv] and dtype
        check(out.shape == case.out_shape, f"out.shape={out.shape}, but should be {case.out_shape}", case)


@clause(
    "SHAPE-WEIGHTS-02",
    "attention weights are [B, H, T, S] (observed directly, or through V = I)",
    WEIGHTS_SHAPE_SOURCE,
    kills=["weights_transposed", "output_length_s"],
)
def test_weights_shape(impl, dtype):
    for i, shape in enumerate((ARTICLE_SHAPES, SWAPPED_SHAPES)):
        case = random_case(10 + i, dtype=dtype, **shape)
        impl.require(case)
        w = observe_weights(impl, case)
        check(w.shape == case.weights_shape, f"weights.shape={w.shape}, but should be {case.weights_shape}", case)


@clause(
    "DTYPE-OUT-03",
    "the output has the input's dtype",
    Source("000", "§8 为什么在点积之前提高精度", "返回时恢复输入 dtype。"),
    kills=["output_float32@float16", "output_float32@bfloat16"],
)
def test_output_dtype(impl, dtype):
    case = random_case(20, dtype=dtype, **ARTICLE_SHAPES)
    impl.forward(case)  # the guarded call fails with "output.dtype=..., but should be ..."
