"""A row of the covering array (parameter -> value class) as one concrete case, and why a row cannot be one.

Each class takes a member of its range (``harness.cases.pairs_ranges``: the extremes and seeded
draws; ``harness.cases.pairs_draws``: the k-th row holding a class takes its k-th candidate);
whether a declaration admits a row is decided on the row's smallest members. It is asked of the
declaration itself
(``Declaration.not_supported_reasons`` on a shape-only probe of the row's case), plus the suite's
own rules: the constraints between values (``harness.cases.pairs_space.CONSTRAINTS``), rows blocked
entirely where the declaration defines no fill (``strategies.empty_rows_allowed``), the backward
only where ``grad`` is declared, a row that is "called again" only where it has a twin (below), and
a cost budget per profile (a row above it is listed as excluded by cost, never dropped silently).

A row whose ``call`` is "again" runs right after its *twin*: a case of the same Q, K, V shapes and
dtype (what a kernel's per-shape cache is keyed by) whose other values (mask form and content, M,
causal, scale, layout; dropout only turned off) all differ where the declaration admits it
(:func:`twin`), so a kernel that caches anything else per shape answers one of the two with the
other's.

Longer than 250 lines because it is the one place where classes become arrays: the probe, the
admission rules, and the builders of masks (every form and content), M (every class), layouts and
twins, which share the row's sizes and draws.
"""

from __future__ import annotations

import functools

import numpy as np

from conformance.contract import Case, Declaration, Presentation, np_dtype
from conformance.harness.cases import drawn_arrays
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.cases.pairs_draws import BUDGET, DROPOUT_BUDGET, SCORES, concrete, smallest
from conformance.harness.cases.pairs_ranges import MASK_PATTERNS, Concrete
from conformance.harness.cases.pairs_space import (
    ASKING,
    BY_DIRECTION,
    BY_NAME,
    DEFAULTS,
    EXPANDED_MASK,
    LEADING_TILE,
    MIXED,
    NON_SHAPE_PARAMETERS,
    OFFSET,
    ONE_OBJECT,
    PARAMETERS,
    TILE,
    violated,
)
from conformance.harness.cases.strategies import empty_rows_allowed

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


def _meant_empty_rows(r: dict[str, str], decl: Declaration, z: dict[str, int]) -> bool:
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
    return list(_row_reasons(decl, tuple(sorted(row.items())), t, tuple(sorted((defaults or DEFAULTS).items()))))


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
    empty = _meant_empty_rows(r, decl, z)
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
    if work > BUDGET[t]:
        reasons.append(f"cost: B*H*T*S*(Dk+Dv) = {work:,} above this profile's row budget {BUDGET[t]:,}")
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
    elif r["context"] == "default dtype float64":
        need.add("default_dtype")
    if r["backward calls"] != "once":
        need.add("backward")
    missing = sorted(need - decl.presents)
    reasons = []
    if missing:
        reasons.append(f"the adapter does not present {', '.join(missing)} to its kernel (Declaration.presents)")
    if r["requires grad"] == "query, key, value and M" and not decl.bias_grad:
        reasons.append("declares no gradient for the additive M (bias_grad)")
    return reasons


def presentation(r: dict[str, str]) -> Presentation | None:
    """The row's :class:`Presentation` (None where every attribute is as the direction asks)."""
    asked = next((frozenset(k) for k, v in ASKING.items() if v == r["requires grad"]), None)
    mode = {"forward under grad": "grad", "forward under inference mode": "inference"}.get(r["context"], "no_grad")
    pres = Presentation(
        requires_grad=asked,
        grad_mode=mode,
        backward="twice" if r["backward calls"] != "once" else "once",
        default_dtype="float64" if r["context"] == "default dtype float64" else None,
    )
    return None if pres == Presentation() else pres


def twin(decl: Declaration, row: dict[str, str], t: int = 2, defaults: dict[str, str] | None = None):
    """The row a "called again" row runs after: its shape classes and dtype, every other value changed to
    the next one the declaration admits (dropout only turned off), called first. None when none can change."""
    found = _twin(decl, tuple(sorted(row.items())), t, tuple(sorted((defaults or DEFAULTS).items())))
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


# -- building --------------------------------------------------------------------------------------
def _mask_rows(n_rows: int, S: int, offset: int, rng: np.random.Generator) -> np.ndarray:
    """``n_rows`` rows of "some keys blocked", row i in pattern ``MASK_PATTERNS[(i + offset) % 4]``
    (scattered, a run at the start under a tile, a hole, a run at the end), each blocking 1 to S - 2
    keys: at least one blocked and two visible (S >= 3)."""
    m = np.zeros((n_rows, S), dtype=bool)
    if S < 3:
        return m
    n = rng.integers(1, S - 1, size=(n_rows, 1))  # blocked per row: 1 .. S - 2
    key = np.arange(S)[None, :]
    kind = (np.arange(n_rows)[:, None] + offset) % len(MASK_PATTERNS)
    ranks = np.argsort(np.argsort(rng.random((n_rows, S)), axis=1), axis=1)
    start = rng.integers(1, np.maximum(S - n, 2))  # a hole starts past key 0 and ends before the last key
    m = np.where(kind == 0, ranks < n, m)  # scattered
    m = np.where(kind == 1, key < np.minimum(n, TILE - 1), m)  # left padding, shorter than a tile
    m = np.where(kind == 2, (key >= start) & (key < start + n), m)  # a hole
    m = np.where(kind == 3, key >= S - n, m)  # right padding
    if S > TILE:  # scattered over a whole leading tile by chance: that is the other class
        m[m[:, :TILE].all(axis=1), 0] = False
    return m


def _mask_content(r: dict[str, str], shape: tuple[int, ...], c: Concrete, seed: int) -> np.ndarray:
    S = shape[-1]
    rows = int(np.prod(shape[:-1]))
    if r["mask content"] == LEADING_TILE:
        flat = np.zeros((rows, S), dtype=bool)
        flat[:, : TILE * c.lead_tiles] = True
        return flat.reshape(shape)
    flat = _mask_rows(rows, S, c.pattern_offset, rng_for(seed + 7919))
    if r["mask content"] == "rows blocked entirely":
        flat[_which(c.which_row, rows)] = True
    return flat.reshape(shape)


def _which(which: str, n: int) -> int:
    return {"first": 0, "last": n - 1, "middle": n // 2}[which]


def _bias(r: dict[str, str], shape: tuple[int, ...], c: Concrete, seed: int) -> np.ndarray:
    rng = rng_for(seed + 31)
    kind = r["additive M"]
    b = rng.standard_normal(shape) * (c.bias_sigma if kind == "finite small" else 0.5)
    flat = b.reshape(-1, shape[-1])
    if kind == "finite large negative on whole rows":  # one magnitude per row, from the last row up
        for j, mag in enumerate(c.neg_magnitudes[: flat.shape[0]]):
            flat[flat.shape[0] - 1 - j] = -mag
    elif kind == "-inf on some keys":
        b[rng.random(shape) < c.inf_fraction] = -np.inf
        for key in (0, -1):  # key 0 and the last key stay finite: a leading tile of blocked keys leaves the last
            b[..., key] = np.where(np.isneginf(b[..., key]), 0.0, b[..., key])
    elif kind == "-inf on whole rows":
        flat[_which(c.which_row if c.which_row != "first" else "last", flat.shape[0])] = -np.inf
    return b


def _reopen_accidents(case: Case, content: np.ndarray, r: dict[str, str], decl: Declaration) -> None:
    """Rows a mask emptied by accident (with causal or -inf) see key 0 again, as the drawn space does."""
    from conformance.oracle import blocked_and_bias

    if r["mask content"] == LEADING_TILE or case.mask is None:
        return  # with causal, the rows inside the tile are empty on purpose
    meant_mask = content.all(axis=-1).copy()
    meant_bias = None if case.bias is None else np.isneginf(case.bias).all(axis=-1)
    blocked, _ = blocked_and_bias(case, decl.causal_alignment)
    plain = Case(case.query, case.key, case.value, is_causal=case.is_causal)
    causal_only, _ = blocked_and_bias(plain, decl.causal_alignment)
    for b, h, t in np.argwhere(blocked.all(axis=-1) & ~causal_only.all(axis=-1)):
        own = drawn_arrays.own_index(content.shape, b, h, t)
        if meant_mask[own] or (meant_bias is not None and meant_bias[drawn_arrays.own_index(case.bias.shape, b, h, t)]):
            continue  # rows blocked entirely on purpose
        content[(*own, 0)] = False


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
    if kind == OFFSET:
        return tuple(offset_view(x) for x in (q, k, v))
    if kind == MIXED:
        return q, drawn_arrays.relayout(k, "non-contiguous", None), offset_view(v)
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


def offset_view(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` [..., L, D] as a view into a larger buffer [..., L + 3, D + 5] that starts past
    its first element (a slice of a KV cache, a query taken out of a longer one): a storage offset and a
    row stride that are not the shape's, the feature axis still unit-strided."""
    buf = np.zeros(x.shape[:-2] + (x.shape[-2] + 3, x.shape[-1] + 5), dtype=x.dtype)
    view = buf[..., 2 : 2 + x.shape[-2], 3 : 3 + x.shape[-1]]
    view[...] = x
    return view


def cotangent(form: str, g: np.ndarray) -> np.ndarray:
    """The cotangent ``g`` in memory ``form`` (pairs_space.COTANGENTS); "expanded" keeps its first query
    row for every row (a stride-0 query axis: the ones of ``out.sum().backward()`` are expanded so)."""
    if form == "transposed view":
        return drawn_arrays.relayout(g, "non-contiguous", None)
    if form == "expanded":
        return np.broadcast_to(g[:, :, :1], g.shape)
    if form == OFFSET:
        return offset_view(g)
    return g


def _identify(r: dict[str, str], q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """Q, K, V with the row's identity: one array object given for the arguments it names."""
    kind = r["identity"]
    if kind == "query is key":
        return q, q, v
    if kind == "key is value":
        return q, k, k
    if kind == ONE_OBJECT:
        return q, q, q
    return q, k, v


def _mask_shapes(form: str, B: int, H: int, T: int, S: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the shape the mask's content is drawn in, the shape the case holds it in)."""
    if form == "[S]":
        return (S,), (S,)
    if form == "[H,T,S]":
        return (H, T, S), (H, T, S)
    if form == EXPANDED_MASK:  # a [B, T, S] mask expanded along H: torch's mask[:, None].expand(B, H, T, S)
        return (B, 1, T, S), (B, H, T, S)
    shape = drawn_arrays.form_shape(form, B, H, T, S)
    return shape, shape


def _build(r: dict[str, str], decl: Declaration, seed: int, c: Concrete, label: str) -> tuple[Case, np.ndarray | None]:
    rng = rng_for(seed)
    dtype = r["dtype"]
    B, Hq, Hkv, T, S, Dk, Dv = c.B, c.Hq, c.Hkv, c.T, c.S, c.Dk, c.Dv
    q = cast(rng.standard_normal((B, Hq, T, Dk)) * c.magnitude, dtype)
    k = cast(rng.standard_normal((B, Hkv, S, Dk)) * c.magnitude, dtype)
    v = cast(rng.standard_normal((B, Hkv, S, Dv)), dtype)
    form = r["mask form"]
    content = mask = None
    if form != "none":
        drawn, held = _mask_shapes(form, B, Hq, T, S)
        content = _mask_content(r, drawn, c, seed)
        mask = np.broadcast_to(content, held) if held != drawn else content
    bias = None if r["additive M"] == "none" else _bias(r, (B, Hq, T, S), c, seed)
    q, k, v = _identify(r, *_layout(r, q, k, v))
    case = Case(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        is_causal=r["causal"] == "on",
        scale=c.scale,
        dropout_p=c.dropout_p,
        seed=seed,
        label=label,
        presentation=presentation(r),
    )
    if content is not None:
        _reopen_accidents(case, content, r, decl)
    grad_out = None
    if r["direction"] == "backward":
        grad_out = cotangent(r["cotangent"], cast(rng.standard_normal((B, Hq, T, Dv)), dtype))
    return case, grad_out


def _label(r: dict[str, str], prefix: str = "covering row") -> str:
    text = "; ".join(f"{p.name}: {r[p.name]}" for p in PARAMETERS if r[p.name] != p.default)
    return f"{prefix}: {text or 'all defaults'}"


def build_planned(
    row: dict[str, str], decl: Declaration, seed: int, picks: dict[str, int] | None = None, t: int = 2
) -> tuple[Case, np.ndarray | None]:
    """The case of ``row`` with its classes at their ``picks`` (and its cotangent when backward)."""
    r = {**DEFAULTS, **row}
    c = concrete(r, decl, t, picks or {}, r["dtype"])
    return _build(r, decl, seed, c, _label(r))


def build(row: dict[str, str], decl: Declaration, seed: int) -> tuple[Case, np.ndarray | None]:
    """The case of ``row``, every class at its first candidate."""
    return build_planned(row, decl, seed)


def build_twin(
    row: dict[str, str], decl: Declaration, seed: int, picks: dict[str, int] | None = None, t: int = 2
) -> tuple[Case, np.ndarray | None]:
    """The twin of ``row`` (:func:`twin`) as a case of exactly ``row``'s Q, K, V shapes."""
    r = {**DEFAULTS, **row}
    other = {**DEFAULTS, **twin(decl, r, t)}
    sizes_of_row = concrete(r, decl, t, picks or {}, r["dtype"])
    z = sizes_of_row.sizes
    for name in ("causal", "mask content", "additive M"):  # at the row's sizes, no fill the declaration leaves open
        has = (other["mask form"] != "none", other["additive M"] != "none", other["causal"] == "on")
        empty = _meant_empty_rows(other, decl, z)
        if not empty or empty_rows_allowed(
            decl, has_mask=has[0], has_bias=has[1], is_causal=has[2], grad=other["direction"] == "backward"
        ):
            break
        other[name] = r[name]
    own = concrete(other, decl, t, picks or {}, other["dtype"])
    c = Concrete(**{**own.__dict__, **sizes_of_row.sizes, "magnitude": own.magnitude, "picks": own.picks})
    return _build(other, decl, seed + 500, c, _label(other, "twin of a covering row (same shapes)"))
