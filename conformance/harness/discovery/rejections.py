"""Discovery's first probe: the classes a kernel rejects invalid input with (``rejects_with``).

It runs before every other probe because the others depend on it: a call that fails counts as the
kernel's "not supported" only when it is a rejection (``witness.Outcome.rejection``: ``NotApplicable``,
or a class this field names), and as a crash (a finding, never declared away) otherwise. Classes a
kernel raises for two clearly invalid inputs are added to the declaration, unless they are crashes
(:data:`CRASHES`: an index out of range in an adapter's lowering is no documented rejection).
"""

from __future__ import annotations

import numpy as np

from conformance.harness.discovery import witness as w
from conformance.harness.discovery.probes import base
from conformance.harness.discovery.probing import Probing

# Crashes, not rejections (an index out of range in an adapter's lowering): never proposed for rejects_with.
CRASHES = frozenset({"LookupError", "AttributeError", "ArithmeticError", "AssertionError", "NameError", "MemoryError"})


def rejects_with(p: Probing) -> None:
    """The classes raised on two clearly invalid inputs; classes the declaration does not name yet are
    added, unless they are crashes (CRASHES), which the evidence names and the declaration does not."""
    if p.pinned_here("rejects_with"):
        return
    c = base(p, 6)
    bad = {
        "query 3-D": c.replace(query=np.ascontiguousarray(c.query[0])),
        "Dk 8 vs key Dk 6": c.replace(key=np.ascontiguousarray(c.key[..., :6])),
    }
    notes, new = [], set()
    for what, case in bad.items():
        with w.declared(p.adapter, p.decl):
            o = w.call(lambda case=case: p.adapter.forward(case), p.timeout)
        if o.ok:
            notes.append(f"{what}: accepted")
            continue
        notes.append(f"{what}: {o.error}")
        if not o.exc_names or set(o.exc_names) & set(p.decl.rejects_with):
            continue
        if set(o.exc_names) & CRASHES:
            notes[-1] += " (a crash, not a rejection: not proposed)"
        else:
            new.add(o.exc_class)
    if new:
        p.record("rejects_with", frozenset(p.decl.rejects_with | new), "; ".join(notes))
    else:
        p.keep("rejects_with", "; ".join(notes))
