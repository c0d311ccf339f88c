"""Per-test records carried from the process that ran a test to the session that reports on it.

Why one mechanism: several sub-plugins count what reached the kernel while a clause test runs (the
case-space cells, ``harness.run.coverage``; the covering arrays' value classes, ``harness.run.pair_coverage``),
and under pytest-xdist the test runs in a worker while the summary and the certificate are written by
the controlling process. A :class:`ReportChannel` puts one JSON-friendly payload per test into the
test's report (``user_properties``, which xdist ships to the controller) and merges the payloads of
every report it receives into one store per adapter, so a parallel run counts what a serial one does.
A nested in-process run (pytester) pushes its own store and pops it when it ends.

A channel is itself a pytest plugin (``harness/plugin.py`` registers each one beside its module): its
hooks are the same for every kind of payload, so they are written once, here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance.harness.run import runstate

Merge = Callable[[dict[str, Any], str, Any], None]  # (store, adapter spec, payload)
Take = Callable[[Any], Any]  # the guarded adapter of a finished test -> its payload, or None for nothing
Lines = Callable[[str, Any, Any], list[str]]  # (adapter spec, its declaration, merged payload) -> summary lines


class ReportChannel:
    """One kind of per-test payload, as a pytest plugin: after each clause test's call, ``take`` reads
    the payload off the test's guarded adapter and it travels in the report; every report received is
    merged into ``store(config)``, the result in the controlling process."""

    def __init__(self, key: str, merge: Merge, take: Take) -> None:
        self.key = key
        self.__name__ = key  # the name it is registered under
        self._merge = merge
        self._take = take
        self._stores: list[dict[str, Any]] = []  # one per configured (non-worker) session
        self._stash = pytest.StashKey[dict]()

    def pytest_configure(self, config: pytest.Config) -> None:
        if not runstate.is_xdist_worker(config):
            store: dict[str, Any] = {}
            config.stash[self._stash] = store
            self._stores.append(store)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        store = config.stash.get(self._stash, None)
        if store is not None and self._stores and self._stores[-1] is store:
            self._stores.pop()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        rep = yield
        if rep.when == "call":
            impl = getattr(item, "funcargs", {}).get("impl")
            payload = self._take(impl) if impl is not None else None
            if payload:
                rep.user_properties.append((self.key, {"impl": impl.spec or impl.name, "payload": payload}))
        return rep

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self._stores:
            return
        for key, value in getattr(report, "user_properties", ()):
            if key == self.key:
                self._merge(self._stores[-1], str(value["impl"]), value["payload"])

    def store(self, config: pytest.Config) -> dict[str, Any]:
        return config.stash.get(self._stash, {})

    def write_summary(self, terminalreporter: Any, config: pytest.Config, title: str, lines: Lines) -> None:
        """A summary section ``title`` with ``lines(spec, declaration, payload)`` for each usable adapter
        that sent payloads; nothing in an xdist worker (the controlling process reports)."""
        rows = self._per_adapter(config)
        if rows:
            terminalreporter.section(title)
        for spec, decl, payload in rows:
            for line in lines(spec, decl, payload):
                terminalreporter.write_line(line)

    def _per_adapter(self, config: pytest.Config) -> list[tuple[str, Any, Any]]:
        state = runstate.get_state(config)
        if state is None or runstate.is_xdist_worker(config):
            return []
        out = []
        for spec, payload in self.store(config).items():
            res = state.resolved.get(spec)
            if res is not None and res.usable:
                out.append((spec, res.adapter.declaration, payload))
        return out


def drain(attr: str) -> Callable[[Any], list[dict] | None]:
    """A channel's ``take`` for records a guarded adapter collects in a list attribute ``attr``: the records
    gathered since the last take (the list emptied), or None when there are none."""

    def take(impl: Any) -> list[dict] | None:
        recs = getattr(impl, attr, None)
        if not recs:
            return None
        out = list(recs)
        recs.clear()
        return out

    return take
