"""The held-out mutants (tests/mutants_heldout.py) are each caught, run alone against one clause.

The mutants the clauses of test_past_a_size.py and test_state_between_calls.py claim are checked
by test_clauses_bite.py like every other kill. The rest are caught by clauses of other modules
whose kill lists do not name them; this test keeps that evidence alive: each is run, on a fresh
kernel object, through the clause recorded next to it, in the dtype it shows in, and must fail
that clause by the clause's own check (not only through the guarded call). A clause change that
lets one of them through fails here, naming the bug class that escaped.
"""

from __future__ import annotations

import pytest

from tests.clause_runner import dtypes_for, load_clauses, run_clause
from tests.mutants import MUTANTS
from tests.mutants_heldout import HELDOUT

CLAUSES = load_clauses()


@pytest.mark.parametrize("name", sorted(HELDOUT))
def test_heldout_mutant_is_caught(name):
    factory, clause_id, dtype = HELDOUT[name]
    assert clause_id in CLAUSES, f"{name}: unknown clause {clause_id}"
    verdicts = {d: run_clause(CLAUSES[clause_id], factory(), d) for d in dtypes_for(CLAUSES[clause_id], dtype)}
    why = "; ".join(f"{d}: {v[:200]}" for d, v in verdicts.items())
    assert any(v.startswith("failed:") for v in verdicts.values()), f"{clause_id} no longer catches {name}: {why}"


def test_heldout_names_are_not_mutant_names():
    """A held-out mutant is either claimed by a clause (in MUTANTS) or recorded here, never both."""
    assert not set(HELDOUT) & set(MUTANTS)


def test_the_correct_base_passes_each_recorded_clause():
    """The clauses recorded as catching a held-out mutant pass the unmutated base in the same dtype,
    so that each catch is due to the mutant's bug."""
    from tests.mutants_features import GradKernel

    for clause_id, dtype in sorted({(cid, d) for _, cid, d in HELDOUT.values()}, key=str):
        for d in dtypes_for(CLAUSES[clause_id], dtype):
            v = run_clause(CLAUSES[clause_id], GradKernel("base-grad"), d)
            assert not v.startswith("failed"), f"{clause_id} [{d}] fails the correct base: {v[:300]}"
