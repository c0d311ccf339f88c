"""Conventions a cause's failing outputs disagree on: the mean of V in one case, NaN in another.

A ``--declare`` says one value per field for every case. When the failing outputs of one cause (the
other failing cases of its clause tests included, which ``harness.run.worst_case`` keeps as
``matches_elsewhere``) match different values of the same field, the behaviour depends on the case
(its size, its dtype), which no declaration can say: ``harness.causes.text.suggestion`` then proposes
none, and the cause's hint says what differs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable


def seen(rows: Iterable[dict], relevant: Callable[[str], bool]) -> Counter:
    """The conventions the failing records match, each failing case's and its clause test's other ones."""
    return Counter(
        m
        for r in rows
        for m in {*(r["failure"].get("matches") or ()), *(r["failure"].get("matches_elsewhere") or ())}
        if relevant(m)
    )


def conflicts(votes: Iterable[str]) -> dict[str, list[str]]:
    """Fields for which more than one value was matched (``field=value`` texts)."""
    values: dict[str, set[str]] = {}
    for m in votes:
        field, eq, value = m.partition("=")
        if eq:
            values.setdefault(field, set()).add(value)
    return {f: sorted(v) for f, v in values.items() if len(v) > 1}
