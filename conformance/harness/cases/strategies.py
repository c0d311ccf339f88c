"""Hypothesis strategies: the shapes of the hand-built clauses, and whole drawn configurations.

:func:`configs` draws one attention problem from the space a declaration admits (its structure from
``harness.cases.space``, its arrays from ``harness.cases.drawn_arrays``): every broadcast form of both masks,
rows blocked entirely by either, causal with and without masks, a custom scale; contiguous,
non-contiguous and broadcast (stride 0) inputs. Features the declaration rules out are never drawn
(they are filtered before building, not rejected after): the verdict's "examples run vs planned"
stays an honest count. The profiles and example counts live in ``harness.cases.profiles``; their names
are re-exported here, where the clauses import them from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from conformance.contract import Case, Declaration
from conformance.harness.cases import drawn_arrays
from conformance.harness.cases.profiles import _PROFILE, PREFIX, examples, load_profile, profile_name, register_profiles
from conformance.harness.cases.space import (
    CI_SPACE,
    COMPILING_STRUCTURES,
    THOROUGH_SPACE,
    Space,
    Structure,
    free_structure,
    share,
    space,
    space_for,
)

__all__ = [
    "CI_SPACE",
    "COMPILING_STRUCTURES",
    "PREFIX",
    "THOROUGH_SPACE",
    "Drawn",
    "Shape",
    "Space",
    "Structure",
    "_PROFILE",
    "configs",
    "empty_rows_allowed",
    "examples",
    "load_profile",
    "profile_name",
    "register_profiles",
    "seeds",
    "shapes",
    "space",
    "space_for",
]


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
            lines.append(f"  {name} = {drawn_arrays.show(a)}")
        return "\n".join(lines)


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


@st.composite
def configs(draw, decl: Declaration, dtype: str, *, sp: Space | None = None, grad: bool = False) -> Drawn:
    """One case from the whole space ``decl`` admits, in ``dtype`` (see the comment above)."""
    from conformance.contract import Case
    from conformance.oracle import blocked_and_bias, causal_blocked

    sp = share(sp or space(), decl, dtype)  # a bucketed kernel's share of the structures for this dtype
    if sp.structures:
        shape = draw(st.sampled_from(sp.structures)).admitted(decl)
    else:
        shape = free_structure(draw, decl, sp)
    B, Hkv, Hq, T, S = shape.B, shape.Hkv, shape.Hkv * shape.group, shape.T, shape.S
    Dk, Dv, mask_form, bias_form = shape.Dk, shape.Dv, shape.mask_form, shape.bias_form
    is_causal, scale = shape.is_causal, shape.scale
    has_mask, has_bias = mask_form != "none", bias_form != "none"
    empties_ok = empty_rows_allowed(decl, has_mask=has_mask, has_bias=has_bias, is_causal=is_causal, grad=grad)
    if is_causal and decl.causal_alignment == "bottom-right" and T > S and not empties_ok:
        is_causal = False  # its first T - S rows would be empty, which this kernel has not declared
    mask = drawn_arrays.mask_bits(draw, drawn_arrays.form_shape(mask_form, B, Hq, T, S)) if has_mask else None
    bias = drawn_arrays.bias_values(draw, drawn_arrays.form_shape(bias_form, B, Hq, T, S)) if has_bias else None
    empty: list[str] = []
    meant = np.zeros((B, Hq, T), dtype=bool)  # rows blocked entirely on purpose
    for kind, arr in (("bool", mask), ("float -inf", bias)):
        if arr is None:
            continue
        picked = []
        if empties_ok and sp.max_empty_rows:
            picked = draw(
                st.lists(st.integers(0, drawn_arrays.rows_of(arr.shape) - 1), max_size=sp.max_empty_rows, unique=True)
            )
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
                arr[(*drawn_arrays.own_index(arr.shape, b, h, t), 0)] = False if arr.dtype == bool else 0.0
    # -- values, layout ---------------------------------------------------------------------------
    layout = shape.layout or draw(st.sampled_from(drawn_arrays.LAYOUTS))
    q_axis, kv_axis = drawn_arrays.broadcast_axis(B, Hq), drawn_arrays.broadcast_axis(B, Hkv)
    if layout == "broadcast" and q_axis is None and kv_axis is None:
        layout = "contiguous"  # B = H = 1: nothing to broadcast along
    q_shape, k_shape, v_shape = (B, Hq, T, Dk), (B, Hkv, S, Dk), (B, Hkv, S, Dv)

    fill_at_stake = bool(meant.any())  # rows blocked entirely: V must not shrink to what hides their fill

    def values(shape, axis, lift=False):
        def drawn(s):
            x = drawn_arrays.values(draw, s, dtype)
            return drawn_arrays.lifted(x, dtype) if lift else x

        if layout == "broadcast" and axis is not None:
            return np.broadcast_to(drawn(tuple(1 if i == axis else n for i, n in enumerate(shape))), shape)
        return drawn_arrays.relayout(drawn(shape), layout, None)

    q, k, v = values(q_shape, q_axis), values(k_shape, kv_axis), values(v_shape, kv_axis, fill_at_stake)
    if layout == "non-contiguous" and all(a.flags.c_contiguous for a in (q, k, v)):
        layout = "contiguous"  # no two of B, H, T longer than 1: nothing to permute
    grad_out = drawn_arrays.values(draw, (B, Hq, T, Dv), dtype) if grad else None
    case = Case(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale, label="drawn")
    return Drawn(case, grad_out, mask_form, bias_form, layout, tuple(empty))
