"""Run a clause function directly on an adapter, outside pytest's parametrisation.

Self-tests use this to show that each clause fails on the mutants it claims to kill and passes on
the correct base kernel. A skip (not applicable) is neither a pass nor a kill and is reported.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import pkgutil
from collections.abc import Iterator

import pytest

import conformance.clauses
from conformance.contract import DTYPES
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.spec.clause import CLAUSES, ClauseInfo

# Clause modules a ci-profile certification reports as "not in profile" (long sequences and the launch-grid
# limit's 65 537 slices: thorough; performance: --conformance-perf). All call the forward only. The self-tests
# that call clauses directly (past that gate) decide from these what the default run gives them.
LONG_SEQUENCE = "conformance.clauses.test_long_sequence"
LIMITS_GRID = "conformance.clauses.test_limits_grid"
PERF = "conformance.clauses.test_perf"
NOT_IN_CI = (LONG_SEQUENCE, LIMITS_GRID, PERF)


def load_clauses() -> dict[str, ClauseInfo]:
    """Import every clause module and every mutant module (``tests/mutants*.py``)."""
    for mod in pkgutil.iter_modules(conformance.clauses.__path__):
        importlib.import_module(f"conformance.clauses.{mod.name}")
    import tests

    for mod in pkgutil.iter_modules(tests.__path__):
        if mod.name.startswith("mutants"):
            importlib.import_module(f"tests.{mod.name}")
    return CLAUSES


def dtypes_for(info: ClauseInfo, only: str | None = None) -> list[str | None]:
    if "dtype" not in inspect.signature(info.func).parameters:
        return [None]
    if only:
        return [only]
    return list(info.dtypes or DTYPES)


def by_the_guard(exc: BaseException) -> bool:
    """True when a failure comes from the guarded call (``GuardedAdapter``: the kernel raised, refused a case
    its declaration covers, hung, returned a wrong shape, dtype or type, touched its inputs), not
    from a check of the clause's own: the guard fails the same way whichever clause is running."""
    from conformance.harness.calls.guarded import UndeclaredRefusal
    from conformance.harness.spec.report import AdapterError

    guards = (AdapterError, UndeclaredRefusal)
    if type(exc).__name__ in ("ExceptionGroup", "BaseExceptionGroup"):
        return all(by_the_guard(e) for e in exc.exceptions)
    return isinstance(exc, guards)


@contextlib.contextmanager
def _without_shrinking(func) -> Iterator[None]:
    """A property clause run on a mutant only has to fail: the shrink phase that would make its
    counterexample small is skipped (a fifth of test_clauses_bite's time). Hypothesis reads the
    settings off the wrapped test at each call, and the examples it generates do not depend on the
    phases, so the first failing example is the one a full run meets first. A covering clause stops at
    its first failing row and does not shrink it (``test_covering.FIRST_FAILING_ROW``)."""
    from hypothesis import Phase, settings

    from conformance.clauses import test_covering

    saved = getattr(func, "_hypothesis_internal_use_settings", None)
    if saved is None:  # not a property clause; a covering clause stops at its first failing row, unshrunk
        test_covering.FIRST_FAILING_ROW = True
        try:
            yield
        finally:
            test_covering.FIRST_FAILING_ROW = False
        return
    func._hypothesis_internal_use_settings = settings(saved, phases=[p for p in saved.phases if p != Phase.shrink])
    try:
        yield
    finally:
        func._hypothesis_internal_use_settings = saved


def run_clause(info: ClauseInfo, adapter, dtype: str | None, *, shrink: bool = True) -> str:
    """'passed', 'failed: <message>', 'failed (guard): <message>' or 'skipped: <reason>'.

    'failed (guard)' marks a failure raised by the guarded call rather than by the clause's checks
    (see :func:`by_the_guard`); both start with 'failed'. ``shrink=False`` reports the first failing
    example of a property clause as it is (for kernels that are meant to fail)."""
    impl = GuardedAdapter(adapter, spec=getattr(adapter, "name", "adapter"), timeout=0)
    reasons = info.not_applicable_reasons(impl.declaration, dtype)  # the plugin's own applicability test
    if reasons:
        return f"skipped: not applicable to {impl.name}: {'; '.join(reasons)}"
    kwargs = {"impl": impl}
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        with contextlib.nullcontext() if shrink else _without_shrinking(info.func):
            info.func(**kwargs)
    except AssertionError as exc:
        return f"failed{' (guard)' if by_the_guard(exc) else ''}: {exc}"
    except BaseException as exc:
        if isinstance(exc, pytest.skip.Exception):
            return f"skipped: {exc}"
        if type(exc).__name__ in ("ExceptionGroup", "BaseExceptionGroup") and all(
            isinstance(e, AssertionError) for e in exc.exceptions
        ):
            return f"failed{' (guard)' if by_the_guard(exc) else ''}: {exc}"
        raise
    return "passed"
