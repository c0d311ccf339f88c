"""More correct production-style kernels for the zoo: held-out positive controls of the error model.

tests/zoo_kernels.py holds the first eight. These are written the same way (NumPy, nothing of the
harness or the oracle imported, only the contract and the zoo's contract plumbing) from the
descriptions of further formulations production kernels use. Each must CONFORM on every clause
(tests/test_zoo.py registers them). A failure of one of them is a false alarm of the suite unless
the kernel is in fact wrong by the spec; docs/tolerance.md records what was found. Long because it
is one job, a catalogue of kernels that must sit side by side to be compared (each some 20-40
lines); splitting it would only scatter the catalogue (as harness/judge/ensemble.py says of its members).

==============================  =================================================================
kernel                          what it imitates
==============================  =================================================================
zoo-tiled-k128-q64              FlashAttention-2 tiles: query tiles of 64, key tiles of 128, fp32
                                online softmax, P rounded to the input dtype before P·V, output
                                rounded once; tiled backward with D = rowsum(dO * O) from the
                                *rounded* output, dS rounded, dQ accumulated over key tiles in
                                fp32 (FA2's atomicAdd), GQA dK/dV summed over the group in fp32
zoo-finite-max-skip-tiles       running max initialised to the finite -FLT_MAX (no -inf guards in
                                the loop), key tiles of 64 skipped when causal or the mask blocks
                                them entirely; an all-blocked row ends with l = 0 and is written 0
zoo-lazy-rescale-exp2           FlashAttention-4's conditional rescaling: exp2 with log2(e) folded
                                into the fp32 scale, the running max (initialised to -1e30) moved
                                only when a tile's max exceeds it by more than 8 (log2 units), so
                                P~ reaches 256 before it is rounded for P·V; key tiles of 16
zoo-l-from-rounded-p            the denominator summed from the *rounded* P (numerator and
                                denominator from the same fp16/bf16 P), one pass
zoo-bwd-delta-fp32-o            forward over key tiles of 32 with P kept in fp32; backward with
                                D = rowsum(dO * O) from the fp32 output (before its rounding), P
                                and dS kept in fp32, over key tiles of 32
zoo-split-kv-combine            FlashAttention-2's split-KV: 2..8 equal splits by sequence length,
                                fp32 partial outputs and lse, the combine kernel's lse_logsum with
                                +inf for rows that see no key (their scales are then 0)
zoo-finfo-min-mask              Hugging Face eager attention: every blocked position gets the finite
                                torch.finfo(float32).min instead of -inf; a row blocked entirely
                                then has equal scores, so it returns the mean of V (declared
                                all_blocked=mean-v, as jax does)
zoo-gqa-index-arith             GQA by index arithmetic (query head h reads kv head h // g), no
                                repeat; backward accumulates each group's dK, dV with np.add.at in
                                fp32 and rounds once
zoo-float64-pairwise            float64 throughout with explicit pairwise (tree) sums: the QK^T dot
                                products over d, the denominator and P·V over the keys
zoo-fast-math-exp2              FlashAttention-3 built with fast math: ex2.approx.ftz (relative
                                error up to 2^-22, subnormals flushed) for every exponential and
                                rcp.approx for 1/l, key tiles of 64
zoo-causal-bottom-right         FA2's tiles with FA2's causal alignment when T != S (declared
                                causal_alignment=bottom-right; rows that see no key written 0)
zoo-unguarded-nan               exp(s - max) / sum with no guard (declared all_blocked=nan), and its
                                unguarded backward
zoo-f64-as-f32                  FA2's tiles with float64 inputs computed in float32 (declared
                                float64_computed_as=float32), forward and backward
zoo-returns-weights             the article's kernel shape: P rounded once, returned and used for P·V
                                (declared returns_weights)
zoo-dropout-fa2                 FA2's dropout: a counter-based keep-mask on the unnormalised P, l from
                                the undropped P, 1/(1 - p) applied once to the output (declared dropout)
zoo-split-rounded-everything    split-KV in 3 parts, each rounding P, summing l from the rounded P and
                                storing its partial output in the input dtype, then the output's own
                                rounding: four roundings between a weight and the output
zoo-bwd-rounded-everything      FA2's forward; a backward using the rounded P for dV *and* inside dS,
                                D from the rounded output, dS rounded, each query head's dK, dV share
                                rounded before the GQA group sum
==============================  =================================================================

``NOT_ADMITTED`` holds a formulation production code uses that the suite refuses by decision
(Q scaled in the input dtype before QK^T); its docstring says why.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.contract import Case, np_dtype
from tests.zoo_kernels import ZooKernel, _rounder, _sum_groups, _work

LOG2E = 1.0 / math.log(2.0)


# -- plumbing: blocked positions and the finite bias, apart ---------------------------------------------
def _blocked_and_bias(case: Case, work, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[B, Hq, T, S] bool (mask, causal, -inf bias) and the finite part of the bias in ``work``;
    causal lets query i see keys j <= i + offset (0: top-left, S - T: bottom-right)."""
    shape = (case.B, case.Hq, case.T, case.S)
    blocked = np.zeros(shape, dtype=bool)
    bias = np.zeros(shape, dtype=work)
    if case.bias is not None:
        b = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), shape)
        blocked = blocked | np.isneginf(b)
        bias = np.where(np.isneginf(b), 0.0, b).astype(work)
    if case.mask is not None:
        blocked = blocked | np.broadcast_to(np.asarray(case.mask, dtype=bool), shape)
    if case.is_causal:
        blocked = blocked | (np.arange(case.S)[None, :] > np.arange(case.T)[:, None] + offset)
    return blocked, bias


def _kv_index(case: Case) -> np.ndarray:
    """The kv head each query head reads: h // (Hq / Hkv); a ratio that is not an integer is refused
    (every GQA kernel checks it: with index arithmetic, 6 query heads on 4 kv heads would run)."""
    if case.Hq % case.Hkv:
        raise ValueError(f"number of query heads ({case.Hq}) must be a multiple of kv heads ({case.Hkv})")
    return np.arange(case.Hq) // (case.Hq // case.Hkv)


def _tiles(n: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _operands(case: Case):
    work = _work(case)
    q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
    return work, q, k, v


# -- 1. FlashAttention-2 tiles, its backward -------------------------------------------------------------
class TiledK128Q64(ZooKernel):
    name = "zoo-tiled-k128-q64"
    has_grad = True
    KTILE, QTILE = 128, 64
    ROUND_P = True  # P rounded to the input dtype before P·V (tensor cores), or kept in fp32

    def _mask(self, case: Case, work):
        return _blocked_and_bias(case, work)

    def _forward(self, case: Case, work, q, k, v, keep: np.ndarray | None = None):
        """(O in fp32 before its rounding, lse) by FA2's loop over query and key tiles; ``keep``: a
        dropout keep-mask applied to P before P·V (l is summed before it)."""
        rnd = _rounder(case, work) if self.ROUND_P else (lambda x: x)
        idx = _kv_index(case)
        blocked, bias = self._mask(case, work)
        sc = work(case.effective_scale)
        out = np.zeros(case.out_shape, dtype=work)
        lse = np.zeros((case.B, case.Hq, case.T, 1), dtype=work)
        for t0, t1 in _tiles(case.T, self.QTILE):
            m = np.full((case.B, case.Hq, t1 - t0, 1), -np.inf, dtype=work)
            l = np.zeros_like(m)
            acc = np.zeros((case.B, case.Hq, t1 - t0, case.Dv), dtype=work)
            for s0, s1 in _tiles(case.S, self.KTILE):
                s = (q[:, :, t0:t1] @ np.swapaxes(k[:, idx, s0:s1], -1, -2)) * sc + bias[:, :, t0:t1, s0:s1]
                s = np.where(blocked[:, :, t0:t1, s0:s1], work(-np.inf), s)
                m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
                ref = np.where(np.isneginf(m_new), work(0), m_new)
                alpha = np.exp(np.where(np.isneginf(m), -np.inf, m - ref))
                p = np.exp(s - ref)
                l = l * alpha + p.sum(axis=-1, keepdims=True)
                if keep is not None:
                    p = np.where(keep[:, :, t0:t1, s0:s1], p, work(0))
                acc = acc * alpha + rnd(p) @ v[:, idx, s0:s1]
                m = m_new
            live = l > 0
            out[:, :, t0:t1] = np.where(live, acc / np.where(live, l, 1), work(0))
            with np.errstate(divide="ignore"):
                lse[:, :, t0:t1] = np.where(live, m + np.log(np.where(live, l, 1)), -np.inf)
        return out, lse

    def attend(self, case, work, q, k, v):
        return self._forward(case, work, q, k, v)[0]

    def _delta(self, case: Case, do: np.ndarray, o32: np.ndarray) -> np.ndarray:
        """D = rowsum(dO * O) with O as FA2 stores it: rounded to the input dtype."""
        o = o32.astype(np_dtype(case.dtype)).astype(do.dtype)
        return (do * o).sum(axis=-1, keepdims=True)

    def vjp(self, case: Case, grad_out: np.ndarray):
        work, q, k, v = _operands(case)
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        o32, lse = self._forward(case, work, q, k, v)
        do = np.asarray(grad_out).astype(work)
        d = self._delta(case, do, o32)
        blocked, bias = self._mask(case, work)
        sc = work(case.effective_scale)
        live = np.isfinite(lse)
        dq = np.zeros(q.shape, dtype=work)
        dk = np.zeros((case.B, case.Hq, case.S, case.Dk), dtype=work)
        dv = np.zeros((case.B, case.Hq, case.S, case.Dv), dtype=work)
        for s0, s1 in _tiles(case.S, self.KTILE):
            kb, vb = k[:, idx, s0:s1], v[:, idx, s0:s1]
            s = (q @ np.swapaxes(kb, -1, -2)) * sc + bias[..., s0:s1]
            s = np.where(blocked[..., s0:s1], work(-np.inf), s)
            p = np.where(live, np.exp(s - np.where(live, lse, 0)), work(0))
            dv[:, :, s0:s1] = np.swapaxes(rnd(p), -1, -2) @ do
            ds = rnd(p * (do @ np.swapaxes(vb, -1, -2) - d))
            dk[:, :, s0:s1] = (np.swapaxes(ds, -1, -2) @ q) * sc
            dq = dq + (ds @ kb) * sc  # fp32 accumulation across key tiles
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), _sum_groups(dk, case.Hkv).astype(lowp), _sum_groups(dv, case.Hkv).astype(lowp)


# -- 2. finite running-max initialisation, skipped tiles -------------------------------------------------
class FiniteMaxSkipTiles(ZooKernel):
    name = "zoo-finite-max-skip-tiles"
    KTILE, QTILE = 64, 32

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        sc = work(case.effective_scale)
        lowest = np.finfo(work).min  # -FLT_MAX: never -inf, so m - m_new is never -inf - (-inf)
        out = np.zeros(case.out_shape, dtype=work)
        for t0, t1 in _tiles(case.T, self.QTILE):
            m = np.full((case.B, case.Hq, t1 - t0, 1), lowest, dtype=work)
            l = np.zeros_like(m)
            acc = np.zeros((case.B, case.Hq, t1 - t0, case.Dv), dtype=work)
            for s0, s1 in _tiles(case.S, self.KTILE):
                if case.is_causal and s0 > t1 - 1:
                    break  # every later key tile lies above the diagonal for this query tile
                tile_blocked = blocked[:, :, t0:t1, s0:s1]
                if tile_blocked.all():
                    continue  # the mask blocks the whole tile: nothing to load
                s = (q[:, :, t0:t1] @ np.swapaxes(k[:, idx, s0:s1], -1, -2)) * sc + bias[:, :, t0:t1, s0:s1]
                s = np.where(tile_blocked, work(-np.inf), s)
                m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
                alpha = np.exp(m - m_new)
                p = np.exp(s - m_new)
                l = l * alpha + p.sum(axis=-1, keepdims=True)
                acc = acc * alpha + rnd(p) @ v[:, idx, s0:s1]
                m = m_new
            out[:, :, t0:t1] = acc / np.where(l == 0, work(1), l)  # FA2's epilogue: 1/l, or 1 where l == 0
        return out


# -- 3. conditional rescaling (FlashAttention-4) ---------------------------------------------------------
class LazyRescaleExp2(ZooKernel):
    name = "zoo-lazy-rescale-exp2"
    KTILE = 16
    TAU = 8.0  # log2 units: P~ <= 2^8 before it is rounded

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        c = work(case.effective_scale * LOG2E)
        kt = np.swapaxes(k[:, idx], -1, -2)
        ktile = self.KTILE if case.S <= 2048 else 512
        m = np.full((case.B, case.Hq, case.T, 1), work(-1e30), dtype=work)
        l = np.zeros_like(m)
        acc = np.zeros(case.out_shape, dtype=work)
        for s0, s1 in _tiles(case.S, ktile):
            s2 = (q @ kt[..., s0:s1]) * c + bias[..., s0:s1] * work(LOG2E)
            s2 = np.where(blocked[..., s0:s1], work(-np.inf), s2)
            tile_max = s2.max(axis=-1, keepdims=True)
            m_new = np.where(tile_max > m + work(self.TAU), tile_max, m)
            alpha = np.exp2(m - m_new)
            p = np.exp2(s2 - m_new)
            l = l * alpha + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + rnd(p) @ v[:, idx, s0:s1]
            m = m_new
        return acc / np.where(l == 0, work(1), l)


# -- 4. the denominator from the rounded P ---------------------------------------------------------------
class LFromRoundedP(ZooKernel):
    name = "zoo-l-from-rounded-p"

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        s = (q @ np.swapaxes(k[:, idx], -1, -2)) * work(case.effective_scale) + bias
        s = np.where(blocked, work(-np.inf), s)
        m = s.max(axis=-1, keepdims=True)
        p = rnd(np.exp(s - np.where(np.isneginf(m), work(0), m)))
        l = p.sum(axis=-1, keepdims=True)
        return np.where(l > 0, (p @ v[:, idx]) / np.where(l > 0, l, 1), work(0))


# -- 5. backward with D from the fp32 output --------------------------------------------------------------
class BwdDeltaFp32O(TiledK128Q64):
    name = "zoo-bwd-delta-fp32-o"
    has_grad = True
    KTILE, QTILE = 32, 16
    ROUND_P = False

    def _delta(self, case, do, o32):
        return (do * o32).sum(axis=-1, keepdims=True)

    def vjp(self, case: Case, grad_out: np.ndarray):
        work, q, k, v = _operands(case)
        idx = _kv_index(case)
        o32, lse = self._forward(case, work, q, k, v)
        do = np.asarray(grad_out).astype(work)
        d = self._delta(case, do, o32)
        blocked, bias = _blocked_and_bias(case, work)
        sc = work(case.effective_scale)
        live = np.isfinite(lse)
        dq = np.zeros(q.shape, dtype=work)
        dk = np.zeros((case.B, case.Hq, case.S, case.Dk), dtype=work)
        dv = np.zeros((case.B, case.Hq, case.S, case.Dv), dtype=work)
        for s0, s1 in _tiles(case.S, self.KTILE):
            kb, vb = k[:, idx, s0:s1], v[:, idx, s0:s1]
            s = np.where(blocked[..., s0:s1], work(-np.inf), (q @ np.swapaxes(kb, -1, -2)) * sc + bias[..., s0:s1])
            p = np.where(live, np.exp(s - np.where(live, lse, 0)), work(0))
            dv[:, :, s0:s1] = np.swapaxes(p, -1, -2) @ do
            ds = p * (do @ np.swapaxes(vb, -1, -2) - d)
            dk[:, :, s0:s1] = (np.swapaxes(ds, -1, -2) @ q) * sc
            dq = dq + (ds @ kb) * sc
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), _sum_groups(dk, case.Hkv).astype(lowp), _sum_groups(dv, case.Hkv).astype(lowp)


# -- 6. split-KV with FlashAttention-2's combine ---------------------------------------------------------
class SplitKvCombine(ZooKernel):
    name = "zoo-split-kv-combine"

    @staticmethod
    def num_splits(S: int) -> int:
        """2..8 splits, one per 64 keys (at least 2, at most 8), as a decoding heuristic would."""
        return max(2, min(8, -(-S // 64)))

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        s_all = (q @ np.swapaxes(k[:, idx], -1, -2)) * work(case.effective_scale) + bias
        s_all = np.where(blocked, work(-np.inf), s_all)
        n = min(self.num_splits(case.S), case.S)
        per = -(-case.S // n)
        outs, lses = [], []
        for a in range(0, case.S, per):
            s = s_all[..., a : a + per]
            m = s.max(axis=-1, keepdims=True)
            p = np.exp(s - np.where(np.isneginf(m), work(0), m))
            l = p.sum(axis=-1, keepdims=True)
            o = (rnd(p) @ v[:, idx, a : a + per]) / np.where(l > 0, l, 1)
            with np.errstate(divide="ignore"):
                lses.append(np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(work))
            outs.append(o)  # fp32 partial (FA2's oaccum)
        return _combine_splits(outs, lses, work, case.out_shape)


def _combine_splits(outs: list[np.ndarray], lses: list[np.ndarray], work, out_shape: tuple) -> np.ndarray:
    """FlashAttention-2's split-KV combine kernel: each part's normalised partial output weighted by
    exp(lse_part - lse_logsum), lse_logsum the log-sum-exp of the parts' lse (a row no part sees stays 0)."""
    lse = np.stack(lses)
    lse_max = lse.max(axis=0)
    lse_max = np.where(np.isneginf(lse_max), work(0), lse_max)
    total = np.exp(lse - lse_max).sum(axis=0)
    with np.errstate(divide="ignore"):
        lse_logsum = np.where(total == 0, work(np.inf), np.log(np.where(total == 0, 1, total)) + lse_max)
    out = np.zeros(out_shape, dtype=work)
    for o, part_lse in zip(outs, lses):
        out = out + np.exp(part_lse - lse_logsum) * o
    return out


# -- 7. Hugging Face eager attention: finfo.min instead of -inf -----------------------------------------
class FinfoMinMask(ZooKernel):
    name = "zoo-finfo-min-mask"

    def __init__(self) -> None:
        super().__init__()
        self.declaration = self.declaration.replace(all_blocked="mean-v")

    def attend(self, case, work, q, k, v):
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        lowest = np.finfo(work).min  # torch.finfo(torch.float32).min (float64: its own), what the mask holds
        s = (q @ np.swapaxes(k[:, idx], -1, -2)) * work(case.effective_scale)
        s = np.where(blocked, s + work(lowest), s + bias)  # a blocked score becomes -FLT_MAX (rounded)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return _rounder(case, work)(p) @ v[:, idx]  # torch: softmax in fp32, .to(q.dtype), then P·V


# -- 8. GQA by index arithmetic ---------------------------------------------------------------------------
class GqaIndexArith(ZooKernel):
    name = "zoo-gqa-index-arith"
    has_grad = True

    def _p(self, case: Case, work, q, k, h: int) -> np.ndarray:
        """The weights of query head h, [B, T, S], reading kv head h // g."""
        kvh = h // (case.Hq // case.Hkv)
        blocked, bias = self._mask
        s = (q[:, h] @ np.swapaxes(k[:, kvh], -1, -2)) * work(case.effective_scale) + bias[:, h]
        s = np.where(blocked[:, h], work(-np.inf), s)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(m), work(0), m))
        l = e.sum(axis=-1, keepdims=True)
        return np.where(l > 0, e / np.where(l > 0, l, 1), work(0))

    def attend(self, case, work, q, k, v):
        _kv_index(case)  # the head ratio check
        self._mask = _blocked_and_bias(case, work)
        rnd = _rounder(case, work)
        out = np.zeros(case.out_shape, dtype=work)
        g = case.Hq // case.Hkv
        for h in range(case.Hq):
            out[:, h] = rnd(self._p(case, work, q, k, h)) @ v[:, h // g]
        return out

    def vjp(self, case: Case, grad_out: np.ndarray):
        work, q, k, v = _operands(case)
        _kv_index(case)
        self._mask = _blocked_and_bias(case, work)
        do = np.asarray(grad_out).astype(work)
        g = case.Hq // case.Hkv
        sc = work(case.effective_scale)
        dq = np.zeros(q.shape, dtype=work)
        dk = np.zeros(k.shape, dtype=work)
        dv = np.zeros(v.shape, dtype=work)
        for h in range(case.Hq):
            kvh = h // g
            p = self._p(case, work, q, k, h)
            dp = do[:, h] @ np.swapaxes(v[:, kvh], -1, -2)
            ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
            dq[:, h] = (ds @ k[:, kvh]) * sc
            np.add.at(dk, (slice(None), kvh), (np.swapaxes(ds, -1, -2) @ q[:, h]) * sc)
            np.add.at(dv, (slice(None), kvh), np.swapaxes(p, -1, -2) @ do[:, h])
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), dk.astype(lowp), dv.astype(lowp)


# -- 9. fast-math exp2 (ex2.approx.ftz) and reciprocal ---------------------------------------------------
def _approx(x: np.ndarray, rel: float) -> np.ndarray:
    """x times (1 + d), |d| <= rel, d a fixed function of x's bits: what an approximate hardware
    instruction does (deterministic, not rounded-to-nearest); subnormal results flushed to zero."""
    if x.dtype != np.float32:
        return x  # float64 cases: no approximate float64 instructions
    bits = x.view(np.uint32).astype(np.uint64)
    d = ((bits * np.uint64(2654435761)) % np.uint64(2001)).astype(np.float64) / 1000.0 - 1.0  # in [-1, 1]
    y = (x.astype(np.float64) * (1.0 + rel * d)).astype(np.float32)
    return np.where(np.abs(y) < np.finfo(np.float32).tiny, np.float32(0), y)


class FastMathExp2(ZooKernel):
    name = "zoo-fast-math-exp2"
    KTILE = 64
    EX2_REL = 2.0**-22  # PTX ex2.approx.ftz.f32: maximum relative error about 2^-22
    RCP_REL = 2.0**-23  # rcp.approx.ftz.f32

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        c = work(case.effective_scale * LOG2E)
        ktile = self.KTILE if case.S <= 2048 else 512
        m = np.full((case.B, case.Hq, case.T, 1), -np.inf, dtype=work)
        l = np.zeros_like(m)
        acc = np.zeros(case.out_shape, dtype=work)
        for s0, s1 in _tiles(case.S, ktile):
            s2 = (q @ np.swapaxes(k[:, idx, s0:s1], -1, -2)) * c + bias[..., s0:s1] * work(LOG2E)
            s2 = np.where(blocked[..., s0:s1], work(-np.inf), s2)
            m_new = np.maximum(m, s2.max(axis=-1, keepdims=True))
            ref = np.where(np.isneginf(m_new), work(0), m_new)
            alpha = _approx(np.exp2(np.where(np.isneginf(m), -np.inf, m - ref)), self.EX2_REL)
            p = _approx(np.exp2(s2 - ref), self.EX2_REL)
            l = l * alpha + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + rnd(p) @ v[:, idx, s0:s1]
            m = m_new
        inv = _approx(work(1) / np.where(l == 0, work(1), l), self.RCP_REL)
        return acc * inv


# -- 10. float64 with pairwise sums -----------------------------------------------------------------------
def _pairwise_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """Sum along ``axis`` by a balanced tree of additions (odd lengths carry their last term up)."""
    x = np.moveaxis(x, axis, -1)
    while x.shape[-1] > 1:
        n = x.shape[-1]
        half = x[..., 0 : n - n % 2 : 2] + x[..., 1 : n - n % 2 : 2]
        x = np.concatenate([half, x[..., n - 1 :]], axis=-1) if n % 2 else half
    return x[..., 0]


class Float64Pairwise(ZooKernel):
    name = "zoo-float64-pairwise"
    CHUNK = 1 << 22  # elements of a product block, so long sequences stay within memory

    def forward(self, case: Case) -> np.ndarray:
        q, k, v = (np.asarray(x).astype(np.float64) for x in (case.query, case.key, case.value))
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, np.float64)
        ke, ve = k[:, idx], v[:, idx]
        out = np.zeros(case.out_shape)
        rows = max(1, self.CHUNK // max(1, case.B * case.Hq * case.S * max(case.Dk, case.Dv)))
        for t0, t1 in _tiles(case.T, rows):
            dots = _pairwise_sum(q[:, :, t0:t1, None, :] * ke[:, :, None, :, :], axis=-1)
            s = np.where(blocked[:, :, t0:t1], -np.inf, dots * case.effective_scale + bias[:, :, t0:t1])
            m = s.max(axis=-1, keepdims=True)
            e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
            l = _pairwise_sum(e, axis=-1)[..., None]
            pv = _pairwise_sum(e[..., None] * ve[:, :, None, :, :], axis=-2)
            out[:, :, t0:t1] = np.where(l > 0, pv / np.where(l > 0, l, 1.0), 0.0)
        return out.astype(np_dtype(case.dtype))


# -- 11. declared conventions: causal bottom-right (FlashAttention 2 when T != S) ------------------------
class CausalBottomRight(TiledK128Q64):
    """FA2's tiles with its causal alignment: query i sees keys j <= i + S - T; with T > S the
    first T - S rows see no key and are written 0 (declared causal_alignment=bottom-right)."""

    name = "zoo-causal-bottom-right"
    has_grad = False

    def __init__(self) -> None:
        super().__init__()
        self.declaration = self.declaration.replace(causal_alignment="bottom-right")

    def _mask(self, case: Case, work):
        return _blocked_and_bias(case, work, offset=case.S - case.T)


# -- 12. declared conventions: no guards, NaN on rows that see no key ------------------------------------
class UnguardedNan(ZooKernel):
    """softmax as written, exp(s - max) / sum, with no guard: a row that sees no key has max = -inf
    and gives NaN, in the output and in the gradients it touches (declared all_blocked=nan, as
    torch's math backend behaves)."""

    name = "zoo-unguarded-nan"
    has_grad = True

    def __init__(self) -> None:
        super().__init__()
        self.declaration = self.declaration.replace(all_blocked="nan")

    def _p(self, case: Case, work, q, k):
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        s = np.where(blocked, work(-np.inf), (q @ np.swapaxes(k[:, idx], -1, -2)) * work(case.effective_scale) + bias)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

    def attend(self, case, work, q, k, v):
        return _rounder(case, work)(self._p(case, work, q, k)) @ v[:, _kv_index(case)]

    def vjp(self, case: Case, grad_out: np.ndarray):
        work, q, k, v = _operands(case)
        idx = _kv_index(case)
        p = self._p(case, work, q, k)
        do = np.asarray(grad_out).astype(work)
        sc = work(case.effective_scale)
        with np.errstate(invalid="ignore"):
            dp = do @ np.swapaxes(v[:, idx], -1, -2)
            ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
            dq = (ds @ k[:, idx]) * sc
            dk = _sum_groups((np.swapaxes(ds, -1, -2) @ q) * sc, case.Hkv)
            dv = _sum_groups(np.swapaxes(p, -1, -2) @ do, case.Hkv)
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), dk.astype(lowp), dv.astype(lowp)


# -- 13. declared conventions: float64 computed in float32 -----------------------------------------------
class Float64AsFloat32(TiledK128Q64):
    """FA2's tiles with float64 inputs computed in float32 and the result returned as float64 (a
    kernel without a float64 path; declared float64_computed_as=float32, as jax on CPU does)."""

    name = "zoo-f64-as-f32"

    def __init__(self) -> None:
        super().__init__()
        self.declaration = self.declaration.replace(float64_computed_as="float32")

    def forward(self, case: Case) -> np.ndarray:
        q, k, v = (np.asarray(x).astype(np.float32) for x in (case.query, case.key, case.value))
        return self._forward(case, np.float32, q, k, v)[0].astype(np_dtype(case.dtype))

    def vjp(self, case: Case, grad_out: np.ndarray):
        if case.dtype != "float64":
            return super().vjp(case, grad_out)
        names = ("query", "key", "value")
        lowered = case.replace(**{n: np.asarray(getattr(case, n)).astype(np.float32) for n in names})
        grads = super().vjp(lowered, np.asarray(grad_out).astype(np.float32))
        return tuple(g.astype(np.float64) for g in grads)


# -- 14. declared conventions: the weights returned too --------------------------------------------------
class ReturnsWeights(ZooKernel):
    """The article's shape of kernel (scores, softmax, P·V, and the weights returned), in fp32 with
    P rounded once to the input dtype and used for both results (declared returns_weights)."""

    name = "zoo-returns-weights"

    def __init__(self) -> None:
        super().__init__()
        self.declaration = self.declaration.replace(returns_weights=True)

    def _weights(self, case: Case, work, q, k) -> np.ndarray:
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        s = np.where(blocked, work(-np.inf), (q @ np.swapaxes(k[:, idx], -1, -2)) * work(case.effective_scale) + bias)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(m), work(0), m))
        l = e.sum(axis=-1, keepdims=True)
        return _rounder(case, work)(np.where(l > 0, e / np.where(l > 0, l, 1), work(0)))

    def attend(self, case, work, q, k, v):
        return self._weights(case, work, q, k) @ v[:, _kv_index(case)]

    def forward_with_weights(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        work, q, k, v = _operands(case)
        p = self._weights(case, work, q, k)
        lowp = np_dtype(case.dtype)
        return (p @ v[:, _kv_index(case)]).astype(lowp), p.astype(lowp)


# -- 15. declared conventions: dropout as FlashAttention-2 applies it ------------------------------------
def _keep(case: Case) -> np.ndarray:
    """[B, Hq, T, S] keep-mask from a counter-based hash of (seed, b, h, t, s) (splitmix64), as
    FlashAttention draws Philox numbers per element from (seed, offset): no generator state."""
    B, H, T, S = case.B, case.Hq, case.T, case.S
    ctr = np.arange(B * H * T * S, dtype=np.uint64).reshape(B, H, T, S)
    with np.errstate(over="ignore"):
        z = ctr + np.uint64(case.seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return u >= case.dropout_p


class DropoutFa2(TiledK128Q64):
    """FA2's dropout: P (unnormalised, fp32) multiplied by the keep-mask before it is rounded for
    P·V, l summed from the *undropped* P, and 1/(1 - p) applied once to the output at the end. Its
    backward replays the keep-mask from the seed (FA2 regenerates its Philox numbers from the saved
    seed and offset), never a stored mask: over key tiles, dV += (keep * P)^T dO rounded as in the
    forward and scaled by 1/(1 - p) at the end, dP = keep * dO V^T / (1 - p), D = rowsum(dO * O) from
    the rounded dropped output, dS = P (dP - D) rounded, dQ accumulated in fp32."""

    name = "zoo-dropout-fa2"
    has_grad = True

    def __init__(self) -> None:
        super().__init__()
        self.declaration = self.declaration.replace(dropout=True)

    def attend(self, case, work, q, k, v):
        if not 0.0 <= case.dropout_p <= 1.0:
            raise ValueError("dropout_p must lie in [0, 1]")
        if case.dropout_p >= 1.0:
            return np.zeros(case.out_shape, dtype=work)
        keep = _keep(case) if case.dropout_p > 0 else None
        out = self._forward(case, work, q, k, v, keep=keep)[0]
        return out * work(1.0 / (1.0 - case.dropout_p)) if keep is not None else out

    def vjp(self, case: Case, grad_out: np.ndarray):
        if not 0.0 <= case.dropout_p <= 1.0:
            raise ValueError("dropout_p must lie in [0, 1]")
        if case.dropout_p == 0.0:
            return super().vjp(case, grad_out)
        if case.dropout_p == 1.0:  # the output is 0 whatever the inputs: so is every gradient
            return tuple(np.zeros(x.shape, dtype=np_dtype(case.dtype)) for x in (case.query, case.key, case.value))
        work, q, k, v = _operands(case)
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        keep = _keep(case)  # replayed from the seed, as FA2's backward regenerates its Philox numbers
        rp = work(1.0 / (1.0 - case.dropout_p))
        o32, lse = self._forward(case, work, q, k, v, keep=keep)
        do = np.asarray(grad_out).astype(work)
        d = self._delta(case, do, o32 * rp)  # D = rowsum(dO * O), O the dropped output
        blocked, bias = self._mask(case, work)
        sc = work(case.effective_scale)
        live = np.isfinite(lse)
        dq = np.zeros(q.shape, dtype=work)
        dk = np.zeros((case.B, case.Hq, case.S, case.Dk), dtype=work)
        dv = np.zeros((case.B, case.Hq, case.S, case.Dv), dtype=work)
        for s0, s1 in _tiles(case.S, self.KTILE):
            kb, vb, kt = k[:, idx, s0:s1], v[:, idx, s0:s1], keep[..., s0:s1]
            s = (q @ np.swapaxes(kb, -1, -2)) * sc + bias[..., s0:s1]
            s = np.where(blocked[..., s0:s1], work(-np.inf), s)
            p = np.where(live, np.exp(s - np.where(live, lse, 0)), work(0))
            dv[:, :, s0:s1] = (np.swapaxes(rnd(np.where(kt, p, work(0))), -1, -2) @ do) * rp
            dp = np.where(kt, (do @ np.swapaxes(vb, -1, -2)) * rp, work(0))
            ds = rnd(p * (dp - d))
            dk[:, :, s0:s1] = (np.swapaxes(ds, -1, -2) @ q) * sc
            dq = dq + (ds @ kb) * sc
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), _sum_groups(dk, case.Hkv).astype(lowp), _sum_groups(dv, case.Hkv).astype(lowp)


# -- 16. split-KV with every rounding a kernel may make ---------------------------------------------------
class SplitRoundedEverything(ZooKernel):
    """Split-KV where each part rounds P to the input dtype, sums its denominator from that rounded
    P, and stores its normalised partial output in the input dtype (vLLM's paged attention v2
    layout), merged by the parts' lse in fp32 and rounded once more: four roundings to the input
    dtype on the way from a weight to the output."""

    name = "zoo-split-rounded-everything"
    PARTS = 3

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        s_all = (q @ np.swapaxes(k[:, idx], -1, -2)) * work(case.effective_scale) + bias
        s_all = np.where(blocked, work(-np.inf), s_all)
        per = -(-case.S // min(self.PARTS, case.S))
        outs, lses = [], []
        for a in range(0, case.S, per):
            s = s_all[..., a : a + per]
            m = s.max(axis=-1, keepdims=True)
            p = rnd(np.exp(s - np.where(np.isneginf(m), work(0), m)))
            l = p.sum(axis=-1, keepdims=True)
            outs.append(rnd((p @ v[:, idx, a : a + per]) / np.where(l > 0, l, 1)))
            with np.errstate(divide="ignore"):
                lses.append(np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(work))
        lse = np.stack(lses)
        top = lse.max(axis=0)
        top = np.where(np.isneginf(top), work(0), top)
        w = np.exp(lse - top)
        total = w.sum(axis=0)
        out = sum(wi * o for wi, o in zip(w, outs))
        return np.where(total > 0, out / np.where(total > 0, total, 1), work(0))


# -- 17. a backward with every rounding a kernel may make ------------------------------------------------
class BwdRoundedEverything(TiledK128Q64):
    """FA2's forward; a backward that uses the *rounded* P both for dV and inside dS = P (dP - D),
    takes D from the rounded output, rounds dS, and stores each query head's dK, dV share in the
    input dtype before the GQA group sum (autograd through a repeat of K and V)."""

    name = "zoo-bwd-rounded-everything"
    has_grad = True

    def vjp(self, case: Case, grad_out: np.ndarray):
        work, q, k, v = _operands(case)
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        o32, lse = self._forward(case, work, q, k, v)
        do = np.asarray(grad_out).astype(work)
        d = self._delta(case, do, o32)
        blocked, bias = self._mask(case, work)
        sc = work(case.effective_scale)
        s = np.where(blocked, work(-np.inf), (q @ np.swapaxes(k[:, idx], -1, -2)) * sc + bias)
        live = np.isfinite(lse)
        p = rnd(np.where(live, np.exp(s - np.where(live, lse, 0)), work(0)))
        dv = rnd(np.swapaxes(p, -1, -2) @ do)
        ds = rnd(p * (do @ np.swapaxes(v[:, idx], -1, -2) - d))
        dq = (ds @ k[:, idx]) * sc
        dk = rnd((np.swapaxes(ds, -1, -2) @ q) * sc)
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), _sum_groups(dk, case.Hkv).astype(lowp), _sum_groups(dv, case.Hkv).astype(lowp)


# -- not admitted: Q pre-scaled in the input dtype ----------------------------------------------------
class QPrescaled(ZooKernel):
    """softmax(round_d(Q * scale) K^T) V: Q multiplied by the scale *in the input dtype* before QK^T
    (the Triton tutorial's first fused kernel; many model codes scale Q before the matmul).

    Not admitted by the error model, by decision. The seed upcasts before the dot product (000 §8:
    "将低精度输入转为 float32 后才计算点积和 softmax"); rounding q * scale to float16 / bfloat16
    perturbs every exponent by up to u_w * scale * sum_d |q_d k_d| (2^-11 / 2^-8 relative), which
    is the size of the temperature deviations the suite must see (0.2 % / 2 %,
    tests/test_sensitivity.py); admitting it would blind the suite to them. Measured (ci profile):
    it fails GOLDEN-01 (large-logits fixtures, 2-3x the allowance) and MASK-BEFORE-SOFTMAX-01
    (float16, Dk = 8, 1.1x). Where 1/sqrt(Dk) is a power of two (Dk = 4, 16, 64, 256) the
    pre-scaling is exact and the kernel is the plain one.
    """

    name = "zoo-q-prescaled"

    def attend(self, case, work, q, k, v):
        rnd = _rounder(case, work)
        idx = _kv_index(case)
        blocked, bias = _blocked_and_bias(case, work)
        qs = rnd(q * work(case.effective_scale))  # q * scale in the input dtype, before QK^T
        s = np.where(blocked, work(-np.inf), qs @ np.swapaxes(k[:, idx], -1, -2) + bias)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(m), work(0), m))
        l = e.sum(axis=-1, keepdims=True)
        return rnd(np.where(l > 0, e / np.where(l > 0, l, 1), work(0))) @ v[:, idx]


MORE: dict[str, type[ZooKernel]] = {
    cls.name: cls
    for cls in (
        TiledK128Q64,
        FiniteMaxSkipTiles,
        LazyRescaleExp2,
        LFromRoundedP,
        BwdDeltaFp32O,
        SplitKvCombine,
        FinfoMinMask,
        GqaIndexArith,
        Float64Pairwise,
        FastMathExp2,
        CausalBottomRight,
        UnguardedNan,
        Float64AsFloat32,
        ReturnsWeights,
        DropoutFa2,
        SplitRoundedEverything,
        BwdRoundedEverything,
    )
}

# Formulations production kernels use that the suite refuses by decision (each class says why).
NOT_ADMITTED: dict[str, type[ZooKernel]] = {QPrescaled.name: QPrescaled}
