"""Discovery: measure a kernel's capabilities and conventions on small witnesses, and say what to declare.

A new user of the suite arrives with a kernel and no idea which of its conventions the spec leaves
open (mask sense, causal alignment when T != S, the fill of a row whose keys are all blocked, float64
computed in float32, ...). Finding them by trial means reading failures; the suite can measure them.
:func:`discover` runs the probes of ``harness.discovery.probes`` (capabilities) and
``harness.discovery.conventions`` (conventions) on the adapter, each one guarded (an exception or a hang
is an evidence line, never a crash), and returns a :class:`Discovery`: one :class:`Measured` per field
(the value and the evidence), the declaration that results, the ``--declare`` line that gets it, and
*findings*: behaviours that are no allowed value of any field (causal dropped when a mask is given,
NaN on some all-blocked rows and zeros on others, fp16 products that match no declarable formulation).
A finding is never declared away: the field keeps its declared value, so the clauses that test it
fail. Formulations (``harness.discovery.formulations``: the precision each dtype is computed at,
where the scale is applied, the fill of blocked keys, normwise merges) are measured by the oracle
and error model of each candidate. A call that fails counts as the kernel's "not supported" only when
it is a rejection (``NotApplicable``, or a class of ``rejects_with``, which is therefore probed first),
as for the guard's bad-input clauses; any other failure (an ``AssertionError``, a ``KeyError``, a hang,
a wrong shape) is a crash and a finding, and no capability is switched off and nothing is folded on it.

Fields the user pinned with ``--declare`` are not probed. Used by ``python -m conformance.discover``
and by ``pytest --discover`` (harness.run.discovery_run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.contract import Declaration
from conformance.harness.discovery import witness
from conformance.harness.discovery.probing import UPCAST, Measured, Probing, declare_value

__all__ = ["UPCAST", "Discovery", "Measured", "Probing", "declare_text", "declare_value", "discover"]


@dataclass
class Discovery:
    """What discovery measured on one adapter."""

    spec: str
    name: str
    reference: Declaration  # what the adapter declared before discovery (the --declare line is relative to it)
    declaration: Declaration  # the discovered declaration (pins included)
    pinned: dict[str, Any]
    measured: list[Measured]
    findings: list[str]
    dtype: str = "float32"  # the working dtype of the convention probes

    def changes(self) -> dict[str, Any]:
        """Fields whose discovered value differs from the reference, and every pin."""
        ref, new = self.reference.as_dict(), self.declaration.as_dict()
        names = [m.field for m in self.measured if m.declared]
        return {n: getattr(self.declaration, n) for n in names if n in self.pinned or ref[n] != new[n]}

    def declare_args(self) -> list[str]:
        return [f"{k}={declare_value(v)}" for k, v in self.changes().items()]

    def declare_line(self) -> str:
        args = self.declare_args()
        if not args:
            return "--declare: nothing to add (every measured field is what the adapter declares)"
        return " ".join(f"--declare {a}" for a in args)

    def lines(self) -> list[str]:
        out = [f"discovery of {self.spec} ({self.name}); convention probes in {self.dtype}; {witness.THRESHOLDS}"]
        out += [m.line() for m in self.measured]
        out.append(self.declare_line())
        out += [f"finding: {f}" for f in self.findings] or ["findings: none"]
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready record (the certificate's ``discovery`` entry; what xdist workers receive)."""
        return {
            "spec": self.spec,
            "declare": self.declare_args(),
            "measured": [
                {"field": m.field, "value": declare_value(m.value) if m.declared else m.value, "evidence": m.evidence}
                for m in self.measured
            ],
            "findings": list(self.findings),
            "pinned": sorted(self.pinned),
        }


def declare_text(record: dict) -> str:
    """The ``--declare`` words of a discovery record (``Discovery.as_dict``), for the summary and the certificate."""
    args = record["declare"]
    return " ".join(f"--declare {a}" for a in args) if args else "the adapter's own declaration (nothing differed)"


def discover(
    adapter: Any, pinned: dict[str, Any] | None = None, *, spec: str = "", timeout: float | None = None
) -> Discovery:
    """Probe ``adapter`` (its declaration is restored afterwards); ``pinned`` fields are not probed."""
    from conformance.harness.discovery import blocked as discovery_blocked
    from conformance.harness.discovery import compiling as discovery_compiling
    from conformance.harness.discovery import conventions as discovery_conventions
    from conformance.harness.discovery import formulations as discovery_formulations
    from conformance.harness.discovery import precision as discovery_precision
    from conformance.harness.discovery import probes as discovery_probes
    from conformance.harness.discovery import rejections as discovery_rejections
    from conformance.harness.discovery import tiers as discovery_tiers

    pinned = dict(pinned or {})
    reference = adapter.declaration
    p = Probing(adapter, reference.replace(**pinned), pinned, witness.DEFAULT_TIMEOUT if timeout is None else timeout)
    probes = (
        *discovery_probes.CAPABILITIES,
        *discovery_conventions.CONVENTIONS,
        discovery_blocked.all_blocked,
        discovery_precision.float64_computed_as,
        *discovery_formulations.PROBES,
        discovery_precision.upcast,
        *discovery_probes.LIMITS,
        *discovery_tiers.TIERS,
        discovery_compiling.compiles_per_shape,
    )
    try:  # rejects_with first: whether a failed call is a rejection or a crash depends on it (Outcome.rejection)
        for probe in (
            discovery_rejections.rejects_with,
            discovery_probes.dtypes,
            discovery_formulations.float32_computed_as,
            *probes,
        ):
            try:
                if probe(p) is False:  # no dtype ran: nothing else can be probed
                    break
            except Exception as exc:  # noqa: BLE001 - a probe's own bug must not hide the others
                p.finding(f"probe {probe.__name__} could not finish: {type(exc).__name__}: {exc}")
                if probe is discovery_probes.dtypes:
                    break
    finally:
        adapter.declaration = reference
    name = str(getattr(adapter, "name", spec))
    return Discovery(spec or name, name, reference, p.decl, pinned, p.measured, p.findings, p.dtype)


def discover_spec(
    spec: str, pinned: dict[str, Any] | None = None, signature: str = "sdpa", timeout: float | None = None
):
    """Resolve ``spec`` as ``--impl`` does (harness.calls.registry, with ``signature``) and discover it.

    Returns ``(Discovery | None, reason)``: None with the reason when the adapter cannot run here.
    Raises ``registry.ImplSpecError`` for a spec that does not resolve."""
    from conformance.harness.calls import registry

    res = registry.resolve(spec, None, signature)
    if not res.usable:
        return None, res.reason
    return discover(res.adapter, pinned, spec=spec, timeout=timeout), None
