"""What a run prints about itself: the report header and the verdict summary (the plugin's hooks call these).

Kept apart from ``harness/plugin.py`` so that the entry point holds the hooks and the wiring, and the
wording of the header and summary lives in one place with the verdict lines it prints.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness.run import runstate
from conformance.harness.run.runstate import get_state


def certifying_from_testpaths(config: pytest.Config) -> bool:
    """True for ``pytest --impl=X`` at the repo root: a certification run, not a self-test run."""
    state = get_state(config)
    return bool(state and state.explicit and config.args_source == pytest.Config.ArgsSource.TESTPATHS)


def header_lines(config: pytest.Config) -> list[str]:
    """The report header: profile, timeout, each adapter's declaration (explicit ``--impl`` runs only)."""
    state = get_state(config)
    if state is None or not state.explicit:
        return []  # a default run resolves built-ins lazily; the summary lists them
    lines = [f"sdpa-conformance: hypothesis profile {state.profile}; call timeout {state.timeout:g}s"]
    for spec, res in state.resolved.items():
        if not res.usable:
            lines.append(f"  {spec}: unavailable here ({res.reason})")
        else:
            d = res.adapter.declaration
            lines.append(
                f"  {spec}: dtypes={','.join(sorted(d.dtypes))} grad={d.grad} dropout={d.dropout} gqa={d.gqa} "
                f"all_blocked={d.all_blocked} causal_alignment={d.causal_alignment} device={d.device}"
            )
    if state.declare:
        lines.append(f"  --declare overrides: {' '.join(state.declare)}")
    if state.discovered:
        from conformance.harness.run import discovery_run

        lines += discovery_run.header_lines(state)
    if certifying_from_testpaths(config):
        lines.append("  certification run: clauses only (the project's self-tests run with a bare `pytest`)")
    return lines


def write_verdicts(terminalreporter: Any, config: pytest.Config) -> None:
    """The summary section: one verdict line per adapter with its details, the failed clauses, likely causes."""
    state = get_state(config)
    if state is None or not state.results:
        return
    tr = terminalreporter
    tr.section("sdpa-conformance summary")
    for spec, v in runstate.verdicts(config).items():
        tr.write_line(f"{spec}: {v.headline()} ({state.profile} profile){_drift(state, spec)}")
        from conformance.harness.run import discovery_run

        for line in v.details() + discovery_run.summary_lines(state, spec):
            tr.write_line(f"    {line}")
    failed = sorted({(r["impl"], r["clause"]) for r in state.results if r["outcome"] == "failed"})
    if failed:
        tr.write_line("failed clauses: " + ", ".join(f"{c} [{i}]" for i, c in failed))
    from conformance.harness.causes import likely as causes

    causes.write_summary(tr, state.results)


def _drift(state: runstate.State, spec: str) -> str:
    """ "; expectations measured with keras 3.15.1; running 3.16.0" when the adapter's libraries are
    not the releases it was measured with (a stale or missing expectation may be the library's news)."""
    from conformance.harness.calls.environment import drift_text, version_drift

    res = state.resolved.get(spec)
    text = drift_text(version_drift(res.adapter)) if res is not None and res.adapter is not None else ""
    return f"; {text}" if text else ""
