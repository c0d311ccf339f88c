"""The covering-array generator, the value-class table and pair coverage (counted where observable).

What must hold for "every admitted pair observable" to mean something: every admitted tuple is shown
by the case built for some row (no third value hides it there, judged on the case itself); every row
is a case the declaration takes; admitted and excluded tuples partition the tuples of admitted values,
each exclusion with a reason; the plan is a pure function of the declaration; every planned class is
really in the case built for it; the hiding rules foresee what the cases hide; the classes reach across
their ranges; a "called again" row has a twin of its shapes whose other values differ; a failing row is
shrunk to its features; and the count fails on the plan made before coverage was counted this way.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from conformance.contract import Declaration
from conformance.harness.covering import array as covering
from conformance.harness.covering import hiding, tuples
from conformance.harness.covering.admission import row_reasons
from conformance.harness.covering.build import build_planned, build_twin
from conformance.harness.covering.ranges import taken
from conformance.harness.covering.table import NON_SHAPE_PARAMETERS, PARAMETERS, SOME_KEYS, Call, reached_values
from conformance.harness.records import coverage_tables
from tests.clause_runner import load_clauses, run_clause
from tests.mutants import MUTANTS, BaseKernel
from tests.mutants_features import DropoutKernel

DECLS = {
    "base": BaseKernel().declaration,
    "dropout": DropoutKernel().declaration,
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
ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _plan_records(which: str) -> list[dict]:
    decl = DECLS[which]
    return _records(decl, covering.plan(decl, 2))


def _records(decl, plan):
    """What the covering clauses record for every row of ``plan`` (as pair_coverage.record does)."""
    out = []
    for i, row in enumerate(plan.rows):
        case, _ = build_planned(row, decl, plan.seeds[i], plan.picks[i])
        for how, classes in tuples.records_of(row):
            got = reached_values(case, how, classes)
            hidden = hiding.in_case(case, how, decl, got)
            out.append(
                {
                    "values": got,
                    "hidden": [[p, v, [sorted(map(list, h)) for h in hs]] for (p, v), hs in hidden.items()],
                    "took": taken(case, got),
                }
            )
    return out


@pytest.mark.parametrize("which", sorted(DECLS))
def test_rows_show_every_admitted_pair_and_are_admitted(which):
    decl = DECLS[which]
    plan = covering.plan(decl, 2)
    table = coverage_tables.pairs_table(_plan_records(which), decl, (2,))["2"]
    assert table["observable"] == table["admitted"] == len(plan.admitted), (
        list(table["not_observable"].items())[:5],
        table["not_reached"][:5],
    )
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
    assert 40 <= len(plan.rows) <= 130, len(plan.rows)


def test_plan_is_deterministic_and_cached_as_built():
    decl = DECLS["no GQA, no float mask, no custom scale, fp32/fp16"]
    first = covering.build_plan(decl, 2)
    again = covering.build_plan(decl, 2)
    assert first.rows == again.rows and first.admitted == again.admitted and first.excluded == again.excluded
    assert first.picks == again.picks and first.seeds == again.seeds
    cached = covering.plan(decl, 2)
    assert cached.rows == first.rows and cached.seeds == first.seeds and cached.excluded == first.excluded


def test_declaration_rules_values_out_with_its_own_reasons():
    plan = covering.plan(DECLS["no GQA, no float mask, no custom scale, fp32/fp16"], 2)
    assert "declares no GQA support" in plan.excluded_values[("heads", "8:1")]
    assert "declares no custom scale support" in plan.excluded_values[("scale", "zero")]
    assert "declares dtypes" in plan.excluded_values[("dtype", "float64")]
    assert "grad=False" in plan.excluded_values[("direction", "backward")]
    assert "dropout" in plan.excluded_values[("dropout", "on")]
    assert plan.defaults["dtype"] == "float32"
    jax_like = covering.plan(DECLS["jax-like"], 2)
    assert "Dk == Dv" in jax_like.excluded_values[("Dv", "> Dk")]
    assert ("Dk", "256") in jax_like.excluded_values  # max_head_dim=128
    mixed = (("mask form", "[B,H,T,S]"), ("additive M", "-inf on whole rows"))
    assert "no fill this declaration defines" in jax_like.excluded[mixed]
    dropout = covering.plan(DECLS["dropout"], 2)
    assert ("dropout", "on") not in dropout.excluded_values
    assert any(r["dropout"] == "on" and r["direction"] == "backward" for r in dropout.rows)


@pytest.mark.parametrize("which", sorted(DECLS))
def test_every_planned_class_holds_in_its_case_and_twins_share_shapes(which):
    decl = DECLS[which]
    plan = covering.plan(decl, 2)
    for i, row in enumerate(plan.rows):
        case, grad_out = build_planned(row, decl, plan.seeds[i], plan.picks[i])
        assert (grad_out is not None) == (row["direction"] == "backward")
        got = reached_values(case, Call(row["direction"], row["call"]), row)
        assert got == row, {k: (v, got.get(k)) for k, v in row.items() if got.get(k) != v}
        if row["call"] == "again":
            twin, _ = build_twin(row, decl, plan.seeds[i], plan.picks[i])
            assert [x.shape for x in (twin.query, twin.key, twin.value)] == [
                x.shape for x in (case.query, case.key, case.value)
            ]
            assert twin.dtype == case.dtype
            other = reached_values(twin, Call(row["direction"]))
            assert any(other.get(p) != row[p] for p in NON_SHAPE_PARAMETERS), (row, other)


@pytest.mark.parametrize("which", ["base", "dropout", "bottom-right, nan"])
def test_the_rules_foresee_what_the_cases_hide(which):
    """The generator steers by the rules (hiding.predicted); the cases decide (in_case). A case that
    hides a value the rules did not foresee is rebuilt with other draws; none is left in the plan."""
    decl = DECLS[which]
    plan = covering.plan(decl, 2)
    surprises = []
    for i, row in enumerate(plan.rows):
        case, _ = build_planned(row, decl, plan.seeds[i], plan.picks[i])
        for how, classes in tuples.records_of(row):
            seen = set(hiding.in_case(case, how, decl, classes))
            foreseen = set(hiding.predicted(classes, decl, how.direction))
            if seen - foreseen:
                surprises.append((i, how.direction, sorted(seen - foreseen)))
    assert len(surprises) <= len(plan.rows) // 20, surprises[:5]


def test_s_equal_one_hides_the_head_dim_in_the_backward():
    decl = DECLS["base"]
    row = {**covering.defaults_for(decl), "S": "1", "T": "> S", "Dk": "256", "direction": "backward"}
    case, _ = build_planned(row, decl, 5)
    hidden = hiding.in_case(case, Call("backward"), decl, reached_values(case, Call("backward"), row))
    assert not hiding.observable((("Dk", "256"), ("direction", "backward")), hidden)
    assert hiding.observable((("S", "1"), ("Dk", "256")), hidden)  # the hider's own pair shows
    plain = {**row, "S": "< 16", "T": "< S"}
    case, _ = build_planned(plain, decl, 5)
    hidden = hiding.in_case(case, Call("backward"), decl, reached_values(case, Call("backward"), plain))
    assert hiding.observable((("Dk", "256"), ("direction", "backward")), hidden)


def test_the_count_fails_on_the_plan_made_before_it():
    """The numpy plan of the suite before this count (tests/data, as committed then): every pair it
    reached was credited, and "Dk: 256 x backward" was reached only in a row with S = 1."""
    old = json.loads((ROOT / "tests" / "data" / "plan_before_observability_numpy.json").read_text())
    from implementations.numpy_kernel import NumpyAdapter

    decl = NumpyAdapter().declaration
    rename = {"random": SOME_KEYS}
    defaults = {k: rename.get(v, v) for k, v in old["defaults"].items()}
    rows = [{**defaults, **{k: rename.get(v, v) for k, v in r.items()}, "call": "first"} for r in old["rows"]]
    recs = []
    for i, row in enumerate(rows):
        case, _ = build_planned(row, decl, 7300 + i)
        for how, classes in tuples.records_of(row):
            got = reached_values(case, how, classes)
            hidden = hiding.in_case(case, how, decl, got)
            flat = [[p, v, [sorted(map(list, h)) for h in hs]] for (p, v), hs in hidden.items()]
            recs.append({"values": got, "hidden": flat})
    reached = {n for r in recs for n in tuples.reached(r["values"], 2)}
    shown = {n for r in recs for n in tuples.observable_in(r["values"], coverage_tables.hidden_of(r), 2)}
    hidden_pairs = reached - shown
    assert "Dk: 256 × direction: backward" in hidden_pairs, sorted(hidden_pairs)[:10]
    assert len(hidden_pairs) >= 10


def test_classes_reach_across_their_ranges():
    decl = DECLS["base"]
    took = coverage_tables.pairs_table(_plan_records("base"), decl, (2,))["2"]["values_taken"]
    m = took["additive M: finite large negative on whole rows"]
    assert "-1e+04" in m and f"{-np.finfo(np.float64).max:.3g}" in m, m
    assert {"0.1", "2"} <= set(took["scale: custom"]), took["scale: custom"]
    assert max(int(s) for s in took["S: long"]) > 1024, took["S: long"]
    assert len(took["heads: 2:1"]) >= 2 and len(took["heads: 8:1"]) >= 2
    patterns = set(took[f"mask content: {SOME_KEYS}"])
    assert {"a run at the start", "a run in the middle", "a run at the end", "scattered"} <= patterns


def test_triples_cover_every_admitted_triple():
    # a small table (one dtype, no masks, head dims up to 8): t = 3 planning grows with the triples
    decl = Declaration(
        gqa=False,
        bool_mask=False,
        float_mask=False,
        causal=False,
        custom_scale=False,
        dtypes=frozenset({"float32"}),
        max_head_dim=8,
        requires_dk_eq_dv=True,
    )
    plan = covering.plan(decl, 3)
    shown = set()
    for i, row in enumerate(plan.rows):
        case, _ = build_planned(row, decl, plan.seeds[i], plan.picks[i], 3)
        shown |= tuples.observable_tuples(
            tuples.records_of(row), 3, lambda how, c, case=case: hiding.in_case(case, how, decl, c)
        )
    assert all(t in shown for t in plan.admitted)
    assert len(plan.rows) > len(covering.plan(decl, 2).rows)


def test_a_failing_row_shrinks_to_its_two_features():
    info = load_clauses()["COVER-PAIRS-01"]
    verdict = run_clause(info, MUTANTS["pairs_zero_scale_mask"](), None)
    assert verdict.startswith("failed: ")
    shrunk = verdict.split("still fail:\n  ")[1].splitlines()[0]
    names = [part.split(":")[0] for part in shrunk.split("; ") if not part.startswith("call")]
    assert "scale" in names and "mask form" in names and len(names) <= 3, shrunk


def test_docs_case_space_lists_every_value_class_and_hiding_rule():
    text = (ROOT / "docs" / "case-space.md").read_text()
    missing = [f"{p.name}: {v.name}" for p in PARAMETERS for v in p.values if v.name not in text]
    assert not missing, f"docs/case-space.md does not list: {missing}"
    rules = [r.hider for r in hiding.RULES if r.hider not in text]
    assert not rules, f"docs/case-space.md does not name the hiding rules of: {rules}"


class _RaisesOnOneDMask(BaseKernel):
    """torch 2.13's CPU SDPA on a 1-D boolean mask [S]: an IndexError, whatever else the row holds."""

    def forward(self, case):
        if case.mask is not None and np.ndim(case.mask) == 1:
            raise IndexError("Dimension out of range")
        return super().forward(case)


def test_a_row_the_kernel_raises_on_does_not_hide_its_other_pairs():
    """The rows holding a 1-D mask raise, and took every other pair they held with them (Dk = 128 x a
    zero scale, ...). The clause runs each such pair again in a row of its own: every pair is observable
    but those of the 1-D mask itself, which the kernel fails alone and which are named blocked by it."""
    from conformance.clauses import test_covering as tc
    from conformance.harness.calls.guarded import GuardedAdapter
    from conformance.harness.run import pair_coverage
    from conformance.harness.spec.report import ClauseViolation

    impl = GuardedAdapter(_RaisesOnOneDMask(), spec="raises-on-1d-mask", timeout=0)
    with pytest.raises(ClauseViolation, match="IndexError"):
        tc._check_rows(impl, "forward")
    recs = getattr(impl, pair_coverage.ATTR)
    table = coverage_tables.pairs_table(recs, impl.declaration, (2,))["2"]
    forward = [a for a in covering.plan(impl.declaration, 2).admitted if ("direction", "backward") not in a]
    names = {tuples.name(a) for a in forward}
    blocked = table["blocked"]
    assert blocked and set(blocked.values()) == {"mask form: [S]"}, blocked
    assert all("mask form: [S]" in a for a in blocked)
    missing = [a for a in names if a in table["not_reached"] or a in table["not_observable"]]
    assert missing == [], missing[:8]  # every forward pair not of the 1-D mask itself is observable
    without = [r for r in recs if "blocked" not in r]
    lost = names - {n for r in without[: len(tc._rows(impl, "forward"))] for n in tuples.reached(r["values"], 2)}
    assert len(lost - set(blocked)) > 0  # the planned rows alone left pairs unreached: the repair rows reached them


def test_switch_scalar_and_memory_classes_hold_on_their_cases():
    """A kernel presenting everything: each class of the switches, scalar types and per-argument memory that a
    row plans is the class its built case is in (the kinds a row names are contract.CONTEXT_KINDS; a "+" joins
    two switches), and the forms they build keep the numbers (the oracle's answer is the plain case's)."""
    from conformance import oracle
    from conformance.contract import CONTEXT_KINDS, PRESENTATION_ATTRIBUTES
    from conformance.harness.covering.table import SWITCHES

    assert {k for k in SWITCHES.values() if k} <= set(CONTEXT_KINDS)
    decl = Declaration(gqa=True, grad=True, presents=frozenset(PRESENTATION_ATTRIBUTES))
    plan = covering.plan(decl, 2)
    names = ("switch", "second switch", "scalar types", "query memory", "key memory", "value memory", "mask memory")
    seen = {n: set() for n in names}
    for i, row in enumerate(plan.rows):
        case, _ = build_planned(row, decl, plan.seeds[i], plan.picks[i])
        got = reached_values(case, Call(row["direction"], row["call"]), row)
        for n in names:
            assert got[n] == row[n], (i, n, row[n], got[n])
            seen[n].add(row[n])
        if row["key memory"] != "as the layout says" or row["mask memory"] != "as its form says":
            plain = case.replace(
                key=np.ascontiguousarray(case.key),
                mask=None if case.mask is None else np.ascontiguousarray(case.mask),
            )
            np.testing.assert_array_equal(oracle.forward(case).out, oracle.forward(plain).out)
    table = {p.name: {v.name for v in p.values} for p in PARAMETERS}
    assert all(seen[n] == table[n] for n in names), {n: table[n] - seen[n] for n in names}
