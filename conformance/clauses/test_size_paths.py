"""Paths a kernel takes only at one size or one memory layout: B == 1, a single head, a mask that is a
view (transposed, or expanded with a zero stride), a long key axis under a declared determinism.

Production kernels dispatch on sizes: a B == 1 path that squeezes the batch axis, a single-head GEMV
path with its own constant scale, a split-K path past some S that adds partial outputs with atomics.
Each is right on the sizes the other clauses draw and wrong on its own; the held-out kernels of
round 3 (tests/mutants_heldout3.py) that do so passed every clause. A mask is an input like Q, K and V:
one that is a transposed view or an ``expand``-ed tensor must be read through its strides.
Every case here is small (the palette's sizes where a compiling kernel can share a program).
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import cross_dims
from conformance.clauses.test_determinism import NOT_BITWISE
from conformance.clauses.test_inputs import LAYOUT
from conformance.clauses.test_metamorphic import SHAPES
from conformance.clauses.test_scale_sign import SCORES_TIMES_SCALE
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import fail


@clause(
    "SIZE-ONE-BATCH-01",
    "with B == 1 a per-head boolean mask [1, H, T, S] is applied head by head (a batch of one is no "
    "reason to read the mask of head 0 for every head)",
    SHAPES,
    requires=["bool_mask"],
    kills=["batch_one_head_zero_mask"],
)
def test_batch_of_one_per_head_mask(impl, dtype):
    shape = buckets.dims(impl, "cross", B=1, Hq=3, T=4, S=6, Dk=8)
    shape["B"] = 1
    mask = random_mask(1500, (1, shape["Hq"], shape["T"], shape["S"]))
    case = random_case(1500, dtype=dtype, mask=mask, label="B = 1, per-head mask", **shape)
    impl.require(case)
    compare.assert_output_matches(impl, case)


@clause(
    "SIZE-ONE-HEAD-02",
    "with a single head (Hq == Hkv == 1) a custom scale (0.3) multiplies the scores as with several heads",
    SCORES_TIMES_SCALE,
    requires=["custom_scale"],
    kills=["single_head_default_scale"],
)
def test_single_head_custom_scale(impl, dtype):
    shape = buckets.dims(impl, "cross", B=2, Hq=1, T=4, S=6, Dk=8)
    shape["Hq"] = shape["Hkv"] = 1
    case = random_case(1501, dtype=dtype, scale=0.3, magnitude=1.5, label="one head, scale = 0.3", **shape)
    impl.require(case)
    compare.assert_output_matches(impl, case)


@clause(
    "MASK-VIEW-03",
    "a boolean mask passed as a view (a transposed array, and a [B, 1, T, S] mask expanded to [B, H, T, S] "
    "with a zero stride) means what its indices say, not what its memory order says",
    LAYOUT,
    requires=["bool_mask"],
    kills=["mask_read_contiguous", "expanded_mask_resized"],
)
def test_mask_views(impl, dtype):
    shape = cross_dims(impl)
    B, H, T, S = (shape[x] for x in ("B", "Hq", "T", "S"))
    values = random_mask(1502, (B, H, T, S))
    stored = np.ascontiguousarray(values.swapaxes(-1, -2)).swapaxes(-1, -2)  # same values, not C-contiguous
    head = random_mask(1503, (B, 1, T, S))
    expanded = np.broadcast_to(head, (B, H, T, S))  # strides[1] == 0
    for label, mask in (("transposed view", stored), ("expanded, stride 0 on the head axis", expanded)):
        case = random_case(1502, dtype=dtype, mask=mask, label=f"mask: {label}", **shape)
        impl.require(case)
        compare.assert_output_matches(impl, case)


@clause(
    "DETERMINISM-LONG-04",
    "past S = 512 keys (T = 4, S = 640: where split-K paths start) repeated forward calls are bitwise equal, "
    "for a kernel declaring deterministic",
    NOT_BITWISE,
    requires=["deterministic"],
    kills=["split_k_atomics_past_512@float32"],
)
def test_long_keys_repeatable(impl, dtype):
    case = random_case(1504, B=1, Hq=2, T=4, S=640, Dk=16, dtype=dtype, label="S = 640, repeated")
    impl.require(case)
    first = impl.forward(case)
    for call in (2, 3, 4):
        again = impl.forward(case)
        if not np.array_equal(first, again, equal_nan=True):
            n = int((np.asarray(first) != np.asarray(again)).sum())
            fail(f"call {call} differs from call 1 in {n} of {first.size} elements (declared deterministic)", case)
