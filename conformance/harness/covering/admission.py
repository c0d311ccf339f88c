"""Whether a row of value classes can be a case for a declaration, and which tuples a declaration admits.

A row is admitted when its case, at its classes' smallest members, is one the declaration takes
(``Declaration.not_supported_reasons`` on a shape-only probe: the one vocabulary), and the suite's own
rules allow it: the constraints between values (``table.CONSTRAINTS``), rows blocked entirely where the
declaration defines no fill (``strategies.empty_rows_allowed``), the backward only where ``grad`` is
declared, a presentation only where the adapter presents it (``Declaration.presents``), a row "called
again" only where it has a *twin* (the row it runs after: the same Q, K, V shapes and dtype, every other
value changed, :func:`twin`), and a cost budget per profile (a row above it is excluded by cost, never
dropped silently): :func:`row_reasons`.

A tuple is admitted when some admitted row holds it and the rules of ``hiding`` let the row show it:
:func:`admit` tries every other parameter at its default, then a row found earlier for one of its
values, then one other parameter changed, then a bounded depth-first search (:func:`complete`) that
reports the reasons it met deepest. Asked once per value and per tuple before any row is built, and its
answer for a tuple it cannot admit is the reason the summary and the certificate print, so the search is
kept cheap and its reasons precise.
"""

from __future__ import annotations

import functools

import numpy as np

from conformance.contract import Case, Declaration, np_dtype
from conformance.harness.cases.strategies import empty_rows_allowed
from conformance.harness.covering import hiding
from conformance.harness.covering.draws import BUDGET as ROW_BUDGET
from conformance.harness.covering.draws import DROPOUT_BUDGET, SCORES, smallest
from conformance.harness.covering.table import (
    ARGUMENT_MEMORY,
    AS_BUILT,
    AS_LAYOUT,
    BY_DIRECTION,
    BY_NAME,
    CONSTRAINTS,
    DEFAULTS,
    LEADING_TILE,
    MIXED,
    NON_SHAPE_PARAMETERS,
    OFFSET,
    PARAMETERS,
    SWITCHES,
    violated,
)

SCALE = {"default": None, "custom": 0.3, "negative": -0.5, "zero": 0.0}  # the probe's scales (any member will do)
DROPOUT_P = 0.5


def sizes(row: dict[str, str]) -> dict[str, int]:
    """B, Hq, Hkv, T, S, Dk, Dv of ``row`` at its classes' smallest members (missing: the defaults)."""
    return smallest(row)


def cost(row: dict[str, str]) -> int:
    z = sizes(row)
    return z["B"] * z["Hq"] * z["T"] * z["S"] * (z["Dk"] + z["Dv"])


def _probe(r: dict[str, str], z: dict[str, int]) -> Case:
    """The row's case without its values (stride-0 zeros): enough for ``not_supported_reasons``."""
    dt = np_dtype(r["dtype"])

    def zeros(*shape):  # stride 0 but along the feature axis: little memory, and cheaper than np.broadcast_to
        row = np.zeros(shape[-1], dtype=dt)  # (the planner calls this often)
        return np.ndarray(shape, dtype=dt, buffer=row, strides=(0,) * (len(shape) - 1) + (dt.itemsize,))

    return Case(
        zeros(z["B"], z["Hq"], z["T"], z["Dk"]),
        zeros(z["B"], z["Hkv"], z["S"], z["Dk"]),
        zeros(z["B"], z["Hkv"], z["S"], z["Dv"]),
        mask=None if r["mask form"] == "none" else np.zeros((1, 1, 1, z["S"]), dtype=bool),
        bias=None if r["additive M"] == "none" else np.zeros((1, 1, 1, z["S"])),
        is_causal=r["causal"] == "on",
        scale=SCALE[r["scale"]],
        dropout_p=DROPOUT_P if r["dropout"] == "on" else 0.0,
    )


_PROBED = ("dtype", "mask form", "additive M", "causal", "scale", "dropout")


@functools.lru_cache(maxsize=1 << 14)
def _unsupported(decl: Declaration, values: tuple, z: tuple) -> list[str]:
    """``decl.not_supported_reasons`` of the row's probe (it depends on these values and sizes only)."""
    return decl.not_supported_reasons(_probe(dict(zip(_PROBED, values)), dict(z)))


def meant_empty_rows(r: dict[str, str], decl: Declaration, z: dict[str, int]) -> bool:
    causal = r["causal"] == "on"
    return (
        r["mask content"] == "rows blocked entirely"
        or r["additive M"] == "-inf on whole rows"
        or (causal and r["mask content"] == LEADING_TILE)
        or (causal and decl.causal_alignment == "bottom-right" and z["T"] > z["S"])
    )


def row_reasons(
    decl: Declaration, row: dict[str, str], t: int = 2, defaults: dict[str, str] | None = None
) -> list[str]:
    """Why ``row`` cannot be a case for ``decl``; empty if it can. A partial row is checked with its
    missing parameters at ``defaults`` (the table's), except that the constraints between values are
    asked of the parameters ``row`` assigns only (so S = 1 is not refused for the default T < S)."""
    return list(_row_reasons(decl, tuple(sorted(row.items())), t, _defaults_key(defaults or DEFAULTS)))


_DEFAULTS_KEYS: dict[int, tuple[dict, tuple]] = {}  # id -> (the defaults dict, kept alive; its sorted items)


def _defaults_key(defaults: dict[str, str]) -> tuple:
    """``defaults``' sorted items, sorted once per defaults dict (a plan asks with the same one every time)."""
    known = _DEFAULTS_KEYS.get(id(defaults))
    if known is None or known[0] is not defaults or len(known[1]) != len(defaults):
        known = _DEFAULTS_KEYS[id(defaults)] = (defaults, tuple(sorted(defaults.items())))
    return known[1]


@functools.lru_cache(maxsize=1 << 16)
def _row_reasons(decl: Declaration, items: tuple, t: int, defaults: tuple) -> tuple[str, ...]:
    row = dict(items)
    r = {**dict(defaults), **row}
    reasons = violated(row)
    z = smallest(r, decl, t)
    reasons += _unsupported(decl, tuple(r[p] for p in _PROBED), tuple(z.items()))
    if r["direction"] == "backward" and not decl.grad:
        reasons.append("declares grad=False")
    has_mask, has_bias, causal = r["mask form"] != "none", r["additive M"] != "none", r["causal"] == "on"
    grad = r["direction"] == "backward"
    empty = meant_empty_rows(r, decl, z)
    if empty and not empty_rows_allowed(decl, has_mask=has_mask, has_bias=has_bias, is_causal=causal, grad=grad):
        reasons.append(
            "rows blocked entirely, with this combination of masks / causal / backward, have no fill this "
            f"declaration defines (all_blocked={decl.all_blocked}, "
            f"all_blocked_float_mask={decl.all_blocked_float_mask})"
        )
    if r["dropout"] == "on" and empty and decl.all_blocked_float_mask not in (None, decl.all_blocked):
        reasons.append(
            "with dropout a row blocked entirely is judged as its lifted boolean mask's row, whose fill this "
            "declaration defines apart from an -inf row's"
        )
    scores = z["B"] * z["Hq"] * z["T"] * z["S"]
    work = scores * (z["Dk"] + z["Dv"])
    if work > ROW_BUDGET[t]:
        reasons.append(f"cost: B*H*T*S*(Dk+Dv) = {work:,} above this profile's row budget {ROW_BUDGET[t]:,}")
    if scores > SCORES[t]:
        reasons.append(f"cost: B*H*T*S = {scores:,} scores above this profile's row budget {SCORES[t]:,}")
    if r["dropout"] == "on" and work > DROPOUT_BUDGET:
        reasons.append(f"cost: a dropout row is judged per query row; B*H*T*S*(Dk+Dv) = {work:,} > {DROPOUT_BUDGET:,}")
    reasons += presentation_reasons(decl, r)
    if r["call"] == "again" and not reasons and _twin(decl, items, t, defaults) is None:
        reasons.append("no twin: no other value of a non-shape parameter is admitted with these shapes")
    return tuple(reasons)


def presentation_reasons(decl: Declaration, r: dict[str, str]) -> list[str]:
    """Why the row's presentation cannot reach ``decl``'s kernel: the attributes it varies that the adapter
    does not present (``Declaration.presents``), or M's gradient where the kernel declares none."""
    need = set()
    if r["layout"] in (OFFSET, MIXED) or r["cotangent"] != "contiguous":
        need.add("memory")
    if r["identity"] != "distinct":
        need.add("identity")
        if r["direction"] == "backward":  # one object's gradient is autograd's sum of its parts
            need.add("requires_grad")
    if r["requires grad"] != BY_DIRECTION:
        need.add("requires_grad")
    if r["context"] in ("forward under grad", "forward under inference mode"):
        need.add("grad_mode")
    if r.get("default dtype") == "float64":
        need.add("default_dtype")
    if r["backward calls"] != "once":
        need.add("backward")
    if r["switch"] != "none" or r["second switch"] != "none":
        need.add("context")
    kinds = (None, *decl.context_kinds) if decl.context_kinds is not None else None
    unapplied = kinds is not None and any(SWITCHES[r[p]] not in kinds for p in ("switch", "second switch"))
    if r["scalar types"] != "Python float" or r["flag types"] != "Python bool":
        need.add("scalars")
    if any(r[p] not in (AS_LAYOUT, AS_BUILT) for p in ARGUMENT_MEMORY):
        need.add("memory")
    if r.get("transform", "none") != "none":
        need.add("transform")
    missing = sorted(need - decl.presents)
    reasons = []
    if missing:
        reasons.append(f"the adapter does not present {', '.join(missing)} to its kernel (Declaration.presents)")
    if unapplied:
        reasons.append("the adapter applies no switch of this kind (Declaration.context_kinds)")
    if r.get("transform") == "forward-mode AD" and not decl.grad:
        reasons.append("forward-mode AD needs derivatives (declares grad=False)")
    if r["requires grad"] == "query, key, value and M" and not decl.bias_grad:
        reasons.append("declares no gradient for the additive M (bias_grad)")
    return reasons


def twin(decl: Declaration, row: dict[str, str], t: int = 2, defaults: dict[str, str] | None = None):
    """The row a "called again" row runs after: its shape classes and dtype, every other value changed to
    the next one the declaration admits (dropout only turned off), called first. None when none can change."""
    found = _twin(decl, tuple(sorted(row.items())), t, _defaults_key(defaults or DEFAULTS))
    return None if found is None else dict(found)


@functools.lru_cache(maxsize=1 << 12)
def _twin(decl: Declaration, items: tuple, t: int, defaults: tuple) -> tuple | None:
    r = {**dict(defaults), **dict(items), "call": "first"}
    changed = 0
    for name in NON_SHAPE_PARAMETERS:
        if name == "dtype":  # a per-shape cache is keyed by the dtype too (STATE-DTYPE-03 crosses dtypes)
            continue
        names = [v.name for v in BY_NAME[name].values]
        i = names.index(r[name])
        others = names[i + 1 :] + names[:i]
        if name == "dropout":
            others = ["off"] if r[name] == "on" else []
        for v in others:
            cand = {**r, name: v}
            if not _row_reasons(decl, tuple(sorted(cand.items())), t, defaults):
                r, changed = cand, changed + 1
                break
    return tuple(sorted(r.items())) if changed else None


ORDER = {p.name: i for i, p in enumerate(PARAMETERS)}
Tuple = tuple[tuple[str, str], ...]  # ((parameter, value), ...) in table order


_CONSTRAINED = {name for c in CONSTRAINTS for name in c.params}
COMPLETION_BUDGET = 1000  # rows checked by one completion (ten times that for one that avoids values)
_CONSTRAINED_FIRST = sorted(PARAMETERS, key=lambda p: p.name not in _CONSTRAINED)


def _shows(decl: Declaration, row: dict[str, str], start: dict[str, str]) -> bool:
    """``start``'s values are observable in the complete ``row`` (by the rules)."""
    tup = tuple(sorted(start.items(), key=lambda kv: ORDER[kv[0]]))
    direction = "backward" if start.get("direction") == "backward" else "forward"
    classes = {**row, "direction": direction} if "direction" in row else row
    return hiding.observable(tup, hiding.predicted(classes, decl, direction))


def complete(
    decl: Declaration, start: dict[str, str], t: int, defaults: dict[str, str], avoid: frozenset = frozenset()
):
    """(``start`` extended to a whole admitted row that shows it, None) or (None, the reasons met
    deepest in the search).

    Missing parameters are tried in table order, those that constraints name first (a dead end shows
    early), values in listed order, depth-first with backtracking (a bounded number of checks). With
    ``avoid`` ((parameter, value) pairs), a row without them is searched for first."""
    if avoid:
        row, _ = _complete(decl, start, t, defaults, avoid, 10 * COMPLETION_BUDGET)
        if row is not None:
            return row, None
    return _complete(decl, start, t, defaults, frozenset(), COMPLETION_BUDGET)


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
                    if witness is not None and len(start) == 1:
                        witness.setdefault(next(iter(start.items())), cand)
                    return None
    known = [(witness or {}).get(item) for item in start.items()]
    if len(start) > 1 and all(k is not None for k in known):  # each value's own witness, their changes joined
        cand = dict(first)
        for k in known:
            cand.update({p: v for p, v in k.items() if p not in start and v != defaults[p]})
        if not row_reasons(decl, cand, t, defaults) and _shows(decl, cand, start):
            return None
    row, deepest = complete(decl, start, t, defaults)
    if row is not None:
        if witness is not None and len(start) == 1:
            witness.update(dict.fromkeys(start.items(), row))
        return None
    reasons = row_reasons(decl, first, t, defaults)
    if not reasons:
        return "no admitted row shows it: " + "; ".join(hiding.describe(_hidden_start(decl, first, start)))
    if deepest and deepest != reasons:  # the defaults' conflict, and what stopped every other completion
        return "; ".join(reasons) + "; and with other values: " + "; ".join(deepest)
    return "; ".join(reasons or ["no admitted row found"])


def _hidden_start(decl, row, start):
    direction = "backward" if start.get("direction") == "backward" else "forward"
    hidden = hiding.predicted({**row, "direction": direction}, decl, direction)
    return {e: h for e, h in hidden.items() if e in start.items()}
