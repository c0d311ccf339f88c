"""§12 误区二 of 000_f3dcd408372d9e02.txt and 003 §输入与输出: softmax runs over the key axis."""

from __future__ import annotations

import numpy as np

from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import check, fail


@clause(
    "SOFTMAX-AXIS-01",
    "without a mask every weight row (over keys) is non-negative and sums to 1",
    Source(
        "000",
        "§12 误区二：softmax 对错维度",
        "应该沿 Key 维度，也就是分数张量的最后一维做 softmax。有有效 Key 且未启用 dropout 时，每个 Query 的权重和为 1",
    ),
    kills=["softmax_query_axis"],
    tolerance="|row sum - 1| <= the sum over the row of the error model's weight allowances (harness.judge.tolerance)",
)
def test_rows_sum_to_one(impl, dtype):
    # A kernel compiling per shape gets the palette's T < S shape in the ci profile (harness.cases.buckets).
    case = random_case(30, dtype=dtype, **buckets.dims(impl, "cross", B=2, Hq=3, T=4, S=7, Dk=8))
    impl.require(case)
    w = observe_weights(impl, case)
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        fail(
            f"weights must be finite and >= 0; min={np.nanmin(w):.3g}, non-finite={int((~np.isfinite(w)).sum())}", case
        )
    sums = w.sum(axis=-1)
    allowed = compare.weights_allowance(case, impl.declaration).sum(axis=-1)  # |sum of errors| <= sum of bounds
    err = np.abs(sums - 1.0)
    worst = np.unravel_index(int(np.argmax(err / allowed)), err.shape)
    check(
        bool(np.all(err <= allowed)),
        f"row sums of the weights should be 1: worst row {list(worst)} sums to {sums[worst]:.6g} "
        f"(|err|={err[worst]:.3g} > allowed {allowed[worst]:.3g}); column sums there: "
        f"{np.round(w[worst[:2]].sum(axis=-2), 4).tolist()}",
        case,
    )
