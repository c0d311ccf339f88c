"""A zoo of correct, production-style attention kernels: the error model's positive controls.

Each kernel computes softmax(QK^T * scale + M) V the way some production kernel does, in that
kernel's precision and order of operations, and each must CONFORM on every clause
(tests/test_zoo.py). They are written here from the descriptions of the kernels they imitate, not
from ``conformance.harness.judge.ensemble`` (nothing of the harness or the oracle is imported), so that
an allowance too tight for some honest formulation shows up as a zoo failure rather than being
sized from the same code that it is tested with.

==========================  =====================================================================
kernel                      what it imitates
==========================  =====================================================================
zoo-maxsub-p-rounded        the plain fused kernel: max-subtract softmax in float32, P rounded to
                            the working dtype before P·V; FlashAttention-style backward (P
                            recomputed from the log-sum-exp, D = rowsum(dO * O), dS rounded)
zoo-lse-two-pass            pass 1: lse over key tiles of 8; pass 2: P = exp(s - lse) rounded, P·V;
                            backward recomputes P = exp(s - lse), D = rowsum(P * dP)
zoo-fa2-exp2                FlashAttention-2 forward: log2(e) folded into the scale, exp2, running
                            max, key tiles of 16 and query tiles of 8, P~ rounded before P·V,
                            normalised at the end; its backward in the exp2 domain
zoo-online-odd-tiles        online softmax, key tiles of 7 and query tiles of 13, P kept in float32
zoo-flash-decoding          split-KV in uneven parts (5, 11, then 9 at a time), each normalised on
                            its own and stored in the working dtype (vLLM's paged attention v2),
                            merged with the parts' log-sum-exps in float32
zoo-float64                 everything in float64, rounded once at the end (forward and backward)
zoo-gqa-grouped-p-fp32      GQA by stacking the query heads of a kv head (no K/V repeat), P kept in
                            float32; backward stores P and sums dK, dV over the group in float32
zoo-reversed-pairwise       keys visited last to first: P·V accumulated key by key in reverse,
                            the denominator summed pairwise
==========================  =====================================================================
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from conformance.contract import Case, Declaration, np_dtype

LOG2E = 1.0 / math.log(2.0)


# -- shared plumbing (the contract, not the numerics) ---------------------------------------------------
def _work(case: Case):
    return np.float64 if case.dtype == "float64" else np.float32


def _rounder(case: Case, work):
    """x -> x rounded to the case's dtype and back to ``work`` (identity for float32/float64)."""
    if case.dtype in ("float32", "float64"):
        return lambda x: x
    lowp = np_dtype(case.dtype)
    return lambda x: x.astype(lowp).astype(work)


def _additive(case: Case, work) -> np.ndarray:
    """[B, Hq, T, S]: the finite float mask, and -inf at every blocked position (mask, causal, -inf bias)."""
    shape = (case.B, case.Hq, case.T, case.S)
    add = np.zeros(shape, dtype=work)
    if case.bias is not None:
        b = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), shape)
        add = np.where(np.isneginf(b), -np.inf, b).astype(work)
    if case.mask is not None:
        add = np.where(np.broadcast_to(np.asarray(case.mask, dtype=bool), shape), work(-np.inf), add)
    if case.is_causal:
        future = np.arange(case.S)[None, :] > np.arange(case.T)[:, None]
        add = np.where(future, work(-np.inf), add)
    return add.astype(work)


def _repeat_kv(x: np.ndarray, hq: int) -> np.ndarray:
    return np.repeat(x, hq // x.shape[1], axis=1)


def _sum_groups(x: np.ndarray, hkv: int) -> np.ndarray:
    b, hq, n, d = x.shape
    return x.reshape(b, hkv, hq // hkv, n, d).sum(axis=2)


class ZooKernel:
    """Contract plumbing shared by the zoo: the declaration and the output dtype."""

    name = "zoo"
    has_grad = False

    def __init__(self) -> None:
        self.declaration = Declaration(
            grad=self.has_grad,
            dropout=False,
            gqa=True,
            bool_mask=True,
            float_mask=True,
            causal=True,
            custom_scale=True,
            all_blocked="zeros",
            deterministic=True,
            # positive controls of the error model: they compute, they do not check their inputs (the
            # precondition clauses measure them all the same and pass them as declared)
            validates_inputs=False,
            notes=f"positive control: {self.name}",
        )

    def forward(self, case: Case) -> np.ndarray:
        work = _work(case)
        q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
        out = self.attend(case, work, q, k, v)
        return out.astype(np_dtype(case.dtype))

    def attend(self, case: Case, work, q, k, v) -> np.ndarray:
        raise NotImplementedError


# -- 1. plain fused kernel, FlashAttention-style backward ---------------------------------------------
class MaxSubPRounded(ZooKernel):
    name = "zoo-maxsub-p-rounded"
    has_grad = True

    def _softmax_stats(self, case, work, q, k):
        s = (q @ np.swapaxes(_repeat_kv(k, case.Hq), -1, -2)) * work(case.effective_scale) + _additive(case, work)
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), work(0), m)
        e = np.exp(s - m)
        l = e.sum(axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(work)
        return s, e, l, lse

    def attend(self, case, work, q, k, v):
        _, e, l, _ = self._softmax_stats(case, work, q, k)
        p = np.where(l > 0, e / np.where(l > 0, l, 1), work(0))
        return _rounder(case, work)(p) @ _repeat_kv(v, case.Hq)

    def vjp(self, case: Case, grad_out: np.ndarray):
        work = _work(case)
        rnd = _rounder(case, work)
        q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
        s, _, _, lse = self._softmax_stats(case, work, q, k)
        o = self.forward(case).astype(work)  # the stored, rounded output
        live = np.isfinite(lse)
        p = np.where(live, np.exp(s - np.where(live, lse, 0)), work(0))
        do = np.asarray(grad_out).astype(work)
        ke, ve = _repeat_kv(k, case.Hq), _repeat_kv(v, case.Hq)
        dv = np.swapaxes(rnd(p), -1, -2) @ do
        dp = do @ np.swapaxes(ve, -1, -2)
        d = (do * o).sum(axis=-1, keepdims=True)
        ds = rnd(p * (dp - d))
        sc = work(case.effective_scale)
        dq = (ds @ ke) * sc
        dk = (np.swapaxes(ds, -1, -2) @ q) * sc
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), _sum_groups(dk, case.Hkv).astype(lowp), _sum_groups(dv, case.Hkv).astype(lowp)


# -- 2. two passes through the log-sum-exp ------------------------------------------------------------
class LseTwoPass(ZooKernel):
    name = "zoo-lse-two-pass"
    has_grad = True
    TILE = 8

    def _scores(self, case, work, q, k):
        return (q @ np.swapaxes(_repeat_kv(k, case.Hq), -1, -2)) * work(case.effective_scale) + _additive(case, work)

    def _lse(self, s: np.ndarray, work) -> np.ndarray:
        m = np.full(s.shape[:-1] + (1,), -np.inf, dtype=work)
        acc = np.zeros_like(m)
        for a in range(0, s.shape[-1], self.TILE):
            tile = s[..., a : a + self.TILE]
            m_new = np.maximum(m, tile.max(axis=-1, keepdims=True))
            ref = np.where(np.isneginf(m_new), work(0), m_new)
            acc = acc * np.exp(np.where(np.isneginf(m), -np.inf, m - ref)) + np.exp(tile - ref).sum(
                axis=-1, keepdims=True
            )
            m = m_new
        with np.errstate(divide="ignore"):
            return np.where(acc > 0, m + np.log(np.where(acc > 0, acc, 1)), -np.inf).astype(work)

    def _p(self, s, lse, work):
        live = np.isfinite(lse)
        return np.where(live, np.exp(s - np.where(live, lse, 0)), work(0))

    def attend(self, case, work, q, k, v):
        s = self._scores(case, work, q, k)
        p = self._p(s, self._lse(s, work), work)
        return _rounder(case, work)(p) @ _repeat_kv(v, case.Hq)

    def vjp(self, case: Case, grad_out: np.ndarray):
        work = _work(case)
        q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
        s = self._scores(case, work, q, k)
        p = self._p(s, self._lse(s, work), work)
        do = np.asarray(grad_out).astype(work)
        ke, ve = _repeat_kv(k, case.Hq), _repeat_kv(v, case.Hq)
        dp = do @ np.swapaxes(ve, -1, -2)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        sc = work(case.effective_scale)
        lowp = np_dtype(case.dtype)
        dq = (ds @ ke) * sc
        dk = _sum_groups((np.swapaxes(ds, -1, -2) @ q) * sc, case.Hkv)
        dv = _sum_groups(np.swapaxes(p, -1, -2) @ do, case.Hkv)
        return dq.astype(lowp), dk.astype(lowp), dv.astype(lowp)


# -- 3. FlashAttention-2 ---------------------------------------------------------------------------------
class FA2Exp2(ZooKernel):
    name = "zoo-fa2-exp2"
    has_grad = True
    KTILE, QTILE = 16, 8

    def _s2(self, case, work, q, kt, add, rows=slice(None), cols=slice(None)):
        """Scores in log2 units: q.k * (scale * log2 e) + M * log2 e (kt: K^T with heads repeated)."""
        c = work(case.effective_scale * LOG2E)
        return (q[:, :, rows] @ kt[..., cols]) * c + add[:, :, rows, cols] * work(LOG2E)

    @staticmethod
    def _operands(case, work, k):
        return np.ascontiguousarray(np.swapaxes(_repeat_kv(k, case.Hq), -1, -2)), _additive(case, work)

    def _forward(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        ve = _repeat_kv(v, case.Hq)
        kt, add = self._operands(case, work, k)
        out = np.zeros(case.out_shape, dtype=work)
        lse2 = np.zeros((case.B, case.Hq, case.T, 1), dtype=work)
        ktile = self.KTILE if case.S <= 2048 else 512
        for t0 in range(0, case.T, self.QTILE):
            rows = slice(t0, min(t0 + self.QTILE, case.T))
            n = rows.stop - rows.start
            m = np.full((case.B, case.Hq, n, 1), -np.inf, dtype=work)
            l = np.zeros_like(m)
            acc = np.zeros((case.B, case.Hq, n, case.Dv), dtype=work)
            for s0 in range(0, case.S, ktile):
                cols = slice(s0, min(s0 + ktile, case.S))
                s2 = self._s2(case, work, q, kt, add, rows, cols)
                m_new = np.maximum(m, s2.max(axis=-1, keepdims=True))
                ref = np.where(np.isneginf(m_new), work(0), m_new)
                alpha = np.exp2(np.where(np.isneginf(m), -np.inf, m - ref))
                pt = np.exp2(s2 - ref)
                l = l * alpha + pt.sum(axis=-1, keepdims=True)
                acc = acc * alpha + rnd(pt) @ ve[:, :, cols]
                m = m_new
            live = l > 0
            out[:, :, rows] = np.where(live, acc / np.where(live, l, 1), work(0))
            with np.errstate(divide="ignore"):
                lse2[:, :, rows] = np.where(live, m + np.log2(np.where(live, l, 1)), -np.inf)
        return out, lse2

    def attend(self, case, work, q, k, v):
        return self._forward(case, work, q, k, v)[0]

    def vjp(self, case: Case, grad_out: np.ndarray):
        work = _work(case)
        rnd = _rounder(case, work)
        lowp = np_dtype(case.dtype)
        q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
        o, lse2 = self._forward(case, work, q, k, v)
        o = o.astype(lowp).astype(work)
        do = np.asarray(grad_out).astype(work)
        ke, ve = _repeat_kv(k, case.Hq), _repeat_kv(v, case.Hq)
        live = np.isfinite(lse2)
        kt, add = self._operands(case, work, k)
        p = np.where(live, np.exp2(self._s2(case, work, q, kt, add) - np.where(live, lse2, 0)), work(0))
        d = (do * o).sum(axis=-1, keepdims=True)
        dv = np.swapaxes(rnd(p), -1, -2) @ do
        ds = rnd(p * (do @ np.swapaxes(ve, -1, -2) - d))
        sc = work(case.effective_scale)
        dq = (ds @ ke) * sc
        dk = (np.swapaxes(ds, -1, -2) @ q) * sc
        return dq.astype(lowp), _sum_groups(dk, case.Hkv).astype(lowp), _sum_groups(dv, case.Hkv).astype(lowp)


# -- 4. online softmax with odd tiles ------------------------------------------------------------------
class OnlineOddTiles(ZooKernel):
    name = "zoo-online-odd-tiles"
    KTILE, QTILE = 7, 13

    def attend(self, case, work, q, k, v):
        ke, ve = _repeat_kv(k, case.Hq), _repeat_kv(v, case.Hq)
        add = _additive(case, work)
        sc = work(case.effective_scale)
        ktile = self.KTILE if case.S <= 2048 else 511
        out = np.zeros(case.out_shape, dtype=work)
        for t0 in range(0, case.T, self.QTILE):
            t1 = min(t0 + self.QTILE, case.T)
            m = np.full((case.B, case.Hq, t1 - t0, 1), -np.inf, dtype=work)
            l = np.zeros_like(m)
            acc = np.zeros((case.B, case.Hq, t1 - t0, case.Dv), dtype=work)
            for s0 in range(0, case.S, ktile):
                s1 = min(s0 + ktile, case.S)
                s = (q[:, :, t0:t1] @ np.swapaxes(ke[:, :, s0:s1], -1, -2)) * sc + add[:, :, t0:t1, s0:s1]
                m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
                ref = np.where(np.isneginf(m_new), work(0), m_new)
                alpha = np.exp(np.where(np.isneginf(m), -np.inf, m - ref))
                e = np.exp(s - ref)
                l = l * alpha + e.sum(axis=-1, keepdims=True)
                acc = acc * alpha + e @ ve[:, :, s0:s1]
                m = m_new
            out[:, :, t0:t1] = np.where(l > 0, acc / np.where(l > 0, l, 1), work(0))
        return out


# -- 5. flash-decoding ---------------------------------------------------------------------------------
class FlashDecoding(ZooKernel):
    name = "zoo-flash-decoding"

    @staticmethod
    def splits(S: int) -> list[tuple[int, int]]:
        """Uneven parts: 5 keys, 11 keys, then 9 at a time (long sequences: 4 roughly equal parts)."""
        if S > 2048:
            edges = [0, S // 4, S // 2, 3 * S // 4, S]
        else:
            edges = [0]
            for size in (5, 11):
                if edges[-1] < S:
                    edges.append(min(S, edges[-1] + size))
            while edges[-1] < S:
                edges.append(min(S, edges[-1] + 9))
        return list(pairwise(edges))

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        ke, ve = _repeat_kv(k, case.Hq), _repeat_kv(v, case.Hq)
        s_all = (q @ np.swapaxes(ke, -1, -2)) * work(case.effective_scale) + _additive(case, work)
        parts = []
        for a, b in self.splits(case.S):
            s = s_all[..., a:b]
            m = s.max(axis=-1, keepdims=True)
            m = np.where(np.isneginf(m), work(0), m)
            e = np.exp(s - m)
            l = e.sum(axis=-1, keepdims=True)
            o = rnd(np.where(l > 0, (rnd(e) @ ve[:, :, a:b]) / np.where(l > 0, l, 1), work(0)))
            with np.errstate(divide="ignore"):
                lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(work)
            parts.append((o, lse))
        top = np.max([lse for _, lse in parts], axis=0)
        top = np.where(np.isneginf(top), work(0), top)
        weights = [np.exp(lse - top) for _, lse in parts]
        total = np.sum(weights, axis=0)
        out = np.sum([w * o for w, (o, _) in zip(weights, parts)], axis=0)
        return np.where(total > 0, out / np.where(total > 0, total, 1), work(0))


# -- 6. float64 throughout -----------------------------------------------------------------------------
class Float64Throughout(ZooKernel):
    name = "zoo-float64"
    has_grad = True

    def _p(self, case, q, k):
        s = np.einsum("bhtd,bhsd->bhts", q, _repeat_kv(k, case.Hq)) * case.effective_scale + _additive(case, np.float64)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
        l = e.sum(axis=-1, keepdims=True)
        return np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)

    def forward(self, case: Case) -> np.ndarray:
        q, k, v = (np.asarray(x).astype(np.float64) for x in (case.query, case.key, case.value))
        out = np.einsum("bhts,bhsd->bhtd", self._p(case, q, k), _repeat_kv(v, case.Hq))
        return out.astype(np_dtype(case.dtype))

    def vjp(self, case: Case, grad_out: np.ndarray):
        q, k, v = (np.asarray(x).astype(np.float64) for x in (case.query, case.key, case.value))
        p = self._p(case, q, k)
        do = np.asarray(grad_out).astype(np.float64)
        ke, ve = _repeat_kv(k, case.Hq), _repeat_kv(v, case.Hq)
        dp = np.einsum("bhtd,bhsd->bhts", do, ve)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        sc = case.effective_scale
        lowp = np_dtype(case.dtype)
        dq = np.einsum("bhts,bhsd->bhtd", ds, ke) * sc
        dk = _sum_groups(np.einsum("bhts,bhtd->bhsd", ds, q) * sc, case.Hkv)
        dv = _sum_groups(np.einsum("bhts,bhtd->bhsd", p, do), case.Hkv)
        return dq.astype(lowp), dk.astype(lowp), dv.astype(lowp)


# -- 7. GQA by grouping the query heads, P in float32 --------------------------------------------------
class GqaGroupedPFloat32(ZooKernel):
    name = "zoo-gqa-grouped-p-fp32"
    has_grad = True

    def _grouped(self, case, work, q, k):
        """P as [B, Hkv, g*T, S]: the g query heads of a kv head stacked along the rows."""
        g = case.Hq // case.Hkv
        qg = q.reshape(case.B, case.Hkv, g * case.T, case.Dk)
        add = _additive(case, work).reshape(case.B, case.Hkv, g * case.T, case.S)
        s = (qg @ np.swapaxes(k, -1, -2)) * work(case.effective_scale) + add
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(m), work(0), m))
        l = e.sum(axis=-1, keepdims=True)
        return qg, np.where(l > 0, e / np.where(l > 0, l, 1), work(0))

    def attend(self, case, work, q, k, v):
        _, p = self._grouped(case, work, q, k)
        return (p @ v).reshape(case.out_shape)

    def vjp(self, case: Case, grad_out: np.ndarray):
        work = _work(case)
        lowp = np_dtype(case.dtype)
        q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
        qg, p = self._grouped(case, work, q, k)
        g = case.Hq // case.Hkv
        do = np.asarray(grad_out).astype(work).reshape(case.B, case.Hkv, g * case.T, case.Dv)
        dp = do @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        sc = work(case.effective_scale)
        dq = ((ds @ k) * sc).reshape(case.query.shape)
        dk = (np.swapaxes(ds, -1, -2) @ qg) * sc  # the group's sum, in float32, inside the GEMM
        dv = np.swapaxes(p, -1, -2) @ do
        return dq.astype(lowp), dk.astype(lowp), dv.astype(lowp)


# -- 8. reversed key order, pairwise denominator ------------------------------------------------------
class ReversedPairwise(ZooKernel):
    name = "zoo-reversed-pairwise"

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        ke, ve = _repeat_kv(k, case.Hq)[:, :, ::-1], _repeat_kv(v, case.Hq)[:, :, ::-1]
        add = _additive(case, work)[..., ::-1]
        s = np.einsum("bhtd,bhsd->bhts", q, ke) * work(case.effective_scale) + add
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(m), work(0), m))
        l = np.add.reduce(e, axis=-1, keepdims=True)  # NumPy sums pairwise along a contiguous axis
        p = rnd(np.where(l > 0, e / np.where(l > 0, l, 1), work(0)))
        acc = np.zeros(case.out_shape, dtype=work)
        step = 1 if case.S <= 2048 else 64
        for j in range(0, case.S, step):  # key by key (long sequences: 64 at a time), last key first
            acc = acc + np.einsum("bhts,bhsd->bhtd", p[..., j : j + step], ve[:, :, j : j + step])
        return acc


ZOO: dict[str, type[ZooKernel]] = {
    cls.name: cls
    for cls in (
        MaxSubPRounded,
        LseTwoPass,
        FA2Exp2,
        OnlineOddTiles,
        FlashDecoding,
        Float64Throughout,
        GqaGroupedPFloat32,
        ReversedPairwise,
    )
}
