"""The concrete sizes and values one covering row takes from its classes' ranges.

The k-th row of a plan that holds a class takes its k-th candidate (``harness.covering.ranges``).
A candidate that leaves the row's classes (T < S needs S >= 3), that the declaration refuses (a head
dim above ``max_head_dim``) or that makes the row cost more than the draw budget steps down to the
largest member that fits, or to the class's smallest member, which is what decides whether a row is
admitted at all (:func:`smallest`). Rows also keep two keys visible wherever their classes allow (a
leading tile of blocked keys leaves two; causal with it starts past the tile): a row that sees one key
hides most other values (``harness.covering.hiding``), and only the values that name that on
purpose may.
"""

from __future__ import annotations

import functools
import math

from conformance.contract import Declaration
from conformance.harness.covering.ranges import MASK_PATTERNS, Concrete, candidates, floats, ladder
from conformance.harness.covering.table import DEFAULTS, LEADING_TILE, TILE

# B * Hq * T * S * (Dk + Dv) of a row: the oracle's and the kernel's work; t = 2 fits every pair under it.
BUDGET = {2: 3_000_000, 3: 20_000_000}
# B * Hq * T * S: what the masks, M, the softmax and the oracle's cache keys (a hash of every input) scale with.
SCORES = {2: 200_000, 3: 1_000_000}
# A row with dropout is judged one query row at a time (harness.judge.dropout_vjp.lift): its work, bounded.
DROPOUT_BUDGET = 400_000
# What a draw past a class's smallest member may cost (work, scores): a fifth of the row budget, so
# that reaching across the ranges does not make the covering rows the run's cost.
DRAW_BUDGET = {2: (2_000_000, 50_000), 3: (6_000_000, 200_000)}


def _lively(r: dict[str, str], decl: Declaration, z: dict[str, int]) -> bool:
    """The row keeps two keys visible where its classes allow: a leading tile leaves two keys, and with
    causal (top-left) the queries start past the tile."""
    if r["mask content"] != LEADING_TILE:
        return True
    if z["S"] < TILE + 2:
        return False
    if r["causal"] == "on" and decl.causal_alignment == "top-left" and r["T"] != "1":
        return z["T"] >= TILE + 2
    return True


def _within(r: dict[str, str], z: dict[str, int], t: int) -> bool:
    scores = z["B"] * z["Hq"] * z["T"] * z["S"]
    work = scores * (z["Dk"] + z["Dv"])
    if r["dropout"] == "on" and work > DROPOUT_BUDGET:
        return False
    return work <= DRAW_BUDGET[t][0] and scores <= DRAW_BUDGET[t][1]


def _in_class(r: dict[str, str], z: dict[str, int]) -> bool:
    S, T, dk, dv = z["S"], z["T"], z["Dk"], z["Dv"]
    t_ok = {
        "< S": 1 < T < S,
        "1": T == 1,
        "= S": T == S > 1,
        "> S": T > S,
        "odd": T % 2 == 1 and T > 1,
        "past a tile": T > TILE,
    }[r["T"]]
    b_ok = {"1": z["B"] == 1, "2": z["B"] == 2, "5 or more": z["B"] >= 5 and z["B"] != z["Hq"]}.get(
        r["B"], z["B"] == z["Hq"] > 2
    )
    return t_ok and b_ok and {"= Dk": dv == dk, "< Dk": dv < dk, "> Dk": dv > dk}[r["Dv"]] and z["Hq"] % z["Hkv"] == 0


def _bump_for_liveness(r: dict[str, str], decl: Declaration, z: dict[str, int]) -> None:
    """A leading tile of blocked keys leaves two keys visible; with causal (top-left) the queries reach
    past the tile. Both stay inside the row's classes (S and T only grow within theirs)."""
    if r["mask content"] != LEADING_TILE or _lively(r, decl, z):
        return
    z["S"] = max(z["S"], TILE + 3)
    if r["T"] == "= S":
        z["T"] = z["S"]
    elif r["T"] == "> S":
        z["T"] = max(z["T"], z["S"] + 1)
    elif r["causal"] == "on" and decl.causal_alignment == "top-left" and r["T"] != "1":
        z["T"] = TILE + 3 if r["T"] == "odd" else max(z["T"], TILE + 2)


def _same_empty_rows(r: dict[str, str], decl: Declaration, z: dict[str, int], t: int, picks: dict) -> bool:
    """Under bottom-right causal, T > S empties the first T - S rows: a draw may do so only where the
    row's smallest members do (what admitted the row, and its fill, ``admission.row_reasons``)."""
    if not picks or r["causal"] != "on" or decl.causal_alignment != "bottom-right":
        return True
    z0 = _sizes(r, decl, t, {})
    return (z["T"] > z["S"]) == (z0["T"] > z0["S"])


FALLBACK_ORDER = ("T", "B", "heads", "Dv", "Dk", "S")  # S last: "long" reaches past 1 024 where T allows


def _sizes(r: dict[str, str], decl: Declaration | None, t: int, picks: dict[str, int]) -> dict[str, int]:
    """The row's sizes: each size class at its pick-th candidate; while that breaks the row (its classes,
    the declaration's head dims, the draw budget), one size after another (``FALLBACK_ORDER``) steps
    down to the largest of its candidates below its pick that fits, or its class's smallest member
    (all of them at their smallest: what admitted the row)."""
    decl = decl or Declaration()
    cap: dict[str, int] = {}  # param -> the candidate index it is held to (its candidates sorted by size)
    chosen = picks

    def attempt() -> tuple[dict[str, int], bool]:
        z: dict[str, int] = {}
        for param in ("heads", "S", "T", "Dk", "Dv", "B"):
            cands = sorted(candidates(param, r[param], z), key=lambda c: c if isinstance(c, int) else c[0])
            want = candidates(param, r[param], z)[chosen.get(param, 0) % len(cands)]
            i = cands.index(want)
            pick = cands[min(i, cap.get(param, i))]
            if param == "heads":
                z["Hq"], z["Hkv"] = pick
            else:
                z[param] = pick
        _bump_for_liveness(r, decl, z)
        dims_ok = (decl.max_head_dim is None or max(z["Dk"], z["Dv"]) <= decl.max_head_dim) and not (
            decl.requires_dk_eq_dv and z["Dk"] != z["Dv"]
        )
        return z, _in_class(r, z) and dims_ok and _within(r, z, t) and _same_empty_rows(r, decl, z, t, chosen)

    z, ok = attempt()
    for param in FALLBACK_ORDER:
        if ok:
            return z
        for i in range(len(candidates(param, r[param], z)) - 1, -1, -1):  # the largest that fits, down to 0
            cap[param] = i
            z, ok = attempt()
            if ok:
                break
    if ok:
        return z
    cap.clear()
    chosen = {}  # every class at its first candidate: the smallest member, what admitted the row
    return attempt()[0]


def smallest(row: dict[str, str], decl: Declaration | None = None, t: int = 2) -> dict[str, int]:
    """B, Hq, Hkv, T, S, Dk, Dv of ``row`` (missing parameters at their defaults), each class at its
    smallest member: what decides whether the row is admitted."""
    r = {**DEFAULTS, **row}
    key = tuple(r[p] for p in ("heads", "S", "T", "Dk", "Dv", "B", "mask content", "causal", "dropout"))
    return dict(_smallest(key, decl, t))


@functools.lru_cache(maxsize=1 << 14)
def _smallest(key: tuple, decl: Declaration | None, t: int) -> tuple:
    names = ("heads", "S", "T", "Dk", "Dv", "B", "mask content", "causal", "dropout")
    return tuple(_sizes({**DEFAULTS, **dict(zip(names, key))}, decl, t, {}).items())


def concrete(row: dict[str, str], decl: Declaration, t: int, picks: dict[str, int], dtype: str) -> Concrete:
    """The row's sizes and values when its classes take their ``picks`` (param -> k: the k-th row of
    the plan that holds this class takes its k-th candidate)."""
    r = {**DEFAULTS, **row}
    z = _sizes(r, decl, t, picks)
    k = picks.get

    def nth(values: list, param: str):
        return values[k(param, 0) % len(values)]

    scale = {
        "default": None,
        "custom": nth(floats(0.1, 2.0, ("scale", "custom")), "scale"),
        "negative": -nth(floats(0.1, 2.0, ("scale", "negative")), "scale"),
        "zero": 0.0,
    }[r["scale"]]
    eff = 1.0 / math.sqrt(z["Dk"]) if scale is None else abs(scale)
    magnitude = min(1.0, math.sqrt(2.0 / max(eff * math.sqrt(z["Dk"]), 1e-12)))
    rows = z["B"] * z["Hq"] * z["T"]
    # M's ladder spans the range of the dtype the kernel computes in: float64 declared as float32 gets float32's
    computed = "float32" if dtype == "float64" and decl.float64_computed_as == "float32" else dtype
    return Concrete(
        **z,
        scale=scale,
        dropout_p=nth([0.5, 0.75], "dropout") if r["dropout"] == "on" else 0.0,
        bias_sigma=nth(floats(0.25, 2.0, ("M", "small")), "additive M"),
        neg_magnitudes=ladder(
            computed, max(1, min(rows - 1, 8)), ("M", k("additive M", 0)), r["direction"] != "backward"
        ),
        inf_fraction=nth(floats(0.2, 0.9, ("M", "-inf")), "additive M"),
        pattern_offset=k("mask content", 0) % len(MASK_PATTERNS),
        lead_tiles=nth([1, max(1, (z["S"] - 2) // TILE)], "mask content"),
        which_row=nth(["first", "last", "middle"], "mask content" if r["mask content"] != "some keys blocked" else "M"),
        magnitude=magnitude,
        picks=dict(picks),
    )
