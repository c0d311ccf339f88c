"""Kernels wrong only for a caller that lives with them: one that refills its buffers a position at a time,
writes into the results it owns, and drops what it no longer needs.

Every clause but CALLER-HISTORY-01 (``conformance/clauses/test_caller.py``) passes them: each is right on
fresh arrays, on arrays refilled whole (STATE-INPLACE-06), and on the same case called again, and wrong only
in a history a real caller makes.
"""

from __future__ import annotations

import hashlib
import weakref

import numpy as np

from tests.mutants import BaseKernel, mutant
from tests.mutants_calls import _Call, _ref


@mutant("kv_cache_checked_by_first_row")
class KvCacheCheckedByFirstRow(BaseKernel):
    """Keeps the converted K/V of each key and value object (behind a weak reference, so a freed object's id is
    never taken for it) and reuses them while the object is alive and its first key and value rows are
    unchanged, a cheap staleness check that a cache refilled whole always trips. A static KV cache written one
    position at a time past position 0 (decode) is read stale."""

    def __init__(self, name: str = "kv_cache_checked_by_first_row"):
        super().__init__(name)
        self._cache: dict = {}

    def operands(self, case):
        key = (id(case.key), id(case.value), case.key.shape, case.value.shape, case.dtype, case.Hq)
        first = (np.array(case.key[..., :1, :], copy=True), np.array(case.value[..., :1, :], copy=True))
        hit = self._cache.get(key)
        if hit is not None:
            kref, vref, (k0, v0), kv = hit
            if (
                kref() is case.key
                and vref() is case.value
                and np.array_equal(k0, first[0])
                and np.array_equal(v0, first[1])
            ):
                return (case.query.astype(self.work(case)), *kv)
        kv = super().operands(case)[1:]
        self._cache[key] = (weakref.ref(case.key), weakref.ref(case.value), first, kv)
        return (case.query.astype(self.work(case)), *kv)


_KEPT: list = []


@mutant("call_keeps_every_input")
class CallKeepsEveryInput(_Call):
    """Appends every call's Q, K and V tensors to a module-level list (a debugging record left on): each tensor
    holds the caller's memory, so nothing a caller passes is ever freed, and memory grows with every call."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        _KEPT.append((q, k, v))
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("result_memo_keeps_returned_array")
class ResultMemoKeepsReturnedArray(BaseKernel):
    """Memoises its output by a digest of everything the call reads and, on a repeat, returns a copy of the
    array it handed out the first time: right until the caller writes into that array (a residual added in
    place), after which a repeated call (a recomputation under activation checkpointing) returns the caller's
    numbers."""

    def __init__(self, name: str = "result_memo_keeps_returned_array"):
        super().__init__(name)
        self._memo: dict = {}

    def forward(self, case):
        h = hashlib.blake2b(digest_size=16)
        for a in (case.query, case.key, case.value, case.mask, case.bias):
            a = np.ascontiguousarray(a) if a is not None else np.zeros(0)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
        h.update(repr((case.is_causal, case.scale)).encode())
        key = h.digest()
        if key in self._memo:
            return self._memo[key].copy()
        out = super().forward(case)
        if len(self._memo) > 64:
            self._memo.clear()
        self._memo[key] = out
        return out
