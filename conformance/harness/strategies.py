"""Hypothesis strategies and profiles.

Two profiles: ``ci`` (derandomized, so every run of the same command sees the same examples and a
failure reproduces with the command printed beside it) and ``thorough`` (random seeds, many more
examples). Example counts are set per clause with :func:`examples`, sized for the clause's power
rather than by habit; the profile multiplies them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from conformance.contract import Case, Declaration

_PROFILE = {"name": "ci"}
PREFIX = "sdpa-conformance-"  # hypothesis has a built-in "ci" profile; ours must not replace it
_MULTIPLIER = {"ci": 1, "thorough": 10}


def register_profiles() -> None:
    common = dict(
        deadline=None,
        print_blob=True,
        # no "explain" phase: its line-coverage notes point into the suite, not into the kernel
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.differing_executors,
            HealthCheck.function_scoped_fixture,
            HealthCheck.filter_too_much,
        ],
    )
    settings.register_profile(PREFIX + "ci", derandomize=True, database=None, **common)
    settings.register_profile(PREFIX + "thorough", derandomize=False, **common)


def load_profile(name: str) -> None:
    register_profiles()
    settings.load_profile(PREFIX + name)
    _PROFILE["name"] = name


def examples(ci: int) -> settings:
    """Settings for a clause whose ci profile needs ``ci`` examples (thorough: 10x).

    The parent is named explicitly: other libraries imported during collection (torch's test
    utilities, for one) load hypothesis profiles of their own, and a clause must not inherit theirs.
    """
    register_profiles()
    parent = settings.get_profile(PREFIX + _PROFILE["name"])
    return settings(parent=parent, max_examples=ci * _MULTIPLIER.get(_PROFILE["name"], 1))


@dataclass(frozen=True)
class Shape:
    B: int
    Hq: int
    Hkv: int
    T: int
    S: int
    Dk: int
    Dv: int


@st.composite
def shapes(
    draw,
    *,
    gqa: bool = True,
    max_len: int = 17,
    dims: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 16, 24, 32),
    square_dims: bool = False,
    sp: Space | None = None,
) -> Shape:
    """Small attention shapes, T != S and Dk != Dv included; shrinks towards 1s.

    With a ``sp`` that lists structures (a kernel that compiles per shape, ci profile: see
    :func:`space_for`), the shape is one of theirs, so the clause compiles few distinct shapes.
    """
    if sp is not None and sp.structures:
        one = draw(st.sampled_from(sp.structures))
        g = one.group if gqa else 1
        return Shape(one.B, one.Hkv * g, one.Hkv, one.T, one.S, one.Dk, one.Dk if square_dims else one.Dv)
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3)) if gqa else 1
    T = draw(st.integers(1, max_len))
    S = draw(st.integers(1, max_len))
    Dk = draw(st.sampled_from(dims))
    Dv = Dk if square_dims else draw(st.sampled_from(dims))
    return Shape(B, Hkv * group, Hkv, T, S, Dk, Dv)


seeds = st.integers(0, 2**31 - 1)


# -- the whole case space ---------------------------------------------------------------------------
# Everything below draws one attention problem from the space a declaration admits: shapes with
# T < S, T == S, T > S (T = 1 and S = 1 included), B and H > 1, GQA ratios 1..8, Dk != Dv, head dims
# off the multiples of 8, tile-tail lengths; every broadcast form of a boolean and of an additive
# mask, both together, rows blocked entirely by either, causal with and without masks, a custom
# scale; contiguous, non-contiguous and broadcast (stride 0) inputs. Values and masks are drawn by
# hypothesis element by element, as small dyadic numbers (integers / 4 in [-2, 2], exact in every
# dtype, bfloat16 included), so a failure shrinks to a small mask and small numbers that a person can
# read; only arrays too large to draw element-wise (rare tile-tail lengths) are filled from a drawn
# seed. Features the declaration rules out are never drawn (they are filtered before building, not
# rejected after): the verdict's "examples run vs planned" stays an honest count.

MASK_FORMS: tuple[str, ...] = ("none", "[T,S]", "[1,1,T,S]", "[B,1,T,S]", "[1,H,T,S]", "[B,H,T,S]", "[B,1,1,S]")
TAIL_LENGTHS: tuple[int, ...] = (31, 33, 63, 65, 127, 129)
SMALL_DIMS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 16)
LAYOUTS: tuple[str, ...] = ("contiguous", "non-contiguous", "broadcast")
BIAS_VALUES: tuple[float, ...] = (0.0, -1.0, 1.0, -0.5, 0.5, -2.0, 2.0, float("-inf"))
SCALES: tuple[float | None, ...] = (None, 0.5, 0.25, 1.0, 0.3)
VALUE_STEP = 0.25  # values are k * VALUE_STEP with |k| <= VALUE_UNITS: dyadic, exact in every dtype
VALUE_UNITS = 8
ELEMENTWISE_MAX = 512  # arrays up to this many elements are drawn element by element (shrinkable)


@dataclass(frozen=True)
class Structure:
    """Everything about a case that a compiling kernel keys its compiled program on: the shapes,
    which masks are present and their broadcast forms, is_causal and the scale."""

    B: int
    Hkv: int
    group: int
    T: int
    S: int
    Dk: int
    Dv: int
    mask_form: str
    bias_form: str
    is_causal: bool
    scale: float | None

    def admitted(self, decl: Declaration) -> Structure:
        """This structure with every feature ``decl`` rules out turned off (never rejected)."""
        cap = decl.max_head_dim or max(self.Dk, self.Dv)
        Dk = min(self.Dk, cap)
        return dataclasses.replace(
            self,
            group=self.group if decl.gqa else 1,
            Dk=Dk,
            Dv=Dk if decl.requires_dk_eq_dv else min(self.Dv, cap),
            mask_form=self.mask_form if decl.bool_mask else "none",
            bias_form=self.bias_form if decl.float_mask else "none",
            is_causal=self.is_causal and decl.causal,
            scale=self.scale if decl.custom_scale else None,
        )


@dataclass(frozen=True)
class Space:
    """How far the drawn space reaches; the profile picks one (:func:`space`).

    ``tail_percent`` is the chance (in %) that a sequence length or head dim is drawn from the
    tile-tail lengths instead of the small ones. ``structures``, when given, replaces the free draw
    of shapes, mask forms, is_causal and scale by a choice among these few, for kernels that compile
    per shape (their cold cost is one compilation per distinct structure and dtype); masks, rows
    blocked entirely, layouts and values are still drawn freely within each.
    """

    max_len: int = 9
    max_batch: int = 3
    max_group: int = 8
    tail_percent: int = 4
    max_empty_rows: int = 2
    structures: tuple[Structure, ...] | None = None


CI_SPACE = Space()
THOROUGH_SPACE = Space(max_len=17, tail_percent=10, max_empty_rows=3)
# For kernels that compile per shape, in the ci profile: eight structures that between them meet
# every T/S relation (decode T = 1, S = 1, a tile tail), B and H > 1, GQA 1:1 to 8:1 and MQA, every
# broadcast form of both masks, both together, causal with each, custom scales, head dims off 8 and
# Dk != Dv. The first is the simplest, where a failure shrinks to when it can.
COMPILING_STRUCTURES: tuple[Structure, ...] = (
    Structure(1, 1, 1, 1, 1, 8, 8, "none", "none", False, None),
    Structure(2, 1, 8, 1, 7, 8, 8, "[B,1,1,S]", "[1,H,T,S]", False, None),
    Structure(2, 2, 2, 5, 5, 16, 16, "[B,1,1,S]", "[B,H,T,S]", True, 0.5),
    Structure(3, 1, 4, 4, 9, 3, 5, "[B,H,T,S]", "[1,1,T,S]", True, None),
    Structure(2, 2, 3, 9, 4, 8, 8, "[1,H,T,S]", "[T,S]", False, 0.25),
    Structure(2, 2, 1, 6, 1, 5, 8, "[T,S]", "[B,1,T,S]", True, None),
    Structure(1, 2, 2, 33, 33, 8, 8, "[B,1,T,S]", "[B,1,1,S]", True, 1.0),
    Structure(2, 1, 2, 3, 6, 8, 8, "[1,1,T,S]", "none", False, None),
)


def space(compiles_per_shape: bool = False) -> Space:
    """The space of the loaded profile; ``compiles_per_shape`` gives the ci profile's few structures."""
    if _PROFILE["name"] == "thorough":
        return THOROUGH_SPACE
    if compiles_per_shape:
        return Space(structures=COMPILING_STRUCTURES, tail_percent=0)
    return CI_SPACE


@dataclass(frozen=True, eq=False)
class Drawn:
    """One drawn configuration: the case, the cotangent for a VJP, and what was drawn, readably.

    Its ``repr`` is what hypothesis prints for a failing (shrunk) example, so it shows the shape,
    the flags and every array small enough to read, masks as 0/1 (1 = blocked).
    """

    case: Case
    grad_out: np.ndarray | None
    mask_form: str
    bias_form: str
    layout: str
    empty_rows: tuple[str, ...]

    def _repr_pretty_(self, printer, cycle) -> None:  # hypothesis' printer, which prefers this to __repr__
        printer.text(repr(self))

    def __repr__(self) -> str:
        c = self.case
        head = (
            f"{c.dtype} B={c.B} Hq={c.Hq} Hkv={c.Hkv} T={c.T} S={c.S} Dk={c.Dk} Dv={c.Dv} "
            f"is_causal={c.is_causal} scale={c.scale} layout={self.layout}"
        )
        if self.empty_rows:
            head += f" rows blocked entirely: {', '.join(self.empty_rows)}"
        lines = [head]
        arrays = [("q", c.query), ("k", c.key), ("v", c.value)]
        if c.mask is not None:
            arrays.append((f"mask{self.mask_form} (1 = blocked)", np.asarray(c.mask).astype(np.int8)))
        if c.bias is not None:
            arrays.append((f"bias{self.bias_form}", c.bias))
        if self.grad_out is not None:
            arrays.append(("grad_out", self.grad_out))
        for name, a in arrays:
            lines.append(f"  {name} = {_show(a)}")
        return "\n".join(lines)


def _show(a: np.ndarray) -> str:
    a = np.asarray(a)
    if a.size > ELEMENTWISE_MAX:
        return f"<{'x'.join(map(str, a.shape))} array: {ELEMENTWISE_MAX} elements drawn, the rest from a drawn seed>"
    vals = a if a.dtype.kind in "bi" else a.astype(np.float64)
    text = np.array2string(vals, separator=", ", max_line_width=10_000, threshold=ELEMENTWISE_MAX + 1)
    return " ".join(text.split())


def _mostly_not_first(options) -> st.SearchStrategy:
    """Choose among ``options``, shrinking to the first (the simplest: 1, "none", None) but
    generating it rarely: the other options are listed three times. Generation then meets batches,
    GQA groups and masks together often, while a failure still shrinks to the plain case."""
    options = tuple(options)
    return st.sampled_from(options[:1] + options[1:] * 3)


def _rarely(draw, percent: int) -> bool:
    """True with about ``percent`` % chance. The window sits mid-range: hypothesis favours the
    bounds of an integer range (0 and 99 come up far more often than 1 in 100)."""
    return bool(percent) and 40 <= draw(st.integers(0, 99)) < 40 + percent


def _length(draw, sp: Space) -> int:
    if _rarely(draw, sp.tail_percent):
        return draw(st.sampled_from(TAIL_LENGTHS))
    return draw(st.integers(1, sp.max_len))


RELATIONS: tuple[str, ...] = ("any", "T == S", "T < S", "T > S", "decode T = 1", "S = 1")


def _lengths(draw, sp: Space) -> tuple[int, int]:
    """(T, S) in a relation drawn first: each shape class gets its share of examples (hypothesis
    mutates an example's values more often than its shape, so a class left to chance is rare)."""
    rel = draw(st.sampled_from(RELATIONS))
    if rel == "decode T = 1":
        return 1, _length(draw, sp)
    if rel == "S = 1":
        return _length(draw, sp), 1
    a = _length(draw, sp)
    if rel == "T == S":
        return a, a
    b = _length(draw, sp)
    if rel == "T < S" and a >= b:
        a, b = (a, a + 1) if a == b else (b, a)
    elif rel == "T > S" and a <= b:
        a, b = (a + 1, a) if a == b else (b, a)
    return a, b


def _dim(draw, sp: Space, allowed: tuple[int, ...]) -> int:
    tails = tuple(d for d in TAIL_LENGTHS if d in allowed)
    if tails and _rarely(draw, sp.tail_percent):
        return draw(st.sampled_from(tails))
    return draw(st.sampled_from(tuple(d for d in allowed if d not in TAIL_LENGTHS)))


def _drawn(draw, shape: tuple[int, ...], decode, rest) -> np.ndarray:
    """An array whose first ``ELEMENTWISE_MAX`` elements (in C order) are decoded from bytes that
    hypothesis draws (``decode(uint8 array)``, byte 0 decoding to the simplest value), and whose
    remaining ones ``rest(rng, count)`` fills from a drawn seed.

    One byte string per array, not one choice per element: the shrinker lowers each byte towards 0
    just the same, at a fraction of the cost of hundreds of separate choices. Its length may exceed
    the array (up to the cap), so when the shrinker tries a smaller shape the drawn bytes still fit
    (an exact length would make them misfit, and the smaller shape look like a pass), and the bytes
    past the array are dropped in one step; a shape beyond the cap adds one seed, so a smaller shape
    is never a longer example.
    """
    from conformance.harness.cases import rng_for

    n = int(np.prod(shape))
    m = min(n, ELEMENTWISE_MAX)
    raw = draw(st.binary(min_size=m, max_size=ELEMENTWISE_MAX))
    head = decode(np.frombuffer(raw, dtype=np.uint8)[:m])
    if n <= ELEMENTWISE_MAX:
        return head.reshape(shape)
    tail = rest(rng_for(draw(st.integers(0, 2**31 - 1))), n - ELEMENTWISE_MAX)
    return np.concatenate([head, tail.astype(head.dtype)]).reshape(shape)


def _zigzag(raw: np.ndarray) -> np.ndarray:
    """Bytes to integers in [-VALUE_UNITS, VALUE_UNITS]: 0, -1, 1, -2, 2, ... (0 first, small next)."""
    u = raw.astype(np.int64) % (2 * VALUE_UNITS + 1)
    return np.where(u % 2 == 1, -(u + 1) // 2, u // 2)


def _values(draw, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Dyadic values k/4, |k| <= 8 (each drawn one shrinks to 0)."""
    from conformance.harness.cases import cast

    units = _drawn(draw, shape, _zigzag, lambda rng, n: rng.integers(-VALUE_UNITS, VALUE_UNITS + 1, size=n))
    return cast(units.astype(np.float64) * VALUE_STEP, dtype)


def _form_shape(form: str, B: int, H: int, T: int, S: int) -> tuple[int, ...]:
    sizes = {"B": B, "H": H, "T": T, "S": S, "1": 1}
    return tuple(sizes[x] for x in form.strip("[]").split(","))


def _mask_bits(draw, shape: tuple[int, ...]) -> np.ndarray:
    """True = blocked; each drawn bit shrinks to False (visible)."""
    return _drawn(draw, shape, lambda raw: raw % 2 == 1, lambda rng, n: rng.random(n) < 0.3)


def _bias_values(draw, shape: tuple[int, ...]) -> np.ndarray:
    """Values of the additive M from BIAS_VALUES, -inf included; each drawn one shrinks to 0."""
    values = np.asarray(BIAS_VALUES)
    return _drawn(
        draw, shape, lambda raw: values[raw % len(values)], lambda rng, n: values[rng.integers(0, len(values), n)]
    )


def _rows(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape[:-1]))


def _own_index(shape: tuple[int, ...], b: int, h: int, t: int) -> tuple[int, ...]:
    """The row of a broadcastable mask of ``shape`` that full row (b, h, t) reads."""
    full = (b, h, t)[-(len(shape) - 1) :]
    return tuple(0 if n == 1 else int(i) for n, i in zip(shape[:-1], full))


def _layout(x: np.ndarray, layout: str, source_axis: int | None) -> np.ndarray:
    """The same values in another memory layout: transposed storage, or stride 0 along an axis.

    Transposed storage swaps two of the B, H, T axes that are longer than 1 (e.g. a [B,T,H,D]
    buffer viewed as [B,H,T,D]); the last axis keeps stride 1, as fused kernels require of any
    tensor. With fewer than two such axes no permutation is non-contiguous, and the array stays.
    """
    if layout == "non-contiguous":
        axes = [i for i in range(3) if x.shape[i] > 1]
        if len(axes) < 2:
            return x
        a, b = axes[0], axes[-1]
        return np.ascontiguousarray(np.swapaxes(x, a, b)).swapaxes(a, b)
    if layout == "broadcast" and source_axis is not None:
        return np.broadcast_to(np.take(x, [0], axis=source_axis), x.shape)
    return x


def _broadcast_axis(n_batch: int, n_heads: int) -> int | None:
    return 0 if n_batch > 1 else (1 if n_heads > 1 else None)


def empty_rows_allowed(decl: Declaration, *, has_mask: bool, has_bias: bool, is_causal: bool, grad: bool) -> bool:
    """Whether a drawn case may contain rows blocked entirely, given what the kernel declared.

    Such rows take the declared policy (``Declaration.all_blocked_policy``). A kernel that fills
    rows emptied by ``-inf`` differently from rows emptied by its boolean mask (jax: NaN vs mean of V)
    has declared nothing for rows emptied by the two together, nor for ``-inf`` rows under is_causal
    (its causal fill is the boolean one); a mean-of-V fill over keys some of which are ``-inf`` is not
    defined either; and a VJP through NaN rows is NaN by declaration.
    """
    one_fill = decl.all_blocked_float_mask in (None, decl.all_blocked)
    if grad and "nan" in (decl.all_blocked, decl.all_blocked_float_mask):
        return False
    if has_mask and has_bias:
        return one_fill and decl.all_blocked != "mean-v"
    if has_bias and is_causal:
        return one_fill
    return True


def _free_structure(draw, decl: Declaration, sp: Space) -> Structure:
    """Shapes, mask forms, is_causal and scale drawn freely from what ``decl`` admits."""
    B = draw(_mostly_not_first(range(1, sp.max_batch + 1)))
    Hkv = draw(st.sampled_from((1, 2))) if decl.gqa else draw(_mostly_not_first((1, 2, 3)))  # Hkv = 1: MQA
    group = draw(_mostly_not_first(range(1, sp.max_group + 1))) if decl.gqa else 1
    T, S = _lengths(draw, sp)
    dims = SMALL_DIMS + TAIL_LENGTHS
    if decl.max_head_dim is not None:
        dims = tuple(d for d in dims if d <= decl.max_head_dim) or (min(decl.max_head_dim, 1),)
    Dk = _dim(draw, sp, dims)
    Dv = Dk if decl.requires_dk_eq_dv or draw(st.booleans()) else _dim(draw, sp, dims)
    mask_form = draw(_mostly_not_first(MASK_FORMS)) if decl.bool_mask else "none"
    bias_form = draw(_mostly_not_first(MASK_FORMS)) if decl.float_mask else "none"
    is_causal = draw(st.booleans()) if decl.causal else False
    scale = draw(_mostly_not_first(SCALES)) if decl.custom_scale else None
    return Structure(B, Hkv, group, T, S, Dk, Dv, mask_form, bias_form, is_causal, scale)


@st.composite
def configs(draw, decl: Declaration, dtype: str, *, sp: Space | None = None, grad: bool = False) -> Drawn:
    """One case from the whole space ``decl`` admits, in ``dtype`` (see the comment above)."""
    from conformance.contract import Case
    from conformance.oracle import blocked_and_bias, causal_blocked

    sp = sp or space()
    if sp.structures:
        shape = draw(st.sampled_from(sp.structures)).admitted(decl)
    else:
        shape = _free_structure(draw, decl, sp)
    B, Hkv, Hq, T, S = shape.B, shape.Hkv, shape.Hkv * shape.group, shape.T, shape.S
    Dk, Dv, mask_form, bias_form = shape.Dk, shape.Dv, shape.mask_form, shape.bias_form
    is_causal, scale = shape.is_causal, shape.scale
    has_mask, has_bias = mask_form != "none", bias_form != "none"
    empties_ok = empty_rows_allowed(decl, has_mask=has_mask, has_bias=has_bias, is_causal=is_causal, grad=grad)
    if is_causal and decl.causal_alignment == "bottom-right" and T > S and not empties_ok:
        is_causal = False  # its first T - S rows would be empty, which this kernel has not declared
    mask = _mask_bits(draw, _form_shape(mask_form, B, Hq, T, S)) if has_mask else None
    bias = _bias_values(draw, _form_shape(bias_form, B, Hq, T, S)) if has_bias else None
    empty: list[str] = []
    meant = np.zeros((B, Hq, T), dtype=bool)  # rows blocked entirely on purpose
    for kind, arr in (("bool", mask), ("float -inf", bias)):
        if arr is None:
            continue
        picked = []
        if empties_ok and sp.max_empty_rows:
            picked = draw(st.lists(st.integers(0, _rows(arr.shape) - 1), max_size=sp.max_empty_rows, unique=True))
        own = np.zeros(arr.shape[:-1], dtype=bool)
        own.reshape(-1)[picked] = True
        arr[own] = True if kind == "bool" else -np.inf
        meant |= np.broadcast_to(own, meant.shape)
        if picked:
            empty.append(f"{len(picked)} by {kind}")
    if is_causal:
        meant |= causal_blocked(T, S, decl.causal_alignment).all(axis=-1)
    # -- rows emptied by accident are reopened at key 0 (visible under every causal alignment) -----
    probe = Case(np.zeros((B, Hq, T, 1)), np.zeros((B, Hkv, S, 1)), np.zeros((B, Hkv, S, 1)), mask, bias, is_causal)
    blocked, _ = blocked_and_bias(probe, decl.causal_alignment)
    for b, h, t in np.argwhere(blocked.all(axis=-1) & ~meant):
        for arr in (mask, bias):
            if arr is not None:
                arr[(*_own_index(arr.shape, b, h, t), 0)] = False if arr.dtype == bool else 0.0
    # -- values, layout ---------------------------------------------------------------------------
    layout = draw(st.sampled_from(LAYOUTS))
    q_axis, kv_axis = _broadcast_axis(B, Hq), _broadcast_axis(B, Hkv)
    if layout == "broadcast" and q_axis is None and kv_axis is None:
        layout = "contiguous"  # B = H = 1: nothing to broadcast along
    q_shape, k_shape, v_shape = (B, Hq, T, Dk), (B, Hkv, S, Dk), (B, Hkv, S, Dv)

    def values(shape, axis):
        if layout == "broadcast" and axis is not None:
            src = _values(draw, tuple(1 if i == axis else n for i, n in enumerate(shape)), dtype)
            return np.broadcast_to(src, shape)
        return _layout(_values(draw, shape, dtype), layout, None)

    q, k, v = values(q_shape, q_axis), values(k_shape, kv_axis), values(v_shape, kv_axis)
    if layout == "non-contiguous" and all(a.flags.c_contiguous for a in (q, k, v)):
        layout = "contiguous"  # no two of B, H, T longer than 1: nothing to permute
    grad_out = _values(draw, (B, Hq, T, Dv), dtype) if grad else None
    case = Case(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale, label="drawn")
    return Drawn(case, grad_out, mask_form, bias_form, layout, tuple(empty))


def space_for(impl: object) -> Space:
    """The space to draw for the kernel under test: bucketed shapes in the ci profile when its
    adapter says it compiles per shape (an optional ``compiles_per_shape = True`` attribute)."""
    adapter = getattr(impl, "adapter", impl)
    return space(bool(getattr(adapter, "compiles_per_shape", False)))


@contextmanager
def aiming(label: str = "error / allowance") -> Iterator[None]:
    """Steer hypothesis towards the largest error/allowance ratio of the comparisons in the block.

    ``target()`` makes the generator mutate the examples that came closest to failing, so a kernel
    whose error grows with some feature is pushed towards the case where it shows.
    """
    from hypothesis import target

    from conformance.harness import compare
    from conformance.harness.report import abs_error

    worst = [0.0]

    def observe(what, case, actual, want, allowed) -> None:
        err = abs_error(actual, want)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            ratio = np.where(err == 0, 0.0, err / np.maximum(allowed, 1e-300))
        finite = ratio[np.isfinite(ratio)]
        if finite.size:
            worst[0] = max(worst[0], float(finite.max()))

    with compare.observing(observe):
        yield
    target(min(worst[0], 1e6), label=label)
