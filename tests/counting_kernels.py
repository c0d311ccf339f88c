"""A wrong kernel that counts its calls, for tests/test_expectations.py (an expected failure runs
without hypothesis' shrink phase: fewer calls than the same failure shrunk)."""

from __future__ import annotations

from tests.mutants import MaskAfterSoftmax

CALLS = {"forward": 0}


class CountingMaskAfterSoftmax(MaskAfterSoftmax):
    def forward(self, case):
        CALLS["forward"] += 1
        return super().forward(case)
