"""The generated mutants (tests/generated_mutants.py) are what scripts/mutant_kill_rates.py counts them as.

A kill rate means something only if each mutant is the correct kernel wherever its trigger is false
(else a "kill" may come from a bug everywhere), if every perturbation changes the answer on some case
its classes allow (else a "survivor" is a no-op), and if the sample is a pure function of its seed.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.harness.covering import admission
from conformance.harness.covering import array as covering
from conformance.harness.covering.build import build_planned
from tests.generated_mutants import AGAIN, PERTURBATIONS, Generated, Spec, sample
from tests.mutants_features import DropoutKernel

DECL = DropoutKernel().declaration


def _values() -> dict[str, list[str]]:
    plan = covering.plan(DECL, 2)
    out: dict[str, set[str]] = {}
    for tup in plan.admitted:
        for p, v in tup:
            out.setdefault(p, set()).add(v)
    return {p: sorted(v) for p, v in out.items()}


def _call(kernel, case, grad_out, direction):
    if direction == "forward":
        return [np.asarray(kernel.forward(case), dtype=np.float64)]
    return [np.asarray(g, dtype=np.float64) for g in kernel.vjp(case, grad_out)]


@pytest.mark.parametrize("pert", PERTURBATIONS, ids=[p.name for p in PERTURBATIONS])
def test_every_perturbation_changes_the_answer_where_its_classes_allow(pert):
    defaults = covering.defaults_for(DECL)
    needs = [{}] if not pert.needs else [dict(alt) for alt in pert.needs]
    for need in needs:
        if pert.direction == "backward":
            need = {**need, "direction": "backward"}
        row = admission.complete(DECL, need, 2, defaults)[0]
        if row is None:
            continue
        case, grad_out = build_planned(row, DECL, 11)
        mutant = Generated(Spec((), pert.name))  # no predicate: always wrong
        right = _call(DropoutKernel(), case, grad_out, pert.direction)
        wrong = _call(mutant, case, grad_out, pert.direction)
        if any(not np.allclose(a, b, equal_nan=True, rtol=1e-3, atol=1e-6) for a, b in zip(wrong, right)):
            return
    pytest.fail(f"{pert.name}: no row holding one of its classes {pert.needs} shows it")


def test_a_mutant_is_the_correct_kernel_where_its_trigger_is_false():
    plan = covering.plan(DECL, 2)
    specs = sample(6, 2, 5, _values(), lambda row: True)
    checked = 0
    for spec in specs:
        if AGAIN in spec.trigger:
            continue
        mutant = Generated(spec)
        direction = next(p.direction for p in PERTURBATIONS if p.name == spec.perturbation)
        for i, row in enumerate(plan.rows[:25]):
            if direction == "backward" and row["direction"] != "backward":
                continue
            if all(row.get(p) == v for p, v in spec.trigger):
                continue  # the planned classes may hold it: only cases clearly outside the trigger
            case, grad_out = build_planned(row, DECL, plan.seeds[i], plan.picks[i])
            if mutant._fires(case, direction):
                continue
            for a, b in zip(
                _call(mutant, case, grad_out, direction), _call(DropoutKernel(), case, grad_out, direction)
            ):
                assert np.array_equal(a, b, equal_nan=True), (spec.name, i)
            checked += 1
    assert checked >= 10


def test_the_sample_is_seeded_and_has_its_arity():
    values = _values()
    first = sample(20, 2, 3, values, lambda row: True)
    assert first == sample(20, 2, 3, values, lambda row: True)
    assert first != sample(20, 2, 4, values, lambda row: True)
    assert len(first) == 20 and all(s.arity == 2 for s in first)
    assert all(len({p for p, _ in s.trigger}) == s.arity for s in first)
    for s in first:  # a backward bug's trigger holds the backward; a bug that needs a class holds one
        pert = next(p for p in PERTURBATIONS if p.name == s.perturbation)
        assert pert.direction == "forward" or ("direction", "backward") in s.trigger
        assert not pert.needs or any(all(item in s.trigger for item in alt.items()) for alt in pert.needs)


# Mutants no input can tell from the correct kernel (docs/mutants.md): the sample leaves them out.
EQUIVALENT = (
    Spec((("scale", "zero"),), "scale off by 10 %"),
    Spec((("S", "1"),), "scale off by 10 %"),
    Spec((("S", "1"),), "query heads mixed"),
    Spec((("scale", "zero"), ("direction", "backward")), "dK doubled"),
)


@pytest.mark.parametrize("spec", EQUIVALENT, ids=[s.name for s in EQUIVALENT])
def test_equivalent_mutants_are_named(spec):
    from tests.generated_mutants import inert_reason

    assert inert_reason(spec, DECL, covering.defaults_for(DECL)).startswith("equivalent: ")


def test_the_sample_leaves_equivalent_mutants_out():
    """Drawn without the filter, a sample of arity-2 mutants holds equivalent ones; with it, none, and
    just as many mutants."""
    from tests.generated_mutants import inert_reason

    defaults, values = covering.defaults_for(DECL), _values()

    def why(spec: Spec) -> str:
        return inert_reason(spec, DECL, defaults)

    unfiltered = sample(150, 2, 27, values, lambda row: True)
    filtered = sample(150, 2, 27, values, lambda row: True, why)
    assert any(why(s) for s in unfiltered) and not any(why(s) for s in filtered) and len(filtered) == 150
