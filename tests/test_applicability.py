"""A clause is not applicable only for what it tests: its ``requires=`` fields (tests/applicability.py).

Every clause (but the performance and long-sequence ones, which call the plain forward only and run
outside the ci profile) is run in float32 (a dtype decides applicability through ``dtypes`` alone,
which ``ClauseInfo.not_applicable_reasons`` checks before any case) on a correct kernel declaring what
the clause requires, requiring Dk == Dv (with any head dims where that rules the clause out, which is
then named unless the clause requires ``requires_dk_eq_dv``); then once more for each capability its
cases used, switched off. A clause that becomes not applicable for a field it does not test fails,
named with the field. The ci profile leaves the clauses that draw their cases from the declared space
(hypothesis, covering arrays: built within the declaration) and the ci long-sequence clause to
``--conformance-profile=thorough``, which also switches the fields under both bases.

The check bites: with the V = I probe of before, which passed 1/sqrt(Dk) as an explicit scale to a
kernel requiring Dk == Dv, the dropout clauses and CAUSAL-DECODE-03 are named.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.harness.calls import probes
from conformance.harness.run import runstate
from tests import applicability
from tests.clause_runner import NOT_IN_CI, dtypes_for, load_clauses

CLAUSES = load_clauses()
CHECKED = sorted(c for c, info in CLAUSES.items() if info.func.__module__ not in NOT_IN_CI)
# Clauses whose cases are drawn from the declared space (hypothesis, covering arrays: the space's
# ``Structure.admitted`` and the covering rows bring every case within the declaration by construction),
# and the ci long-sequence clause: the most expensive runs, checked in the thorough profile only.
THOROUGH_ONLY = frozenset(
    [c for c, info in CLAUSES.items() if getattr(info.func, "is_hypothesis_test", False)]
    + ["COVER-PAIRS-01", "COVER-PAIRS-GRAD-02", "LONG-SEQ-CI-03"]
)


def _kernels() -> dict:
    """The correct kernels of tests/test_clauses_bite.py, the widest declarations first."""
    from tests.test_clauses_bite import CORRECT

    order = ("base-dropout", "base-variants", "base-batch-invariant", "base-grad", "base")
    return {name: CORRECT[name] for name in order}


def _thorough(request: pytest.FixtureRequest) -> bool:
    return runstate.getoption(request.config, runstate.OPT_PROFILE) == "thorough"


@pytest.mark.parametrize("clause_id", CHECKED)
def test_a_clause_is_not_applicable_only_for_what_it_tests(clause_id, request):
    info = CLAUSES[clause_id]
    thorough = _thorough(request)
    if clause_id in THOROUGH_ONLY and not thorough:
        pytest.skip(f"not in profile: {clause_id} draws its cases within the declaration; checked with thorough")
    every = dtypes_for(info)
    dtype = None if None in every else "float32" if "float32" in every else every[0]
    found = applicability.silenced(info, _kernels(), dtype, every_base=thorough)
    assert not found, "\n".join(found)


def _explicit_scale_probe(case, decl=None):
    """The probe as it was: Q and K zero-padded to V's width and 1/sqrt(Dk) passed as a scale."""
    (only,) = [p for p in _PROBES(case, None)]
    if decl is None or not decl.requires_dk_eq_dv or case.Dk >= only.case.Dv:
        return _PROBES(case, decl)
    pad = [(0, 0)] * 3 + [(0, only.case.Dv - case.Dk)]
    widened = only.case.replace(query=np.pad(case.query, pad), key=np.pad(case.key, pad), scale=case.effective_scale)
    return [probes.Probe(widened, 0, case.S)]


_PROBES = probes.probes


@pytest.mark.parametrize("clause_id", ["DROPOUT-INDEPENDENT-06", "CAUSAL-DECODE-03"])
def test_the_check_names_a_clause_silenced_by_an_explicit_scale(clause_id, monkeypatch):
    info = CLAUSES[clause_id]
    monkeypatch.setattr(probes, "probes", _explicit_scale_probe)
    found = applicability.silenced(info, _kernels(), "float32")
    assert any(s.startswith(f"{clause_id} [float32] becomes not applicable with custom_scale=False") for s in found), (
        found
    )
