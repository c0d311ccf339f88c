"""Every clause fails on each mutant it claims to kill, and passes on the correct base kernels.

The kill list in each clause's metadata is the input of this test, so the clause catalog cannot
claim evidence that does not exist: "a clause no mutant can fail is a defect". Two stronger
properties are checked too, because a claimed kill can be hollow:

* a clause must kill at least one mutant *by its own check*, not only through the guarded call
  (``GuardedAdapter`` fails a wrong shape or dtype, an exception, a touched input whichever clause runs): a
  clause whose every kill comes from the guard only repeats the guard;
* a clause must be *passed* (not skipped) by at least one correct kernel in at least one dtype: a
  clause that no correct kernel ever runs is not known to admit correct kernels at all, and a skip
  would otherwise count as success in :func:`test_correct_kernels_pass`.
"""

from __future__ import annotations

import pytest

from tests.clause_runner import NOT_IN_CI, dtypes_for, load_clauses, run_clause
from tests.mutants import MUTANTS

CLAUSES = load_clauses()
PAIRS = [(cid, kill) for cid, info in sorted(CLAUSES.items()) for kill in info.kills]

_VERDICTS: dict[tuple[str, str, str | None], str] = {}  # (clause, kernel, dtype) -> verdict, per process


def _correct_kernels() -> dict:
    """The unmutated kernels the mutants are derived from; each must pass every clause, so that a
    mutant's failure is due to its bug alone. The dropout, gradient and batch-invariant bases
    declare more than ``base``, so the clauses that need those features run on a correct kernel too."""
    from tests.mutants_features import BatchInvariantKernel, DropoutKernel, GradKernel
    from tests.mutants_variants import VariantKernel

    return {
        "base": MUTANTS["base"],
        "base-dropout": lambda: DropoutKernel("base-dropout"),
        "base-grad": lambda: GradKernel("base-grad"),
        "base-batch-invariant": lambda: BatchInvariantKernel("base-batch-invariant"),
        "base-variants": lambda: VariantKernel("base-variants"),  # windows, softcap, ALiBi, lse; bottom-right
    }


CORRECT = _correct_kernels()


def verdict(clause_id: str, kernel: str, dtype: str | None) -> str:
    """run_clause on a mutant or correct kernel, once per process; a mutant's failure is not shrunk."""
    key = (clause_id, kernel, dtype)
    if key not in _VERDICTS:
        correct = kernel in CORRECT
        factory = CORRECT[kernel] if correct else MUTANTS[kernel]
        _VERDICTS[key] = run_clause(CLAUSES[clause_id], factory(), dtype, shrink=correct)
    return _VERDICTS[key]


@pytest.mark.parametrize("clause_id,kill", PAIRS, ids=[f"{c}-{k}" for c, k in PAIRS])
def test_clause_kills_mutant(clause_id, kill):
    info = CLAUSES[clause_id]
    name, _, only = kill.partition("@")
    assert name in MUTANTS, f"{clause_id} claims to kill unknown mutant {name!r}"
    verdicts = {d: verdict(clause_id, name, d) for d in dtypes_for(info, only or None)}
    killed = [d for d, v in verdicts.items() if v.startswith("failed")]
    assert killed, f"{clause_id} did not catch mutant {name}: " + "; ".join(
        f"{d}: {v[:200]}" for d, v in verdicts.items()
    )


# The long-sequence and performance clauses cost seconds per kernel (S >= 4096 in every dtype; a forward
# at S = 2048 in a fresh worker process). They call the forward only, so on the dropout, gradient and
# batch-invariant bases (``base`` plus features those clauses never use) the same code runs again;
# ``base`` and ``base-variants`` (the other causal alignment) keep the no-false-alarm check.
_LONG = {c for c, info in CLAUSES.items() if info.func.__module__ in NOT_IN_CI}
_LONG_KERNELS = {"base", "base-variants"}
PASS_PAIRS = [(c, k) for c in sorted(CLAUSES) for k in sorted(CORRECT) if c not in _LONG or k in _LONG_KERNELS]


@pytest.mark.parametrize("clause_id,kernel", PASS_PAIRS, ids=[f"{c}-{k}" for c, k in PASS_PAIRS])
def test_correct_kernels_pass(clause_id, kernel):
    info = CLAUSES[clause_id]
    for d in dtypes_for(info):
        v = verdict(clause_id, kernel, d)
        assert not v.startswith("failed"), f"{clause_id} [{d}] fails the correct kernel {kernel}: {v}"


def test_every_clause_is_passed_by_a_correct_kernel():
    """A skip is not a pass: each clause runs, and passes, on some correct kernel in some dtype."""
    never = []
    for cid in sorted(CLAUSES):
        runs = [(k, d) for k in sorted(CORRECT) for d in dtypes_for(CLAUSES[cid])]
        if not any(verdict(cid, k, d) == "passed" for k, d in runs):  # any() stops at the first pass
            never.append(f"{cid}: " + "; ".join(sorted({verdict(cid, k, d)[:120] for k, d in runs})))
    assert not never, "clauses no correct kernel passes (each correct kernel skips them):\n  " + "\n  ".join(never)


def test_every_clause_kills_a_mutant_by_its_own_check():
    """Some claimed kill of each clause fails in the clause's own check, not only in the guard."""
    hollow = []
    for cid, info in sorted(CLAUSES.items()):
        runs = [(k.partition("@")[0], d) for k in info.kills for d in dtypes_for(info, k.partition("@")[2] or None)]
        own = any(verdict(cid, m, d).startswith("failed:") for m, d in runs)  # "failed (guard):" does not count
        if not own:
            hollow.append(f"{cid} (kills {', '.join(info.kills)} only through the guarded call)")
    assert not hollow, "clauses that only repeat the guard:\n  " + "\n  ".join(hollow)


def test_every_mutant_is_killed_by_some_clause():
    claimed = {k.partition("@")[0] for info in CLAUSES.values() for k in info.kills}
    unused = sorted(set(MUTANTS) - claimed - {"base"})
    assert not unused, f"mutants no clause claims to kill: {unused}"


def test_every_clause_has_a_source_and_a_kill():
    for cid, info in CLAUSES.items():
        assert info.kills, cid
        assert info.source.sentence and info.source.section, cid
