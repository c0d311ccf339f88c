"""The V = I probe (harness.calls.probes): exact, and using nothing of the kernel that the case does not.

For a kernel requiring Dk == Dv the probe widens Q and K; it must keep every score bit for bit without
passing a scale (a kernel without a scale argument refuses one), and fall back to blocks of Dk keys
where the widening would pass the declared head-dim limit.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import oracle
from conformance.contract import Declaration
from conformance.harness.calls.guarded import GuardedAdapter, declarations_ruling_out
from conformance.harness.calls.probes import observe_weights, probes
from conformance.harness.cases.build import random_case
from tests.mutants import BaseKernel

SHAPES = [(16, 40), (8, 5), (8, 33), (12, 30), (64, 100), (16, 16)]  # (Dk, S)


def _kernel(**decl) -> GuardedAdapter:
    kernel = BaseKernel("probe-kernel")
    kernel.declaration = kernel.declaration.replace(requires_dk_eq_dv=True, custom_scale=False, **decl)
    return GuardedAdapter(kernel, timeout=0)


@pytest.mark.parametrize("dk,S", SHAPES)
@pytest.mark.parametrize("limit", [None, 64])
def test_the_probe_needs_nothing_the_case_does_not(dk, S, limit):
    decl = Declaration(requires_dk_eq_dv=True, custom_scale=False, max_head_dim=limit)
    case = random_case(7, B=2, Hq=2, T=3, S=S, Dk=dk, dtype="float32", is_causal=True)
    plan = probes(case, decl)

    def switches(c) -> set[str]:  # the features a case needs (its head dims are the limit's, checked below)
        return {f.partition("=")[0] for f in declarations_ruling_out(c, decl)} - {"max_head_dim"}

    for p in plan:
        assert switches(p.case) <= switches(case), p.case.describe()
        assert not decl.not_supported_reasons(p.case), decl.not_supported_reasons(p.case)
    assert sum(p.keys for p in plan) == S and [p.first for p in plan] == sorted(p.first for p in plan)


@pytest.mark.parametrize("dk,S", SHAPES)
@pytest.mark.parametrize("limit", [None, 64])
def test_the_observed_weights_are_the_weights_bit_for_bit(dk, S, limit):
    """float64: the probe's scores are the case's exactly (powers of two), so the oracle's weights match."""
    impl = _kernel(max_head_dim=limit)
    case = random_case(8, B=2, Hq=2, T=3, S=S, Dk=dk, dtype="float64", is_causal=True, magnitude=2.0)
    got = observe_weights(impl, case)
    want = oracle.forward(case).weights
    assert np.array_equal(got, want) or np.max(np.abs(got - want)) <= 4 * np.finfo(np.float64).eps, np.max(
        np.abs(got - want)
    )


def test_blocks_when_the_widening_passes_the_head_dim_limit():
    decl = Declaration(requires_dk_eq_dv=True, custom_scale=False, max_head_dim=64)
    case = random_case(9, B=1, Hq=2, T=2, S=100, Dk=48, dtype="float32")  # Dk * 4 = 192 > 64
    plan = probes(case, decl)
    assert [(p.first, p.keys) for p in plan] == [(0, 48), (48, 48), (96, 4)]
    assert all(p.case.scale is None and p.case.Dv == 48 for p in plan)
    with_scale = probes(case, decl.replace(custom_scale=True))
    assert len(with_scale) == 1 and with_scale[0].case.scale == case.effective_scale
