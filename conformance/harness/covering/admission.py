"""Which tuples of value classes a declaration admits: some row holding the tuple is a case it takes,
and the rules of ``harness.cases.pairs_hiding`` let the row show it.

Why apart from the generator (``harness.cases.covering``): admission is asked once per value and per
tuple before any row is built, and its answer for a tuple it cannot admit is the reason the summary
and the certificate print, so the search is worth keeping cheap and its reasons precise: first every
other parameter at its default, then a whole row found earlier for one of the tuple's values, then one
other parameter changed, then a bounded depth-first search that reports the reasons it met deepest.
"""

from __future__ import annotations

from conformance.contract import Declaration
from conformance.harness.cases import pairs_hiding
from conformance.harness.cases.pairs_cases import row_reasons
from conformance.harness.cases.pairs_space import CONSTRAINTS, PARAMETERS, violated

ORDER = {p.name: i for i, p in enumerate(PARAMETERS)}
Tuple = tuple[tuple[str, str], ...]  # ((parameter, value), ...) in table order


_CONSTRAINED = {name for c in CONSTRAINTS for name in c.params}
BUDGET = 1000  # rows checked by one completion (ten times that for one that avoids values)
_CONSTRAINED_FIRST = sorted(PARAMETERS, key=lambda p: p.name not in _CONSTRAINED)


def _shows(decl: Declaration, row: dict[str, str], start: dict[str, str]) -> bool:
    """``start``'s values are observable in the complete ``row`` (by the rules)."""
    tup = tuple(sorted(start.items(), key=lambda kv: ORDER[kv[0]]))
    direction = "backward" if start.get("direction") == "backward" else "forward"
    classes = {**row, "direction": direction} if "direction" in row else row
    return pairs_hiding.observable(tup, pairs_hiding.predicted(classes, decl, direction))


def complete(
    decl: Declaration, start: dict[str, str], t: int, defaults: dict[str, str], avoid: frozenset = frozenset()
):
    """(``start`` extended to a whole admitted row that shows it, None) or (None, the reasons met
    deepest in the search).

    Missing parameters are tried in table order, those that constraints name first (a dead end shows
    early), values in listed order, depth-first with backtracking (a bounded number of checks). With
    ``avoid`` ((parameter, value) pairs), a row without them is searched for first."""
    if avoid:
        row, _ = _complete(decl, start, t, defaults, avoid, 10 * BUDGET)
        if row is not None:
            return row, None
    return _complete(decl, start, t, defaults, frozenset(), BUDGET)


def _complete(
    decl: Declaration, start: dict[str, str], t: int, defaults: dict[str, str], avoid: frozenset, checks: int
):
    missing = [p for p in _CONSTRAINED_FIRST if p.name not in start]
    budget = [checks]
    deepest: list = [-1, row_reasons(decl, {**defaults, **start}, t, defaults)]

    def extend(row: dict[str, str], i: int) -> dict[str, str] | None:
        if i == len(missing):
            return row if _shows(decl, row, start) else None
        for v in missing[i].values:
            if (missing[i].name, v.name) in avoid:
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return None
            cand = {**row, missing[i].name: v.name}
            why = row_reasons(decl, cand, t, defaults)
            if why and i >= deepest[0]:
                deepest[:] = [i, why]
            if not why:
                done = extend(cand, i + 1)
                if done is not None:
                    return done
        return None

    row = extend(dict(start), 0)
    return (row, None) if row is not None else (None, deepest[1])


def admit(
    decl: Declaration, start: dict[str, str], t: int, defaults: dict[str, str], witness: dict | None = None
) -> str | None:
    """None when some admitted row holds ``start`` and shows it (first try: every other parameter at
    its default; then a row found earlier for one of its values, ``witness``), else why not."""
    first = {**defaults, **start}
    if not row_reasons(decl, first, t, defaults) and _shows(decl, first, start):
        return None
    own = violated(start)  # a constraint between the values themselves: no other parameter can help
    if own:
        return "; ".join(own)
    for item in start.items():
        known = (witness or {}).get(item)
        if known is not None:
            cand = {**known, **start}
            if not row_reasons(decl, cand, t, defaults) and _shows(decl, cand, start):
                return None
    for p in _CONSTRAINED_FIRST:  # one other parameter off its default is usually enough
        if p.name not in start:
            for v in p.values[1:]:
                cand = {**first, p.name: v.name}
                if not row_reasons(decl, cand, t, defaults) and _shows(decl, cand, start):
                    return None
    row, deepest = complete(decl, start, t, defaults)
    if row is not None:
        if witness is not None and len(start) == 1:
            witness.update(dict.fromkeys(start.items(), row))
        return None
    reasons = row_reasons(decl, first, t, defaults)
    if not reasons:
        return "no admitted row shows it: " + "; ".join(pairs_hiding.describe(_hidden_start(decl, first, start)))
    if deepest and deepest != reasons:  # the defaults' conflict, and what stopped every other completion
        return "; ".join(reasons) + "; and with other values: " + "; ".join(deepest)
    return "; ".join(reasons or ["no admitted row found"])


def _hidden_start(decl, row, start):
    direction = "backward" if start.get("direction") == "backward" else "forward"
    hidden = pairs_hiding.predicted({**row, "direction": direction}, decl, direction)
    return {e: h for e, h in hidden.items() if e in start.items()}
