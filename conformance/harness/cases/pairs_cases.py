"""A row of the covering array (parameter -> value class) as one concrete case, and why a row cannot be one.

Each class is built at the smallest size that is in it (``SIZES``), so a row of the ci profile costs
milliseconds: keys "past a tile" are 33 (``harness.cases.space.TAIL_LENGTHS``), "several tiles" 129,
"long" 300. Whether a declaration admits a row is asked of the declaration itself
(``Declaration.not_supported_reasons`` on a shape-only probe of the row's case), plus the suite's
own rules: the constraints between values (``harness.cases.pairs_space.CONSTRAINTS``), rows blocked
entirely where the declaration defines no fill (``strategies.empty_rows_allowed``), the backward
only where ``grad`` is declared, and a cost budget per profile (a row above it is listed as excluded
by cost, never dropped silently).
"""

from __future__ import annotations

import functools

import numpy as np

from conformance.contract import Case, Declaration, np_dtype
from conformance.harness.cases import drawn_arrays
from conformance.harness.cases.build import cast, random_mask, rng_for
from conformance.harness.cases.pairs_space import DEFAULTS, LARGE_NEGATIVE, PARAMETERS, TILE, violated
from conformance.harness.cases.strategies import empty_rows_allowed

B_SIZE = {"1": 1, "2": 2, "5 or more": 5}
HEADS = {"1:1": (2, 2), "2:1": (4, 2), "3:1": (3, 1), "8:1": (8, 1), "more than 16 heads": (17, 17)}
S_SIZE = {"< 16": 6, "1": 1, "a tile tail": TILE + 1, "several tiles": 4 * TILE + 1, "long": 300}
DK = {
    "8": 8,
    "1": 1,
    "not a multiple of 8": 5,
    "64": 64,
    "above 64, not a multiple of 32": 80,
    "128": 128,
    "160": 160,
    "256": 256,
}
SCALE = {"default": None, "custom": 0.3, "negative": -0.5, "zero": 0.0}
DROPOUT_P = 0.5
# B * Hq * T * S * (Dk + Dv) of a row: the oracle's and the kernel's work; t = 2 fits every pair under it.
BUDGET = {2: 3_000_000, 3: 20_000_000}
# B * Hq * T * S: what the masks, M, the softmax and the oracle's cache keys (a hash of every input) scale with.
SCORES = {2: 200_000, 3: 1_000_000}


def sizes(row: dict[str, str]) -> dict[str, int]:
    """B, Hq, Hkv, T, S, Dk, Dv of ``row`` (missing parameters take their defaults)."""
    r = {**DEFAULTS, **row}
    hq, hkv = HEADS[r["heads"]]
    S = S_SIZE[r["S"]]
    T = {"< S": min(2, S - 1), "1": 1, "= S": S, "> S": S + 1, "odd": 5, "past a tile": TILE + 1}[r["T"]]
    dk = DK[r["Dk"]]
    dv = {"= Dk": dk, "< Dk": max(1, dk // 2), "> Dk": dk + 8}[r["Dv"]]
    B = hq if r["B"] == "equal to H" else B_SIZE[r["B"]]
    return dict(B=B, Hq=hq, Hkv=hkv, T=max(T, 1), S=S, Dk=dk, Dv=dv)


def cost(row: dict[str, str]) -> int:
    z = sizes(row)
    return z["B"] * z["Hq"] * z["T"] * z["S"] * (z["Dk"] + z["Dv"])


def _probe(r: dict[str, str], z: dict[str, int]) -> Case:
    """The row's case without its values (stride-0 zeros): enough for ``not_supported_reasons``."""
    dt = np_dtype(r["dtype"])

    one = np.zeros(1, dtype=dt)

    def zeros(*shape):  # stride 0: no memory, and cheaper than np.broadcast_to (the planner calls this often)
        return np.ndarray(shape, dtype=dt, buffer=one, strides=(0,) * len(shape))

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


def _meant_empty_rows(r: dict[str, str], decl: Declaration, z: dict[str, int]) -> bool:
    causal = r["causal"] == "on"
    return (
        r["mask content"] == "rows blocked entirely"
        or r["additive M"] == "-inf on whole rows"
        or (causal and r["mask content"] == "leading keys blocked over a whole tile")
        or (causal and decl.causal_alignment == "bottom-right" and z["T"] > z["S"])
    )


def row_reasons(
    decl: Declaration, row: dict[str, str], t: int = 2, defaults: dict[str, str] | None = None
) -> list[str]:
    """Why ``row`` cannot be a case for ``decl``; empty if it can. A partial row is checked with its
    missing parameters at ``defaults`` (the table's), except that the constraints between values are
    asked of the parameters ``row`` assigns only (so S = 1 is not refused for the default T < S)."""
    return list(_row_reasons(decl, tuple(sorted(row.items())), t, tuple(sorted((defaults or DEFAULTS).items()))))


@functools.lru_cache(maxsize=1 << 16)
def _row_reasons(decl: Declaration, items: tuple, t: int, defaults: tuple) -> tuple[str, ...]:
    row = dict(items)
    r = {**dict(defaults), **row}
    reasons = violated(row)
    z = sizes(r)
    reasons += decl.not_supported_reasons(_probe(r, z))
    if r["direction"] == "backward" and not decl.grad:
        reasons.append("declares grad=False")
    has_mask, has_bias, causal = r["mask form"] != "none", r["additive M"] != "none", r["causal"] == "on"
    grad = r["direction"] == "backward"
    if _meant_empty_rows(r, decl, z) and not empty_rows_allowed(
        decl, has_mask=has_mask, has_bias=has_bias, is_causal=causal, grad=grad
    ):
        reasons.append(
            "rows blocked entirely, with this combination of masks / causal / backward, have no fill this "
            f"declaration defines (all_blocked={decl.all_blocked}, "
            f"all_blocked_float_mask={decl.all_blocked_float_mask})"
        )
    scores = z["B"] * z["Hq"] * z["T"] * z["S"]
    work = scores * (z["Dk"] + z["Dv"])
    if work > BUDGET[t]:
        reasons.append(f"cost: B*H*T*S*(Dk+Dv) = {work:,} above this profile's row budget {BUDGET[t]:,}")
    if scores > SCORES[t]:
        reasons.append(f"cost: B*H*T*S = {scores:,} scores above this profile's row budget {SCORES[t]:,}")
    return tuple(reasons)


def _mask(r: dict[str, str], shape: tuple[int, ...], seed: int) -> np.ndarray:
    m = random_mask(seed, shape, p_blocked=0.3)
    S = shape[-1]
    if r["mask content"] == "leading keys blocked over a whole tile":
        m = np.zeros(shape, dtype=bool)
        m[..., : 1 << (S - 1).bit_length() - 1] = True  # the largest power of two below S (>= 32 here)
    elif r["mask content"] == "rows blocked entirely":
        m.reshape(-1, S)[0] = True
    return m


def _bias(r: dict[str, str], shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = rng_for(seed + 31)
    b = rng.standard_normal(shape) * 0.5
    kind = r["additive M"]
    if kind == "finite large negative on whole rows":  # the last row: the mask's special row is the first
        b.reshape(-1, shape[-1])[-1] = LARGE_NEGATIVE
    elif kind == "-inf on some keys":
        b[rng.random(shape) < 0.3] = -np.inf
        for key in (0, -1):  # key 0 and the last key stay finite: a leading tile of blocked keys leaves the last
            b[..., key] = np.where(np.isneginf(b[..., key]), 0.0, b[..., key])
    elif kind == "-inf on whole rows":
        b.reshape(-1, shape[-1])[-1] = -np.inf
    return b


def _reopen_accidents(case: Case, r: dict[str, str], decl: Declaration) -> None:
    """Rows a random mask emptied by accident (with causal) see key 0 again, as the drawn space does."""
    from conformance.oracle import blocked_and_bias

    if r["mask content"] == "leading keys blocked over a whole tile" or case.mask is None:
        return  # with causal, the rows inside the tile are empty on purpose
    meant_mask = case.mask.all(axis=-1).copy()
    meant_bias = None if case.bias is None else np.isneginf(case.bias).all(axis=-1)
    blocked, _ = blocked_and_bias(case, decl.causal_alignment)
    plain = Case(case.query, case.key, case.value, is_causal=case.is_causal)
    causal_only, _ = blocked_and_bias(plain, decl.causal_alignment)
    for b, h, t in np.argwhere(blocked.all(axis=-1) & ~causal_only.all(axis=-1)):
        own = drawn_arrays.own_index(case.mask.shape, b, h, t)
        if meant_mask[own] or (meant_bias is not None and meant_bias[drawn_arrays.own_index(case.bias.shape, b, h, t)]):
            continue  # rows blocked entirely on purpose
        case.mask[(*own, 0)] = False


def _layout(r: dict[str, str], q: np.ndarray, k: np.ndarray, v: np.ndarray):
    kind = r["layout"]
    if kind == "transposed view":
        return tuple(drawn_arrays.relayout(x, "non-contiguous", None) for x in (q, k, v))
    if kind == "expanded":
        out = []
        for x in (q, k, v):
            axis = drawn_arrays.broadcast_axis(x.shape[0], x.shape[1])
            out.append(drawn_arrays.relayout(x, "broadcast", axis) if axis is not None else x)
        return tuple(out)
    if kind == "sliced from a packed QKV":  # one [B, L, Hq*Dk + Hkv*Dk + Hkv*Dv] buffer, as a fused QKV GEMM writes
        B, L = q.shape[0], max(q.shape[2], k.shape[2])
        widths = [x.shape[1] * x.shape[3] for x in (q, k, v)]
        buf = np.zeros((B, L, sum(widths)), dtype=q.dtype)
        out, start = [], 0
        for x, w in zip((q, k, v), widths):
            n, h, d = x.shape[2], x.shape[1], x.shape[3]
            buf[:, :n, start : start + w] = x.transpose(0, 2, 1, 3).reshape(B, n, w)
            out.append(buf[:, :n, start : start + w].reshape(B, n, h, d).transpose(0, 2, 1, 3))
            start += w
        return tuple(out)
    return q, k, v


def build(row: dict[str, str], decl: Declaration, seed: int) -> tuple[Case, np.ndarray | None]:
    """The case of ``row`` (and its cotangent when the row's direction is backward)."""
    r, z = {**DEFAULTS, **row}, sizes(row)
    B, Hq, Hkv, T, S, Dk, Dv = (z[k] for k in ("B", "Hq", "Hkv", "T", "S", "Dk", "Dv"))
    rng = rng_for(seed)
    dtype = r["dtype"]
    q, k, v = (cast(rng.standard_normal(s), dtype) for s in ((B, Hq, T, Dk), (B, Hkv, S, Dk), (B, Hkv, S, Dv)))
    form = r["mask form"]
    mask = None if form == "none" else _mask(r, drawn_arrays.form_shape(form, B, Hq, T, S), seed)
    bias = None if r["additive M"] == "none" else _bias(r, (B, Hq, T, S), seed)
    q, k, v = _layout(r, q, k, v)
    label = "covering row: " + "; ".join(f"{p.name}: {r[p.name]}" for p in PARAMETERS if r[p.name] != p.default)
    case = Case(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        is_causal=r["causal"] == "on",
        scale=SCALE[r["scale"]],
        dropout_p=DROPOUT_P if r["dropout"] == "on" else 0.0,
        seed=seed,
        label=label if label != "covering row: " else "covering row: all defaults",
    )
    _reopen_accidents(case, r, decl)
    grad_out = cast(rng.standard_normal((B, Hq, T, Dv)), dtype) if r["direction"] == "backward" else None
    return case, grad_out
