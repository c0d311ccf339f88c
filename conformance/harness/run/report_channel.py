"""Per-test records carried from the process that ran a test to the session that reports on it.

Why one mechanism: several sub-plugins count what reached the kernel while a clause test runs (the
case-space cells, ``harness.run.coverage``; the covering arrays' value classes, ``harness.run.pair_coverage``),
and under pytest-xdist the test runs in a worker while the summary and the certificate are written by
the controlling process. A :class:`ReportChannel` puts one JSON-friendly payload per test into the
test's report (``user_properties``, which xdist ships to the controller) and merges the payloads of
every report it receives into one store per adapter, so a parallel run counts what a serial one does.
A nested in-process run (pytester) pushes its own store and pops it when it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance.harness.run import runstate

Merge = Callable[[dict[str, Any], str, Any], None]  # (store, adapter spec, payload)


class ReportChannel:
    """One kind of per-test payload: ``send`` it from a report hook, ``receive`` it in
    ``pytest_runtest_logreport``; ``store(config)`` is the merged result (controlling process)."""

    def __init__(self, key: str, merge: Merge) -> None:
        self.key = key
        self._merge = merge
        self._stores: list[dict[str, Any]] = []  # one per configured (non-worker) session
        self._stash = pytest.StashKey[dict]()

    def configure(self, config: pytest.Config) -> None:
        if not runstate.is_xdist_worker(config):
            store: dict[str, Any] = {}
            config.stash[self._stash] = store
            self._stores.append(store)

    def unconfigure(self, config: pytest.Config) -> None:
        store = config.stash.get(self._stash, None)
        if store is not None and self._stores and self._stores[-1] is store:
            self._stores.pop()

    def send(self, rep: pytest.TestReport, impl: str, payload: Any) -> None:
        rep.user_properties.append((self.key, {"impl": impl, "payload": payload}))

    def receive(self, report: pytest.TestReport) -> None:
        if not self._stores:
            return
        for key, value in getattr(report, "user_properties", ()):
            if key == self.key:
                self._merge(self._stores[-1], str(value["impl"]), value["payload"])

    def store(self, config: pytest.Config) -> dict[str, Any]:
        return config.stash.get(self._stash, {})
