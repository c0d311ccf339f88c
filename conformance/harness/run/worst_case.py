"""After a clause test fails: its other failing cases, and the worst of them.

A clause stops at its first failing case, and hypothesis shrinks that one to a minimal example: the
right thing for a reproducer and the wrong thing for a diagnosis. A kernel that is off by rounding on
most cases and returns 1e30 on one class of them shows the 1e30 nowhere if the rounding case comes
first. So when a clause test fails with a clause's own violation (not the guard's: a kernel that raised,
refused or hung has no error to rank) that no expectations file lists, on a call without dropout (whose
answer is random), the clause runs again with the kernel's answer to each
failing call replaced by the oracle's (:class:`OracleFor`: the clause then gets past that case and
meets its next failing one), up to :data:`MAX_RUNS` times, hypothesis' shrink phase off (the examples
it generates are the same; deterministic clauses go on through their cases). Every failing case's
record (``harness.causes.record``) is kept, and the worst (``harness.causes.gross.severity``: error
over allowance, NaN and inf as infinite) becomes the clause test's record for likely causes, with the
conventions the other failing cases matched (a fill that is the mean of V in one case and NaN in
another is no convention); when it is not the first, a note on the failure names it. The coverage
counters stay those of the first run.

A passing clause test costs nothing; a failing one up to :data:`MAX_RUNS` more runs of its clause.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import pytest

from conformance.contract import np_dtype
from conformance.harness.calls.guarded import UndeclaredRefusal
from conformance.harness.causes import gross
from conformance.harness.causes.record import failing_call, failure_record
from conformance.harness.judge import compare
from conformance.harness.spec.report import AdapterError, ClauseViolation

# Set to "0" to skip the search (the suite's self-tests do, where a mutant's first failing case is all
# they check; a user's run keeps it).
ENV = "SDPA_CONFORMANCE_WORST_CASE"
MAX_RUNS = 6  # further runs of a failing clause test, each past one more failing case
_COUNTERS = ("cases_run", "examples_run", "cells", "case_features", "rejected", "refused")


class OracleFor:
    """``adapter`` with the oracle's answer (in the declared conventions, the case's dtype) for the
    calls whose case key is in ``keys``; every other call, and every other attribute, is the adapter's."""

    def __init__(self, adapter: Any, keys: set[str]):
        self._adapter = adapter
        self._keys = keys

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)

    @property
    def declaration(self):
        return self._adapter.declaration

    def _known(self, case) -> bool:
        return compare.case_key(case) in self._keys

    def _cast(self, x, case) -> np.ndarray:
        return np.asarray(x, dtype=np.float64).astype(np_dtype(case.dtype))

    def forward(self, case):
        if not self._known(case):
            return self._adapter.forward(case)
        return self._cast(compare.expected(case, self.declaration).out, case)

    def forward_with_weights(self, case):
        if not self._known(case):
            return self._adapter.forward_with_weights(case)
        want = compare.expected(case, self.declaration)
        return self._cast(want.out, case), self._cast(want.weights, case)

    def forward_with_lse(self, case):
        if not self._known(case):
            return self._adapter.forward_with_lse(case)
        want = compare.expected(case, self.declaration)
        return self._cast(want.out, case), np.asarray(want.lse, dtype=np.float32)

    def vjp(self, case, grad_out):
        if not self._known(case):
            return self._adapter.vjp(case, grad_out)
        return tuple(self._cast(g, case) for g in compare.expected_vjp(case, grad_out, self.declaration))


def _searchable(exc: BaseException, entry) -> bool:
    """A clause's own violation (not the guard's: a kernel that raised, refused, hung or returned a wrong
    shape has no error to rank) on a call the oracle can answer (no dropout: its answer is random)."""
    from conformance.harness.causes.record import _violation

    violation = _violation(exc)
    own = isinstance(violation, ClauseViolation) and not isinstance(violation, (AdapterError, UndeclaredRefusal))
    return own and entry is not None and entry[0].dropout_p == 0


def _run_again(item: pytest.Function) -> BaseException | None:
    """The clause test's function once more (hypothesis without its shrink phase); its exception or None."""
    obj = item.obj
    saved = getattr(obj, "_hypothesis_internal_use_settings", None)
    if saved is not None:
        from hypothesis import Phase, settings

        obj._hypothesis_internal_use_settings = settings(saved, phases=[p for p in saved.phases if p != Phase.shrink])
    args = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
    try:
        obj(**args)
    except pytest.skip.Exception:
        return None
    except Exception as exc:  # noqa: BLE001 - any failure of the clause is the next failing case
        return exc
    finally:
        if saved is not None:
            obj._hypothesis_internal_use_settings = saved
    return None


def after_failure(item: pytest.Function, impl: Any, exc: BaseException) -> None:
    """The plugin's hook: :func:`search` for a clause test (its guarded adapter ``impl``) that failed with
    ``exc`` and that no expectations file lists as an expected failure (those are known: no search)."""
    from conformance.harness.run import expectations_plugin
    from conformance.harness.spec.clause import info_of

    if os.environ.get(ENV, "1") == "0":
        return
    info = info_of(getattr(item, "function", None))
    if info is not None and hasattr(impl, "recent_calls") and not expectations_plugin.listed(item, info.id):
        search(item, impl, exc)


def search(item: pytest.Function, impl: Any, exc: BaseException) -> None:
    """Find the clause test's failing cases past ``exc`` and keep the worst (see the module docstring) as
    ``impl.worst_failure``, the record ``harness.causes.record.record_fields`` then reports. A search
    that breaks leaves the failure as it was, with a note saying so."""
    try:
        _search(item, impl, exc)
    except Exception as bug:  # noqa: BLE001 - the clause's own failure must reach the user unchanged
        impl.worst_failure = None
        exc.add_note(f"(the search for this clause test's worst failing case stopped: {type(bug).__name__}: {bug})")


def _search(item: pytest.Function, impl: Any, exc: BaseException) -> None:
    first = failure_record(impl, exc)
    impl.worst_failure = None
    entry = failing_call(impl, exc)
    if not _searchable(exc, entry):
        return
    records, keys = [first], set()
    saved = {name: copy.copy(getattr(impl, name)) for name in _COUNTERS}
    adapter = impl.adapter
    try:
        for _ in range(MAX_RUNS):
            key = compare.case_key(entry[0])
            if key in keys:
                break
            keys.add(key)
            impl.adapter = OracleFor(adapter, keys)
            impl.recent_calls.clear()
            again = _run_again(item)
            if again is None:
                break
            entry = failing_call(impl, again)
            records.append(failure_record(impl, again))
            if not _searchable(again, entry):
                break
    finally:
        impl.adapter = adapter
        for name, value in saved.items():
            setattr(impl, name, value)
    worst = max(records, key=gross.severity)
    each = [sorted(r.get("matches") or ()) for r in records if r is not worst and r.get("matches")]
    impl.worst_failure = dict(
        worst, failing_cases=len(records), matches_by_case=[sorted(worst.get("matches") or ())] + each
    )
    if worst is not first:
        exc.add_note(
            f"the worst of {len(records)} failing cases of this clause test (found by running it on past each "
            f"failing case, with the oracle's answer in its place): {gross.describe(worst)}"
        )
