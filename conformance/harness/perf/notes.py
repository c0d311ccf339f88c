"""Measurements the performance clauses make, kept for the report and the certificate.

A clause's outcome is pass or fail; what it measured on the way (the memory scaling it fitted, the
kernel that ran for each dtype) is worth stating either way ("the certificate states which it
is"). Clauses call :func:`note`; the perf sub-plugin (harness.run.perf) moves the notes made during a
test onto that test's report, so that they reach the controller under pytest-xdist as well, and
collects them per ``--impl`` for perf.json and the certificate.
"""

from __future__ import annotations

from typing import Any

_PENDING: list[dict[str, Any]] = []


def note(impl: Any, clause: str, dtype: str | None, **data: Any) -> None:
    """Record ``data`` measured by ``clause`` on ``impl`` (its spec, a guarded GuardedAdapter or an adapter)."""
    name = impl if isinstance(impl, str) else str(getattr(impl, "spec", "") or getattr(impl, "name", ""))
    _PENDING.append({"impl": name, "clause": clause, "dtype": dtype, **data})


def drain() -> list[dict[str, Any]]:
    """The notes made since the last call (the plugin calls this after each test)."""
    out = list(_PENDING)
    _PENDING.clear()
    return out
