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

_VERDICTS: dict[tuple[str, str, str | None], str] = {}  # (clause, kernel, dtype) -> verdict, per process


def _correct_kernels() -> dict:
    """The unmutated kernels the mutants are derived from; each must pass every clause, so that a
    mutant's failure is due to its bug alone. The dropout, gradient and batch-invariant bases
    declare more than ``base``, so the clauses that need those features run on a correct kernel too."""
    from tests.mutants_features import BatchInvariantKernel, DropoutKernel, GradKernel
    from tests.mutants_variants import VariantKernel

    def function():  # the torch reference with torch's SDPA signature, as a user's plain function is certified
        from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter
        from tests.trust_kernels import reference

        return FunctionAdapter(reference, name="base-function", declaration=FUNCTION_DEFAULTS)

    return {
        "base": MUTANTS["base"],
        "base-dropout": lambda: DropoutKernel("base-dropout"),
        "base-grad": lambda: GradKernel("base-grad"),
        "base-batch-invariant": lambda: BatchInvariantKernel("base-batch-invariant"),
        "base-variants": lambda: VariantKernel("base-variants"),  # windows, softcap, ALiBi, lse; bottom-right
        "base-function": function,  # every presentation, the GQA flag, M's gradient
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


@pytest.mark.parametrize("clause_id", sorted(CLAUSES))
def test_clause_kills_its_mutants(clause_id):
    """Each mutant the clause claims fails it in some dtype, and at least one of them by the clause's own
    check: a clause whose every kill comes from the guarded call only repeats the guard."""
    info = CLAUSES[clause_id]
    missed, own = [], False
    for kill in info.kills:
        name, _, only = kill.partition("@")
        assert name in MUTANTS, f"{clause_id} claims to kill unknown mutant {name!r}"
        verdicts = {d: verdict(clause_id, name, d) for d in dtypes_for(info, only or None)}
        if not any(v.startswith("failed") for v in verdicts.values()):
            missed.append(f"{name}: " + "; ".join(f"{d}: {v[:200]}" for d, v in verdicts.items()))
        own = own or any(v.startswith("failed:") for v in verdicts.values())  # "failed (guard):" does not count
    assert not missed, f"{clause_id} did not catch " + " | ".join(missed)
    assert own, f"{clause_id} kills {', '.join(info.kills)} only through the guarded call: it repeats the guard"


# The long-sequence and performance clauses (the thorough profile's own: a ci certification leaves
# them out) cost seconds per kernel (S >= 4096 in every dtype; a forward at S = 2048 in a fresh worker
# process), 45 s of the default run: their correct kernels run in the thorough tier, on ``base`` and
# ``base-variants`` (the other causal alignment). They call the forward only, so on the dropout,
# gradient and batch-invariant bases (``base`` plus features those clauses never use) the same code
# would run again.
_LONG = {c for c, info in CLAUSES.items() if info.func.__module__ in NOT_IN_CI}
_LONG_KERNELS = {"base", "base-variants"}
_FEATURE_BASES = ("base-batch-invariant", "base-dropout", "base-grad", "base-function")


def _admits(clause_id: str, kernel: str) -> bool:
    info = CLAUSES[clause_id]
    decl = CORRECT[kernel]().declaration
    return any(not info.not_applicable_reasons(decl, d) for d in dtypes_for(info))


def _correct_kernels_for(clause_id: str, *, rest: bool) -> list[str]:
    """The correct bases ``clause_id`` runs on: the default run's share, or (``rest``) the others.

    The default run takes ``base`` and ``base-variants`` (both causal alignments), every feature base
    the clause needs (it does not apply to ``base``), and one more feature base, dealt round robin over
    the clauses: the feature bases are ``base`` plus one declared feature each, so on a clause that
    never reads the feature they run ``base``'s code again. The rest is the thorough tier's."""
    if clause_id in _LONG:
        return [k for k in sorted(_LONG_KERNELS) if _admits(clause_id, k)] if rest else []
    admitting = [k for k in sorted(CORRECT) if _admits(clause_id, k)]
    share = [k for k in admitting if k in _LONG_KERNELS]
    features = [k for k in _FEATURE_BASES if k in admitting]
    if "base" in admitting and features:
        share.append(features[sorted(CLAUSES).index(clause_id) % len(features)])
    else:
        share += features
    return [k for k in admitting if (k in share) != rest]


def _run_correct(clause_id: str, kernels: list[str]) -> list[str]:
    """Assert no correct kernel fails; return the (kernel, dtype) runs that passed."""
    info = CLAUSES[clause_id]
    passed = []
    for kernel in kernels:
        for d in dtypes_for(info):
            v = verdict(clause_id, kernel, d)
            assert not v.startswith("failed"), f"{clause_id} [{d}] fails the correct kernel {kernel}: {v}"
            passed += [f"{kernel} [{d}]"] if v == "passed" else []
    return passed


def _passed_by_some(clause_id: str, kernels: list[str]) -> None:
    """A clause no correct kernel runs is not known to admit correct kernels at all, and a skip would
    otherwise count as success: some correct kernel passes it (not skips it) in some dtype."""
    if _run_correct(clause_id, kernels):
        return
    runs = {verdict(clause_id, k, d)[:120] for k in sorted(CORRECT) for d in dtypes_for(CLAUSES[clause_id])}
    assert any(v == "passed" for v in runs), f"no correct kernel passes {clause_id} (each skips it): {sorted(runs)}"


@pytest.mark.parametrize("clause_id", sorted(CLAUSES))
def test_correct_kernels_pass(clause_id):
    """The correct bases of the default run's share pass the clause, and one of them passes it."""
    share = _correct_kernels_for(clause_id, rest=False)
    if not share:
        pytest.skip(f"{clause_id} runs on the correct bases in the thorough tier (`pytest tests -m thorough`)")
    _passed_by_some(clause_id, share)


@pytest.mark.thorough
@pytest.mark.parametrize("clause_id", sorted(CLAUSES))
def test_correct_kernels_pass_rest(clause_id):
    rest = _correct_kernels_for(clause_id, rest=True)
    if _correct_kernels_for(clause_id, rest=False):
        _run_correct(clause_id, rest)
    else:
        _passed_by_some(clause_id, rest)


def test_the_default_share_runs_each_clause_on_both_alignments_and_its_features():
    for clause_id in CLAUSES:
        share = _correct_kernels_for(clause_id, rest=False)
        admitting = [k for k in CORRECT if _admits(clause_id, k) and (clause_id not in _LONG or k in _LONG_KERNELS)]
        assert set(share) | set(_correct_kernels_for(clause_id, rest=True)) == set(admitting), clause_id
        if clause_id in _LONG:
            assert not share, clause_id
            continue
        assert {k for k in _LONG_KERNELS if k in admitting} <= set(share), clause_id
        if "base" not in admitting:
            assert set(admitting) <= set(share), clause_id


def test_every_mutant_is_killed_by_some_clause():
    claimed = {k.partition("@")[0] for info in CLAUSES.values() for k in info.kills}
    unused = sorted(set(MUTANTS) - claimed - {"base"})
    assert not unused, f"mutants no clause claims to kill: {unused}"


def test_every_clause_has_a_source_and_a_kill():
    for cid, info in CLAUSES.items():
        assert info.kills, cid
        assert info.source.sentence and info.source.section, cid
