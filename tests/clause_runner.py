"""Run a clause function directly on an adapter, outside pytest's parametrisation.

Self-tests use this to show that each clause fails on the mutants it claims to kill and passes on
the correct base kernel. A skip (not applicable) is neither a pass nor a kill and is reported.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import conformance.clauses
from conformance.contract import DTYPES
from conformance.harness.clause import CATALOG, ClauseInfo
from conformance.harness.impl import Impl


def load_catalog() -> dict[str, ClauseInfo]:
    """Import every clause module and every mutant module (``tests/mutants*.py``)."""
    for mod in pkgutil.iter_modules(conformance.clauses.__path__):
        importlib.import_module(f"conformance.clauses.{mod.name}")
    import tests

    for mod in pkgutil.iter_modules(tests.__path__):
        if mod.name.startswith("mutants"):
            importlib.import_module(f"tests.{mod.name}")
    return CATALOG


def dtypes_for(info: ClauseInfo, only: str | None = None) -> list[str | None]:
    if "dtype" not in inspect.signature(info.func).parameters:
        return [None]
    if only:
        return [only]
    return list(info.dtypes or DTYPES)


def run_clause(info: ClauseInfo, adapter, dtype: str | None) -> str:
    """'passed', 'failed: <message>' or 'skipped: <reason>'."""
    impl = Impl(adapter, spec=getattr(adapter, "name", "adapter"), timeout=0)
    kwargs = {"impl": impl}
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        info.func(**kwargs)
    except AssertionError as exc:
        return f"failed: {exc}"
    except BaseException as exc:
        if isinstance(exc, pytest.skip.Exception):
            return f"skipped: {exc}"
        if type(exc).__name__ in ("ExceptionGroup", "BaseExceptionGroup") and all(
            isinstance(e, AssertionError) for e in exc.exceptions
        ):
            return f"failed: {exc}"
        raise
    return "passed"
