"""The worked example of 003_648455d5abd16778.txt, checked against the article's own numbers.

The expected values here are the article's, not anything this project computed: q = [1, 1],
k1 = [1, 0], k2 = [0, 1], v1 = [2, 0], v2 = [0, 4] gives [1, 2]; with k2 blocked it gives [2, 0].
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case
from conformance.harness.cases.build import cast
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

WORKED = Source(
    "003",
    "Worked Example",
    (
        "Softmax 权重相同，均为 0.5，因此输出：",
        "o = 0.5·v₁ + 0.5·v₂ = [1, 2]",
        "若因果 Mask 禁止读取 k₂，第二个分数变为负无穷，权重变成 [1,0]，输出为 [2,0]。",
    ),
)


def worked_case(dtype: str, block_k2: bool) -> Case:
    q = cast(np.array([1.0, 1.0]).reshape(1, 1, 1, 2), dtype)
    k = cast(np.array([[1.0, 0.0], [0.0, 1.0]]).reshape(1, 1, 2, 2), dtype)
    v = cast(np.array([[2.0, 0.0], [0.0, 4.0]]).reshape(1, 1, 2, 2), dtype)
    mask = np.array([False, True]).reshape(1, 1, 1, 2) if block_k2 else None
    return Case(q, k, v, mask=mask, label="worked example" + (", k2 blocked" if block_k2 else ""))


def _blocking_k2_as_declared(impl, case: Case) -> Case:
    """The article blocks k2 with "因果 Mask": a boolean mask here, else the kernel's additive mask (-inf)
    or is_causal (T = 1, S = 2, top-left: the query sees k1 only), whichever the declaration has; the
    article's numbers hold for each. A kernel with none of them runs the unmasked half only."""
    decl = impl.declaration
    if case.mask is None or decl.bool_mask:
        return case
    if decl.float_mask:
        return case.replace(mask=None, bias=np.where(case.mask, -np.inf, 0.0), label=case.label + " (additive -inf)")
    if decl.causal and decl.causal_alignment == "top-left":
        return case.replace(mask=None, is_causal=True, label=case.label + " (is_causal)")
    return case


@clause(
    "WORKED-EXAMPLE-01",
    "q=[1,1], k1=[1,0], k2=[0,1], v1=[2,0], v2=[0,4] gives [1,2]; with k2 blocked, [2,0]",
    WORKED,
    kills=["decode_path_drops_mask@float64", "value_in_similarity", "mask_sense_inverted", "bitpacked_mask_tail"],
)
def test_worked_example(impl, dtype):
    ran = 0
    for block_k2, article in ((False, [1.0, 2.0]), (True, [2.0, 0.0])):
        case = _blocking_k2_as_declared(impl, worked_case(dtype, block_k2))
        if ran and not impl.supports(case):
            continue  # the example without a mask ran; this kernel has no way of blocking k2
        impl.require(case)
        ran += 1
        out = impl.forward(case)
        want = np.array(article).reshape(1, 1, 1, 2)
        compare.assert_close(out, want, case=case, decl=impl.declaration)
