"""The escape mutants (tests/mutants_escapes.py) against the covering clauses.

``STATUS`` says what the covering array does to them: "escapes" while it counts the pairs they need
as reached without being able to show them (each mutant passes COVER-PAIRS-01 and
COVER-PAIRS-GRAD-02), "killed" once the coverage is counted only where it can show a bug (each fails
one of them).
"""

from __future__ import annotations

import pytest

from tests.clause_runner import load_clauses, run_clause
from tests.mutants_escapes import ESCAPES

STATUS = "killed"
COVERING = ("COVER-PAIRS-01", "COVER-PAIRS-GRAD-02")


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_mutant_against_the_covering_clauses(name):
    clauses = load_clauses()
    verdicts = {cid: run_clause(clauses[cid], ESCAPES[name](), None, shrink=False) for cid in COVERING}
    if STATUS == "escapes":
        assert all(v == "passed" for v in verdicts.values()), verdicts
    else:
        assert any(v.startswith("failed") for v in verdicts.values()), verdicts


def test_six_escape_shapes():
    assert len(ESCAPES) >= 6
