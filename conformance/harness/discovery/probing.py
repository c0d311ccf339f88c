"""The vocabulary discovery's probes share: one field's measurement (:class:`Measured`) and the
probing state (:class:`Probing`: the adapter, the declaration built so far, what was found).

Apart from ``harness.discovery.discover`` so that imports run one way: discovery -> its probe modules
(discovery_probes, _conventions, _blocked, _precision) -> this module -> the witness calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conformance.contract import DTYPES, Declaration
from conformance.harness.discovery import witness

# Pseudo-fields: measured and reported, never part of a declaration (no field can say them).
UPCAST = "upcast"


@dataclass(frozen=True)
class Measured:
    """One field's measurement: ``value`` goes into the declaration when ``declared``."""

    field: str
    value: Any
    evidence: str
    declared: bool = True

    def line(self) -> str:
        shown = declare_value(self.value) if self.declared else str(self.value)
        return f"{self.field} = {shown}: {self.evidence}"


def declare_value(value: Any) -> str:
    """A field value as ``--declare`` writes it (parsed back by harness.calls.declare.parse_declare)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (frozenset, set, tuple, list)):
        order = {d: i for i, d in enumerate(DTYPES)}
        return ",".join(sorted(map(str, value), key=lambda v: (order.get(v, len(order)), v)))
    return str(value)


@dataclass
class Probing:
    """The state the probes share: the adapter, the declaration built so far, and what was found."""

    adapter: Any
    decl: Declaration
    pinned: dict[str, Any]
    timeout: float = witness.DEFAULT_TIMEOUT
    dtype: str = "float32"  # the working dtype of convention probes (float32 where it runs)
    measured: list[Measured] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    # dtype -> the lower format it is computed at, where no field of its own says so (an inference precision
    # hint rounds every dtype's operands: harness.discovery.formulations.every_dtype_at); its probes skip it
    swallowed: dict[str, str] = field(default_factory=dict)
    match_as: str | None = None  # the precision the convention probes' thresholds are read at (None: dtype's)

    def matches(self, e: float) -> bool:
        """Whether an error measured on a witness in the working dtype matches a candidate (witness.MATCH),
        at the precision every dtype is computed at when none runs at its own."""
        return witness.matches(e, self.match_as or self.dtype)

    def pinned_here(self, name: str) -> bool:
        """True (and the pin recorded) when ``--declare`` fixed ``name``: it is not probed."""
        if name not in self.pinned:
            return False
        self.measured.append(Measured(name, self.pinned[name], "pinned by --declare (not probed)"))
        return True

    def record(self, name: str, value: Any, evidence: str) -> None:
        self.measured.append(Measured(name, value, evidence))
        self.decl = self.decl.replace(**{name: value})

    def keep(self, name: str, evidence: str) -> None:
        """``name`` keeps its declared value (not measurable, or a finding stands in its place)."""
        self.measured.append(Measured(name, getattr(self.decl, name), evidence))

    def note(self, name: str, value: str, evidence: str) -> None:
        self.measured.append(Measured(name, value, evidence, declared=False))

    def finding(self, text: str) -> None:
        self.findings.append(text)

    def failed(self, name: str, o: witness.Outcome, what: str, off: Any = False) -> None:
        """A call using feature ``name`` failed: not supported (``off``) when it was a rejection; a crash
        keeps the declared value (and is a finding: :meth:`crashed`)."""
        if self.crashed(o, what):
            self.keep(name, f"kept: {what}: {o.error} (a crash, not a rejection)")
        else:
            self.record(name, off, f"{what}: {o.error}")

    def crashed(self, o: witness.Outcome, what: str) -> bool:
        """True (and a finding) when the failed call ``o`` is a crash, not a rejection (``Outcome.rejection``):
        a probe then keeps the field's declared value instead of declaring the feature away, so the
        clauses that use it run and fail with the crash."""
        if o.ok or o.rejection(self.decl):
            return False
        self.finding(
            f"{what}: {o.error}: a crash, not a rejection (neither NotApplicable nor a declared rejects_with class: "
            f"{', '.join(sorted(self.decl.rejects_with))}); not declared away"
        )
        return True

    def forward(self, case, decl: Declaration | None = None) -> witness.Outcome:
        with witness.declared(self.adapter, decl or self.decl):
            return witness.forward(self.adapter, case, self.timeout)

    def vjp(self, case, grad_out, decl: Declaration | None = None) -> witness.Outcome:
        with witness.declared(self.adapter, decl or self.decl):
            return witness.vjp(self.adapter, case, grad_out, self.timeout)
