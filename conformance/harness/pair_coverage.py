"""Pair (and triple) coverage: which admitted t-tuples of value classes reached the kernel, per adapter.

Counted from what reached the kernel, not from the plan: the covering clauses
(conformance/clauses/test_covering.py) call :func:`record` after a guarded call *returned*, with the
value classes the case it sent is in (``pairs_space.reached_values``: a planned class is credited only
when the case really is in it). The records live on the guarded adapter while a test runs, travel in
the test's report (``user_properties``, JSON: one dict of classes per case), and the controlling
process sums them, so a pytest-xdist run counts the same tuples as a serial one. What is admitted and
excluded comes from the plan (``harness.covering.plan``), a function of the declaration alone.

Registered as a sub-plugin by ``conformance.harness.plugin``; the certificate calls :func:`table` and
:func:`render_markdown`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from conformance.contract import Case, Declaration
from conformance.harness import covering, runstate
from conformance.harness.pairs_space import reached_values
from conformance.harness.profiles import profile_name
from conformance.harness.report_channel import ReportChannel

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


CHANNEL = ReportChannel("sdpa_conformance_pairs", _merge)  # harness.report_channel


def pytest_configure(config: pytest.Config) -> None:
    CHANNEL.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    CHANNEL.unconfigure(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.when == "call":
        impl = getattr(item, "funcargs", {}).get("impl")
        recs = getattr(impl, ATTR, None)
        if recs:
            CHANNEL.send(rep, impl.spec or impl.name, list(recs))
            recs.clear()
    return rep


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    CHANNEL.receive(report)


def records(config: pytest.Config) -> dict[str, list[dict[str, str]]]:
    """spec -> the value-class records of every case that reached the kernel (controlling process)."""
    return CHANNEL.store(config)


def _n(k: int) -> str:
    return f"{k:,}".replace(",", " ")


def table(recs: list[dict[str, str]], decl: Declaration, ts: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The certificate's record: per t, admitted / reached, the admitted tuples not reached, the
    excluded tuples and values with their reasons."""
    out: dict[str, Any] = {}
    for t in ts or strengths():
        plan = covering.plan(decl, t)
        reached = {name for r in recs for name in covering.reached(r, t)}
        admitted = [covering.name(tup) for tup in plan.admitted]
        missing = [a for a in admitted if a not in reached]
        out[str(t)] = {
            "rows": len(plan.rows),
            "admitted": len(admitted),
            "reached": len(admitted) - len(missing),
            "cases": len(recs),
            "not_reached": missing,
            "excluded": {covering.name(tup): why for tup, why in plan.excluded.items()},
            "excluded_values": {f"{p}: {v}": why for (p, v), why in plan.excluded_values.items()},
        }
    return out


def line(t: str, rec: dict[str, Any], shown: int = 4) -> str:
    """``2-way: 1 754 / 1 754 admitted pairs reached (72 rows; 17 pairs and 1 value excluded, with reasons)``."""
    what = {"2": "pairs", "3": "triples"}.get(t, f"{t}-tuples")
    text = f"{t}-way: {_n(rec['reached'])} / {_n(rec['admitted'])} admitted {what} reached ({rec['rows']} rows"
    nv = len(rec["excluded_values"])
    text += f"; {_n(len(rec['excluded']))} {what} and {nv} value{'s' * (nv != 1)} excluded, with reasons)"
    if rec["not_reached"]:
        text += "; not reached: " + "; ".join(rec["not_reached"][:shown])
        if len(rec["not_reached"]) > shown:
            text += f"; ... and {len(rec['not_reached']) - shown} more (--certificate lists all)"
    return text


def excluded_line(rec: dict[str, Any]) -> str:
    """The excluded values, and the excluded tuples counted by their first reason (the certificate lists each)."""
    reasons = Counter(why.split("; ")[0] for why in rec["excluded"].values())
    parts = [f"{k} ({why.split('; ')[0][:70]})" for k, why in rec["excluded_values"].items()]
    parts += [f"{n} x {why}" for why, n in reasons.most_common()]
    return "excluded: " + "; ".join(parts) if parts else "excluded: none"


def render_markdown(record_: dict[str, Any]) -> list[str]:
    out = ["\n## Pair coverage (covering arrays, COVER-PAIRS-01 / COVER-PAIRS-GRAD-02)\n"]
    for t, rec in record_.items():
        out.append(f"**{line(t, rec, shown=0)}**, from {rec['cases']} cases that reached the kernel.\n")
        if rec["not_reached"]:
            out.append("Admitted but never reached: " + "; ".join(f"`{a}`" for a in rec["not_reached"]) + "\n")
        if rec["excluded_values"]:
            out.append("| value excluded | reason |\n|---|---|")
            out += [f"| {k} | {why} |" for k, why in rec["excluded_values"].items()]
        if rec["excluded"]:
            out.append(f"\n| {t}-tuple excluded | reason |\n|---|---|")
            out += [f"| {k} | {why} |" for k, why in rec["excluded"].items()]
    return out


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = runstate.get_state(config)
    store = records(config)
    if state is None or not store or runstate.is_xdist_worker(config):
        return
    terminalreporter.section("sdpa-conformance pair coverage")
    for spec, recs in store.items():
        res = state.resolved.get(spec)
        if res is None or not res.usable:
            continue
        for t, rec in table(recs, res.adapter.declaration).items():
            terminalreporter.write_line(f"{spec}: {line(t, rec)}")
            if t == "2":
                terminalreporter.write_line(f"    {excluded_line(rec)}")
