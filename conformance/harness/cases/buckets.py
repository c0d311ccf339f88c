"""Shape buckets: fewer distinct programs for kernels that compile per shape, in the ci profile only.

Why: a jitted kernel (jax) compiles one XLA program per distinct (shapes, dtype, static arguments,
forward or VJP); cold, that compilation, not the arithmetic, is its certification cost (jax
once ran ~13x numpy's time, nearly all of it compiling). The hand-built clauses each chose
their own B, H, T, S, D, so almost no two of them shared a program. Two tools cut that, both only
when :func:`bucketed` (the declaration says ``compiles_per_shape=True`` and the profile is ci; the
drawn clauses use the same switch, ``strategies.space_for``):

* :func:`dims`: a clause asks for "a case of this shape class" (self-attention T == S, T < S,
  T > S, decode T = 1, one key S = 1) with its own sizes; a bucketed kernel gets the palette's
  sizes for that class instead, identical across clauses, so XLA's in-process cache is hit. Every
  other kernel, and every kernel in the thorough profile, gets the clause's own sizes unchanged.
  A clause whose property depends on particular sizes (tile tails, head dims, long keys, golden
  fixtures) does not ask.
* :func:`spread`: a clause that checks the same property on several shapes (T < S and T > S, GQA
  ratios 3:1, 2:1 and MQA, tile tails), mask forms, scales or gradient features runs, for a
  bucketed kernel, each of them in one declared dtype (round robin) instead of each in every dtype:
  across the run every one is still checked, and every dtype on at least one of them. The property
  is dtype-independent where this is used; a clause about a dtype (precision, range) does not spread.

Both keep what a clause checks for the kernels that do not compile per shape, which is what the
mutant self-tests (tests/test_clauses_bite.py) run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from conformance.contract import DTYPES
from conformance.harness.cases import strategies

T = TypeVar("T")

# One shape per class, Dk == Dv == 8 (jax requires Dk == Dv; 8 is every fused kernel's head-dim
# multiple), B and H > 1 so a batch or head mix-up shows. A class names what must hold of T and S.
# self, cross and tall are the golden fixtures' own shapes (fixtures/golden: self-*, cross-*,
# large-logits-*, all-blocked-*, causal-long-q-*), so a clause on the palette shares their programs.
PALETTE: dict[str, dict[str, int]] = {
    "self": dict(B=2, Hq=2, Hkv=2, T=5, S=5, Dk=8, Dv=8),  # T == S
    "cross": dict(B=2, Hq=2, Hkv=2, T=4, S=6, Dk=8, Dv=8),  # 1 < T < S
    "tall": dict(B=2, Hq=2, Hkv=2, T=6, S=4, Dk=8, Dv=8),  # T > S > 1
    "decode": dict(B=2, Hq=2, Hkv=2, T=1, S=7, Dk=8, Dv=8),  # T == 1 < S
    "one-key": dict(B=2, Hq=2, Hkv=2, T=3, S=1, Dk=8, Dv=8),  # S == 1 < T
}

_CLASS_HOLDS = {
    "self": lambda T, S: T == S,
    "cross": lambda T, S: 1 < T < S,
    "tall": lambda T, S: T > S > 1,
    "decode": lambda T, S: T == 1 < S,
    "one-key": lambda T, S: S == 1 < T,
}


def bucketed(impl: object) -> bool:
    """True when ``impl`` compiles per shape and the loaded profile bounds its shapes (ci)."""
    return strategies.space_for(impl).structures is not None


def dims(impl: object, shape_class: str, **own: int) -> dict[str, int]:
    """The sizes to build a case of ``shape_class`` with: the clause's ``own`` (B, Hq, Hkv, T, S,
    Dk, Dv; Hkv defaults to Hq, Dv to Dk), or the palette's when :func:`bucketed`.

    ``own`` must itself be of the class: a clause that asks for "self" with T != S is a defect
    (it would check something else on the palette than on its own sizes), and raises.
    """
    own = dict(own)
    own.setdefault("Hkv", own["Hq"])
    own.setdefault("Dv", own["Dk"])
    if not _CLASS_HOLDS[shape_class](own["T"], own["S"]):
        raise ValueError(f"T={own['T']} S={own['S']} is not of shape class {shape_class!r}")
    if not bucketed(impl):
        return own
    if own["Hkv"] != own["Hq"] or own["Dv"] != own["Dk"]:
        raise ValueError("the palette has neither GQA nor Dk != Dv: keep this clause's own sizes")
    return dict(PALETTE[shape_class])


def spread(impl: object, dtype: str, items: Sequence[T]) -> list[T]:
    """The ``items`` (shapes, ratios, ...) this ``dtype``'s run of a clause checks: all of them,
    or, when :func:`bucketed`, those that fall to ``dtype`` dealt round robin over the declared
    dtypes (first item to the first declared dtype in ``DTYPES`` order), so that each item runs
    once per run; a dtype left without one (fewer items than dtypes) gets one again, so no dtype's
    run checks nothing. A dtype outside the declaration keeps all items (the clause refuses it).
    """
    items = list(items)
    if not bucketed(impl):
        return items
    declared = [d for d in DTYPES if d in getattr(getattr(impl, "declaration", None), "dtypes", DTYPES)]
    if dtype not in declared:
        return items
    k, n = declared.index(dtype), len(declared)
    return [item for i, item in enumerate(items) if i % n == k] or [items[k % len(items)]]
