"""Determinism and batch invariance, as declared tiers (003_648455d5abd16778.txt §边界与失败方式).

The spec does not ask for bitwise reproducibility: "精确注意力" is not "逐 bit 相同", and different
fusion orders may differ within tolerance. Bitwise equality is a *tier* a kernel may declare
(``deterministic``, ``batch_invariant``), and these clauses hold it to exactly what it declared.
"""

from __future__ import annotations

import numpy as np

from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import fail

NOT_BITWISE = Source(
    "003",
    "边界与失败方式",
    "FP16/BF16 下不同融合顺序会产生允许范围内的数值差异；“精确注意力”不表示逐 bit 相同。",
)


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    """Where two results that must be bitwise equal differ (NaN equals NaN): how many elements, and the first."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = ~((a64 == b64) | (np.isnan(a64) & np.isnan(b64)))
    idx = tuple(int(i) for i in np.argwhere(diff)[0])
    return f"{int(diff.sum())} of {a64.size} elements differ; first at {list(idx)}: {float(a64[idx])!r} vs {float(b64[idx])!r}"


@clause(
    "DETERMINISM-01",
    "repeated calls on the same input are bitwise equal (forward, and backward where declared), for a kernel declaring deterministic",
    NOT_BITWISE,
    requires=["deterministic"],
    kills=["nondeterministic_noise"],
)
def test_repeatable(impl, dtype):
    # S = 40 spans more than one key tile of a tiled kernel; a kernel compiling per shape gets the
    # palette's T < S shape in the ci profile (harness.cases.buckets: with its [B,1,T,S] mask, forward and
    # backward are programs the golden set compiles already).
    shape = buckets.dims(impl, "cross", B=2, Hq=2, T=9, S=40, Dk=16)
    B, T, S, D = shape["B"], shape["T"], shape["S"], shape["Dv"]
    case = random_case(
        80, dtype=dtype, mask=random_mask(80, (B, 1, T, S)) if impl.declaration.bool_mask else None, **shape
    )
    impl.require(case)
    outs = [impl.forward(case) for _ in range(3)]
    for i, o in enumerate(outs[1:], start=2):
        if not np.array_equal(outs[0], o, equal_nan=True):
            fail(f"call {i} differs from call 1 (declared deterministic): {first_difference(outs[0], o)}", case)
    if impl.declaration.grad:
        g = random_case(81, B=B, Hq=shape["Hq"], T=T, S=1, Dk=D, dtype=dtype).query
        first, again = impl.vjp(case, g), impl.vjp(case, g)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            if not np.array_equal(a, b, equal_nan=True):
                fail(
                    f"{name} of the second backward differs from the first (declared deterministic): "
                    f"{first_difference(a, b)}",
                    case,
                )


@clause(
    "BATCH-INVARIANT-02",
    "a batch item's output is bitwise the same alone and inside batches of other sizes and contents, for a kernel declaring batch_invariant",
    NOT_BITWISE,
    requires=["batch_invariant"],
    kills=["batch_dependent_reduction"],
)
def test_batch_invariant(impl, dtype):
    T, S, H, D = 16, 48, 2, 32
    item = random_case(82, B=1, Hq=H, T=T, S=S, Dk=D, Dv=D, dtype=dtype)
    impl.require(item)
    alone = impl.forward(item)
    # A kernel compiling per shape places the item in one batch size per dtype (harness.cases.buckets.spread).
    for B, pos in buckets.spread(impl, dtype, [(2, 1), (5, 3)]):
        crowd = random_case(83 + B, B=B, Hq=H, T=T, S=S, Dk=D, Dv=D, dtype=dtype)
        q, k, v = (np.array(a, copy=True) for a in (crowd.query, crowd.key, crowd.value))
        q[pos], k[pos], v[pos] = item.query[0], item.key[0], item.value[0]
        batch = crowd.replace(query=q, key=k, value=v, label=f"item placed at {pos} of a batch of {B}")
        got = impl.forward(batch)[pos : pos + 1]
        if not np.array_equal(got, alone, equal_nan=True):
            fail(
                f"the item's output at position {pos} of a batch of {B} differs from its output alone "
                f"(declared batch_invariant): {first_difference(got, alone)}",
                batch,
            )
