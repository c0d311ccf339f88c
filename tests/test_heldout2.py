"""The round-2 held-out mutants that existing clauses catch (``@caught_by`` in tests/mutants_heldout2.py)
are caught by the clause named, by its own check or the guarded call, until that clause's ``kills``
names them (then tests/test_clauses_bite.py checks them and these entries move there)."""

from __future__ import annotations

import pytest

from tests.clause_runner import dtypes_for, load_clauses, run_clause
from tests.mutants_heldout2 import CAUGHT_BY

CLAUSES = load_clauses()


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_caught_by_the_named_clause(name):
    kill, cls = CAUGHT_BY[name]
    clause_id, _, only = kill.partition("@")
    assert clause_id in CLAUSES, f"{name}: unknown clause {clause_id}"
    assert not any(k.partition("@")[0] == name for info in CLAUSES.values() for k in info.kills), (
        f"{name} is in a kill list now: decorate it @mutant and drop its @caught_by"
    )
    verdicts = {d: run_clause(CLAUSES[clause_id], cls(name), d) for d in dtypes_for(CLAUSES[clause_id], only or None)}
    assert any(v.startswith("failed") for v in verdicts.values()), f"{clause_id} did not catch {name}: " + "; ".join(
        f"{d}: {v[:200]}" for d, v in verdicts.items()
    )
