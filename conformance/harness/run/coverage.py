"""Coverage of the case space: which cells (feature x shape class) a run reached, per adapter.

"Passed" must never hide "not tried". Every case that reaches a kernel through the guarded call
(``harness.calls.guarded.GuardedAdapter``) is classified into its cells (``harness.cases.cells``: the features it
exercises x its shape classes), counted per adapter. The cells a declaration *admits* are listed
too, so the certificate (and the run's summary) can name the cells the declaration admits but the
run never reached.

Registered as a sub-plugin by ``conformance.harness.plugin``. The counts live on each guarded
adapter while a clause test runs; this module moves them into the test's report
(``report.user_properties``), and the controlling process sums them from the reports, so a run
under pytest-xdist counts the same cells as a serial run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from conformance.contract import Declaration
from conformance.harness.cases.cells import FEATURES, SEP, SHAPE_CLASSES, admitted, cells_of, features_of
from conformance.harness.records import coverage_tables
from conformance.harness.run.report_channel import ReportChannel

__all__ = [
    "FEATURES",
    "SEP",
    "SHAPE_CLASSES",
    "admitted",
    "cells_of",
    "counts",
    "features_of",
]


# -- the sub-plugin: counts travel in the reports (harness.run.report_channel) -------------------------
def _merge(store: dict[str, Counter], impl: str, cells: dict[str, int]) -> None:
    store.setdefault(impl, Counter()).update(cells)


def _take(impl: Any) -> dict[str, int] | None:
    cells = getattr(impl, "cells", None)
    return dict(cells) if cells else None


CHANNEL = ReportChannel("sdpa_conformance_cells", _merge, _take)  # registered by harness/plugin.py


def counts(config: pytest.Config) -> dict[str, Counter]:
    """spec -> Counter of cells reached in this run (the controlling process's sum)."""
    return CHANNEL.store(config)


def _summary_lines(spec: str, decl: Declaration, reached: Counter) -> list[str]:
    rec = coverage_tables.cells_table(reached, decl)
    line = f"{spec}: {rec['reached']}/{rec['admitted']} admitted cells reached"
    if rec["not_reached"]:
        shown = "; ".join(rec["not_reached"][:4])
        more = len(rec["not_reached"]) - 4
        line += f"; never reached: {shown}"
        if more > 0:
            line += f"; ... and {more} more (--certificate lists all)"
    return [line]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    CHANNEL.write_summary(terminalreporter, config, "sdpa-conformance case-space coverage", _summary_lines)
