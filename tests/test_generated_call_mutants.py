"""The generated torch-signature mutants (tests/generated_call_mutants.py) are what their names say: a sample
is seeded and distinct, every precondition of 000 §8 has its arity-1 mutant, and a mutant is the reference
itself on a call its trigger does not hold on (so a kill is its bug's, not another's)."""

from __future__ import annotations

import pytest

from conformance.contract import PRECONDITIONS

torch = pytest.importorskip("torch")

from tests.generated_call_mutants import PREDICATES, Call, function, sample
from tests.trust_kernels import reference


def test_samples_are_seeded_distinct_and_hold_every_precondition():
    one, again = sample(60, 1, 27), sample(60, 1, 27)
    assert one == again and len(set(one)) == len(one) == 60
    assert {s.accepts for s in one if s.accepts} == set(PRECONDITIONS)
    two = sample(40, 2, 28)
    assert all(s.arity == 2 for s in two) and len(set(two)) == 40


def test_a_mutant_is_the_reference_where_its_trigger_does_not_hold():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=gen) for _ in range(3))
    plain = Call(q, k, v, None, 0.0, False, None, False)
    checked = 0
    with torch.no_grad():
        want = reference(q, k, v)
        for spec in sample(80, 2, 29):
            if all(PREDICATES[p](plain) for p in spec.trigger):
                continue
            got = function(spec)(q, k, v)
            assert torch.equal(got, want), spec.name
            checked += 1
    assert checked >= 40
