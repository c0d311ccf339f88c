"""What every discovery probe shares: one guarded call, the oracle under a candidate convention, and the error.

A probe (``harness.discovery.probes``, ``harness.discovery.conventions``) builds a small witness, a case
whose candidate conventions give answers that differ by O(1) (>= 0.1 in the measure below, seen in
every probe's evidence line), calls the kernel through :func:`call`, which never raises (an exception,
a refusal, a wrong shape or a hang becomes an :class:`Outcome` carrying the sentence that says so), and
compares the output with the float64 oracle (``conformance.oracle``) under each candidate with
:func:`err`. A candidate *matches* when ``err <= MATCH[dtype]``: thresholds far above any correct
kernel's rounding and far below the separation of the conventions, so that a kernel whose accuracy is
poor is still recognised by its convention (its accuracy is the clauses' business, not discovery's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance import oracle
from conformance.contract import Case, Declaration, NotApplicable
from conformance.harness.judge.rejection import class_names

# max |out - ref| / (1 + |ref|) at or below which an output matches a candidate's oracle answer.
MATCH: dict[str, float] = {"float64": 1e-3, "float32": 1e-3, "float16": 3e-2, "bfloat16": 8e-2}
THRESHOLDS = (
    "matched: max |out - ref| / (1 + |ref|) <= 1e-3 (float32, float64), 3e-2 (float16), 8e-2 (bfloat16); "
    "the witnesses make wrong conventions differ by >= 0.1"
)
DEFAULT_TIMEOUT = 60.0


@dataclass
class Outcome:
    """One call's result: ``value`` (NumPy array or tuple of them) or ``error`` (a sentence)."""

    value: Any = None
    error: str | None = None
    refused: bool = False  # NotApplicable: "not supported", never a rejection
    exc_names: tuple[str, ...] = ()  # class names of the exception's MRO (bare and qualified)
    exc_class: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def rejection(self, decl: Declaration) -> bool:
        """True when the call failed as a kernel says "not this": a refusal (``NotApplicable``) or an
        exception of a class ``decl.rejects_with`` names (matched on the MRO, as the guard's
        ``judge.rejection.documented``). Anything else (another exception, a hang, a wrong shape) is a
        crash: evidence of a bug, never of a limit."""
        return not self.ok and (self.refused or bool(set(self.exc_names) & set(decl.rejects_with)))


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 90 else text[:87] + "..."


def call(fn: Callable[[], Any], timeout: float = DEFAULT_TIMEOUT, shapes: tuple | None = None) -> Outcome:
    """``fn()`` under the suite's per-call timeout (harness.calls.guarded), every failure an Outcome.

    ``shapes``: the expected shape of the result (or of each member of a tuple result)."""
    from conformance.harness.calls.guarded import _call_with_timeout

    try:
        value = _call_with_timeout(fn, timeout, "discovery probe")
    except NotApplicable as exc:
        return Outcome(error=f"refused (NotApplicable: {_short(exc)})", refused=True, exc_class="NotApplicable")
    except Exception as exc:  # noqa: BLE001 - every failure of a probe is evidence, never a crash
        name = type(exc).__name__
        if "did not return within" in str(exc):
            return Outcome(error=f"did not return within {timeout:g} s", exc_class=name)
        return Outcome(error=f"raised {name}: {_short(exc)}", exc_names=tuple(class_names(exc)), exc_class=name)
    if shapes is not None:
        parts = value if isinstance(value, tuple) else (value,)
        want = shapes if isinstance(shapes[0], tuple) else (shapes,)
        got = tuple(np.shape(p) for p in parts)
        if len(got) != len(want) or any(g != w for g, w in zip(got, want)):
            return Outcome(
                error=f"returned shape {got if len(got) > 1 else got[0]}, expected {want if len(want) > 1 else want[0]}"
            )
        value = tuple(np.asarray(p) for p in parts) if isinstance(value, tuple) else np.asarray(value)
    return Outcome(value=value)


def forward(adapter: Any, case: Case, timeout: float = DEFAULT_TIMEOUT) -> Outcome:
    return call(lambda: adapter.forward(case), timeout, case.out_shape)


def vjp(adapter: Any, case: Case, grad_out: np.ndarray, timeout: float = DEFAULT_TIMEOUT) -> Outcome:
    if not callable(getattr(adapter, "vjp", None)):
        return Outcome(error="the adapter has no vjp method", refused=True)
    shapes = (case.query.shape, case.key.shape, case.value.shape)
    return call(lambda: tuple(adapter.vjp(case, grad_out)), timeout, shapes)


@contextlib.contextmanager
def declared(adapter: Any, decl: Declaration) -> Iterator[None]:
    """Run with ``adapter.declaration = decl`` (how a plain function's call is built: mask sense,
    causal with a mask), restoring the adapter's own afterwards."""
    saved = adapter.declaration
    adapter.declaration = decl
    try:
        yield
    finally:
        adapter.declaration = saved


def reference(case: Case, all_blocked: str = "zeros", alignment: str = "top-left") -> np.ndarray:
    """The float64 oracle's output for ``case`` under a candidate convention."""
    return oracle.forward(case, all_blocked=all_blocked, causal_alignment=alignment).out


def err(out: Any, ref: np.ndarray, rows: np.ndarray | None = None) -> float:
    """max |out - ref| / (1 + |ref|), over the query rows selected by ``rows`` ([B, H, T] bool)
    when given; a NaN where the reference has one is no error, anywhere else an infinite one."""
    got = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if rows is not None:
        got, ref = got[rows], ref[rows]
    if ref.size == 0:
        return 0.0
    both_nan = np.isnan(got) & np.isnan(ref)
    with np.errstate(invalid="ignore"):
        e = np.abs(got - ref) / (1.0 + np.abs(ref))
    e = np.where(both_nan, 0.0, np.where(np.isfinite(e), e, np.inf))
    return float(e.max())


def matches(e: float, dtype: str) -> bool:
    return e <= MATCH[dtype]


def fmt(e: float) -> str:
    return "inf" if not np.isfinite(e) else f"{e:.2g}"
