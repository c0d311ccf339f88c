"""The caller's arrays written in place between calls: the second call answers for the new contents.

A KV cache is a buffer updated in place step after step, and a mask buffer is refilled per batch; the
objects stay the same, their contents change. A kernel that caches converted K/V or an expanded
mask keyed on the arrays' identity (``id()``, a data pointer) returns the first call's answer for the
second. STATE-* and META-INDEPENDENT-05 build fresh arrays per call, where such a cache hits only
when the allocator happens to reuse a freed address: the held-out kernels of round 3 with an
``id()``-keyed cache passed them or failed them by chance. Here the same array objects are refilled,
so the stale cache is hit on every run.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import cross_dims
from conformance.clauses.test_state_between_calls import FUNCTION_OF_INPUTS
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare
from conformance.harness.spec.clause import clause


@clause(
    "STATE-INPLACE-06",
    "the same Q, K, V and mask arrays, refilled in place by the caller between calls (a KV cache "
    "written step by step), give the oracle's answer for their new contents on every call (the mask where "
    "boolean masks are declared)",
    FUNCTION_OF_INPUTS,
    kills=["key_cache_by_id", "mask_cache_by_id"],
)
def test_refilled_buffers(impl, dtype):
    shape = cross_dims(impl)
    B, H, T, S = (shape[x] for x in ("B", "Hq", "T", "S"))
    masked = impl.declaration.bool_mask
    mask = random_mask(1520, (B, H, T, S)) if masked else None
    first = random_case(1520, dtype=dtype, mask=mask, label="first call", **shape)
    impl.require(first)
    q, k, v = (np.array(a, copy=True) for a in (first.query, first.key, first.value))
    case = first.replace(query=q, key=k, value=v)
    compare.assert_output_matches(impl, case)
    fresh = random_case(1521, dtype=dtype, **shape)
    np.copyto(k, fresh.key)
    np.copyto(v, fresh.value)
    compare.assert_output_matches(impl, case.replace(label="K and V refilled in place"))
    if masked:
        np.copyto(mask, random_mask(1522, (B, H, T, S)))
        compare.assert_output_matches(impl, case.replace(label="K, V, then the mask refilled in place"))
