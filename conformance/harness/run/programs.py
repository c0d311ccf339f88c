"""Programs per adapter: the distinct structures a kernel was given, and the share of call time in first calls.

The guarded adapter notes every call (``harness.calls.programs.ProgramLog``); after each clause test
the structures new to that process and the call times travel in the test's report
(``harness.run.report_channel``), and the controlling process sums them, so a pytest-xdist run reports
what a serial one does: ``distinct`` structures over the whole run (what the kernel was given),
``first_calls`` (the programs a compiling kernel built: each process compiles its own), and the
seconds of first calls against all calls.

The summary prints a line for a kernel that declares ``compiles_per_shape``, and for one whose first
call of a structure took on average many times its repeated calls without declaring it (the measured
hint to declare it); the certificate records every adapter's (:func:`table`).
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.contract import Declaration
from conformance.harness.calls import programs
from conformance.harness.run import runstate
from conformance.harness.run.report_channel import ReportChannel

# A kernel not declaring compiles_per_shape whose first calls of a structure took on average at least
# HINT_FACTOR times its repeated calls, and HINT_SECONDS more, over at least HINT_CALLS of each, is told
# it seems to compile per shape (discovery's rule, harness.discovery.compiling, on the run's own calls).
HINT_FACTOR = 5.0
HINT_SECONDS = 0.05
HINT_CALLS = 20


def _merge(store: dict[str, dict[str, Any]], impl: str, payload: dict[str, Any]) -> None:
    entry = store.setdefault(impl, {"keys": set(), "first_calls": 0, "calls": 0, "first_s": 0.0, "all_s": 0.0})
    entry["keys"].update(payload["new"])
    entry["first_calls"] += len(payload["new"])
    entry["calls"] += payload["calls"]
    entry["first_s"] += payload["first_s"]
    entry["all_s"] += payload["all_s"]


def _take(impl: Any) -> dict[str, Any] | None:
    log = getattr(impl, "programs", None)
    return log.take() if log is not None else None


CHANNEL = ReportChannel("sdpa_conformance_programs", _merge, _take)  # registered by harness/plugin.py


def table(config: pytest.Config, spec: str) -> dict[str, Any]:
    """The programs record of ``spec`` for the certificate."""
    return programs.summarize(CHANNEL.store(config).get(spec))


def _summary_lines(spec: str, decl: Declaration, entry: dict[str, Any]) -> list[str]:
    rec = programs.summarize(entry)
    if decl.compiles_per_shape:
        return [f"{spec} (compiles_per_shape): {programs.sentence(rec)}"]
    first, repeats = rec["first_calls"], rec["calls"] - rec["first_calls"]
    if min(first, repeats) < HINT_CALLS:
        return []
    first_mean, repeat_mean = rec["first_s"] / first, (rec["all_s"] - rec["first_s"]) / repeats
    if first_mean >= HINT_FACTOR * repeat_mean and first_mean - repeat_mean >= HINT_SECONDS:
        return [
            f"{spec}: {programs.sentence(rec)}; it seems to compile per shape: --declare compiles_per_shape=true "
            "takes the ci profile's shapes from a few buckets"
        ]
    return []


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """A section only when some adapter has a line (most runs print nothing here)."""
    state = runstate.get_state(config)
    if state is None or runstate.is_xdist_worker(config):
        return
    lines = []
    for spec, entry in CHANNEL.store(config).items():
        res = state.resolved.get(spec)
        if res is not None and res.usable:
            lines += _summary_lines(spec, res.adapter.declaration, entry)
    if lines:
        terminalreporter.section("sdpa-conformance programs")
    for text in lines:
        terminalreporter.write_line(text)
