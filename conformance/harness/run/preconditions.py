"""What a kernel did with each invalid input of 000 §8's preconditions, per adapter, on every run.

The precondition clauses (conformance/clauses/test_preconditions.py) call :func:`record` for every bad
input they send, whatever the kernel declares, so a run always says which invalid inputs a kernel
accepts and what it returned, which it refuses, and which make it crash with an error it does not
declare. The records travel in the test reports (``harness.run.report_channel``) so a pytest-xdist run
says what a serial one does; the summary prints one line per adapter (:func:`line`) and the
certificate carries :func:`table`.

Registered as a sub-plugin by ``conformance.harness.plugin``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conformance.contract import Declaration, dtype_name
from conformance.harness.judge.rejection import documented
from conformance.harness.records.invalid_inputs import line, table_of
from conformance.harness.run.report_channel import ReportChannel, drain

ATTR = "preconditions_seen"  # list of outcome records on the guarded adapter


def outcome(decl: Declaration, result: Any, exc: BaseException | None) -> tuple[str, str]:
    """("refused" | "accepted" | "declined" | "crashed", what happened in words)."""
    if exc is None:
        arr = np.asarray(result) if isinstance(result, np.ndarray) else None
        if arr is None:
            return "accepted", f"returned {type(result).__name__}"
        finite = "finite" if arr.size == 0 or np.isfinite(arr.astype(np.float64)).all() else "with NaN or inf"
        return "accepted", f"returned {dtype_name(arr.dtype)} {list(arr.shape)}, {finite}"
    text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}".rstrip(": ")
    if type(exc).__name__ == "NotApplicable":
        return "declined", f"declined (NotApplicable: {str(exc)[:120]})"
    if documented(exc, decl):
        return "refused", text
    return "crashed", f"{text} (not a declared error class)"


def record(impl: Any, name: str, what: str, result: Any, exc: BaseException | None) -> None:
    """Note what the kernel behind ``impl`` did with the bad input ``what`` of precondition ``name``."""
    kind, detail = outcome(impl.declaration, result, exc)
    store = getattr(impl, ATTR, None)
    if store is None:
        store = []
        setattr(impl, ATTR, store)
    store.append({"name": name, "what": what, "outcome": kind, "detail": detail})


def _merge(store: dict[str, dict[tuple[str, str], dict]], impl: str, payload: list[dict]) -> None:
    entry = store.setdefault(impl, {})
    for rec in payload:  # one bad input is sent once per dtype: the first outcome of each is kept, a change noted
        key = (rec["name"], rec["what"])
        if key not in entry:
            entry[key] = dict(rec)
        elif entry[key]["outcome"] != rec["outcome"]:
            entry[key]["detail"] += f"; in another dtype {rec['outcome']}: {rec['detail']}"


CHANNEL = ReportChannel("sdpa_conformance_preconditions", _merge, drain(ATTR))  # registered by harness/plugin.py


def table(config: pytest.Config, spec: str) -> dict[str, list[dict]]:
    """precondition name -> its bad inputs' outcomes (what, outcome, detail), in PRECONDITIONS order."""
    entry = CHANNEL.store(config).get(spec, {})
    return table_of(list(entry.values()))


def _summary_lines(spec: str, decl: Declaration, entry: dict) -> list[str]:
    return line(spec, decl, table_of(list(entry.values())))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    CHANNEL.write_summary(terminalreporter, config, "sdpa-conformance invalid inputs (000 §8)", _summary_lines)
