"""Covering arrays over the value-class table: every admitted t-tuple of values in some row.

Why written here and not taken from PyPI: the one maintained pure-Python library (allpairspy) builds
pairs only (t = 2) and takes constraints as a filter over a row prefix, with no way to say *why* a
tuple was left out; the suite must list every excluded tuple with its reason and needs t = 3 for the
thorough profile. The generator is the one-row-at-a-time greedy of AETG / PICT, made deterministic
(no random candidates): each row starts from the first still-uncovered tuple and gives every other
parameter, in table order, the admitted value that covers most uncovered tuples together with the
values already in the row (ties: the value listed first, so defaults win). For the table of
``harness.cases.pairs_space`` it builds ~60-70 rows for t = 2, about what IPOG gives.

A tuple is *admitted* when some row containing it is a case the declaration takes
(``harness.cases.pairs_cases.row_reasons``); otherwise it is *excluded* with the reasons. A plan is a pure
function of the declaration and t (cached per process), so every pytest-xdist worker and the
controlling process that writes the summary compute the same one.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

from conformance.contract import DTYPES, Declaration
from conformance.harness.cases.pairs_cases import row_reasons
from conformance.harness.cases.pairs_space import CONSTRAINTS, DEFAULTS, PARAMETERS, violated

ORDER = {p.name: i for i, p in enumerate(PARAMETERS)}
JOIN = " \u00d7 "  # " × " between the values of a tuple, each "parameter: value"
Tuple = tuple[tuple[str, str], ...]  # ((parameter, value), ...) in table order


def name(tup: Tuple) -> str:
    """``"heads: 8:1 × mask form: [B,1,T,S]"``: the tuple as the summary and the certificate show it."""
    return JOIN.join(f"{p}: {v}" for p, v in tup)


def tuples_of(row: dict[str, str], t: int) -> list[Tuple]:
    items = sorted(row.items(), key=lambda kv: ORDER[kv[0]])
    return [tuple(c) for c in itertools.combinations(items, t)]


@dataclass
class Plan:
    """The rows of one adapter's covering array, and what it admits and excludes."""

    t: int
    defaults: dict[str, str]
    rows: list[dict[str, str]] = field(default_factory=list)
    admitted: list[Tuple] = field(default_factory=list)
    excluded: dict[Tuple, str] = field(default_factory=dict)  # tuple -> reason
    excluded_values: dict[tuple[str, str], str] = field(default_factory=dict)  # (parameter, value) -> reason


def defaults_for(decl: Declaration) -> dict[str, str]:
    """The table's defaults, the dtype replaced by the first declared one (in ``DTYPES`` order)."""
    dtype = next((d for d in DTYPES if d in decl.dtypes), DEFAULTS["dtype"])
    return {**DEFAULTS, "dtype": dtype}


_CONSTRAINED = {name for c in CONSTRAINTS for name in c.params}
_CONSTRAINED_FIRST = sorted(PARAMETERS, key=lambda p: p.name not in _CONSTRAINED)


def _complete(decl: Declaration, start: dict[str, str], t: int, defaults: dict[str, str]):
    """(``start`` extended to a whole admitted row, None) or (None, the reasons met deepest in the search).

    Missing parameters are tried in table order, those that constraints name first (a dead end shows
    early), values in listed order, depth-first with backtracking (a bounded number of checks)."""
    missing = [p for p in _CONSTRAINED_FIRST if p.name not in start]
    budget = [3000]
    deepest: list = [-1, row_reasons(decl, {**defaults, **start}, t, defaults)]

    def extend(row: dict[str, str], i: int) -> dict[str, str] | None:
        if i == len(missing):
            return row
        for v in missing[i].values:
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


def _admit(decl: Declaration, start: dict[str, str], t: int, defaults: dict[str, str]) -> str | None:
    """None when some admitted row holds ``start`` (first try: every other parameter at its default),
    else why not."""
    if not row_reasons(decl, {**defaults, **start}, t, defaults):
        return None
    own = violated(start)  # a constraint between the values themselves: no other parameter can help
    if own:
        return "; ".join(own)
    for p in _CONSTRAINED_FIRST:  # one other parameter off its default is usually enough
        if p.name not in start:
            for v in p.values[1:]:
                if not row_reasons(decl, {**defaults, **start, p.name: v.name}, t, defaults):
                    return None
    row, deepest = _complete(decl, start, t, defaults)
    if row is not None:
        return None
    first = row_reasons(decl, {**defaults, **start}, t, defaults)
    if deepest and deepest != first:  # the defaults' conflict, and what stopped every other completion
        return "; ".join(first) + "; and with other values: " + "; ".join(deepest)
    return "; ".join(first or ["no admitted row found"])


@functools.lru_cache(maxsize=64)
def plan(decl: Declaration, t: int = 2) -> Plan:
    """The covering array of strength ``t`` for ``decl`` (deterministic; cached)."""
    defaults = defaults_for(decl)
    out = Plan(t=t, defaults=defaults)
    values: dict[str, list[str]] = {}
    for p in PARAMETERS:
        values[p.name] = []
        for v in p.values:
            why = _admit(decl, {p.name: v.name}, t, defaults)
            if why:
                out.excluded_values[(p.name, v.name)] = why
            else:
                values[p.name].append(v.name)
    lower: dict[Tuple, str] = {}  # for t = 3: the excluded pairs (a triple holding one is excluded too)
    if t > 2:
        lower = plan(decl, t - 1).excluded
    for params in itertools.combinations([p.name for p in PARAMETERS], t):
        for combo in itertools.product(*(values[p] for p in params)):
            tup = tuple(zip(params, combo))
            why = next((lower[sub] for sub in itertools.combinations(tup, t - 1) if sub in lower), None)
            why = why or _admit(decl, dict(tup), t, defaults)
            if why:
                out.excluded[tup] = why
            else:
                out.admitted.append(tup)
    uncovered = dict.fromkeys(out.admitted)  # insertion-ordered set
    while uncovered:
        seed = next(iter(uncovered))
        row = _grow(decl, dict(seed), values, uncovered, t, defaults)
        if row is None:  # admitted by some completion, but not by the greedy one: complete it plainly
            row = _complete(decl, dict(seed), t, defaults)[0]
        if row is None:
            out.excluded[seed] = "no admitted row found for it"
            out.admitted.remove(seed)
            del uncovered[seed]
            continue
        out.rows.append(row)
        for tup in tuples_of(row, t):
            uncovered.pop(tup, None)
    return out


def _grow(decl, row, values, uncovered, t, defaults) -> dict[str, str] | None:
    for p in PARAMETERS:
        if p.name in row:
            continue
        assigned = sorted(row.items(), key=lambda kv: ORDER[kv[0]])
        groups = [
            (others, sum(ORDER[q] < ORDER[p.name] for q, _ in others))
            for others in itertools.combinations(assigned, t - 1)
        ]
        best, best_gain = None, -1
        for v in values[p.name]:
            if row_reasons(decl, {**row, p.name: v}, t, defaults):
                continue
            item = ((p.name, v),)
            gain = sum((others[:k] + item + others[k:]) in uncovered for others, k in groups)
            if gain > best_gain:
                best, best_gain = v, gain
        if best is None:
            return None
        row[p.name] = best
    return row


def reached(record: dict[str, str], t: int) -> list[str]:
    """The names of the t-tuples a case in the value classes ``record`` reaches."""
    return [name(tup) for tup in tuples_of(record, t)]
