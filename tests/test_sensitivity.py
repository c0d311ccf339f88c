"""Sensitivity controls: uniform deviations the error model must see, one dtype at a time.

A correct kernel (two zoo kernels, tests/zoo_kernels.py) is wrapped with a deviation that no
rounding explains, and the clause that should see it must fail: a softmax temperature off by
2 % in bfloat16, 0.2 % in float16, 0.01 % in float32 and float64 (ORACLE-AGREE-01), and every
gradient scaled by 0.95 in bfloat16, 0.99 in float16, 0.9999 in float32 and float64
(GRAD-VJP-01). Each wrapper declares the one dtype under test, as a kernel shipped for one dtype
would. The unwrapped factor 1 passes the same clause, so each failure is the deviation's.
docs/tolerance.md (scripts/tolerance_report.py) shows how far beyond these targets the model sees.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.contract import Case, np_dtype
from tests.clause_runner import load_clauses, run_clause
from tests.zoo_kernels import ZOO

CLAUSES = load_clauses()
BASES = ("zoo-maxsub-p-rounded", "zoo-fa2-exp2")
TEMPERATURE = {"bfloat16": 1.02, "float16": 1.002, "float32": 1.0001, "float64": 1.0001}
GRADIENT = {"bfloat16": 0.95, "float16": 0.99, "float32": 0.9999, "float64": 0.9999}


class Temperature:
    """softmax((QK^T * scale + M) * factor) V: a temperature of 1/factor."""

    def __init__(self, base: str, factor: float, dtype: str):
        self.base = ZOO[base]()
        self.factor = factor
        self.name = f"{base} temperature x{factor:g}"
        self.declaration = self.base.declaration.replace(dtypes=frozenset({dtype}))

    def forward(self, case: Case) -> np.ndarray:
        bias = None if case.bias is None else np.asarray(case.bias, dtype=np.float64) * self.factor
        return self.base.forward(case.replace(scale=case.effective_scale * self.factor, bias=bias))

    def vjp(self, case: Case, grad_out: np.ndarray):
        return self.base.vjp(case, grad_out)


class GradientScaled:
    """A correct forward; every gradient multiplied by ``factor``."""

    def __init__(self, base: str, factor: float, dtype: str):
        self.base = ZOO[base]()
        self.factor = factor
        self.name = f"{base} gradients x{factor:g}"
        self.declaration = self.base.declaration.replace(dtypes=frozenset({dtype}))

    def forward(self, case: Case) -> np.ndarray:
        return self.base.forward(case)

    def vjp(self, case: Case, grad_out: np.ndarray):
        lowp = np_dtype(case.dtype)
        return tuple(
            (np.asarray(g, dtype=np.float64) * self.factor).astype(lowp) for g in self.base.vjp(case, grad_out)
        )


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("dtype", sorted(TEMPERATURE))
def test_temperature_is_seen(base, dtype):
    info = CLAUSES["ORACLE-AGREE-01"]
    assert run_clause(info, Temperature(base, 1.0, dtype), dtype) == "passed"
    factor = TEMPERATURE[dtype]
    verdict = run_clause(info, Temperature(base, factor, dtype), dtype, shrink=False)
    assert verdict.startswith("failed"), f"temperature x{factor} in {dtype} ({base}) not seen: {verdict[:300]}"


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("dtype", sorted(GRADIENT))
def test_gradient_scale_is_seen(base, dtype):
    info = CLAUSES["GRAD-VJP-01"]
    assert run_clause(info, GradientScaled(base, 1.0, dtype), dtype) == "passed"
    factor = GRADIENT[dtype]
    verdict = run_clause(info, GradientScaled(base, factor, dtype), dtype, shrink=False)
    assert verdict.startswith("failed"), f"gradients x{factor} in {dtype} ({base}) not seen: {verdict[:300]}"
