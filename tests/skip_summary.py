"""The self-tests' skip lines: what is missing on this machine is listed, what is skipped by design is counted.

The README's test command ends with pytest's short summary (``-ra``). A skip there should tell a user what
their machine lacks (a framework not installed, no CUDA device, the seed articles elsewhere); most of the
self-tests' skips are no such thing: the thorough tier left to ``pytest tests -m thorough``, a check that
applies to no kernel of a set by its declaration, a kernel that declares no float16. Those are taken out of
the short summary and accounted for in one line per kind instead (hooked in tests/conftest.py). A skip
whose reason matches no kind below stays listed: an unknown reason is shown, not hidden.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

# (kind, pattern on the skip reason): skips by design, in the words of the accounting line.
BY_DESIGN = (
    ("the thorough tier (pytest tests -m thorough)", re.compile(r"thorough tier|in the thorough tier|not in profile")),
    ("not applicable to the kernels' declarations", re.compile(
        r"applies to none of|declares no |declares every dtype|declares -inf|has no fill|refuses is_causal with T != S"
        r"|behaviour not measured")),
    ("opt-in heavy runs (SDPA_CONFORMANCE_COMPILED=1)", re.compile(r"SDPA_CONFORMANCE_COMPILED=1")),
)  # fmt: skip


def reason_of(report: Any) -> str:
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def kind_of(reason: str) -> str | None:
    return next((kind for kind, pattern in BY_DESIGN if pattern.search(reason)), None)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config):
    """Around the short summary: the by-design skips out of its list while it writes, one line per kind after."""
    if any(a.startswith("-r") and not a.startswith("--") for a in config.invocation_params.args):
        return (yield)  # an -r on the command line is the user's choice, honoured whole
    stats = terminalreporter.stats
    reports = stats.get("skipped") or []
    counted: Counter = Counter()
    kept = []
    for r in reports:
        kind = kind_of(reason_of(r)) if "tests/" in str(getattr(r, "nodeid", "")) else None
        if kind is None:
            kept.append(r)
        else:
            counted[kind] += 1
    stats["skipped"] = kept
    try:
        return (yield)
    finally:
        stats["skipped"] = reports
        if counted:
            said = "; ".join(f"{n} {kind}" for kind, n in counted.most_common())
            terminalreporter.write_line(f"self-tests skipped by design, not listed above: {said}")
