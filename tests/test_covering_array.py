"""The covering-array generator, the value-class table and pair coverage.

What must hold for "every admitted pair reached" to mean something: the rows cover every admitted
tuple; every row is a case the declaration takes; admitted and excluded tuples partition the tuples of
admitted values, each exclusion with a reason; the plan is a pure function of the declaration; every
planned class is really in the case built for it (coverage is counted from the case, so a class that
does not hold would show as not reached); and a failing row is shrunk to its two features.
"""

from __future__ import annotations

import itertools

import pytest

from conformance.contract import Declaration
from conformance.harness.cases import covering
from conformance.harness.cases.pairs_cases import build, row_reasons
from conformance.harness.cases.pairs_space import PARAMETERS, reached_values
from conformance.harness.records import coverage_tables
from tests.clause_runner import load_clauses, run_clause
from tests.mutants import MUTANTS, BaseKernel

DECLS = {
    "base": BaseKernel().declaration,
    "no GQA, no float mask, no custom scale, fp32/fp16": Declaration(
        gqa=False, float_mask=False, custom_scale=False, dtypes=frozenset({"float32", "float16"})
    ),
    "jax-like": Declaration(
        gqa=True,
        float_mask=True,
        grad=True,
        all_blocked="mean-v",
        all_blocked_float_mask="nan",
        requires_dk_eq_dv=True,
        max_head_dim=128,
    ),
    "bottom-right, nan": Declaration(gqa=True, grad=True, causal_alignment="bottom-right", all_blocked="nan"),
}


@pytest.mark.parametrize("which", sorted(DECLS))
def test_rows_cover_every_admitted_pair_and_are_admitted(which):
    decl = DECLS[which]
    plan = covering.plan(decl, 2)
    covered = {tup for row in plan.rows for tup in covering.tuples_of(row, 2)}
    missing = [covering.name(t) for t in plan.admitted if t not in covered]
    assert not missing, missing[:5]
    for row in plan.rows:
        assert set(row) == {p.name for p in PARAMETERS}
        assert not row_reasons(decl, row, 2, plan.defaults), row
    values = {p.name: [v.name for v in p.values if (p.name, v.name) not in plan.excluded_values] for p in PARAMETERS}
    every = {
        tuple(zip(ps, combo))
        for ps in itertools.combinations(values, 2)
        for combo in itertools.product(*(values[p] for p in ps))
    }
    assert set(plan.admitted) | set(plan.excluded) == every
    assert not set(plan.admitted) & set(plan.excluded)
    assert all(why.strip() for why in [*plan.excluded.values(), *plan.excluded_values.values()])
    assert 40 <= len(plan.rows) <= 90, len(plan.rows)


def test_plan_is_deterministic():
    decl = DECLS["base"]
    first = covering.plan(decl, 2)
    covering.plan.cache_clear()
    again = covering.plan(decl, 2)
    assert first.rows == again.rows and first.admitted == again.admitted and first.excluded == again.excluded


def test_declaration_rules_values_out_with_its_own_reasons():
    plan = covering.plan(DECLS["no GQA, no float mask, no custom scale, fp32/fp16"], 2)
    assert "declares no GQA support" in plan.excluded_values[("heads", "8:1")]
    assert "declares no custom scale support" in plan.excluded_values[("scale", "zero")]
    assert "declares dtypes" in plan.excluded_values[("dtype", "float64")]
    assert "grad=False" in plan.excluded_values[("direction", "backward")]
    assert plan.defaults["dtype"] == "float32"
    jax_like = covering.plan(DECLS["jax-like"], 2)
    assert "Dk == Dv" in jax_like.excluded_values[("Dv", "> Dk")]
    assert ("Dk", "256") in jax_like.excluded_values  # max_head_dim=128
    mixed = (("mask form", "[B,H,T,S]"), ("additive M", "-inf on whole rows"))
    assert "no fill this declaration defines" in jax_like.excluded[mixed]


@pytest.mark.parametrize("which", sorted(DECLS))
def test_every_planned_class_holds_in_its_case(which):
    decl = DECLS[which]
    plan = covering.plan(decl, 2)
    for i, row in enumerate(plan.rows):
        case, grad_out = build(row, decl, 100 + i)
        assert (grad_out is not None) == (row["direction"] == "backward")
        got = reached_values(case, row["direction"], row)
        assert got == row, {k: (v, got.get(k)) for k, v in row.items() if got.get(k) != v}


def test_coverage_counts_what_reached_and_lists_the_rest():
    decl = DECLS["base"]
    plan = covering.plan(decl, 2)
    records = [dict(row) for row in plan.rows]
    full = coverage_tables.pairs_table(records, decl, (2,))["2"]
    assert full["reached"] == full["admitted"] == len(plan.admitted) and not full["not_reached"]
    last = len(records) - 1  # the greedy's last row covers a tuple no other row has
    dropped = coverage_tables.pairs_table(records[:last], decl, (2,))["2"]
    lost = {covering.name(t) for t in covering.tuples_of(plan.rows[last], 2)} - {
        covering.name(t) for r in plan.rows[:last] for t in covering.tuples_of(r, 2)
    }
    assert set(dropped["not_reached"]) == lost and lost
    assert coverage_tables.pairs_line("2", full).startswith(f"2-way: {full['admitted']:,}".replace(",", " "))


def test_triples_cover_every_admitted_triple():
    decl = DECLS["no GQA, no float mask, no custom scale, fp32/fp16"]  # the smaller table: a few seconds
    plan = covering.plan(decl, 3)
    covered = {tup for row in plan.rows for tup in covering.tuples_of(row, 3)}
    assert all(t in covered for t in plan.admitted)
    assert len(plan.rows) > len(covering.plan(decl, 2).rows)


def test_a_failing_row_shrinks_to_its_two_features():
    info = load_clauses()["COVER-PAIRS-01"]
    verdict = run_clause(info, MUTANTS["pairs_zero_scale_mask"](), None)
    assert verdict.startswith("failed: ")
    shrunk = verdict.split("still fail:\n  ")[1].splitlines()[0]
    names = [part.split(":")[0] for part in shrunk.split("; ")]
    assert "scale" in names and "mask form" in names and len(names) <= 3, shrunk


def test_docs_case_space_lists_every_value_class():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "case-space.md").read_text()
    missing = [f"{p.name}: {v.name}" for p in PARAMETERS for v in p.values if v.name not in text]
    assert not missing, f"docs/case-space.md does not list: {missing}"
