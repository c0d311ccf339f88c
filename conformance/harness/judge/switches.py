"""What a caller's switch asks of an answer: the precisions it allows, and the member of a kind a row applies.

A switch that lowers the precision the caller asked for (autocast to bfloat16 or float16, a float32 matmul
precision of "high" or "medium", a flag allowing TF32 or 16-bit reductions) makes the framework's own products
run lower, whatever the kernel does: its answer is judged at that precision, as the switch's documentation
states it (:func:`readings`). Every other switch leaves the question and its precision as they were. A switch
permits a lower precision, it does not oblige the kernel to use it: the case's own reading comes first.

A covering row names a switch's *kind* (``table.SWITCHES``: "flag", "sdp_backend", ...); the kernel's adapter
names the members it can apply (``contexts()``, generated from the framework's API), and :func:`members` gives
the row's case with a member of each kind, picked by the row's seed and rotated to the next member where the
framework refuses the call under one in its own words (a forced backend that cannot take the inputs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from conformance.contract import LOW_PRECISION, Case, Declaration, joined, np_dtype
from conformance.harness.judge import compare
from conformance.harness.spec.report import ClauseViolation

# The precision a switch asks for a float32 case (torch.set_float32_matmul_precision's documentation: "high"
# TF32 or bfloat16 x 3, "medium" bfloat16; autocast: its dtype): judged as that formulation.
_MATMUL_PRECISION = {"high": "tf32", "medium": "bfloat16"}
_LOWER = ("products", "sums")  # the formulations of a 16-bit computation a switch allows (conformance.contract)
MAX_MEMBERS_TRIED = 6  # members of a row's kinds tried before the row is recorded as refused under its switch


class Answered:
    """An answer the kernel gave, judged as the answer to a case under ``declaration`` by the comparisons of
    harness.judge.compare (which ask an adapter for it)."""

    def __init__(self, answer: Any, declaration: Declaration) -> None:
        self._answer = answer
        self.declaration = declaration

    def forward(self, case: Case) -> np.ndarray:
        return self._answer

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple:
        return self._answer


def applies(context: str, dtype: str) -> bool:
    """Autocast to a 16-bit dtype casts a 16-bit case of the other one to it: another question than the case's.
    jax with its 64-bit mode off holds no float64 array: a float64 case does not exist there."""
    for part in joined(context):
        kind, _, what = part.partition(":")
        if kind == "autocast" and dtype not in ("float32", "float64", what.rpartition(":")[2]):
            return False
        if kind == "x64" and what == "off" and dtype == "float64":
            return False
    return True


def _in_dtype(case: Case, g: np.ndarray | None, dtype: str, bias: bool = True) -> tuple[Case, np.ndarray | None]:
    """``case`` as autocast hands it to the kernel: Q, K, V (and, with ``bias``, M) rounded to ``dtype`` (and the
    cotangent, which reaches the kernel's output in its dtype), the question then a case of that dtype. Whether
    autocast casts a float mask depends on the op that adds it (a kernel of its own adds it in float32 to the
    16-bit scores, promoted): both are readings, so an M of float32's largest magnitude, -inf in bfloat16, is
    judged either way."""
    low = np_dtype(dtype)
    cast: dict[int, np.ndarray] = {}  # one object given for two arguments stays one object
    changes: dict[str, Any] = {
        n: cast.setdefault(id(getattr(case, n)), getattr(case, n).astype(low)) for n in ("query", "key", "value")
    }
    if case.bias is not None and bias:
        changes["bias"] = np.asarray(case.bias).astype(low).astype(np.float64)
    return case.replace(**changes), None if g is None else g.astype(low)


def readings(
    decl: Declaration, context: str | None, case: Case, g: np.ndarray | None
) -> list[tuple[Declaration, Case, np.ndarray | None]]:
    """(declaration, case, cotangent) an answer under ``context`` may be judged as: the case itself at its own
    precision first; for a float32 case under a lower matmul precision, the case computed with operands in TF32 /
    bfloat16 (``float32_computed_as``); under autocast, the case in autocast's dtype (what torch hands the kernel).
    Joined switches allow what each allows."""
    out = [(decl, case, g)]
    for part in joined(context):
        kind, _, what = part.partition(":")
        if kind == "matmul_precision" and what in _MATMUL_PRECISION and case.dtype == "float32":
            out.append((decl.replace(float32_computed_as=_MATMUL_PRECISION[what]), case, g))
        elif kind == "flag" and what.endswith("=True") and "tf32" in what and case.dtype == "float32":
            out.append((decl.replace(float32_computed_as="tf32"), case, g))  # a flag allowing TF32 products
        elif kind == "flag" and what.endswith("=True") and "reduction" in what and case.dtype in LOW_PRECISION:
            # a flag allowing reductions in float16 / bfloat16 (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp)
            out += [(decl.replace(**{f"{case.dtype}_computed_as": f"{case.dtype}-{how}"}), case, g) for how in _LOWER]
        elif kind == "autocast":
            # autocast runs a matmul in its dtype whatever the kernel upcast to (000 §8's kernel switches it off
            # around its products for that reason): the products rounded to it, or their sums accumulated there,
            # as "<dtype>-products" and "<dtype>-sums" declare
            low = what.rpartition(":")[2]
            lowered = [decl.replace(**{f"{low}_computed_as": f"{low}-{how}"}) for how in _LOWER]
            if case.dtype == "float32":
                for rounded_bias in (True, False)[: 1 + (case.bias is not None)]:
                    low_case, low_g = _in_dtype(case, g, low, rounded_bias)
                    out += [(d, low_case, low_g) for d in (decl, *lowered)]
            elif case.dtype == low:
                out += [(d, case, g) for d in lowered]
    return out


def assert_matches(impl: Any, case: Case, g: np.ndarray | None = None) -> None:
    """The kernel's answer to ``case`` (called once: forward, or the VJP of cotangent ``g``), right under one of
    the readings its context allows."""
    answer = impl.forward(case) if g is None else impl.vjp(case, g)
    context = case.presentation.context if case.presentation is not None else None
    options = readings(impl.declaration, context, case, g)
    for i, (decl, judged, judged_g) in enumerate(options):
        try:
            if g is None:
                compare.assert_output_matches(Answered(answer, decl), judged)
            else:
                compare.assert_vjp_matches(Answered(answer, decl), judged, judged_g)
            return
        except ClauseViolation:
            if i == len(options) - 1:
                raise


def offered_by(impl: Any) -> tuple[str, ...]:
    """The contexts the kernel's adapter can apply (its ``contexts()``; none when it has no such method)."""
    method = getattr(getattr(impl, "adapter", impl), "contexts", None)
    return tuple(method()) if callable(method) else ()


def members(impl: Any, case: Case, pick: int) -> Iterator[Case]:
    """``case`` with each switch kind of its context (a covering row's: "flag", "sdp_backend", ...) replaced by a
    member the adapter offers (``contexts()``) that applies to the case's dtype, the ``pick``-th first, then the
    next ones (at most :data:`MAX_MEMBERS_TRIED`); ``case`` itself when its context names no kind. None offered
    for a kind: nothing (the caller records it)."""
    pres = case.presentation
    parts = joined(pres.context if pres is not None else None)
    offered = offered_by(impl)
    if not parts or all(p in offered for p in parts):
        yield case
        return
    choices = []
    for part in parts:
        named = [part] if part in offered else [n for n in offered if n.partition(":")[0] == part]
        named = [n for n in named if applies(n, case.dtype)]
        if not named:
            return
        # a member that sets several switches of the kind at once (every flag but the SDP backends') first, so
        # that each of them meets the row's classes; then the others from the pick on
        widest = max(len(joined(n)) for n in named)
        first = [n for n in named if len(joined(n)) == widest and widest > 1]
        rest = [n for n in named if n not in first]
        choices.append(first + [rest[(pick + i) % len(rest)] for i in range(len(rest))])
    longest = max(len(c) for c in choices)
    for j in range(min(longest, MAX_MEMBERS_TRIED)):
        names = [c[j % len(c)] for c in choices]
        label = f"{case.label}, under {'+'.join(names)}"
        yield case.replace(presentation=dataclasses.replace(pres, context="+".join(names)), label=label)
