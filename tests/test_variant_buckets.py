"""The variant clauses that spread their cases over the dtypes for kernels compiling per shape (ci
profile, conformance.harness.cases.buckets.spread) still catch every mutant they claim there.

test_clauses_bite.py runs the mutants as kernels that do not compile per shape (every case in every
dtype); here they run declaring ``compiles_per_shape=True``, as jax does, where each case of
WINDOW-ALIGN-02, WINDOW-CAUSAL-03, VARLEN-EDGES-04, KV-LENGTHS-01, LSE-01 and LSE-GQA-02 runs in one
dtype only, and must still fail the clause in some dtype, while the correct kernel passes in all.
"""

from __future__ import annotations

import pytest

from tests.clause_runner import dtypes_for, load_clauses, run_clause
from tests.test_buckets import CompilingPerShape

SPREAD = ["WINDOW-ALIGN-02", "WINDOW-CAUSAL-03", "VARLEN-EDGES-04", "KV-LENGTHS-01", "LSE-01", "LSE-GQA-02"]
CLAUSES = load_clauses()
PAIRS = [(cid, kill) for cid in SPREAD for kill in CLAUSES[cid].kills]


@pytest.mark.parametrize("clause_id, mutant", PAIRS, ids=[f"{c}-{m}" for c, m in PAIRS])
def test_spread_variant_clauses_still_kill(clause_id, mutant):
    from tests.mutants import MUTANTS

    info = CLAUSES[clause_id]
    results = [run_clause(info, CompilingPerShape(MUTANTS[mutant]()), d, shrink=False) for d in dtypes_for(info)]
    assert any(r.startswith("failed") for r in results), results


@pytest.mark.parametrize("clause_id", SPREAD)
def test_spread_variant_clauses_pass_the_correct_kernel(clause_id):
    from conformance.harness.cases import buckets
    from tests.mutants_variants import VariantKernel

    info = CLAUSES[clause_id]
    assert buckets.bucketed(CompilingPerShape(VariantKernel())), "the ci profile's spread is not in effect here"
    results = [run_clause(info, CompilingPerShape(VariantKernel()), d) for d in dtypes_for(info)]
    assert all(r == "passed" for r in results), results
