"""``pytest --impl=SPEC --discover``: certify under the declaration discovery measured (harness.discovery.discover).

The plugin calls :func:`apply` right after ``--impl`` resolved: discovery probes a fresh instance of each
adapter (``registry.resolve`` again, so that its probe calls leave no state on the instance the clauses
use), and the discovered fields replace the adapter's declaration; fields given with ``--declare`` are
pinned (not probed), so explicit values win. The record (``Discovery.as_dict``) is kept on the run's
state (``State.discovered``) for the summary, the report header and the certificate.

With pytest-xdist the discovery runs once, in the controller, and each worker receives the record in
its ``workerinput`` (:func:`to_worker`, from the ``pytest_configure_node`` hook) and applies the same
``--declare`` values: probes are deterministic witnesses, but a determinism probe, a kernel at the edge
of a threshold or a timeout under load could still answer differently in two processes, and every
worker must certify under one declaration, the one the summary reports.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness.calls import registry
from conformance.harness.discovery import discover as discovery

WORKER_KEY = "sdpa_conformance_discovery"


def apply(config: pytest.Config, state: Any, overrides: dict[str, Any], signature: str) -> None:
    """Discover (or, in an xdist worker, receive) each adapter's declaration and put it in force."""
    given = getattr(config, "workerinput", {}).get(WORKER_KEY)
    timeout = state.timeout if state.timeout and state.timeout > 0 else 0.0
    for spec, res in state.resolved.items():
        if not res.usable:
            continue
        if given is not None and spec in given:
            record = given[spec]
        else:
            fresh = registry.resolve(spec, overrides, signature).adapter
            record = discovery.discover(fresh, overrides, spec=spec, timeout=timeout).as_dict()
        found = registry.parse_declare(record["declare"])
        res.adapter.declaration = res.adapter.declaration.replace(**found)
        state.discovered[spec] = record


def to_worker(node: Any, config: pytest.Config) -> None:
    """xdist controller: hand the discovery records to a worker (JSON-ready dicts travel as they are)."""
    from conformance.harness.run.runstate import get_state

    state = get_state(config)
    if state is not None and state.discovered:
        node.workerinput[WORKER_KEY] = state.discovered


def header_lines(state: Any) -> list[str]:
    lines = []
    for spec, record in state.discovered.items():
        lines.append(f"  {spec}: discovered (--discover): " + discovery.declare_text(record))
        lines += [f"    {m['field']} = {m['value']}: {m['evidence']}" for m in record["measured"]]
        lines += [f"    finding: {f}" for f in record["findings"]]
    return lines


def summary_lines(state: Any, spec: str) -> list[str]:
    """The lines under an adapter's verdict: certified under a discovered declaration, and the findings."""
    record = state.discovered.get(spec)
    if record is None:
        return []
    lines = [f"certified under a discovered declaration (--discover): {discovery.declare_text(record)}"]
    lines += [f"discovery finding: {f}" for f in record["findings"]]
    return lines
