"""Pair (and triple) coverage: which admitted t-tuples of value classes reached the kernel where they
could show a bug, per adapter.

Counted from what reached the kernel, not from the plan: the covering clauses
(conformance/clauses/test_covering.py) call :func:`record` after a guarded call *returned*, with the
value classes the case it sent is in (``table.reached_values``: a planned class is credited only
when the case really is in it), what is hidden in that case (``hiding.in_case``: a tuple is
observable unless a third value hides one of its values) and the values each class took
(``ranges.taken``). The records live on the guarded adapter while a test runs, travel in the
test's report (``user_properties``, JSON), and the controlling process sums them, so a pytest-xdist run
counts the same tuples as a serial one. What is admitted and excluded comes from the plan
(``harness.covering.array.plan``), a function of the declaration alone.

Registered as a sub-plugin by ``conformance.harness.plugin``; the certificate calls :func:`table`.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.contract import Case, Declaration
from conformance.harness.cases.profiles import profile_name
from conformance.harness.covering import hiding
from conformance.harness.covering.ranges import taken
from conformance.harness.covering.table import Call, reached_values
from conformance.harness.records import coverage_tables
from conformance.harness.run.report_channel import ReportChannel

ATTR = "covering_reached"  # list of value-class records on the guarded adapter


def strengths() -> tuple[int, ...]:
    """The t of the loaded profile's covering arrays (ci: pairs; thorough: triples, pairs shown too)."""
    return (2, 3) if profile_name() == "thorough" else (2,)


def record(impl: Any, case: Case, how: Call, planned: dict[str, str]) -> None:
    """Note that ``case`` reached the kernel behind ``impl``, sent as ``how`` (its direction, and
    whether it was called again after a twin of the same shapes)."""
    store = getattr(impl, ATTR, None)
    if store is None:
        store = []
        setattr(impl, ATTR, store)
    classes = reached_values(case, how, planned)
    hidden = hiding.in_case(case, how, impl.declaration, classes)
    store.append(
        {
            "values": classes,
            "hidden": [[p, v, [sorted(map(list, h)) for h in hs]] for (p, v), hs in hidden.items()],
            "took": taken(case, classes),
        }
    )


def record_blocked(impl: Any, pair: str, by: str) -> None:
    """Note that the admitted ``pair`` cannot reach the kernel behind ``impl``: its value ``by`` fails
    alone there (the covering clause ran it in a row of its own, and the kernel raised or refused)."""
    store = getattr(impl, ATTR, None)
    if store is None:
        store = []
        setattr(impl, ATTR, store)
    store.append({"blocked": pair, "by": by})


PLANS_SENT = "covering_plans_sent"  # set on the guarded adapter once its plans went into a report


def _merge(store: dict[str, dict[str, Any]], impl: str, payload: dict[str, Any]) -> None:
    entry = store.setdefault(impl, {"recs": [], "plans": {}})
    entry["recs"].extend(payload["recs"])
    entry["plans"].update(payload.get("plans", {}))


def _take(impl: Any) -> dict[str, Any] | None:
    """The records since the last report; with the first of them, the plans they are counted against
    (computed already by the covering clause that produced the records: ``covering.plan`` is cached)."""
    recs = getattr(impl, ATTR, None)
    if not recs:
        return None
    out: dict[str, Any] = {"recs": list(recs)}
    recs.clear()
    if not getattr(impl, PLANS_SENT, False):
        setattr(impl, PLANS_SENT, True)
        out["plans"] = {str(t): coverage_tables.plan_summary(impl.declaration, t) for t in strengths()}
    return out


CHANNEL = ReportChannel("sdpa_conformance_pairs", _merge, _take)  # registered by harness/plugin.py


def records(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """spec -> {"recs": the value-class records of every case that reached the kernel, "plans": the
    plan summaries a worker sent (harness.records.coverage_tables.plan_summary)} (controlling process)."""
    return CHANNEL.store(config)


def table(config: pytest.Config, spec: str, decl: Declaration) -> dict[str, Any]:
    """The coverage record of ``spec`` for the certificate."""
    return _table(records(config).get(spec, {}), decl)


def _table(entry: dict[str, Any], decl: Declaration) -> dict[str, Any]:
    return coverage_tables.pairs_table(entry.get("recs", []), decl, strengths(), entry.get("plans"))


def _summary_lines(spec: str, decl: Declaration, entry: dict[str, Any]) -> list[str]:
    out = []
    for t, rec in _table(entry, decl).items():
        out.append(f"{spec}: {coverage_tables.pairs_line(t, rec)}")
        if t == "2":
            out.append(f"    {coverage_tables.pairs_excluded_line(rec)}")
    return out


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    CHANNEL.write_summary(terminalreporter, config, "sdpa-conformance pair coverage", _summary_lines)
