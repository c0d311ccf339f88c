"""The parameters of a case and their value classes: the table the covering arrays are built over.

Why a table of *classes*: a kernel's faults live in classes of inputs (a mask form, a GQA ratio, a
head dim past 64, keys past a tile), and most need two classes to meet (NIST's combinatorial
testing studies); a covering array (``harness.covering.array``) puts every admitted pair (t = 2) or triple
(t = 3) of classes into some row, and ``harness.covering.build`` turns a row into one small concrete case,
each class at the smallest size that is in it. The same table is ``docs/case-space.md``.

Each value says what must hold of a case for the value to be *reached* (``holds``): coverage is
counted from the cases that reached the kernel (``harness.run.pair_coverage``), not from the plan. Which
declarations admit a value is not listed here: ``harness.covering.admission.row_reasons`` builds the row's
case and asks ``Declaration.not_supported_reasons`` (the one vocabulary), so a value or pair is
admitted exactly when the kernel's own declaration takes its case. Constraints between values that
no declaration decides (a form with a T axis at T = 1, a tile of blocked keys in fewer keys than a
tile) are :data:`CONSTRAINTS`, each with its reason; nothing is dropped silently.

Longer than 250 lines because it is one table (its parameters, their classes and what each class
requires of a case) and the constraints that belong to it; split, the table would be read in pieces.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from conformance.contract import DTYPES, Case, joined

TILE = 32  # the tile of "past a tile": T and S tails (harness.cases.space.TAIL_LENGTHS: 33 is 32 + 1)
LONG = 300  # "long" keys: past the 256 keys where split-KV kernels start to split
LARGE_NEGATIVE = -1e4  # the class "finite large negative" is M at or below it on a whole row (down to finfo.min)


class Call(NamedTuple):
    """How a case reached the kernel: ``direction`` ("forward" or "backward"), ``call`` ("first", or
    "again": right after a call of the same Q, K, V shapes whose other values differ) and, for a
    backward, the memory form of its cotangent (:func:`memory_form`)."""

    direction: str
    call: str = "first"
    cotangent: str = "contiguous"


@dataclass(frozen=True)
class Value:
    """One value class of a parameter; ``holds(case, how)`` says whether a case, sent as ``how``
    (:class:`Call`), is in it."""

    name: str
    holds: Callable[[Case, Call], bool]


@dataclass(frozen=True)
class Parameter:
    """A parameter and its value classes; the first is the default (what shrinking resets to)."""

    name: str
    values: tuple[Value, ...]

    def value(self, name: str) -> Value:
        for v in self.values:
            if v.name == name:
                return v
        raise KeyError(f"parameter {self.name} has no value {name!r}; it has {[v.name for v in self.values]}")

    @property
    def default(self) -> str:
        return self.values[0].name


def _v(name: str, holds: Callable[[Case, Call], bool]) -> Value:
    return Value(name, holds)


def _expanded_axes(arr) -> tuple[int, ...]:
    a = np.asarray(arr)
    return tuple(i for i, (n, s) in enumerate(zip(a.shape, a.strides)) if s == 0 and n > 1)


def _form(case: Case, arr) -> str:
    """The mask form of ``arr`` (its broadcast shape, axes of length 1 where the case's are longer), or
    "other" for shapes the table does not name."""
    if arr is None:
        return "none"
    shape = np.shape(arr)
    zero = _expanded_axes(arr)
    if len(shape) == 1:
        return "[S]" if shape == (case.S,) else "other"
    if len(shape) == 2:
        return "[T,S]" if shape[0] == case.T > 1 and not zero else "other"
    if len(shape) == 3:
        return "[H,T,S]" if shape == (case.Hq, case.T, case.S) and case.Hq > 1 and case.T > 1 and not zero else "other"
    b, h, t, _ = shape
    name = f"[{'B' if b == case.B > 1 else '1'},{'H' if h == case.Hq > 1 else '1'},{'T' if t == case.T > 1 else '1'},S]"
    if zero == (1,) and name == "[B,H,T,S]":
        return EXPANDED_MASK
    return "other" if zero else name


def _rows_blocked(arr, neg_inf: bool) -> bool:
    a = np.asarray(arr)
    return bool((np.isneginf(a) if neg_inf else a).all(axis=-1).any())


def _leading_tile(case: Case) -> bool:
    m = np.asarray(case.mask)
    return case.S > TILE and bool(m[..., :TILE].all())


def _bias_class(case: Case) -> str:
    if case.bias is None:
        return "none"
    b = np.asarray(case.bias, dtype=np.float64)
    if _rows_blocked(b, True):
        return "-inf on whole rows"
    if np.isneginf(b).any():
        return "-inf on some keys"
    if (b <= LARGE_NEGATIVE).all(axis=-1).any():
        return "finite large negative on whole rows"
    return "finite small"


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def memory_form(a) -> str:
    """One array's memory: "expanded" (a stride-0 axis), "offset into a larger buffer" (a view that starts
    past its buffer's first element), "transposed view" (its axes out of memory order), or "contiguous"."""
    a = np.asarray(a)
    if _expanded_axes(a):
        return "expanded"
    root = _root(a)
    own = root.dtype == np.uint8 and root.ndim == 1 and a.dtype != np.uint8  # at_alignment's raw byte buffer
    if root is not a and a.size and not own and a.__array_interface__["data"][0] != root.__array_interface__["data"][0]:
        return OFFSET
    if not a.flags.c_contiguous:
        return "transposed view"
    return "contiguous"


def _layout(case: Case) -> str:
    arrays = [np.asarray(a) for a in (case.query, case.key, case.value)]
    if any(_expanded_axes(a) for a in arrays):
        return "expanded"
    distinct = len({id(a) for a in (case.query, case.key, case.value)}) == 3
    roots = {id(_root(a)) for a in arrays}
    if distinct and len(roots) == 1 and all(a.base is not None for a in arrays):
        return "sliced from a packed QKV"
    forms = [memory_form(a) for a in arrays]
    if forms == ["contiguous", "transposed view", OFFSET]:
        return MIXED
    if forms == [OFFSET] * 3:
        return OFFSET
    if "transposed view" in forms:
        return "transposed view"
    return "contiguous"  # each argument as its own memory parameter says (key memory, ...)


def _identity(case: Case) -> str:
    q, k, v = case.query, case.key, case.value
    if q is k and k is v:
        return ONE_OBJECT
    if q is k:
        return "query is key"
    if k is v:
        return "key is value"
    return "distinct" if q is not v else "query is value"


def _asked(case: Case, how: Call) -> str:
    pres = case.presentation
    if pres is None or pres.requires_grad is None:
        return BY_DIRECTION
    names = [n for n in ("query", "key", "value", "bias") if n in pres.requires_grad]
    return ASKING.get(tuple(names), "other")


def _context(case: Case, how: Call) -> str:
    pres = case.presentation
    if pres is None or how.direction == "backward" or pres.grad_mode == "no_grad":
        return BY_DIRECTION
    return {"grad": "forward under grad", "inference": "forward under inference mode"}[pres.grad_mode]


def _switch(case: Case, part: int) -> str | None:
    """The kind of the ``part``-th switch of the case's context (Presentation.context), or None."""
    pres = case.presentation
    parts = joined(pres.context) if pres is not None else ()
    kinds = [k for k, _ in itertools.groupby(p.partition(":")[0] for p in parts)]  # several flags: one switch
    return kinds[part] if part < len(kinds) else None


def _scalar_forms(case: Case, flags: bool) -> str | None:
    """The case's scalar forms (Presentation.scalars) of the causal flag (``flags``) or of the other arguments."""
    pres = case.presentation
    parts = [p for p in joined(pres.scalars if pres is not None else None) if p.startswith("is_causal:") == flags]
    return "+".join(parts) or None


def _flag_types(case: Case) -> str:
    form = _scalar_forms(case, flags=True)
    return next((n for n, f in FLAG_TYPES.items() if f == form), "other")


def _scalar_types(case: Case) -> str:
    form = _scalar_forms(case, flags=False)
    name = next((n for n, f in SCALAR_TYPES.items() if f == form), "other")
    if name == "scale an int" and not (case.scale is not None and float(case.scale).is_integer()):
        return "other"  # an int only where the value is integral
    if name == "scale a NumPy float32" and not (case.scale is not None and float(np.float32(case.scale)) == case.scale):
        return "other"
    return name


def _transform(case: Case) -> str:
    pres = case.presentation
    form = pres.transform if pres is not None else None
    return next(n for n, f in TRANSFORMS.items() if f == form)


def _off_boundary(a) -> bool:
    if a is None:
        return False
    a = np.asarray(a)
    return a.size > 0 and a.ctypes.data % 64 != 0


def _arg_memory(name: str, form: str) -> Callable[[Case, Call], bool]:
    def holds(c: Case, d: Call) -> bool:
        a = getattr(c, name)
        if form in (AS_LAYOUT, AS_BUILT):
            return True  # the default names no form of its own: the joint layout (or the mask's form) decides
        if form == OFF_BOUNDARY:
            return _off_boundary(a) and memory_form(a) in ("contiguous", "expanded")
        if form == PITCHED:
            m = None if a is None else np.asarray(a)
            return m is not None and m.ndim >= 2 and m.shape[-2] > 1 and m.strides[-2] not in (0, m.shape[-1])
        return a is not None and memory_form(a) == form

    return holds


def _default_dtype(case: Case) -> str:
    pres = case.presentation
    return "float64" if pres is not None and pres.default_dtype == "float64" else "float32"


def _heads(g: int, many: bool = False) -> Callable[[Case, Call], bool]:
    return lambda c, d: c.Hq // max(c.Hkv, 1) == g and c.Hq % max(c.Hkv, 1) == 0 and (c.Hq > 16) == many


def _dv(rel: str) -> Callable[[Case, Call], bool]:
    return {"= Dk": lambda c, d: c.Dv == c.Dk, "< Dk": lambda c, d: c.Dv < c.Dk, "> Dk": lambda c, d: c.Dv > c.Dk}[rel]


def _is(read: Callable[[Case], object], want: object) -> Callable[[Case, Call], bool]:
    return lambda c, d: read(c) == want


EXPANDED_MASK = "[B,H,T,S], stride 0 along H"
MASK_FORMS = ("none", "[T,S]", "[B,1,1,S]", "[B,1,T,S]", "[1,H,T,S]", "[B,H,T,S]", "[S]", "[H,T,S]", EXPANDED_MASK)
SOME_KEYS = "some keys blocked"
LEADING_TILE = "leading keys blocked over a whole tile"
BIASES = ("none", "finite small", "finite large negative on whole rows", "-inf on some keys", "-inf on whole rows")
OFFSET = "offset into a larger buffer"
MIXED = "mixed (query contiguous, key a transposed view, value offset)"
LAYOUTS = ("contiguous", "transposed view", "sliced from a packed QKV", "expanded", OFFSET, MIXED)
ONE_OBJECT = "query, key and value one object"
IDENTITIES = ("distinct", "query is key", "key is value", ONE_OBJECT)
BY_DIRECTION = "as the direction asks"  # requires grad: none forward, Q, K, V backward; context: no_grad forward
# requires grad: the inputs that ask for a gradient (Presentation.requires_grad), by the names they take
ASKING = {
    ("query",): "query",
    ("key",): "key",
    ("value",): "value",
    ("key", "value"): "key and value",
    ("query", "value"): "query and value",
    ("query", "key"): "query and key",
    ("query", "key", "value"): "query, key and value",
    ("query", "key", "value", "bias"): "query, key, value and M",
}
SUBSETS = ("query", "key", "value", "key and value", "query and value", "query and key")  # not every grad is computed
CONTEXTS = (BY_DIRECTION, "forward under grad", "forward under inference mode")
# torch's default dtype around the call: its own is float32; a caller may have set float64 (a parameter apart
# from the context, so that inference mode meets it too)
DEFAULT_DTYPES = ("float32", "float64")
COTANGENTS = ("contiguous", "transposed view", "expanded", OFFSET)
# Each argument's own memory, beside the joint layout: a kernel that reads one argument at the wrong address or
# pitch is wrong only where that argument, and not the others, arrives so. "off a 64-byte boundary" is a
# contiguous array 1 to 3 elements past a 64-byte boundary (SIMD and GEMM blocking chosen by address); the
# mask "rows not S apart" is a per-row mask sliced from a wider one (row pitch S + 5, as a slice of a longer
# padding mask gives).
AS_LAYOUT = "as the layout says"
AS_BUILT = "as its form says"
OFF_BOUNDARY = "off a 64-byte boundary"
PITCHED = "rows not S apart"
QUERY_MEMORY = (AS_LAYOUT, OFF_BOUNDARY)
KV_MEMORY = (AS_LAYOUT, OFF_BOUNDARY, OFFSET)
MASK_MEMORY = (AS_BUILT, PITCHED, OFF_BOUNDARY)
ARGUMENT_MEMORY = ("query memory", "key memory", "value memory", "mask memory")
# The switches a caller of the framework sets around the call (Presentation.context), as classes of the kinds
# of contract.CONTEXT_KINDS: a row names the kind, and the covering clause applies a member the adapter offers
# (``contexts()``: every flag of torch.backends, each SDP backend, ...) that the row's seed picks. Two switches
# at once: "switch" then "second switch".
SWITCHES: dict[str, str | None] = {
    "none": None,
    "a backend flag flipped": "flag",
    "an SDP backend forced": "sdp_backend",
    "deterministic algorithms": "deterministic",
    "float32 matmul precision lowered": "matmul_precision",
    "autocast": "autocast",
    "anomaly detection": "anomaly",
    "subnormals flushed": "flush_denormal",
    "saved-tensor hooks": "saved_tensors_hooks",
    "activation checkpointing": "checkpoint",
    "another thread": "thread",
}
# Scalar arguments in the Python types callers pass (Presentation.scalars); the flags' forms (is_causal=1) are
# ARGS-SCALAR-TYPES-01's, where a refusal in a declared error class is an answer.
SCALAR_TYPES: dict[str, str | None] = {
    "Python float": None,
    "scale an int": "scale:int",
    "NumPy float64": "scale:numpy.float64+dropout_p:numpy.float64",
    "scale a NumPy float32": "scale:numpy.float32",
    "scale a 0-d tensor": "scale:tensor",
}
# The causal flag in the types callers pass it (Presentation.scalars): a numpy.bool_ read from an array or a
# config, 1 or 0 from an integer setting. Either is an answer (the plain form's) or a refusal in a declared
# error class (torch's SDPA takes a bool only), recorded as ARGS-SCALAR-TYPES-01 records it.
FLAG_TYPES: dict[str, str | None] = {
    "Python bool": None,
    "is_causal a NumPy bool": "is_causal:numpy.bool_",
    "is_causal an int": "is_causal:int",
}
# The call asked under a transform of the framework's (Presentation.transform): forward-mode AD of the forward,
# judged by the oracle's JVP along tangents of Q, K and V; vmap over this case and a second one of the same form
# and other values, each item judged by the oracle (a backward row: vmap of the VJP, per-example gradients). A
# transform met the other classes only in TRANSFORM-*'s few bases.
TRANSFORMS: dict[str, str | None] = {"none": None, "forward-mode AD": "jvp", "vmap": "vmap"}
SHAPE_PARAMETERS = ("B", "heads", "S", "T", "Dk", "Dv")  # what a per-shape cache keys on (the Q, K, V shapes)
NON_SHAPE_PARAMETERS = (
    "dtype",
    "mask form",
    "mask content",
    "additive M",
    "causal",
    "scale",
    "dropout",
    "layout",
    "identity",
    "requires grad",
    "context",
    "default dtype",
)
# The parameters of how a case reaches the kernel besides its values (the presentation, docs/case-space.md),
# and the Declaration.presents attribute each value other than the first needs.
PRESENTATION_PARAMETERS = (
    "identity",
    "requires grad",
    "context",
    "default dtype",
    "backward calls",
    "cotangent",
    "switch",
    "second switch",
    "scalar types",
    "flag types",
    "transform",
    *ARGUMENT_MEMORY,
)

PARAMETERS: tuple[Parameter, ...] = (
    Parameter("dtype", tuple(_v(d, _is(lambda c: c.dtype, d)) for d in DTYPES)),
    Parameter(
        "B",
        (
            _v("1", lambda c, d: c.B == 1),
            _v("2", lambda c, d: c.B == 2),
            _v("5 or more", lambda c, d: c.B >= 5 and c.B != c.Hq),
            _v("equal to H", lambda c, d: c.B == c.Hq > 2),
        ),
    ),
    Parameter(
        "heads",
        (
            _v("1:1", _heads(1)),
            _v("2:1", _heads(2)),
            _v("3:1", _heads(3)),
            _v("8:1", _heads(8)),
            _v("more than 16 heads", _heads(1, many=True)),
        ),
    ),
    Parameter(
        "S",
        (
            _v("< 16", lambda c, d: 1 < c.S < 16),
            _v("1", lambda c, d: c.S == 1),
            _v("a tile tail", lambda c, d: TILE < c.S < 2 * TILE),
            _v("several tiles", lambda c, d: 2 * TILE < c.S <= 256),
            _v("long", lambda c, d: c.S > 256),
        ),
    ),
    Parameter(
        "T",
        (
            _v("< S", lambda c, d: 1 < c.T < c.S),
            _v("1", lambda c, d: c.T == 1),
            _v("= S", lambda c, d: c.T == c.S > 1),
            _v("> S", lambda c, d: c.T > c.S),
            _v("odd", lambda c, d: c.T % 2 == 1 and c.T > 1),
            _v("past a tile", lambda c, d: c.T > TILE),
        ),
    ),
    Parameter(
        "Dk",
        tuple(_v(n, _is(lambda c: c.Dk, k)) for n, k in (("8", 8), ("1", 1)))
        + (_v("not a multiple of 8", lambda c, d: c.Dk % 8 != 0 and 1 < c.Dk < 64),)
        + (_v("64", _is(lambda c: c.Dk, 64)),)
        + (_v("above 64, not a multiple of 32", lambda c, d: c.Dk > 64 and c.Dk % 32 != 0),)
        + tuple(_v(n, _is(lambda c: c.Dk, k)) for n, k in (("128", 128), ("160", 160), ("256", 256))),
    ),
    Parameter("Dv", tuple(_v(r, _dv(r)) for r in ("= Dk", "< Dk", "> Dk"))),
    Parameter("mask form", tuple(_v(f, _is(lambda c: _form(c, c.mask), f)) for f in MASK_FORMS)),
    Parameter(
        "mask content",
        (
            _v(SOME_KEYS, lambda c, d: c.mask is None or not (_leading_tile(c) or _rows_blocked(c.mask, False))),
            _v(LEADING_TILE, lambda c, d: c.mask is not None and _leading_tile(c)),
            _v("rows blocked entirely", lambda c, d: c.mask is not None and _rows_blocked(c.mask, False)),
        ),
    ),
    Parameter("additive M", tuple(_v(b, _is(_bias_class, b)) for b in BIASES)),
    Parameter("causal", (_v("off", lambda c, d: not c.is_causal), _v("on", lambda c, d: c.is_causal))),
    Parameter(
        "scale",
        (
            _v("default", lambda c, d: c.scale is None),
            _v("custom", lambda c, d: c.scale is not None and c.scale > 0),
            _v("negative", lambda c, d: c.scale is not None and c.scale < 0),
            _v("zero", lambda c, d: c.scale == 0),
        ),
    ),
    Parameter("dropout", (_v("off", lambda c, d: c.dropout_p == 0), _v("on", lambda c, d: c.dropout_p > 0))),
    Parameter("layout", tuple(_v(n, _is(_layout, n)) for n in LAYOUTS)),
    Parameter("call", (_v("first", lambda c, d: d.call == "first"), _v("again", lambda c, d: d.call == "again"))),
    Parameter(
        "direction",
        (_v("forward", lambda c, d: d.direction == "forward"), _v("backward", lambda c, d: d.direction == "backward")),
    ),
    Parameter("identity", tuple(_v(n, _is(_identity, n)) for n in IDENTITIES)),
    Parameter(
        "requires grad", tuple(_v(n, lambda c, d, n=n: _asked(c, d) == n) for n in (BY_DIRECTION, *ASKING.values()))
    ),
    Parameter("context", tuple(_v(n, lambda c, d, n=n: _context(c, d) == n) for n in CONTEXTS)),
    Parameter("default dtype", tuple(_v(n, lambda c, d, n=n: _default_dtype(c) == n) for n in DEFAULT_DTYPES)),
    Parameter(
        "backward calls",
        (
            _v(
                "once",
                lambda c, d: d.direction == "forward" or c.presentation is None or c.presentation.backward == "once",
            ),
            _v(
                "twice over one graph",
                lambda c, d: (
                    d.direction == "backward" and c.presentation is not None and c.presentation.backward == "twice"
                ),
            ),
        ),
    ),
    Parameter("cotangent", tuple(_v(n, lambda c, d, n=n: d.cotangent == n) for n in COTANGENTS)),
    Parameter("switch", tuple(_v(n, lambda c, d, k=k: _switch(c, 0) == k) for n, k in SWITCHES.items())),
    Parameter("second switch", tuple(_v(n, lambda c, d, k=k: _switch(c, 1) == k) for n, k in SWITCHES.items())),
    Parameter("scalar types", tuple(_v(n, lambda c, d, n=n: _scalar_types(c) == n) for n in SCALAR_TYPES)),
    Parameter("flag types", tuple(_v(n, lambda c, d, n=n: _flag_types(c) == n) for n in FLAG_TYPES)),
    Parameter("transform", tuple(_v(n, lambda c, d, n=n: _transform(c) == n) for n in TRANSFORMS)),
    Parameter("query memory", tuple(_v(n, _arg_memory("query", n)) for n in QUERY_MEMORY)),
    Parameter("key memory", tuple(_v(n, _arg_memory("key", n)) for n in KV_MEMORY)),
    Parameter("value memory", tuple(_v(n, _arg_memory("value", n)) for n in KV_MEMORY)),
    Parameter("mask memory", tuple(_v(n, _arg_memory("mask", n)) for n in MASK_MEMORY)),
)
BY_NAME: dict[str, Parameter] = {p.name: p for p in PARAMETERS}
DEFAULTS: dict[str, str] = {p.name: p.default for p in PARAMETERS}


@dataclass(frozen=True)
class Constraint:
    """Values that cannot meet in one case, or that read as other values when they do, and why."""

    params: tuple[str, ...]
    excludes: Callable[..., bool]  # called with the values of ``params`` in order
    reason: str


_T_AXIS_FORMS = ("[T,S]", "[B,1,T,S]", "[1,H,T,S]", "[B,H,T,S]", "[H,T,S]", EXPANDED_MASK)
_B_AXIS_FORMS = ("[B,1,1,S]", "[B,1,T,S]", "[B,H,T,S]", EXPANDED_MASK)
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(("T", "S"), lambda t, s: s == "1" and t in ("< S", "= S"), "T < S and T = S > 1 need S > 1"),
    Constraint(("T", "mask form"), lambda t, f: t == "1" and f in _T_AXIS_FORMS, "at T = 1 a mask's T axis reads as 1"),
    Constraint(("B", "mask form"), lambda b, f: b == "1" and f in _B_AXIS_FORMS, "at B = 1 a mask's B axis reads as 1"),
    Constraint(
        ("mask form", "mask content"),
        lambda f, m: f == "none" and m != SOME_KEYS,
        "a mask content needs a boolean mask",
    ),
    Constraint(
        ("mask form", "mask content"),
        lambda f, m: f == "[S]" and m == "rows blocked entirely",
        "a 1-D mask is one row for every query: blocking it blocks every row of the case",
    ),
    Constraint(
        ("S", "mask content"),
        lambda s, m: m == LEADING_TILE and s in ("1", "< 16"),
        "a whole tile of 32 keys blocked needs S > 32",
    ),
    Constraint(("B", "heads"), lambda b, h: b == "equal to H" and h == "1:1", "B = H = 2 is the class B = 2"),
    Constraint(
        ("S", "mask form", "mask content"),
        lambda s, f, m: s == "1" and f != "none" and m == SOME_KEYS,
        "at S = 1 a mask that keeps a key in every row blocks nothing (it reads as no mask)",
    ),
    Constraint(
        ("S", "additive M"), lambda s, b: s == "1" and b == "-inf on some keys", "at S = 1 the one key is kept finite"
    ),
    Constraint(
        ("B", "heads", "T", "S", "layout"),
        lambda b, h, t, s, x: x == "transposed view" and b == "1" and t == "1" and (h in ("3:1", "8:1") or s == "1"),
        "a transposed view needs two of B, H, T (S) longer than 1 in Q or K",
    ),
    Constraint(("Dk", "Dv"), lambda k, v: k == "1" and v == "< Dk", "no head dim is below Dk = 1"),
    Constraint(
        ("T", "identity"),
        lambda t, i: i in ("query is key", ONE_OBJECT) and t != "= S",
        "one object for the query and the key needs T = S",
    ),
    Constraint(
        ("heads", "identity"),
        lambda h, i: i in ("query is key", ONE_OBJECT) and h not in ("1:1", "more than 16 heads"),
        "one object for the query and the key needs as many key heads as query heads",
    ),
    Constraint(
        ("Dv", "identity"),
        lambda v, i: i in ("key is value", ONE_OBJECT) and v != "= Dk",
        "one object for the key and the value needs Dv = Dk",
    ),
    Constraint(
        ("layout", "identity"),
        lambda x, i: i != "distinct" and x in ("sliced from a packed QKV", MIXED),
        "views into one packed buffer, or of three memory forms, are three objects",
    ),
    Constraint(
        ("requires grad", "identity"),
        lambda r, i: (
            (i == "query is key" and r in ("query", "key", "query and value", "key and value"))
            or (i == "key is value" and r in ("key", "value", "query and key", "query and value"))
            or (i == ONE_OBJECT and r in SUBSETS)
        ),
        "one object asks for its gradient as a whole (a subset asking would split it)",
    ),
    Constraint(
        ("requires grad", "additive M"),
        lambda r, b: r == "query, key, value and M" and b == "none",
        "M's gradient needs an additive M",
    ),
    Constraint(
        ("requires grad", "dropout"),
        lambda r, d: r == "query, key, value and M" and d == "on",
        "M's gradient is not judged under dropout (the replayed mask is lifted into V, not into M)",
    ),
    Constraint(
        ("context", "direction"),
        lambda c, d: d == "backward" and c in ("forward under grad", "forward under inference mode"),
        "a backward runs under autograd whatever a forward's context",
    ),
    Constraint(
        ("backward calls", "direction"),
        lambda b, d: d == "forward" and b != "once",
        "a second backward needs a backward",
    ),
    Constraint(
        ("cotangent", "direction"), lambda c, d: d == "forward" and c != "contiguous", "a cotangent needs a backward"
    ),
    Constraint(
        ("switch", "second switch"),
        lambda a, b: b != "none" and a in ("none", b),
        "a second switch needs a first, and one switch set twice is one switch",
    ),
    Constraint(
        ("scalar types", "scale"),
        lambda s, c: s != "Python float" and c == "default",
        "a scalar's Python type needs the scale given",
    ),
    *(
        Constraint(
            (joint, own),
            lambda j, m, joint=joint: m != AS_LAYOUT and j != ("contiguous" if joint == "layout" else "distinct"),
            "an argument's own memory form needs the three arguments distinct and the joint layout contiguous",
        )
        for joint in ("layout", "identity")
        for own in ("query memory", "key memory", "value memory")
    ),
    Constraint(
        ("mask form", "mask memory"),
        lambda f, m: m != AS_BUILT and f == "none",
        "a mask's memory needs a boolean mask",
    ),
    Constraint(
        ("T", "mask memory"),
        lambda t, m: m == PITCHED and t == "1",
        "a row pitch needs a mask with more than one row (a T axis, T > 1)",
    ),
    Constraint(
        ("mask form", "mask memory"),
        lambda f, m: m == PITCHED and f not in _T_AXIS_FORMS,
        "a row pitch needs a mask with more than one row (a T axis, T > 1)",
    ),
    Constraint(
        ("transform", "direction"),
        lambda x, d: x == "forward-mode AD" and d == "backward",
        "forward-mode AD is asked of the forward (of the backward: TRANSFORM-FWD-OVER-REV-02)",
    ),
    Constraint(
        ("transform", "backward calls"),
        lambda x, b: x != "none" and b != "once",
        "a backward under vmap is one VJP per item (a second backward is asked without a transform)",
    ),
    Constraint(
        ("transform", "dropout"),
        lambda x, d: x != "none" and d == "on",
        "under a transform dropout's mask is not replayed (vmap draws per item, and the replay lifts it into V)",
    ),
    *(
        Constraint(
            ("transform", other),
            lambda x, o, first=first: x != "none" and o != first,
            "a transform is asked with the inputs as the direction asks, no switch set around it",
        )
        for other, first in (("requires grad", BY_DIRECTION), ("switch", "none"))
    ),
    Constraint(
        ("transform", "context"),
        lambda x, c: x == "forward-mode AD" and c != BY_DIRECTION,
        "forward-mode AD sets its own context (a dual level); vmap runs under grad or inference mode too",
    ),
    Constraint(
        ("T", "cotangent"),
        lambda t, c: t == "1" and c == "expanded",
        "a cotangent expanded along the query axis needs T > 1",
    ),
    Constraint(
        ("B", "T", "cotangent"),
        lambda b, t, c: c == "transposed view" and b == "1" and t == "1",
        "a transposed cotangent needs B or T longer than 1",
    ),
)


_CONSTRAINED = tuple(sorted({p for c in CONSTRAINTS for p in c.params}))


def violated(row: dict[str, str]) -> list[str]:
    """The reasons of every constraint ``row`` (a partial row: parameter -> value) breaks."""
    return list(_violated(tuple(map(row.get, _CONSTRAINED))))


# each constraint's parameters read out of a _CONSTRAINED tuple in one C call (the planner asks this for every
# row it tries: hundreds of thousands of times for a kernel that presents everything), and its answers kept
def _getter(params: tuple[str, ...]) -> Callable[[tuple], tuple]:
    get = operator.itemgetter(*(_CONSTRAINED.index(p) for p in params))
    return get if len(params) > 1 else lambda values: (get(values),)  # itemgetter of one index gives no tuple


_GETTERS = tuple(_getter(c.params) for c in CONSTRAINTS)
_ANSWERS: tuple[dict, ...] = tuple({} for _ in CONSTRAINTS)


@functools.lru_cache(maxsize=1 << 16)
def _violated(values: tuple) -> tuple[str, ...]:
    out = []
    for c, get, seen in zip(CONSTRAINTS, _GETTERS, _ANSWERS):
        args = get(values)
        if None in args:
            continue
        broken = seen.get(args)
        if broken is None:
            broken = seen[args] = bool(c.excludes(*args))
        if broken:
            out.append(c.reason)
    return tuple(out)


def reached_values(case: Case, how: Call | str, planned: dict[str, str] | None = None) -> dict[str, str]:
    """The value class of each parameter that ``case`` (sent as ``how``: a :class:`Call`, or its
    direction alone) is in: the ``planned`` one when the case is in it (classes overlap: T = 5 is odd
    and may be < S), else the first that holds; a parameter whose class no value names (a mask form
    outside the table) is left out."""
    out = {}
    how = Call(how) if isinstance(how, str) else how
    planned = planned or {}
    for p in PARAMETERS:
        first = [p.value(planned[p.name])] if p.name in planned else []
        for v in first + list(p.values):
            try:
                ok = v.holds(case, how)
            except Exception:  # noqa: BLE001 - a malformed case is in no class
                ok = False
            if ok:
                out[p.name] = v.name
                break
    return out
