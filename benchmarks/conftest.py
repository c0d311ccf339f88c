"""Benchmark fixtures: the two-GEMM floor measured on this machine, in this run.

Attention does two products of T·S·D multiply-adds each (Q·K^T and P·V), 4·B·H·T·S·D flops in all; no
kernel can beat the time this machine's NumPy BLAS takes for exactly those two GEMMs in float32, so
that time is the floor every adapter's figure is set against. Backward is counted as four such
GEMMs (dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q), 8·B·H·T·S·D flops, floor twice the forward's.

``SDPA_BENCH_QUICK=1`` shrinks the grid to a one-minute smoke run.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

QUICK = os.environ.get("SDPA_BENCH_QUICK", "") not in ("", "0", "false", "no")
SIZES = (128, 512, 1024) if QUICK else (128, 256, 512, 1024, 2048, 4096)
HEAD_DIMS = (64,) if QUICK else (64, 128)
B, H = 1, 2
IMPLS = ("numpy", "torch-eager", "torch-sdpa", "torch-sdpa-math", "torch-sdpa-flash", "jax")


def best_time(fn, repeat: int = 5, min_total: float = 0.2, max_runs: int = 200) -> float:
    """Best of at least ``repeat`` runs, continued until ``min_total`` seconds: the minimum is the
    figure least disturbed by other work on a shared machine."""
    best, total, runs = float("inf"), 0.0, 0
    while runs < repeat or (total < min_total and runs < max_runs):
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, total, runs = min(best, dt), total + dt, runs + 1
    return best


def two_gemm_seconds(T: int, S: int, D: int, dtype=np.float32, b: int = B, h: int = H) -> float:
    """Best-of-3 time of Q·K^T then P·V with NumPy for [b, h, T, D] x [b, h, S, D] operands."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, h, T, D)).astype(dtype)
    kt = np.ascontiguousarray(np.swapaxes(rng.standard_normal((b, h, S, D)).astype(dtype), -1, -2))
    v = rng.standard_normal((b, h, S, D)).astype(dtype)
    p = np.empty((b, h, T, S), dtype=dtype)

    def run():
        np.matmul(q, kt, out=p)
        return p @ v

    run()
    return best_time(run)


def record(benchmark, *, impl: str, pass_: str, T: int, S: int, D: int, flops: float, floor_s: float) -> None:
    """The figures every benchmark row carries (benchmarks/report.py reads them): throughput and its
    ratio to the two-GEMM floor, from the benchmark's best time."""
    best = benchmark.stats.stats.min
    benchmark.extra_info.update(
        impl=impl,
        pass_=pass_,
        B=B,
        H=H,
        T=T,
        S=S,
        D=D,
        flops=flops,
        floor_s=floor_s,
        gflops=flops / best / 1e9,
        floor_gflops=flops / floor_s / 1e9,
        x_floor=best / floor_s,
    )


@pytest.fixture(scope="session")
def floor():
    """``floor(T, S, D)`` -> seconds of the float32 two-GEMM forward floor.

    Re-measured at every request (once per benchmark of that shape) and the minimum kept, so one
    measurement disturbed by other work on the machine cannot set the floor for a whole row.
    """
    best: dict = {}

    def get(T: int, S: int, D: int) -> float:
        t = two_gemm_seconds(T, S, D)
        best[(T, S, D)] = min(t, best.get((T, S, D), float("inf")))
        return best[(T, S, D)]

    return get
