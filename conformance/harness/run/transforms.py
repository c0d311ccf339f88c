"""What a kernel did under each transform asked of it (forward AD, a double backward, vmap), per adapter.

The guarded call records every transform call (``GuardedAdapter.transforms_seen``: answered, or refused and
with what); the records travel in the test reports (``harness.run.report_channel``) so a pytest-xdist run
says what a serial one does; the summary prints one line per adapter and the certificate carries
:func:`table` (``harness.records.transforms`` words both).

Registered as a sub-plugin by ``conformance.harness.plugin``.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.contract import Declaration
from conformance.harness.records.transforms import line, table_of
from conformance.harness.run.report_channel import ReportChannel, drain

ATTR = "transforms_seen"  # list of records on the guarded adapter (harness.calls.guarded)


def _merge(store: dict[str, list[dict]], impl: str, payload: list[dict]) -> None:
    store.setdefault(impl, []).extend(payload)


CHANNEL = ReportChannel("sdpa_conformance_transforms", _merge, drain(ATTR))  # registered by harness/plugin.py


def table(config: pytest.Config, spec: str) -> dict[str, dict[str, dict]]:
    """transform -> dtype -> {"outcome", "detail"} for ``spec`` (harness.records.transforms.table_of)."""
    return table_of(CHANNEL.store(config).get(spec, []))


def _summary_lines(spec: str, decl: Declaration, records: list[dict]) -> list[str]:
    return line(spec, table_of(records))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    CHANNEL.write_summary(terminalreporter, config, "sdpa-conformance transforms", _summary_lines)
