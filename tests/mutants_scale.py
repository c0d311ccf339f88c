"""Mutants that only show at scale, or only across calls: the evidence for the long-sequence and
self-consistency clauses.

Each is a :class:`tests.mutants.BaseKernel` with one hook overridden by a bug real kernels have had:
a fixed-size key buffer, a low-precision softmax denominator, a workspace reused across calls, and
a result cache keyed by shape alone.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import LOW_PRECISION, np_dtype
from tests.mutants import BaseKernel, mutant

KEY_BUFFER = 4096


@mutant("drop_keys_beyond_4096")
class DropKeysBeyond4096(BaseKernel):
    """A fixed key buffer of 4096 rows: keys past it are silently ignored (never seen by softmax)."""

    def blocked(self, case):
        b = super().blocked(case).copy()
        b[..., KEY_BUFFER:] = True
        return b


@mutant("low_precision_running_sum")
class LowPrecisionRunningSum(BaseKernel):
    """The softmax denominator accumulated key by key in the input's float16/bfloat16.

    Exact for a handful of keys; past a few hundred the sum's spacing exceeds the terms being
    added and it stalls, so long rows come out over-weighted.
    """

    _sum_dtype = None

    def weights(self, case):
        self._sum_dtype = np_dtype(case.dtype) if case.dtype in LOW_PRECISION else None
        return super().weights(case)

    def softmax(self, scores, blocked):
        if self._sum_dtype is None:
            return super().softmax(scores, blocked)
        s = np.where(blocked, -np.inf, scores)
        empty = blocked.all(axis=-1, keepdims=True)
        s = np.where(empty, 0.0, s)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        denom = np.add.accumulate(e.astype(self._sum_dtype), axis=-1)[..., -1:].astype(e.dtype)
        return np.where(empty, 0.0, e / denom)


@mutant("reused_accumulator")
class ReusedAccumulator(BaseKernel):
    """An output workspace kept between calls and accumulated into without being zeroed first.

    The first call of each shape is right; every later call of that shape adds the previous
    results in: its answer depends on what ran before.
    """

    def __init__(self, name="reused_accumulator"):
        super().__init__(name)
        self._workspace: dict = {}

    def finish(self, out, case):
        key = (out.shape, case.dtype)
        acc = self._workspace.setdefault(key, np.zeros(out.shape, dtype=out.dtype))
        acc += out
        return acc.astype(np_dtype(case.dtype))


@mutant("stale_result_cache")
class StaleResultCache(BaseKernel):
    """Memoises results by (shape, dtype) only: a second call with new values of the same shape
    returns the first call's output."""

    def __init__(self, name="stale_result_cache"):
        super().__init__(name)
        self._memo: dict = {}

    def finish(self, out, case):
        key = (case.query.shape, case.key.shape, case.value.shape, case.dtype)
        if key not in self._memo:
            self._memo[key] = super().finish(out, case)
        return self._memo[key].copy()
