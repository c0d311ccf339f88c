"""pytest's short test summary without the lines the verdict already accounts for.

This project's ``addopts = -ra`` (and many a user's) makes pytest end a run with one line per
skipped and expected-failing test. For a clause test those lines repeat what the verdict summary
says, per adapter and with the reason: "not applicable by declaration: ...", "not in this profile",
"expected failures (listed in the expectations file)", "not run or incomplete" (harness.records.verdict).
A certification (``pytest --impl=X``) printed about thirty such lines after its verdict, so the
verdict scrolled away. Left out: the skip and expected-failure lines of every test that became a
verdict record. Kept: the failure and error lines (each names a test to rerun), and every line of
a test that is not a clause test (the project's self-tests in the default run, the availability
check that names each built-in not usable here). An ``-r`` given on the command line is the user's
explicit choice and is honoured whole. pytest's closing counts still count every test.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness.run import runstate

HIDDEN = ("skipped", "xfailed")  # the terminal reporter's stats keys of the lines left out


def _asked_on_command_line(config: pytest.Config) -> bool:
    return any(a.startswith("-r") and not a.startswith("--") for a in config.invocation_params.args)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config):
    """Around the terminal reporter's own summary (which writes the short test summary last): the
    reports of clause tests are taken out of its skipped / xfailed lists while it writes, and put
    back before pytest writes its closing counts."""
    state = runstate.get_state(config)
    if state is None or not state.results or runstate.is_xdist_worker(config) or _asked_on_command_line(config):
        return (yield)
    accounted = {r["nodeid"] for r in state.results}
    stats = terminalreporter.stats
    held = {}
    for key in HIDDEN:
        reports = stats.get(key) or []
        kept = [r for r in reports if getattr(r, "nodeid", None) not in accounted]
        if len(kept) != len(reports):
            held[key] = reports
            stats[key] = kept
    try:
        return (yield)
    finally:
        stats.update(held)
