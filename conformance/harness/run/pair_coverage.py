"""Pair (and triple) coverage: which admitted t-tuples of value classes reached the kernel, per adapter.

Counted from what reached the kernel, not from the plan: the covering clauses
(conformance/clauses/test_covering.py) call :func:`record` after a guarded call *returned*, with the
value classes the case it sent is in (``pairs_space.reached_values``: a planned class is credited only
when the case really is in it). The records live on the guarded adapter while a test runs, travel in
the test's report (``user_properties``, JSON: one dict of classes per case), and the controlling
process sums them, so a pytest-xdist run counts the same tuples as a serial one. What is admitted and
excluded comes from the plan (``harness.cases.covering.plan``), a function of the declaration alone.

Registered as a sub-plugin by ``conformance.harness.plugin``; the certificate calls :func:`table` and
:func:`render_markdown`.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.contract import Case, Declaration
from conformance.harness.cases.pairs_space import reached_values
from conformance.harness.cases.profiles import profile_name
from conformance.harness.records import coverage_tables
from conformance.harness.run.report_channel import ReportChannel

ATTR = "covering_reached"  # list of value-class records on the guarded adapter


def strengths() -> tuple[int, ...]:
    """The t of the loaded profile's covering arrays (ci: pairs; thorough: triples, pairs shown too)."""
    return (2, 3) if profile_name() == "thorough" else (2,)


def record(impl: Any, case: Case, direction: str, planned: dict[str, str]) -> None:
    """Note that ``case`` reached the kernel behind ``impl`` in ``direction`` ("forward"/"backward")."""
    store = getattr(impl, ATTR, None)
    if store is None:
        store = []
        setattr(impl, ATTR, store)
    store.append(reached_values(case, direction, planned))


def _merge(store: dict[str, list], impl: str, recs: list[dict[str, str]]) -> None:
    store.setdefault(impl, []).extend(recs)


def _take(impl: Any) -> list[dict[str, str]] | None:
    recs = getattr(impl, ATTR, None)
    if not recs:
        return None
    out = list(recs)
    recs.clear()
    return out


CHANNEL = ReportChannel("sdpa_conformance_pairs", _merge, _take)  # registered by harness/plugin.py


def records(config: pytest.Config) -> dict[str, list[dict[str, str]]]:
    """spec -> the value-class records of every case that reached the kernel (controlling process)."""
    return CHANNEL.store(config)


def _summary_lines(spec: str, decl: Declaration, recs: list[dict[str, str]]) -> list[str]:
    out = []
    for t, rec in coverage_tables.pairs_table(recs, decl, strengths()).items():
        out.append(f"{spec}: {coverage_tables.pairs_line(t, rec)}")
        if t == "2":
            out.append(f"    {coverage_tables.pairs_excluded_line(rec)}")
    return out


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    CHANNEL.write_summary(terminalreporter, config, "sdpa-conformance pair coverage", _summary_lines)
