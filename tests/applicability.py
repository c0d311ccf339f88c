"""Which declaration fields make a clause not applicable, measured by running it (tests/test_applicability.py).

A clause is not applicable to a kernel for the fields it tests (``requires=``) and for nothing else:
a clause about dropout that becomes not applicable because its V = I probe passed a scale the kernel
has no argument for certifies a dropout bug as CONFORMS AS DECLARED. Reading the clause's code cannot
tell (clauses adapt their cases to the declaration, so a field they never use can still rule out the
case they build under another declaration), so each clause is run, on a correct kernel, under a
declaration and again with each field its cases use switched off in turn; a run that ends not
applicable where the first did not names a field that belongs in ``requires`` or a probe that must
change.

The runs are the self-tests' clause runner's (tests/clause_runner.py), through a guard that records,
for every case the clause hands the kernel, the capability fields that case needs
(``guarded.declarations_ruling_out``) and the extra outputs the clause asks for (the backward,
the returned weights, the lse).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from conformance.contract import Case, Declaration
from conformance.harness.calls import guarded
from conformance.harness.spec.clause import ClauseInfo
from tests import clause_runner

# Fields a kernel can switch off, each to the value that takes the capability away. max_head_dim,
# page_size_multiple and dtypes limit sizes rather than switch a feature; requires_dk_eq_dv is the
# one restriction that changes how clauses build their cases (the V = I probe), so it is a base of
# its own (BASES) rather than a switch.
SWITCHES: dict[str, object] = {
    name: False
    for name in (
        "grad dropout gqa bool_mask float_mask causal custom_scale returns_lse window softcap alibi sinks varlen "
        "kv_lengths paged_kv kv_append"
    ).split()
}
BASES: dict[str, dict[str, object]] = {"Dk == Dv required": {"requires_dk_eq_dv": True}, "any head dims": {}}


@dataclass
class Run:
    """One clause run: its outcome (tests/clause_runner.run_clause) and the fields its cases used."""

    outcome: str
    used: set[str] = field(default_factory=set)

    @property
    def not_applicable(self) -> bool:
        return self.outcome.startswith("skipped")


class RecordingGuard(guarded.GuardedAdapter):
    """The guarded adapter, recording the capability fields of every case it is asked to run."""

    used: set[str]

    def require(self, case: Case) -> None:
        self.used.update(needed_fields(case, self.declaration))
        super().require(case)

    def vjp(self, case: Case, grad_out):
        self.used.add("grad")
        return super().vjp(case, grad_out)

    def forward_with_lse(self, case: Case):
        self.used.add("returns_lse")
        return super().forward_with_lse(case)


def needed_fields(case: Case, decl: Declaration) -> set[str]:
    """The fields a declaration must have on for ``case`` to run (a flag per ``--declare`` that rules it out)."""
    flags = guarded.declarations_ruling_out(case, decl)
    return {f.partition("=")[0] for flag in flags for f in flag.split(" --declare ")}


@contextlib.contextmanager
def recording(used: set[str]) -> Iterator[None]:
    """The clause runner's guard replaced by :class:`RecordingGuard` adding to ``used``."""
    saved = clause_runner.GuardedAdapter

    class Guard(RecordingGuard):
        pass

    Guard.used = used
    clause_runner.GuardedAdapter = Guard
    try:
        yield
    finally:
        clause_runner.GuardedAdapter = saved


def run(info: ClauseInfo, kernel, decl: Declaration, dtype: str | None) -> Run:
    """``info``'s clause on ``kernel`` declaring ``decl``, in ``dtype``; what it used."""
    kernel.declaration = decl
    used: set[str] = set()
    with recording(used):
        outcome = clause_runner.run_clause(info, kernel, dtype, shrink=False)
    return Run(outcome, used)


def requires_fields(info: ClauseInfo) -> set[str]:
    return {r.partition("=")[0] for r in info.requires}


def _first_run(info: ClauseInfo, kernels: dict, base: dict, dtype: str | None):
    """(kernel name, its declaration under ``base``, the run) of the first kernel the clause runs on, or None."""
    for name, factory in kernels.items():
        decl = factory().declaration.replace(**base)
        first = run(info, factory(), decl, dtype)
        if not first.not_applicable:
            return name, decl, first
    return None


def silenced(info: ClauseInfo, kernels: dict, dtype: str | None, every_base: bool = True) -> list[str]:
    """Each field whose switching off makes ``info`` not applicable although it is not among the fields
    the clause tests, as a sentence naming the clause, the base, the field and the skip reason.

    ``kernels``: name -> factory of correct kernels; under each base of :data:`BASES` the first one the
    clause runs on (is applicable to) is the one switched. ``every_base`` False: only the first base
    the clause runs under (Dk == Dv required, else any head dims). A clause no kernel runs under any
    base is left to tests/test_clauses_bite.py (every clause is passed by some correct kernel)."""
    found, not_run = [], []
    for base_name, base in BASES.items():
        chosen = _first_run(info, kernels, base, dtype)
        if chosen is None:
            not_run.append(base_name)
            continue
        name, decl, first = chosen
        restricted = [b for b in not_run if not set(BASES[b]) <= requires_fields(info)]
        if restricted:
            found.append(
                f"{info.id} [{dtype}] is not applicable to any correct kernel when {' or '.join(restricted)} "
                f"(it runs with {base_name}), which it does not test (requires={list(info.requires)})"
            )
        factory = kernels[name]
        for field_name in sorted((first.used & set(SWITCHES)) - requires_fields(info)):
            if getattr(decl, field_name) == SWITCHES[field_name]:
                continue
            again = run(info, factory(), decl.replace(**{field_name: SWITCHES[field_name]}), dtype)
            if again.not_applicable:
                found.append(
                    f"{info.id} [{dtype}] becomes not applicable with {field_name}={SWITCHES[field_name]} "
                    f"({base_name}, {name}), which it does not test (requires={list(info.requires)}): "
                    f"{again.outcome[:300]}"
                )
        if not every_base:
            break
    return found
