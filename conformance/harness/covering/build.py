"""A row of the covering array (parameter -> value class) as one concrete case.

Each class takes a member of its range (``ranges``: the extremes and seeded draws; ``draws``: the k-th
row holding a class takes its k-th candidate), and the builders turn the row into arrays: masks of
every form and content, M of every class, the memory layouts of Q, K, V, which of them is one object,
the presentation (``contract.Presentation``: which inputs ask for a gradient, the context, a second
backward), the cotangent in its memory form, and the twin a row "called again" runs after (``admission.twin``).
Whether a row can be a case at all is ``admission``'s.

Longer than 250 lines because it is the one place where classes become arrays: masks, M, layouts,
identity, twins and cotangents share the row's sizes and draws.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, Declaration, Presentation
from conformance.harness.cases import drawn_arrays
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.cases.strategies import empty_rows_allowed
from conformance.harness.covering.admission import meant_empty_rows, twin
from conformance.harness.covering.draws import concrete
from conformance.harness.covering.ranges import MASK_PATTERNS, Concrete
from conformance.harness.covering.table import (
    ASKING,
    DEFAULTS,
    EXPANDED_MASK,
    FLAG_TYPES,
    LEADING_TILE,
    MIXED,
    OFF_BOUNDARY,
    OFFSET,
    ONE_OBJECT,
    PARAMETERS,
    PITCHED,
    SCALAR_TYPES,
    SWITCHES,
    TILE,
    TRANSFORMS,
)


def presentation(r: dict[str, str]) -> Presentation | None:
    """The row's :class:`Presentation` (None where every attribute is as the direction asks)."""
    asked = next((frozenset(k) for k, v in ASKING.items() if v == r["requires grad"]), None)
    mode = {"forward under grad": "grad", "forward under inference mode": "inference"}.get(r["context"], "no_grad")
    switches = [SWITCHES[r[p]] for p in ("switch", "second switch") if SWITCHES[r[p]] is not None]
    pres = Presentation(
        requires_grad=asked,
        grad_mode=mode,
        backward="twice" if r["backward calls"] != "once" else "once",
        default_dtype="float64" if r.get("default dtype") == "float64" else None,
        # the kinds only: the covering clause applies a member of each that the adapter offers
        # (harness.calls.switches.resolve)
        context="+".join(switches) or None,
        scalars="+".join(f for f in (SCALAR_TYPES[r["scalar types"]], FLAG_TYPES[r["flag types"]]) if f) or None,
        transform=TRANSFORMS[r.get("transform", "none")],
    )
    return None if pres == Presentation() else pres


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


# Whole-buffer alignment: SIMD and GEMM paths choose their blocking by the address of the data (16, 32 and 64
# bytes: SSE, AVX2, AVX-512 vector widths and the cache line), so a kernel that is right at one address and
# wrong at another is seen only when its inputs arrive at both. 64 covers every width up to AVX-512.
ALIGNMENT = 64


def at_alignment(x: np.ndarray, offset_bytes: int = 0) -> np.ndarray:
    """The values of ``x``, C-contiguous, starting ``offset_bytes`` past a 64-byte boundary (a multiple of the
    itemsize): 0 gives an aligned copy, any other offset one that no vector width divides. Nothing but the
    address differs, so a kernel whose answer changes beyond the error model here depends on alignment."""
    x = np.asarray(x)
    if offset_bytes % x.itemsize:
        raise ValueError(f"offset of {offset_bytes} bytes is not a multiple of the itemsize {x.itemsize}")
    raw = np.empty(x.nbytes + ALIGNMENT + offset_bytes, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT + offset_bytes
    view = raw[start : start + x.nbytes].view(x.dtype).reshape(x.shape)
    view[...] = x
    return view


def cotangent(form: str, g: np.ndarray) -> np.ndarray:
    """The cotangent ``g`` in memory ``form`` (table.COTANGENTS); "expanded" keeps its first query
    row for every row (a stride-0 query axis: the ones of ``out.sum().backward()`` are expanded so)."""
    if form == "transposed view":
        return drawn_arrays.relayout(g, "non-contiguous", None)
    if form == "expanded":
        return np.broadcast_to(g[:, :, :1], g.shape)
    if form == OFFSET:
        return offset_view(g)
    return g


def _own_memory(form: str, x: np.ndarray, seed: int) -> np.ndarray:
    """``x`` in an argument's own memory ``form`` (table.KV_MEMORY, table.MASK_MEMORY)."""
    if form == OFF_BOUNDARY:  # 1 to 3 elements past a 64-byte boundary (the seed picks)
        return at_alignment(x, (1 + seed % 3) * x.itemsize)
    if form == OFFSET:
        return offset_view(x)
    if form == PITCHED:  # a per-row mask sliced from one 5 keys wider
        wider = np.zeros(x.shape[:-1] + (x.shape[-1] + 5,), dtype=x.dtype)
        view = wider[..., : x.shape[-1]]
        view[...] = x
        return view
    return x


def _scalar_value(r: dict[str, str], scale: float | None) -> float | None:
    """The scale a row's scalar types can carry: integral for "scale an int" (sign kept: 2, -1, 0), exact in
    float32 for "scale a NumPy float32" and for "scale a 0-d tensor" (``torch.tensor(0.1)`` is float32 under
    torch's default dtype: the value the kernel receives is the float32 one)."""
    if scale is None:
        return None
    if r["scalar types"] == "scale an int":
        return float(np.sign(scale) * max(1, round(abs(scale)))) if scale else 0.0
    if r["scalar types"] in ("scale a NumPy float32", "scale a 0-d tensor"):
        return float(np.float32(scale))
    return scale


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
        content = _own_memory(r["mask memory"], _mask_content(r, drawn, c, seed), seed)
        mask = np.broadcast_to(content, held) if held != drawn else content
    bias = None if r["additive M"] == "none" else _bias(r, (B, Hq, T, S), c, seed)
    q, k, v = _layout(r, q, k, v)
    q, k, v = (
        _own_memory(r[f"{n} memory"], x, seed + i) for i, (n, x) in enumerate(zip(("query", "key", "value"), (q, k, v)))
    )
    q, k, v = _identify(r, q, k, v)
    case = Case(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        is_causal=r["causal"] == "on",
        scale=_scalar_value(r, c.scale),
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
        empty = meant_empty_rows(other, decl, z)
        if not empty or empty_rows_allowed(
            decl, has_mask=has[0], has_bias=has[1], is_causal=has[2], grad=other["direction"] == "backward"
        ):
            break
        other[name] = r[name]
    own = concrete(other, decl, t, picks or {}, other["dtype"])
    c = Concrete(**{**own.__dict__, **sizes_of_row.sizes, "magnitude": own.magnitude, "picks": own.picks})
    return _build(other, decl, seed + 500, c, _label(other, "twin of a covering row (same shapes)"))
