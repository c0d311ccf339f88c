"""Values that hide others: a pair that reached the kernel is credited only where it could change the result.

Why: with one key (S = 1) the softmax of a row is 1 whatever its scores, so dQ and dK are zero and
Dk, the scale and a finite M cannot change anything; a kernel whose backward is wrong only above
Dk = 192 passes a row that holds "Dk: 256 x backward" together with S = 1. The combinatorial-testing
literature calls this masking (Yilmaz, Dumlu, Cohen and Porter, "Reducing masking effects in
combinatorial interaction testing"; Colbourn and McClary, "Locating and detecting arrays for
interaction faults"): a tuple is covered only in a row where it can change the result.

``RULES`` is the table (docs/case-space.md shows it): each names the values that hide, the direction
they hide in, and what they hide. :func:`predicted` applies it to a row of classes (the covering
array's generator steers by it); :func:`in_case` decides on the case itself, from the blocked set the
oracle computes (a mask that blocks only what causal blocks anyway hides itself, a row that sees one
key hides its scores), and is what coverage counts. A value is hidden *by* some values (its hiders);
a tuple is observable unless one of its values is hidden by values outside the tuple, so a pair that
holds the hider itself ("S: 1 x Dk: 80") is covered where the hider's own effect shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from conformance import oracle
from conformance.contract import Case, Declaration
from conformance.harness.covering.table import DEFAULTS, LEADING_TILE, PARAMETERS, SOME_KEYS, SUBSETS, Call

Item = tuple[str, str]  # (parameter, value)
Hidden = dict[Item, list[frozenset[Item]]]  # a hidden value -> the sets of values that hide it
FINITE_M = ("finite small", "finite large negative on whole rows")
EVERYTHING = "everything else (in dQ and dK, which are zero)"


@dataclass(frozen=True)
class Rule:
    """Values (``hider``) that hide others in a direction, as the table shows it."""

    hider: str
    direction: str
    hides: str
    why: str


RULES: tuple[Rule, ...] = (
    Rule("S: 1", "both", "Dk, scale, a finite M, causal (top-left)", "the one key's weight is 1 whatever its score"),
    Rule("S: 1", "backward", EVERYTHING, "a constant softmax has no gradient"),
    Rule("T: 1 (bottom-right causal)", "both", "causal: on", "the one query sees every key"),
    Rule(
        "T: 1 with causal: on (top-left)",
        "both",
        "Dk, scale, a finite M, -inf on some keys, a mask with some keys blocked",
        "the one query sees key 0 alone (a mask or -inf that blocks key 0 leaves it to the fill)",
    ),
    Rule("T: 1 with causal: on (top-left)", "backward", EVERYTHING, "one key per row: a constant softmax"),
    Rule("scale: zero", "forward", "Dk", "every score is 0 (plus M): Q and K cannot matter"),
    Rule("scale: zero", "backward", EVERYTHING, "dQ and dK carry the scale"),
    Rule(
        "layout: expanded",
        "both",
        "B (expanded along B), or the heads (expanded along H, when B = 1)",
        "every batch item (head) holds the same Q, K, V: a batch (head) mixed up reads the same numbers",
    ),
    Rule(
        "mask content: leading keys blocked over a whole tile",
        "both",
        "the mask form (which axes it varies along)",
        "every row of the mask is the same: a mask read for the wrong head or batch item reads the same row",
    ),
    Rule(
        "any row where every query sees one key, or none (in the case itself)",
        "both",
        "Dk, scale, a finite M; in the backward everything",
        "the blocked set of the case, computed by the oracle; the row is rebuilt with other draws",
    ),
    Rule(
        "a mask, causal or -inf M that blocks nothing the others do not (in the case itself)",
        "both",
        "itself",
        "it cannot change which keys a row sees",
    ),
    Rule(
        "requires grad: some of query, key, value only",
        "backward",
        "everything else (in the gradients not asked for)",
        "a gradient nobody asks for is never computed: a bug that lives in it cannot show",
    ),
    Rule(
        "additive M other than none",
        "both",
        "mask memory (a pitch or an address of the boolean mask's own)",
        "a caller with one attention mask folds the boolean mask and M into a new array of its own memory",
    ),
)


def observable(tup: Iterable[Item], hidden: Hidden) -> bool:
    """True unless a value of ``tup`` is hidden by values outside ``tup``."""
    if not hidden:
        return True
    items = set(tup)
    return all(all(h <= items for h in hidden.get(e, ())) for e in items)


def _hide(out: Hidden, items: Iterable[Item], by: Iterable[Item]) -> None:
    h = frozenset(by)
    for e in items:
        if e not in h:
            out.setdefault(e, []).append(h)


def _pick(row: dict[str, str], params: dict[str, object]) -> list[Item]:
    """The row's items whose parameter is in ``params`` and whose value is listed (None: any value)."""
    out = []
    for p, values in params.items():
        if p in row and (values is None or row[p] in values):
            out.append((p, row[p]))
    return out


def predicted(row: dict[str, str], decl: Declaration, direction: str) -> Hidden:
    """What ``RULES`` hide in ``row`` (a row of classes, possibly partial) run in ``direction``."""
    out: Hidden = {}
    g = row.get
    everything = list(row.items())
    top_left = decl.causal_alignment == "top-left"
    if g("S") == "1":
        hider = [("S", "1")]
        causal = top_left or g("T") == "1"
        _hide(out, _pick(row, {"Dk": None, "scale": None, "additive M": FINITE_M, "causal": ("on",) * causal}), hider)
        if direction == "backward":
            _hide(out, everything, hider)
    elif g("T") == "1" and g("causal") == "on" and not top_left:  # bottom-right: the one query sees every key
        _hide(out, [("causal", "on")], [("T", "1")])
    if g("T") == "1" and g("causal") == "on" and top_left:
        hider = [("T", "1"), ("causal", "on")]
        if g("mask content") == LEADING_TILE:  # key 0 blocked: every row is empty
            _hide(out, everything, [*hider, ("mask content", LEADING_TILE)])
        hides = {"Dk": None, "scale": None, "additive M": (*FINITE_M, "-inf on some keys")}
        if g("mask content") == SOME_KEYS:
            hides.update({"mask form": None, "mask content": (SOME_KEYS,)})
        _hide(out, _pick(row, hides), hider)
        if direction == "backward":
            _hide(out, everything, hider)
    if g("mask content") == LEADING_TILE and g("mask form") not in (None, "none", "[S]"):
        _hide(out, [("mask form", g("mask form"))], [("mask content", LEADING_TILE)])  # the same row everywhere
    if g("scale") == "zero":
        _hide(out, _pick(row, {"Dk": None}), [("scale", "zero")])
        if direction == "backward":
            _hide(out, everything, [("scale", "zero")])
    if direction == "backward" and g("requires grad") in SUBSETS:
        _hide(out, everything, [("requires grad", g("requires grad"))])
    _mask_memory_folded(out, row)
    if g("layout") == "expanded":  # Q, K, V the same in every batch item (head): a mask or M varying does not help
        if g("B") not in (None, "1"):
            _hide(out, _pick(row, {"B": None}), [("layout", "expanded")])
        if g("B") == "1":
            _hide(out, _pick(row, {"heads": None}), [("layout", "expanded")])
    return out


def _mask_memory_folded(out: Hidden, row: dict[str, str]) -> None:
    """A boolean mask's own memory does not reach a kernel that takes one attention mask when an additive M is
    given too: the caller folds both into one new float array, in memory of its own. (Causal is passed beside the
    mask where the kernel takes both: a plain function does; torch's own SDPA takes no mask with is_causal, and its
    adapter folds them, so there the pair of a pitched mask with causal is reached in name only.)"""
    mem = row.get("mask memory")
    if mem in (None, "as its form says"):
        return
    m = row.get("additive M")
    if m not in (None, "none"):
        _hide(out, [("mask memory", mem)], [("additive M", m)])


# -- in the case itself --------------------------------------------------------------------------------
_BLOCKING = ("S", "T", "mask form", "mask content", "additive M", "causal")


def _constant_along(a, axis: int) -> bool:
    a = np.asarray(a)
    if a.ndim < 4 - axis or a.shape[axis - 4] == 1 or a.strides[axis - 4] == 0:
        return True
    first = np.take(a, [0], axis=axis - 4)
    return bool(np.array_equal(a, np.broadcast_to(first, a.shape)))


def in_case(case: Case, how: Call, decl: Declaration, classes: dict[str, str]) -> Hidden:
    """What is hidden in ``case`` sent as ``how``, whose value classes are ``classes``."""
    out: Hidden = {}
    everything = list(classes.items())
    top_left = decl.causal_alignment == "top-left"
    backward = how.direction == "backward"

    def hiders(exclude: str = "") -> list[Item]:
        if case.S == 1:
            return [("S", "1")]
        if case.T == 1 and case.is_causal and top_left:
            return [("T", "1"), ("causal", "on")]
        return [(p, classes[p]) for p in _BLOCKING if p in classes and p != exclude and classes[p] != DEFAULTS[p]]

    blocked, _ = oracle.blocked_and_bias(case, decl.causal_alignment)
    # a mask, causal or -inf M that changes no row's visible keys hides itself
    for param, without in (
        ("mask", case.replace(mask=None)),
        ("causal", case.replace(is_causal=False)),
        (
            "additive M",
            case.replace(bias=None if case.bias is None else np.where(np.isneginf(case.bias), 0.0, case.bias)),
        ),
    ):
        present = {"mask": case.mask is not None, "causal": case.is_causal}.get(
            param, case.bias is not None and bool(np.isneginf(np.asarray(case.bias)).any())
        )
        if present and np.array_equal(blocked, oracle.blocked_and_bias(without, decl.causal_alignment)[0]):
            params = ("mask form", "mask content") if param == "mask" else (param,)
            mine = [(p, classes[p]) for p in params if p in classes]
            exclude = "mask content" if param == "mask" else param
            _hide(out, mine, [h for h in hiders(exclude) if h[0] not in params])
    visible = (~blocked).sum(axis=-1)
    live = visible > 0
    if not live.any() or (visible[live] == 1).all():
        h = hiders()
        scores = [(p, classes[p]) for p in ("Dk", "scale") if p in classes]
        if classes.get("additive M") in FINITE_M:
            scores.append(("additive M", classes["additive M"]))
        _hide(out, everything if not live.any() or backward else scores, h)
        if backward:
            _hide(out, everything, h)
    if case.mask is not None and np.ndim(case.mask) > 1 and "mask form" in classes:
        rows = np.asarray(case.mask).reshape(-1, case.S)
        if (rows == rows[:1]).all():  # every row of the mask the same: which axes it has cannot show
            _hide(out, [("mask form", classes["mask form"])], [("mask content", classes.get("mask content", ""))])
    if case.scale == 0:
        _hide(out, [(p, classes[p]) for p in ("Dk",) if p in classes], [("scale", "zero")])
        if backward:
            _hide(out, everything, [("scale", "zero")])
    if backward and classes.get("requires grad") in SUBSETS:
        _hide(out, everything, [("requires grad", classes["requires grad"])])
    _mask_memory_folded(out, classes)
    # a batch item (head) mixed up reads the same Q, K, V: what varies in a mask or M does not show it
    arrays = [case.query, case.key, case.value]
    for axis, param in ((0, "B"), (1, "heads")):
        n = case.B if axis == 0 else case.Hq
        if n > 1 and param in classes and all(_constant_along(a, axis) for a in arrays):
            _hide(out, [(param, classes[param])], [("layout", classes.get("layout", "expanded"))])
    return out


def describe(hidden: Hidden) -> list[str]:
    """``"Dk: 256 (by S: 1)"`` for each hidden value, for a failure report or a certificate."""
    order = {p.name: i for i, p in enumerate(PARAMETERS)}
    out = []
    for (p, v), hs in sorted(hidden.items(), key=lambda kv: order.get(kv[0][0], 99)):
        by = " | ".join(" and ".join(f"{a}: {b}" for a, b in sorted(h)) for h in hs)
        out.append(f"{p}: {v} (by {by})")
    return out
