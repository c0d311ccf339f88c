"""The pair mutants (tests/mutants_pairs.py) are correct whenever either of their two features is absent,
and the covering array puts both features into some case of their kernel's own plan.

The first property is what makes each a *pair* fault: a clause that tests either feature alone cannot
see it. It is checked on the cases of the covering array itself (every row of the base kernel's plan,
about 70 cases of every value class: its forward and, for backward rows, its VJP): on every case with
exactly one of the two features the mutant must agree with the oracle under the error model. That
the covering clause then catches each one is tests/test_clauses_bite.py's check.
"""

from __future__ import annotations

import pytest

from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.covering import array as covering
from conformance.harness.covering.build import build_planned
from conformance.harness.judge import compare
from tests.mutants import MUTANTS
from tests.mutants_pairs import FEATURES


def _cases(impl: GuardedAdapter):
    plan = covering.plan(impl.declaration, 2)
    for i, row in enumerate(plan.rows):
        case, grad_out = build_planned(row, impl.declaration, plan.seeds[i], plan.picks[i])
        yield case, grad_out


# 12 s over the pair mutants: a property of the mutants themselves, which change only with this file's
# table; the thorough tier (.ci/run) checks it on every change.
@pytest.mark.thorough
@pytest.mark.parametrize("name", sorted(FEATURES))
def test_correct_with_only_one_of_its_features(name):
    impl = GuardedAdapter(MUTANTS[name](), spec=name, timeout=0)
    has_a, has_b, _ = FEATURES[name]
    one_only = both = 0
    for case, grad_out in _cases(impl):
        a = has_a(case)
        for d in ("forward", "backward"):
            if d == "backward" and grad_out is None:
                continue
            b = (d == "backward") if has_b is None else has_b(case)
            if a and b:
                both += 1
                continue
            if a or b:
                one_only += 1
                if d == "forward":
                    compare.assert_output_matches(impl, case)
                else:
                    compare.assert_vjp_matches(impl, case, grad_out)
    assert one_only >= 3, f"{name}: only {one_only} cases of the plan have exactly one of its features"
    assert both >= 1, f"{name}: no case of the plan has both of its features"


def test_every_pair_mutant_has_features_and_a_kill():
    from conformance.clauses.test_covering import GRAD_MUTANTS, PAIR_MUTANTS

    names = {n for n in MUTANTS if n.startswith("pairs_")}
    assert names == set(FEATURES), sorted(names ^ set(FEATURES))
    claimed = {n for n in PAIR_MUTANTS + GRAD_MUTANTS if n.startswith("pairs_")}
    assert names == claimed, sorted(names ^ claimed)
    assert len(names) >= 15
