"""Conventions a cause's failing outputs disagree on: the mean of V in one case, NaN in another.

A ``--declare`` says one value per field for every case. When the failing outputs of one cause (the
other failing cases of its clause tests included, which ``harness.run.worst_case`` keeps as
``matches_by_case``) match different values of the same field, the behaviour depends on the case
(its size, its dtype), which no declaration can say: ``harness.causes.text.suggestion`` then proposes
none, and the cause's hint says what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def conflicts(rows: Iterable[dict], relevant: Callable[[str], bool]) -> dict[str, list[str]]:
    """Fields for which the failing cases match different values and no one value is matched by every
    case that matches the field at all (several fills that coincide on every failing case are no
    conflict: each case matches them all)."""
    per_field: dict[str, list[set[str]]] = {}
    for r in rows:
        # each failing case on its own: the worst's and its clause test's others (harness.run.worst_case)
        by_case = r["failure"].get("matches_by_case") or [r["failure"].get("matches") or ()]
        for matched in by_case:
            values: dict[str, set[str]] = {}
            for m in matched:
                field, eq, value = m.partition("=")
                if eq and relevant(m):
                    values.setdefault(field, set()).add(value)
            for field, vs in values.items():
                per_field.setdefault(field, []).append(vs)
    out = {}
    for field, sets in per_field.items():
        every = set.union(*sets)
        if len(every) > 1 and not set.intersection(*sets):
            out[field] = sorted(every)
    return out
