"""Positive controls for the error model: every zoo kernel passes every clause (ci profile).

The zoo (tests/zoo_kernels.py) is eight correct kernels written the way production kernels are:
P rounded or kept, exp(s - lse), exp2 with log2(e) in the scale, online softmax with odd tiles,
split-KV merged by log-sum-exps, float64 throughout, GQA by grouped queries, reversed and pairwise
sums. A clause that fails one of them has an allowance that refuses an honest formulation, which
is the failure the error model exists to prevent. Clauses the zoo's declarations rule out (dropout,
input validation, returned weights, batch invariance) are not applicable, and say so.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import oracle
from conformance.contract import DTYPES
from conformance.harness.cases import random_case
from tests.clause_runner import dtypes_for, load_clauses, run_clause
from tests.zoo_kernels import ZOO

CLAUSES = load_clauses()


@pytest.mark.parametrize("clause_id", sorted(CLAUSES))
@pytest.mark.parametrize("kernel", sorted(ZOO))
def test_zoo_kernel_passes(kernel, clause_id):
    info = CLAUSES[clause_id]
    for d in dtypes_for(info):
        verdict = run_clause(info, ZOO[kernel](), d)
        assert not verdict.startswith("failed"), f"{clause_id} [{d}] refuses the correct kernel {kernel}: {verdict}"
        if verdict.startswith("skipped"):
            assert "not applicable" in verdict or "declares" in verdict, f"{clause_id} [{d}] {kernel}: {verdict}"


def test_zoo_is_large_enough_and_has_backward_kernels():
    assert len(ZOO) >= 8
    with_grad = [name for name, cls in ZOO.items() if cls().declaration.grad]
    assert len(with_grad) >= 4, with_grad


@pytest.mark.parametrize("kernel", sorted(ZOO))
@pytest.mark.parametrize("dtype", DTYPES)
def test_zoo_kernel_is_honest_not_exact(kernel, dtype):
    """Each zoo kernel lands near the oracle, and (below float64) not bitwise on it: a control that
    matched the oracle exactly would say nothing about the allowance."""
    case = random_case(5, B=2, Hq=4, Hkv=2, T=9, S=23, Dk=16, Dv=8, dtype=dtype, is_causal=True)
    got = np.asarray(ZOO[kernel]().forward(case), dtype=np.float64)
    want = oracle.forward(case).out
    err = float(np.max(np.abs(got - want)))
    scale = {"float64": 1e-13, "float32": 1e-5, "float16": 1e-2, "bfloat16": 6e-2}[dtype]
    assert err < scale, f"{kernel} [{dtype}] is {err:.3g} from the oracle"
    if dtype in ("float16", "bfloat16"):
        assert err > 0
