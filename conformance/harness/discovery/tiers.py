"""Discovery's probes of the claims a kernel may make beyond the spec's SDPA: it validates its inputs,
and a batch item's output does not depend on the batch around it.

Validation is the spec's rule (000 §8's preconditions; the PRECOND-* clauses measure it on every run,
and accepting an invalid input is a declared deviation); batch invariance is a tier
(``batch_invariant``: a kernel that claims it gets BATCH-INVARIANT-*). Discovery claims what it
measures, so that a plain function under ``--discover`` is held to what it does: ``validates_inputs``
when every invalid input (4-D floating tensors of one dtype, matching batch, head, feature and length
dims, ``dropout_p`` in [0, 1]) raises, ``accepts_invalid`` naming those it takes where it refuses the
others, ``validates_inputs=False`` where it takes them all; and ``batch_invariant`` when an item's
output is bitwise the same alone and inside larger batches, at a size where reductions split (T = 300,
S = 700, D = 64). Which class each rejection raises is the clauses' to judge (``rejects_with``, probed
first).
"""

from __future__ import annotations

import numpy as np

from conformance.contract import PRECONDITIONS
from conformance.harness.cases import preconditions
from conformance.harness.discovery import witness as w
from conformance.harness.discovery.probes import base
from conformance.harness.discovery.probing import Probing


def _invalid(p: Probing) -> dict:
    """One invalid call per precondition of 000 §8 (``harness.cases.preconditions``), by what it breaks."""
    c = base(p, 20, B=2, Hq=2, T=3, S=5, Dk=8)
    cut = np.ascontiguousarray
    other = "float16" if p.dtype != "float16" else "float32"
    heads = base(p, 21, B=2, Hq=3, Hkv=2, T=3, S=5, Dk=8)
    return {
        "query 3-D": c.replace(query=cut(c.query[0])),
        "integer q, k, v": c.replace(
            query=c.query.astype(np.int32), key=c.key.astype(np.int32), value=c.value.astype(np.int32)
        ),
        f"key in {other}": c.replace(key=c.key.astype(np.float16 if other == "float16" else np.float32)),
        "query batch 1 vs key batch 2": c.replace(query=cut(c.query[:1])),
        "3 query heads vs 2 key heads": heads,
        "key Dk 6 vs query Dk 8": c.replace(key=cut(c.key[..., :6])),
        "value length 4 vs key length 5": c.replace(value=cut(c.value[:, :, :4])),
        "dropout_p = 1.5": c.replace(dropout_p=1.5),
    }


def validates_inputs(p: Probing) -> None:
    """Which preconditions the kernel refuses: all (``validates_inputs``, the spec's and the default), some
    (``accepts_invalid`` names the others: a declared deviation), or none (``validates_inputs=False``)."""
    if p.pinned_here("validates_inputs") or p.pinned_here("accepts_invalid"):
        return
    accepted, notes = [], []
    for what, case in _invalid(p).items():
        with w.declared(p.adapter, p.decl):
            o = w.call(lambda case=case: p.adapter.forward(case), p.timeout)
        if o.ok:
            accepted += preconditions.broken(case)
        notes.append(f"{what}: {'accepted' if o.ok else o.error}")
    evidence = "; ".join(notes)
    names = sorted(set(accepted), key=PRECONDITIONS.index)
    if not names:
        p.record("validates_inputs", True, f"every invalid input raised ({evidence})")
    elif len(names) == len(_invalid(p)):
        p.record("validates_inputs", False, f"accepts every invalid input ({evidence})")
    else:
        p.record("validates_inputs", True, f"refuses some invalid inputs ({evidence})")
        p.record("accepts_invalid", frozenset(names), f"accepts {', '.join(names)} ({evidence})")


def batch_invariant(p: Probing) -> None:
    if p.pinned_here("batch_invariant"):
        return
    shape = dict(Hq=2, T=300, S=700, Dk=64)
    crowd = base(p, 21, B=4, **shape)
    item = crowd.replace(query=crowd.query[2:3].copy(), key=crowd.key[2:3].copy(), value=crowd.value[2:3].copy())
    what = "item 2 of a batch of 4 and the same item alone (H=2 T=300 S=700 D=64)"
    alone, inside = p.forward(item), p.forward(crowd)
    if not (alone.ok and inside.ok):
        p.keep("batch_invariant", f"kept: {what}: {alone.error or inside.error}")
        return
    same = np.array_equal(np.asarray(alone.value)[0], np.asarray(inside.value)[2], equal_nan=True)
    p.record("batch_invariant", same, f"{what}: {'bitwise equal' if same else 'differ'}")


TIERS = (validates_inputs, batch_invariant)
