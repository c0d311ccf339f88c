"""§8 of 000_f3dcd408372d9e02.txt: low-precision inputs are upcast *before* the QK^T product.

The inputs are built so that the exact answer is known and nontrivial: q = c * 1, each key
``c * (±1 pattern)`` with f_j sign flips plus a fine offset m_j * delta on its first entry, so that

    q.k_j = c^2 (Dk - 2 f_j) + c * delta * m_j.

The keys with f_j = 0 share the top score and differ among themselves by about one unit after
scaling, so the output is a genuine mixture of their values. With c = 32, Dk = 64 the raw
product reaches 65536 + 24 > 65504 = float16's largest finite value: a kernel that forms QK^T in
float16 gets inf and then NaN. With c = 128 even the *scaled* scores (about 131072) exceed float16,
so pre-scaling q in float16 does not save a kernel that keeps scores in float16. In bfloat16 the
product does not overflow, but at 65536 its spacing is 512: a bfloat16 product erases the fine
offsets and gives equal weights where the exact weights are not equal.

What is asserted: every output finite, and within the error model's allowance. At c = 128 the
scaled scores reach ~1.3e5, where a correct float32 kernel that folds log2(e) into the scale or
subtracts an lse carries an exponent error of u|s| ~ 0.01 (weights off by ~1-2 %); the model's
u|s| term admits that, and still refuses the bfloat16 product, whose error is the whole fine
structure (weights off by factors of e).
"""

from __future__ import annotations

import numpy as np

from conformance.contract import LOW_PRECISION, Case
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import fail

UPCAST = Source(
    "000",
    "§8 为什么在点积之前提高精度",
    "如果先在 float16 中计算点积，再调用 scores.float()，已经溢出为 inf 的值无法恢复。因此，这里将低精度输入转为 float32 后才计算点积和 softmax",
)


def large_logit_case(dtype: str, c: float, seed: int, Dk: int = 64, S: int = 16, H: int = 4) -> Case:
    rng = rng_for(seed)
    delta = c / 128.0  # exactly representable next to c in float16 and bfloat16
    q = np.full((1, H, 1, Dk), c)
    k = np.empty((1, H, S, Dk))
    for h in range(H):
        flips = rng.integers(0, 3, size=S)
        flips[rng.choice(S, size=3, replace=False)] = 0  # at least three keys tie on the top pattern
        offsets = rng.integers(0, 4, size=S)
        for j in range(S):
            row = np.full(Dk, c)
            if flips[j]:
                row[Dk - flips[j] :] = -c
            row[0] = c + delta * offsets[j]
            k[0, h, j] = row
    v = rng.standard_normal((1, H, S, Dk))
    return Case(cast(q, dtype), cast(k, dtype), cast(v, dtype), seed=seed, label=f"large logits c={c:g}")


@clause(
    "UPCAST-01",
    "fp16/bf16 inputs whose QK^T overflows float16 (or loses its fine structure in bfloat16) give finite outputs matching the oracle, in the input dtype",
    UPCAST,
    dtypes=sorted(LOW_PRECISION, reverse=True),
    kills=["no_upcast@float16", "no_upcast@bfloat16"],
)
def test_upcast_before_product(impl, dtype):
    for seed, c in ((70, 32.0), (71, 128.0)):
        case = large_logit_case(dtype, c, seed)
        impl.require(case)
        out = impl.forward(case)
        o = np.asarray(out, dtype=np.float64)
        decl = impl.declaration
        want = compare.expected(case, decl).out  # finite, unless a declared formulation overflows
        if not np.all(np.isfinite(o)[np.isfinite(want)]):
            fail(
                f"{int((~np.isfinite(o)).sum())} of {o.size} outputs are not finite: raw q.k reaches "
                f"{float(np.max(case.query.astype(np.float64) @ np.swapaxes(case.key.astype(np.float64), -1, -2))):.6g} "
                "(float16 max 65504); the product must be formed after upcasting",
                case,
            )
        compare.assert_close(out, want, case=case, decl=decl)
