"""Coverage of the case space: which cells (feature x shape class) a run reached, per adapter.

"Passed" must never hide "not tried". Every case that reaches a kernel through the guarded call
(``harness.guarded.GuardedAdapter``) is classified into its cells (``harness.cells``: the features it
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
from conformance.harness import runstate
from conformance.harness.cells import FEATURES, SEP, SHAPE_CLASSES, admitted, cells_of, features_of
from conformance.harness.report_channel import ReportChannel

__all__ = [
    "FEATURES",
    "SEP",
    "SHAPE_CLASSES",
    "admitted",
    "cells_of",
    "counts",
    "features_of",
    "render_markdown",
    "table",
]


# -- the sub-plugin: counts travel in the reports (harness.report_channel) -------------------------
def _merge(store: dict[str, Counter], impl: str, cells: dict[str, int]) -> None:
    store.setdefault(impl, Counter()).update(cells)


CHANNEL = ReportChannel("sdpa_conformance_cells", _merge)


def pytest_configure(config: pytest.Config) -> None:
    CHANNEL.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    CHANNEL.unconfigure(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.when == "call":
        impl = getattr(item, "funcargs", {}).get("impl")
        cells = getattr(impl, "cells", None)
        if cells:
            CHANNEL.send(rep, impl.spec or impl.name, dict(cells))
    return rep


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    CHANNEL.receive(report)


def counts(config: pytest.Config) -> dict[str, Counter]:
    """spec -> Counter of cells reached in this run (the controlling process's sum)."""
    return CHANNEL.store(config)


def table(reached: Counter, decl: Declaration) -> dict[str, Any]:
    """The certificate's record: per feature and shape class the count, None where not admitted."""
    admit = set(admitted(decl))
    rows = {
        f: {c: (reached.get(f"{f}{SEP}{c}", 0) if f"{f}{SEP}{c}" in admit else None) for c in SHAPE_CLASSES}
        for f in FEATURES
    }
    missing = [cell for cell in admitted(decl) if not reached.get(cell)]
    return {
        "shape_classes": list(SHAPE_CLASSES),
        "rows": rows,
        "admitted": len(admit),
        "reached": len(admit) - len(missing),
        "not_reached": missing,
    }


def render_markdown(record: dict[str, Any]) -> list[str]:
    """The certificate's section: the table, then the admitted cells never reached."""
    classes = record["shape_classes"]
    out = [
        "\n## Coverage of the case space\n",
        f"Cases that reached the kernel, per feature and shape class: **{record['reached']} of "
        f"{record['admitted']} cells the declaration admits were reached**. `-` = not admitted by the "
        "declaration (or no case can fall there); **0** = admitted but never reached.\n",
        "| feature | " + " | ".join(classes) + " |",
        "|---|" + "---:|" * len(classes),
    ]
    for feature, row in record["rows"].items():
        marks = ["-" if n is None else ("**0**" if n == 0 else str(n)) for n in (row[c] for c in classes)]
        out.append(f"| {feature} | " + " | ".join(marks) + " |")
    if record["not_reached"]:
        out.append("\nAdmitted by the declaration but never reached in this run: " + "; ".join(record["not_reached"]))
    else:
        out.append("\nEvery cell the declaration admits was reached.")
    return out


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = runstate.get_state(config)
    store = counts(config)
    if state is None or not store or runstate.is_xdist_worker(config):
        return
    terminalreporter.section("sdpa-conformance case-space coverage")
    for spec, reached in store.items():
        res = state.resolved.get(spec)
        if res is None or not res.usable:
            continue
        rec = table(reached, res.adapter.declaration)
        line = f"{spec}: {rec['reached']}/{rec['admitted']} admitted cells reached"
        if rec["not_reached"]:
            shown = "; ".join(rec["not_reached"][:4])
            more = len(rec["not_reached"]) - 4
            line += f"; never reached: {shown}"
            if more > 0:
                line += f"; ... and {more} more (--certificate lists all)"
        terminalreporter.write_line(line)
