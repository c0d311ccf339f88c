"""Every clause fails on each mutant it claims to kill, and passes on the correct base kernel.

The kill list in each clause's metadata is the input of this test, so the clause catalog cannot
claim evidence that does not exist: "a clause no mutant can fail is a defect".
"""

from __future__ import annotations

import pytest

from tests.clause_runner import dtypes_for, load_catalog, run_clause
from tests.mutants import MUTANTS

CATALOG = load_catalog()
PAIRS = [(cid, kill) for cid, info in sorted(CATALOG.items()) for kill in info.kills]


@pytest.mark.parametrize("clause_id,kill", PAIRS, ids=[f"{c}-{k}" for c, k in PAIRS])
def test_clause_kills_mutant(clause_id, kill):
    info = CATALOG[clause_id]
    name, _, only = kill.partition("@")
    assert name in MUTANTS, f"{clause_id} claims to kill unknown mutant {name!r}"
    verdicts = {d: run_clause(info, MUTANTS[name](), d) for d in dtypes_for(info, only or None)}
    killed = [d for d, v in verdicts.items() if v.startswith("failed")]
    assert killed, f"{clause_id} did not catch mutant {name}: " + "; ".join(f"{d}: {v[:200]}" for d, v in verdicts.items())


def _correct_kernels() -> dict:
    """The unmutated kernels the mutants are derived from; each must pass every clause, so that a
    mutant's failure is due to its bug alone. The dropout and gradient bases declare more features
    than ``base``, so the clauses that need those features run on a correct kernel too."""
    from tests.mutants_catalog_b import DropoutKernel, GradKernel

    return {"base": MUTANTS["base"], "base-dropout": lambda: DropoutKernel("base-dropout"),
            "base-grad": lambda: GradKernel("base-grad")}


CORRECT = _correct_kernels()


@pytest.mark.parametrize("kernel", sorted(CORRECT))
@pytest.mark.parametrize("clause_id", sorted(CATALOG))
def test_correct_kernels_pass(clause_id, kernel):
    info = CATALOG[clause_id]
    for d in dtypes_for(info):
        verdict = run_clause(info, CORRECT[kernel](), d)
        assert not verdict.startswith("failed"), f"{clause_id} [{d}] fails the correct kernel {kernel}: {verdict}"


def test_every_mutant_is_killed_by_some_clause():
    claimed = {k.partition("@")[0] for info in CATALOG.values() for k in info.kills}
    unused = sorted(set(MUTANTS) - claimed - {"base"})
    assert not unused, f"mutants no clause claims to kill: {unused}"


def test_every_clause_has_a_source_and_a_kill():
    for cid, info in CATALOG.items():
        assert info.kills, cid
        assert info.source.sentence and info.source.section, cid
