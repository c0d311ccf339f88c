"""The declared bitwise tiers on the paths their clauses did not take: batch invariance with padding
masks and causal, determinism of a GQA backward.

DETERMINISM-01 repeats a masked call without grouped heads, BATCH-INVARIANT-02 places an unmasked
item in batches. A kernel's masked (or varlen-packing) path and its GQA backward are other programs:
a split-K heuristic keyed on the batch on the masked path only, and dK summed over a group's query
heads with atomics in the order the heads finish (FlashAttention 2's backward under GQA unless
``deterministic=True``), keep the plain paths bitwise and break the declared tier elsewhere; the
held-out kernels that do so passed every clause. These hold the declaration on those paths.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import key_padding
from conformance.clauses.test_determinism import NOT_BITWISE, first_difference
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import fail


@clause(
    "BATCH-INVARIANT-MASKED-03",
    "with a key padding mask (and is_causal, where declared), a batch item's output is bitwise the same alone and "
    "inside batches of other sizes whose items have other lengths, for a kernel declaring batch_invariant",
    NOT_BITWISE,
    requires=["batch_invariant", "bool_mask"],
    kills=["batch_variant_under_mask"],
)
def test_batch_invariant_masked(impl, dtype):
    T, S, H, D = 16, 48, 2, 32  # BATCH-INVARIANT-02's shapes
    own = 37
    crowds = ((2, 1, [48, own]), (5, 3, [5, 48, 20, 37, 11]))
    runs = [(causal, crowd) for causal in ((False, True) if impl.declaration.causal else (False,)) for crowd in crowds]
    # A kernel compiling per shape checks each (causal, batch) pair in one dtype (harness.cases.buckets.spread).
    runs = buckets.spread(impl, dtype, runs)
    for causal in dict.fromkeys(c for c, _ in runs):
        item = random_case(1400, B=1, Hq=H, T=T, S=S, Dk=D, dtype=dtype, is_causal=causal, mask=key_padding([own], S))
        impl.require(item)
        alone = impl.forward(item)
        for B, pos, lengths in (crowd for c, crowd in runs if c == causal):
            crowd = random_case(1401 + B, B=B, Hq=H, T=T, S=S, Dk=D, dtype=dtype, is_causal=causal)
            q, k, v = (np.array(a, copy=True) for a in (crowd.query, crowd.key, crowd.value))
            q[pos], k[pos], v[pos] = item.query[0], item.key[0], item.value[0]
            lengths = list(lengths)
            lengths[pos] = own
            batch = crowd.replace(
                query=q,
                key=k,
                value=v,
                mask=key_padding(lengths, S),
                label=f"item with {own} of {S} keys at {pos} of a batch of {B}{', causal' if causal else ''}",
            )
            got = impl.forward(batch)[pos : pos + 1]
            if not np.array_equal(got, alone, equal_nan=True):
                fail(
                    f"the item's output at position {pos} of a batch of {B} (padding lengths {lengths}"
                    f"{', causal' if causal else ''}) differs from its output alone (declared batch_invariant): "
                    f"{first_difference(got, alone)}",
                    batch,
                )


@clause(
    "DETERMINISM-GQA-03",
    "with grouped heads (6 query heads over 2 kv heads, causal), repeated backward calls give bitwise equal dQ, dK, dV "
    "(the group's contributions summed in a fixed order), for a kernel declaring deterministic",
    NOT_BITWISE,
    requires=["deterministic", "grad", "gqa"],
    kills=["gqa_backward_atomic_order"],
)
def test_gqa_backward_repeatable(impl, dtype):
    # GRAD-GQA-02's "gqa causal" shape: a kernel compiling per shape has built this backward already.
    case = random_case(1410, B=2, Hq=6, Hkv=2, T=3, S=6, Dk=8, Dv=8, dtype=dtype, is_causal=True)
    if not impl.supports(case):
        case = case.replace(is_causal=False)
    impl.require(case.replace(label="GQA 6:2 backward, repeated"))
    g = random_case(1411, B=2, Hq=6, T=3, S=1, Dk=8, dtype=dtype).query
    first = impl.vjp(case, g)
    for call in (2, 3, 4):
        again = impl.vjp(case, g)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            if not np.array_equal(a, b, equal_nan=True):
                fail(
                    f"{name} of backward call {call} differs from call 1 (declared deterministic): {first_difference(a, b)}",
                    case,
                )
