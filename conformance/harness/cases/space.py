"""The structure of the drawn case space: shapes, mask forms, is_causal and scale.

A *structure* is everything about a case that a compiling kernel keys its compiled program on;
the values, masks and layouts that fill it are drawn by ``harness.cases.drawn_arrays``, and the two are
put together into a case by ``harness.cases.strategies.configs``. The space reaches T < S, T == S, T > S
(T = 1 and S = 1 included), B and H > 1, GQA ratios 1..8, Dk != Dv, head dims off the multiples of 8,
tile-tail lengths, every broadcast form of a boolean and of an additive mask, causal and a custom
scale; which part of it is drawn depends on the profile (:func:`space`) and on whether the kernel
compiles per shape (:func:`space_for`). Features the declaration rules out are never drawn.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import strategies as st

from conformance.contract import DTYPES, Declaration
from conformance.harness.cases.profiles import profile_name

MASK_FORMS: tuple[str, ...] = ("none", "[T,S]", "[1,1,T,S]", "[B,1,T,S]", "[1,H,T,S]", "[B,H,T,S]", "[B,1,1,S]")
TAIL_LENGTHS: tuple[int, ...] = (31, 33, 63, 65, 127, 129)
SMALL_DIMS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 16)
SCALES: tuple[float | None, ...] = (None, 0.5, 0.25, 1.0, 0.3)


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
    # The memory layout of Q, K and V (harness.cases.drawn_arrays.LAYOUTS), which a compiler keys its
    # program on too (strides); None: drawn freely (the free space), set: this structure's own.
    layout: str | None = None

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
    dealt_for: str | None = None  # the dtype whose share ``structures`` is (:func:`share`)


CI_SPACE = Space()
THOROUGH_SPACE = Space(max_len=17, tail_percent=10, max_empty_rows=3)
# For kernels that compile per shape, in the ci profile: eight structures that between them meet
# every T/S relation (decode T = 1, S = 1, a tile tail), B and H > 1, GQA 1:1 to 8:1 and MQA, every
# broadcast form of both masks, both together, causal with each, custom scales, head dims off 8,
# Dk != Dv, and each memory layout (a layout is part of a compiled program: strides are keyed on).
# The first is the simplest, where a failure shrinks to when it can.
COMPILING_STRUCTURES: tuple[Structure, ...] = (
    Structure(1, 1, 1, 1, 1, 8, 8, "none", "none", False, None, "contiguous"),
    Structure(2, 1, 8, 1, 7, 8, 8, "[B,1,1,S]", "[1,H,T,S]", False, None, "broadcast"),
    Structure(2, 2, 2, 5, 5, 16, 16, "[B,1,1,S]", "[B,H,T,S]", True, 0.5, "non-contiguous"),
    Structure(3, 1, 4, 4, 9, 3, 5, "[B,H,T,S]", "[1,1,T,S]", True, None, "contiguous"),
    Structure(2, 2, 3, 9, 4, 8, 8, "[1,H,T,S]", "[T,S]", False, 0.25, "non-contiguous"),
    Structure(2, 2, 1, 6, 1, 5, 8, "[T,S]", "[B,1,T,S]", True, None, "broadcast"),
    Structure(1, 2, 2, 33, 33, 8, 8, "[B,1,T,S]", "[B,1,1,S]", True, 1.0, "contiguous"),
    Structure(2, 1, 2, 3, 6, 8, 8, "[1,1,T,S]", "none", False, None, "non-contiguous"),
)


def space(compiles_per_shape: bool = False) -> Space:
    """The space of the loaded profile; ``compiles_per_shape`` gives the ci profile's few structures."""
    if profile_name() == "thorough":
        return THOROUGH_SPACE
    if compiles_per_shape:
        return Space(structures=COMPILING_STRUCTURES, tail_percent=0)
    return CI_SPACE


def space_for(impl: object, dtype: str | None = None) -> Space:
    """The space to draw for the kernel under test (a guarded adapter or an adapter): bucketed shapes
    in the ci profile when its declaration says it compiles per shape (``compiles_per_shape``); with
    ``dtype``, its share of them (:func:`share`)."""
    decl = getattr(impl, "declaration", None)
    sp = space(bool(getattr(decl, "compiles_per_shape", False)))
    return sp if dtype is None else share(sp, decl, dtype)


def share(sp: Space, decl: object, dtype: str) -> Space:
    """A bucketed kernel's structures dealt round robin over its declared dtypes (the first to the first
    declared dtype, as ``harness.cases.buckets.spread`` deals a clause's shapes): each dtype's run draws
    from its share, so across the run every structure is drawn and each structure compiles in one dtype,
    not in all of them. A dtype outside the declaration keeps all; a space already dealt is kept (the
    property clauses' ``configs`` deals what ``space_for`` gives them)."""
    declared = [d for d in DTYPES if d in getattr(decl, "dtypes", DTYPES)]
    if sp.structures is None or dtype not in declared or sp.dealt_for is not None:
        return sp
    k, n = declared.index(dtype), len(declared)
    dealt = tuple(one for i, one in enumerate(sp.structures) if i % n == k) or (sp.structures[k % len(sp.structures)],)
    return dataclasses.replace(sp, structures=dealt, dealt_for=dtype)


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


def free_structure(draw, decl: Declaration, sp: Space) -> Structure:
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
