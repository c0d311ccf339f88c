"""Forward and backward time of each CPU adapter over T = S and D, against the two-GEMM floor.

Run with ``pytest benchmarks --benchmark-only`` (``SDPA_BENCH_QUICK=1`` for a short grid); print the
table with ``python benchmarks/report.py``. Inputs are float32, B = 1, H = 2, no mask.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.conftest import HEAD_DIMS, IMPLS, SIZES, B, H, record
from conformance.harness.calls import registry
from conformance.harness.cases.build import random_case

_ADAPTERS: dict = {}


def adapter(name: str):
    if name not in _ADAPTERS:
        res = registry.resolve(name)
        _ADAPTERS[name] = res.adapter if res.adapter is not None and not res.reason else res.reason
    got = _ADAPTERS[name]
    if isinstance(got, str) or got is None:
        pytest.skip(f"{name} unavailable: {got}")
    return got


def _rounds(T: int) -> int:
    return 5 if T <= 512 else 3 if T <= 1024 else 1


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("T", SIZES)
@pytest.mark.parametrize("pass_", ["forward", "backward"])
@pytest.mark.parametrize("impl", IMPLS)
def test_adapter(benchmark, floor, impl, pass_, T, D):
    a = adapter(impl)
    case = random_case(0, B=B, Hq=H, T=T, S=T, Dk=D, Dv=D, dtype="float32")
    if pass_ == "forward":

        def fn():
            return a.forward(case)

        flops, floor_s = 4 * B * H * T * T * D, floor(T, T, D)
    else:
        if not a.declaration.grad:
            pytest.skip(f"{impl} declares grad=False")
        g = np.random.default_rng(1).standard_normal(case.out_shape).astype(np.float32)

        def fn():
            return a.vjp(case, g)

        flops, floor_s = 8 * B * H * T * T * D, 2 * floor(T, T, D)
    benchmark.group = f"{pass_} T=S={T} D={D}"
    benchmark.pedantic(fn, rounds=_rounds(T), iterations=1, warmup_rounds=1)
    floor_s = min(floor_s, (2 if pass_ == "backward" else 1) * floor(T, T, D))  # measured again after the run
    record(benchmark, impl=impl, pass_=pass_, T=T, S=T, D=D, flops=flops, floor_s=floor_s)
