"""Judging a kernel's rejection of an invalid input, and its acceptance of the valid neighbour.

A rejection clause feeds the kernel an input the spec rules out and expects an exception. "Any
exception" is not evidence: a kernel that raises on *every* call, one that declines the case
(``NotApplicable``: "I do not take such cases", not "this input is invalid"), one that crashes with
a ``KeyError`` from a dispatch table, or one that times out would all pass. So a rejection counts
only when the exception is of a class the kernel documents (``Declaration.rejects_with``, matched
against the names of the exception's MRO so that subclasses count), and each bad input is paired
with its *valid neighbour*, the same case with the one defect repaired, which the kernel must accept
and answer correctly (against the oracle): rejecting everything then fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance.contract import Case, Declaration, NotApplicable
from conformance.harness.calls.guarded import GuardedAdapter, UndeclaredRefusal
from conformance.harness.judge import compare
from conformance.harness.spec.report import AdapterError, ClauseViolation

# Failures meaning "the kernel did not take the case" rather than "it answered wrongly".
_NOT_TAKEN: tuple[type, ...] = (AdapterError, UndeclaredRefusal)


def class_names(exc: BaseException) -> list[str]:
    """The names an exception answers to: each class of its MRO, bare and module-qualified."""
    names = []
    for cls in type(exc).__mro__:
        names += [cls.__name__, f"{cls.__module__}.{cls.__qualname__}"]
    return names


def documented(exc: BaseException, decl: Declaration) -> bool:
    """True when ``exc`` is a rejection ``decl`` documents; ``NotApplicable`` never is."""
    if isinstance(exc, NotApplicable):
        return False
    return bool(set(class_names(exc)) & set(decl.rejects_with))


def _declared(decl: Declaration) -> str:
    return ", ".join(sorted(decl.rejects_with))


def judge(decl: Declaration, what: str, result: Any, exc: BaseException | None) -> str | None:
    """None when the call was a documented rejection; else one line saying what went wrong."""
    if exc is None:
        return f"{what}: accepted, returned {type(result).__name__} of shape {np.shape(result)}"
    if isinstance(exc, NotApplicable):
        return (
            f"{what}: raised NotApplicable ({exc}), a refusal of the case, not a rejection of an invalid "
            f"input; declared rejection classes: {_declared(decl)}"
        )
    if not documented(exc, decl):
        return (
            f"{what}: raised {type(exc).__module__}.{type(exc).__name__} ({str(exc)[:160]}), not one of the "
            f"declared rejection classes {_declared(decl)} (--declare rejects_with=... if this class is "
            "the kernel's documented error)"
        )
    return None


def reject(impl: GuardedAdapter, case: Case, what: str) -> str | None:
    """Call the kernel on an invalid ``case`` and judge the outcome (see :func:`judge`).

    A hang is not a rejection: ``GuardedAdapter.call_raw`` raises the suite's ``AdapterError`` for it, which
    fails the clause as it is.
    """
    result, exc = impl.call_raw(case)
    return judge(impl.declaration, what, result, exc)


@dataclass(frozen=True)
class BadInput:
    """One invalid input and the valid neighbours that differ from it by the one repaired defect.

    ``neighbours`` are tried in order and the first one the declaration supports is run (a kernel
    that takes no GQA is shown the non-GQA repair of a bad head ratio, for example). ``check``
    judges the neighbour's output; by default it must match the oracle.
    """

    what: str
    case: Case
    neighbours: Sequence[Case]
    check: Callable[[GuardedAdapter, Case], Any] | None = None


def first_supported(impl: GuardedAdapter, cases: Iterable[Case]) -> Case | None:
    return next((c for c in cases if impl.supports(c)), None)


def accept_neighbour(impl: GuardedAdapter, bad: BadInput) -> str | None:
    """Run the valid neighbour of ``bad``; None when it was accepted and right, else why not.

    Returns None also when the declaration supports none of the neighbours (nothing to ask).
    """
    good = first_supported(impl, bad.neighbours)
    if good is None:
        return None
    try:
        (bad.check or compare.assert_output_matches)(impl, good)
    except ClauseViolation as exc:  # a refusal (NotApplicable) of a declared case is one too: UndeclaredRefusal
        kind = "was not accepted" if isinstance(exc, _NOT_TAKEN) else "was accepted but answered wrongly"
        return f"the valid neighbour of '{bad.what}' {kind}:\n    " + str(exc).replace("\n", "\n    ")
    return None


def check_rejections(impl: GuardedAdapter, bad_inputs: Sequence[BadInput], context: str) -> None:
    """Every bad input is rejected with a documented class and every valid neighbour is accepted.

    Neighbours shared by several bad inputs (the same case object) run once. All problems are
    collected into one failure, rejections first.
    """
    rejections = [p for b in bad_inputs if (p := reject(impl, b.case, b.what)) is not None]
    neighbours = []
    seen: set[int] = set()
    for b in bad_inputs:
        good = first_supported(impl, b.neighbours)
        if good is None or id(good) in seen:
            continue
        seen.add(id(good))
        problem = accept_neighbour(impl, b)
        if problem is not None:
            neighbours.append(problem)
    if rejections or neighbours:
        parts = []
        if rejections:
            parts.append(
                f"{len(rejections)} of {len(bad_inputs)} invalid inputs were not rejected with a documented "
                f"error ({context}):\n  - " + "\n  - ".join(rejections)
            )
        if neighbours:
            parts.append(
                f"{len(neighbours)} valid neighbours (the same case with the one defect repaired) failed:"
                "\n  - " + "\n  - ".join(neighbours)
            )
        raise ClauseViolation("\n".join(parts))
