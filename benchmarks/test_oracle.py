"""The float64 oracle against the float64 two-GEMM floor, at T = S = 2048 (and the plain oracle beside it).

The blocked oracle (``conformance.oracle.forward_blocked``) is what long-sequence clauses use; its
target is at most 2x the time of the two float64 products it cannot avoid.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.conftest import B, H, record, two_gemm_seconds
from conformance import oracle
from conformance.harness.cases.build import random_case

L = 2048


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("which", ["forward_blocked", "forward"])
def test_oracle(benchmark, which, D):
    case = random_case(0, B=B, Hq=H, T=L, S=L, Dk=D, Dv=D, dtype="float64")
    fn = getattr(oracle, which)
    floor_before = two_gemm_seconds(L, L, D, dtype=np.float64)
    benchmark.group = f"oracle float64 T=S={L} D={D}"
    benchmark.pedantic(lambda: fn(case), rounds=5 if which == "forward_blocked" else 1, iterations=1, warmup_rounds=1)
    floor_s = min(floor_before, two_gemm_seconds(L, L, D, dtype=np.float64))  # bracket the run: load drifts
    flops = 4 * B * H * L * L * D
    record(benchmark, impl=f"oracle.{which}", pass_="forward(float64)", T=L, S=L, D=D, flops=flops, floor_s=floor_s)
