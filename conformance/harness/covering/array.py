"""Covering arrays over the value-class table: every admitted t-tuple of values in some row where it shows.

Why written here and not taken from PyPI: the one maintained pure-Python library (allpairspy) builds
pairs only (t = 2) and takes constraints as a filter over a row prefix, with no way to say *why* a
tuple was left out; the suite must list every excluded tuple with its reason, needs t = 3 for the
thorough profile, and must credit a tuple only in a row where no third value hides it
(``harness.covering.hiding``). The generator is the one-row-at-a-time greedy of AETG / PICT, made
deterministic: each row starts from the first tuple not yet shown and gives every other parameter,
in table order, the admitted value under which most tuples not yet shown become observable (ties:
the value listed first, so defaults win), never one that hides a value of the row's first tuple.
The finished row is then built as its case (each class at its k-th candidate,
``harness.covering.ranges``) and the tuples observable *in that case* (``hiding.in_case``)
are what it covers; a case that hides more than the rules foresaw is rebuilt with other draws.

A tuple is *admitted* when some row of classes containing it is a case the declaration takes and
shows it (``harness.covering.admission``); otherwise it is *excluded* with the reasons. A plan is a pure
function of the declaration, t and the profile (cached per process and on disk,
``harness.covering.cache``), so every pytest-xdist worker and the controlling process that writes
the summary compute the same one.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

from conformance.contract import DTYPES, Declaration
from conformance.harness.covering import cache, hiding, ranges
from conformance.harness.covering.admission import ORDER, Tuple, admit, complete, row_reasons
from conformance.harness.covering.build import build_planned
from conformance.harness.covering.table import DEFAULTS, PARAMETERS, reached_values
from conformance.harness.covering.tuples import (
    observable_tuples,
    records_of,
    tuples_of,
)

SEED = 7300  # row i of a plan is built from SEED + i (a rebuilt row: + 1000 per retry)
RETRIES = 3


@dataclass
class Plan:
    """The rows of one adapter's covering array, how each is built, and what it admits and excludes."""

    t: int
    defaults: dict[str, str]
    rows: list[dict[str, str]] = field(default_factory=list)
    picks: list[dict[str, int]] = field(default_factory=list)  # row i: parameter -> k (its class's k-th candidate)
    seeds: list[int] = field(default_factory=list)  # row i is built from seeds[i]
    admitted: list[Tuple] = field(default_factory=list)
    excluded: dict[Tuple, str] = field(default_factory=dict)  # tuple -> reason
    excluded_values: dict[tuple[str, str], str] = field(default_factory=dict)  # (parameter, value) -> reason


def defaults_for(decl: Declaration) -> dict[str, str]:
    """The table's defaults, the dtype replaced by the first declared one (in ``DTYPES`` order)."""
    dtype = next((d for d in DTYPES if d in decl.dtypes), DEFAULTS["dtype"])
    return {**DEFAULTS, "dtype": dtype}


@functools.lru_cache(maxsize=64)
def plan(decl: Declaration, t: int = 2) -> Plan:
    """The covering array of strength ``t`` for ``decl`` (deterministic; cached in the process and on
    disk, ``harness.covering.cache``)."""
    k = cache.key(decl, t, ranges.draws())
    known = cache.load(k)
    if known is not None:
        try:
            return Plan(**cache.decode(known))
        except (KeyError, TypeError, ValueError):
            pass
    out = build_plan(decl, t)
    cache.store(k, cache.encode(out))
    return out


def build_plan(decl: Declaration, t: int = 2) -> Plan:
    """The covering array of strength ``t`` for ``decl``, built (no cache)."""
    defaults = defaults_for(decl)
    out = Plan(t=t, defaults=defaults)
    values: dict[str, list[str]] = {}
    witness: dict[tuple[str, str], dict[str, str]] = {}  # a value -> a whole admitted row that holds it
    for p in PARAMETERS:
        values[p.name] = []
        for v in p.values:
            why = admit(decl, {p.name: v.name}, t, defaults, witness)
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
            why = why or admit(decl, dict(tup), t, defaults, witness)
            if why:
                out.excluded[tup] = why
            else:
                out.admitted.append(tup)
    _fill(decl, out, values, t, defaults)
    return out


def _fill(decl: Declaration, out: Plan, values, t: int, defaults: dict[str, str]) -> None:
    """Rows until every admitted tuple is shown by one (or excluded, with why no built row showed it)."""
    uncovered = dict.fromkeys(out.admitted)  # insertion-ordered set
    uses: dict[tuple[str, str], int] = {}
    missed: dict[Tuple, int] = {}
    while uncovered:
        seed = next(iter(uncovered))
        row = _grow(decl, dict(seed), values, uncovered, t, defaults)
        if row is None:  # admitted by some completion, but not by the greedy one: complete it plainly
            row = complete(decl, dict(seed), t, defaults)[0]
        shown: set[Tuple] = set()
        if row is not None:
            picks = {p: uses.get((p, v), 0) for p, v in row.items()}
            shown, build_seed = _shown(decl, row, picks, len(out.rows), t)
        new = shown & uncovered.keys()
        if row is not None and new:
            out.rows.append(row)
            out.picks.append(picks)
            out.seeds.append(build_seed)
            for item in row.items():
                uses[item] = uses.get(item, 0) + 1
            for tup in new:
                del uncovered[tup]
        if seed in uncovered:  # its row did not show it: try once more from the back of the queue, then exclude
            missed[seed] = missed.get(seed, 0) + 1
            del uncovered[seed]
            if missed[seed] < 2:
                uncovered[seed] = None
            else:
                why = "no row built for it shows it"
                if row is not None:
                    why += ": " + "; ".join(_why_hidden(decl, row, picks, build_seed, seed))
                out.excluded[seed] = why
                out.admitted.remove(seed)


def row_showing(
    decl: Declaration, tup: Tuple, t: int, defaults: dict[str, str], i: int, avoid: frozenset = frozenset()
):
    """(row, picks, seed) of a row of its own that shows ``tup``, or None: what the covering clause runs
    again for a tuple the plan's row for it never showed (the kernel raised on that row). Tried in turn:
    every other value at its default; one other value changed (a mask content needs a mask form), none
    of ``avoid`` (values the kernel raised on); a plain completion."""
    need = dict(tup)
    full = {**defaults, **need}
    rows = [full]
    for p in PARAMETERS:
        if p.name not in need:
            rows += [
                {**full, p.name: v.name} for v in p.values if v.name != full[p.name] and (p.name, v.name) not in avoid
            ]
    rows = [r for r in rows if not row_reasons(decl, r, t, defaults)][:4]
    rows += [r for r in (complete(decl, need, t, defaults, avoid)[0],) if r is not None and r not in rows]
    for row in rows:
        for k in range(3):  # the k-th candidate of every class: B "equal to H" needs an H to equal
            picks = {p: k for p in row}
            shown, seed = _shown(decl, row, picks, i, t)
            if any(set(tup) <= set(x) for x in shown):  # a tuple of the plan's strength that holds it
                return row, picks, seed
    return None


def _shown(decl: Declaration, row: dict[str, str], picks: dict[str, int], i: int, t: int) -> tuple[set[Tuple], int]:
    """The tuples the case of ``row`` shows, and its seed: rebuilt with other draws (up to ``RETRIES``
    times) while the case hides a tuple the rules say it shows."""
    foreseen = observable_tuples(records_of(row), t, lambda how, c: hiding.predicted(c, decl, how.direction))
    best: tuple[set[Tuple], int] = (set(), SEED + i)
    for attempt in range(RETRIES):
        seed = SEED + i + 1000 * attempt
        case, _ = build_planned(row, decl, seed, picks, t)
        records = [(how, reached_values(case, how, c)) for how, c in records_of(row)]  # what the clause records
        shown = observable_tuples(records, t, lambda how, c, case=case: hiding.in_case(case, how, decl, c))
        if len(shown) > len(best[0]):
            best = (shown, seed)
        if foreseen <= shown:
            break
    return best


def _why_hidden(decl, row, picks, seed, tup) -> list[str]:
    case, _ = build_planned(row, decl, seed, picks, 2)
    out = []
    for how, classes in records_of(row):
        hidden = hiding.in_case(case, how, decl, classes)
        out += hiding.describe({e: h for e, h in hidden.items() if e in tup})
    return sorted(set(out)) or ["the rules hide it"]


def _grow(decl, row, values, uncovered, t, defaults) -> dict[str, str] | None:
    """The row that starts from the tuple ``row`` and shows most uncovered tuples (by the rules)."""
    start = dict(row)
    for p in PARAMETERS:
        if p.name in row:
            continue
        assigned = sorted(row.items(), key=lambda kv: ORDER[kv[0]])
        groups = [
            (others, sum(ORDER[q] < ORDER[p.name] for q, _ in others))
            for others in itertools.combinations(assigned, t - 1)
        ]
        before = _gain_view(decl, row)
        base = None
        gains = []  # (gain, order listed, value) of each value that hides nothing of the first tuple
        for i, v in enumerate(values[p.name]):
            cand = {**row, p.name: v}
            after = _gain_view(decl, cand)
            if not all(hiding.observable(tuple(start.items()), h) for h in after.values()):
                continue  # never hide a value of the row's first tuple
            item = ((p.name, v),)
            new = [others[:k] + item + others[k:] for others, k in groups]
            if _same_hiding(before, after, row):
                gain = sum(tup in uncovered and _obs(tup, after) for tup in new)
            else:  # the value hides (or reveals) values already in the row: count the row again
                if base is None:
                    base = _count(before, row, t, uncovered)
                gain = _count(after, cand, t, uncovered) - base
            gains.append((-gain, i, v))
        # the most gaining value the declaration admits here, the first listed among equals: admission (the
        # costly question) asked in that order, so mostly of one value, not of every value
        gains.sort()
        best = next((v for _, _, v in gains if not row_reasons(decl, {**row, p.name: v}, t, defaults)), None)
        if best is None:
            return None
        row[p.name] = best
    return row


def _gain_view(decl, row) -> dict[str, hiding.Hidden]:
    """The hidden values of each call the (partial) row makes, by the rules."""
    out = {"forward": hiding.predicted(row, decl, "forward")}
    if row.get("direction") == "backward":
        out["backward"] = hiding.predicted(row, decl, "backward")
    return out


def _same_hiding(before, after, row) -> bool:
    return all(
        {e: h for e, h in after.get(d, {}).items() if e in row.items()}
        == {e: h for e, h in hs.items() if e in row.items()}
        for d, hs in before.items()
    ) and set(after) == set(before)


def _obs(tup: Tuple, view) -> bool:
    """Observable in the call its direction makes (a tuple without a direction: in the forward)."""
    direction = dict(tup).get("direction", "forward")
    return hiding.observable(tup, view.get(direction, view["forward"]))


def _count(view, row, t, uncovered) -> int:
    return sum(tup in uncovered and _obs(tup, view) for tup in tuples_of(row, t))
