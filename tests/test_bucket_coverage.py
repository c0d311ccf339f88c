"""Coverage under shape buckets: a kernel declaring ``compiles_per_shape`` still meets every admitted
pair of value classes, every admitted value class, and the drawn space's reach, on few structures.

Buckets change which shapes the hand-built and drawn clauses use (``harness.cases.buckets``,
``harness.cases.space.COMPILING_STRUCTURES``); the covering arrays already build each value class at
one size (``harness.covering.build.SIZES``), so their rows are the same with or without the
declaration, and whatever makes a pair observable in a row (no third value hiding it) holds alike.
Here the covering clauses run on a correct kernel declaring ``compiles_per_shape`` and the pairs
that reached it are counted as the certificate counts them.
"""

from __future__ import annotations

from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.covering import array as covering
from conformance.harness.covering.table import PARAMETERS
from conformance.harness.records import coverage_tables
from tests.clause_runner import load_clauses
from tests.mutants import BaseKernel
from tests.test_buckets import CompilingPerShape


def test_every_admitted_pair_and_value_class_reaches_a_compiling_kernel():
    kernel = CompilingPerShape(BaseKernel())
    decl = kernel.declaration
    assert decl.compiles_per_shape
    impl = GuardedAdapter(kernel, spec="compiling base", timeout=0)
    clauses = load_clauses()
    for cid in ("COVER-PAIRS-01", "COVER-PAIRS-GRAD-02"):
        clauses[cid].func(impl=impl)
    records = impl.covering_reached
    pairs = coverage_tables.pairs_table(records, decl, (2,))["2"]
    assert pairs["observable"] == pairs["admitted"] > 1000, pairs.get("not_observable", [])[:5]
    plan = covering.plan(decl, 2)
    assert plan.rows == covering.plan(BaseKernel().declaration, 2).rows  # the rows do not depend on it
    admitted = {(p.name, v.name) for p in PARAMETERS for v in p.values if (p.name, v.name) not in plan.excluded_values}
    reached = {(p, v) for rec in records for p, v in rec["values"].items()}
    assert admitted <= reached, sorted(admitted - reached)
    # what a compiling kernel pays for them: per row and direction, one structure and at most one more
    # for its repeated-call twin (the same shapes with other non-shape values)
    rows = len(plan.rows) + sum(r["direction"] == "backward" for r in plan.rows)
    assert 0 < len(impl.programs.seen) <= 2 * rows
