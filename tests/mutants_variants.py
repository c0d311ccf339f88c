"""Deliberately wrong variant kernels: each one a bug that window, softcap, ALiBi or lse code ships.

``VariantKernel`` is the base kernel of tests/mutants.py with FlashAttention's conventions added as
hooks of their own (bottom-right causal alignment, sliding window, softcap, ALiBi, a returned lse),
written from FlashAttention's documentation, not from the oracle. It must pass every clause (it is
one of the correct kernels of tests/test_clauses_bite.py); each mutant overrides one hook with a bug
from the issue: windows off by one, passed as (w, w), top-left aligned, or dropping causal; softcap
as s·tanh(s), before the scale, without the factor c, or after ALiBi; ALiBi slopes recomputed for a
power of two, read per kv head, per first batch, without the absolute value, or top-left; the lse in
base 2, 0 on empty rows, without the scale, or in kv-major head order under GQA; variable-length
sequences positioned by the batch's longest lengths, or reading keys past their own end. The
backward's and the sinks' mutants are in tests/mutants_sinks_grads.py.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.contract import Case, np_dtype
from tests.mutants import BaseKernel, mutant


class VariantKernel(BaseKernel):
    """A correct kernel with FlashAttention's variants; declares them all, bottom-right aligned."""

    mutant_name = "base-variants"

    def __init__(self, name: str = "base-variants"):
        super().__init__(name)
        self.declaration = self.declaration.replace(
            causal_alignment="bottom-right",
            window=True,
            softcap=True,
            alibi=True,
            returns_lse=True,
            varlen=True,
            kv_lengths=True,
            paged_kv=True,
            kv_append=True,
            sinks=True,
            grad=True,
            notes="self-test kernel with FlashAttention's variants",
        )

    # -- positions ---------------------------------------------------------------------------------
    def lengths(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        """(query lengths [B], key lengths [B]) of the case's sequences."""
        tq = np.full(case.B, case.T) if case.seqlens_q is None else np.asarray(case.seqlens_q, dtype=np.int64)
        sk = np.full(case.B, case.S) if case.seqlens_k is None else np.asarray(case.seqlens_k, dtype=np.int64)
        return tq, sk

    def offsets(self, case: Case) -> np.ndarray:
        """[B] bottom-right offset of each sequence: its own S_b - T_b."""
        tq, sk = self.lengths(case)
        return sk - tq

    def window_offset(self, case: Case) -> np.ndarray:
        return self.offsets(case)

    def alibi_offset(self, case: Case) -> np.ndarray:
        return self.offsets(case)

    def place(self, case: Case, offset: np.ndarray) -> np.ndarray:
        """[B, 1, T, 1]: query i's position on its sequence's key axis."""
        return (np.arange(case.T)[None, :] + np.asarray(offset).reshape(-1, 1))[:, None, :, None]

    def window_sides(self, case: Case) -> tuple[int, int]:
        left, right = case.window
        return int(left), int(right)

    def window_blocked(self, case: Case) -> np.ndarray:
        left, right = self.window_sides(case)
        pos = self.place(case, self.window_offset(case))
        j = np.arange(case.S)
        hide = np.zeros((case.B, 1, case.T, case.S), dtype=bool)
        if left >= 0:
            hide = hide | (j < pos - left)
        if right >= 0:
            hide = hide | (j > pos + right)
        return hide

    def keys_hidden(self, case: Case) -> np.ndarray:
        """[B, 1, T, S]: keys past their sequence's end and query rows past theirs."""
        tq, sk = self.lengths(case)
        past = np.arange(case.S)[None, None, None, :] >= sk[:, None, None, None]
        return past | (np.arange(case.T)[None, None, :, None] >= tq[:, None, None, None])

    def blocked(self, case: Case) -> np.ndarray:
        b = BaseKernel.blocked(self, case.replace(is_causal=False))
        if case.is_causal:
            b = b | (np.arange(case.S) > self.place(case, self.offsets(case)))
        if case.window is not None:
            b = b | self.window_blocked(case)
        if case.is_varlen:
            b = b | self.keys_hidden(case)
        return b

    # -- score modifications -------------------------------------------------------------------------
    def cap(self, s: np.ndarray, c: float) -> np.ndarray:
        return c * np.tanh(s / c)

    def slopes(self, case: Case) -> np.ndarray:
        return np.broadcast_to(np.asarray(case.alibi_slopes, dtype=np.float64), (case.B, case.Hq))

    def distance(self, case: Case) -> np.ndarray:
        """[B, 1, T, S] |query position - key position| on the key axis."""
        pos = self.place(case, self.alibi_offset(case))
        return np.abs(pos - np.arange(case.S)).astype(np.float64)

    def alibi(self, case: Case) -> np.ndarray:
        return -self.slopes(case)[:, :, None, None] * self.distance(case)

    def scaled(self, case: Case, raw: np.ndarray, w) -> np.ndarray:
        s = raw * w(self.scale(case))
        return self.cap(s, w(case.softcap)) if case.softcap else s

    def scores(self, case: Case) -> np.ndarray:
        q, k, v = self.operands(case)
        w = self.work(case)
        s = self.scaled(case, self.raw_scores(case, q, k, v), w)
        if case.bias is not None:
            bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
            s = s + np.where(np.isneginf(bias), 0.0, bias).astype(w)
        if case.alibi_slopes is not None:
            s = s + self.alibi(case).astype(w)
        return s.astype(w)

    def weights(self, case: Case) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            if case.sinks is None:
                return self.softmax(self.scores(case), self.blocked(case))
            return self.sink_softmax(self.scores(case), self.blocked(case), self.sink_logits(case))

    # -- attention sinks -----------------------------------------------------------------------------
    def sink_logits(self, case: Case) -> np.ndarray:
        """[1, Hq, 1] each query head's sink logit."""
        return np.asarray(case.sinks, dtype=np.float64)[None, :, None]

    def sink_softmax(self, scores: np.ndarray, blocked: np.ndarray, sink: np.ndarray) -> np.ndarray:
        """Softmax over the visible scores and the sink, the sink's column dropped (a row with no key: 0)."""
        s = np.where(blocked, -np.inf, scores)
        m = np.maximum(s.max(axis=-1), sink).astype(scores.dtype)
        e = np.exp(s - m[..., None])
        return e / (e.sum(axis=-1) + self.sink_term(sink, m))[..., None]

    def sink_term(self, sink: np.ndarray, m: np.ndarray) -> np.ndarray:
        return np.exp(sink - m).astype(m.dtype)

    # -- lse ---------------------------------------------------------------------------------------
    def lse(self, case: Case) -> np.ndarray:
        s = np.where(self.blocked(case), -np.inf, self.scores(case)).astype(np.float64)
        if case.sinks is not None:  # the sink is one more column of the normaliser
            sink = np.broadcast_to(self.sink_logits(case), s.shape[:-1])[..., None]
            s = np.concatenate([s, sink], axis=-1)
        m = s.max(axis=-1)
        empty = np.isneginf(m)
        safe = np.where(empty, 0.0, m)
        with np.errstate(divide="ignore"):
            return np.where(empty, -np.inf, safe + np.log(np.exp(s - safe[..., None]).sum(axis=-1)))

    def forward_with_lse(self, case: Case):
        return self.forward(case), self.lse(case).astype(self.work(case))  # float32, float64 for float64

    # -- backward ----------------------------------------------------------------------------------
    def cap_grad(self, s: np.ndarray, c: float) -> np.ndarray:
        """d(c tanh(s/c))/ds = 1 - tanh(s/c)^2, on the scaled product s."""
        return 1.0 - np.tanh(s / c) ** 2

    def backward_case(self, case: Case) -> Case:
        """The case whose weights the backward recomputes (a flash backward recomputes P)."""
        return case

    def vjp(self, case: Case, grad_out: np.ndarray):
        """The base kernel's backward over this kernel's weights, dS scaled by the softcap's derivative."""
        self.validate(case)
        q, k, v = self.operands(case)
        w = self.work(case)
        with np.errstate(invalid="ignore", over="ignore"):
            p = self.weights(self.backward_case(case))
        do = grad_out.astype(w)
        dp = do @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        scale = w(self.scale(case))
        if case.softcap:
            ds = ds * self.cap_grad(self.raw_scores(case, q, k, v) * scale, w(case.softcap)).astype(w)
        dq = ds @ k * scale
        dk = np.swapaxes(ds, -1, -2) @ q * scale
        dv = np.swapaxes(p, -1, -2) @ do
        low = np_dtype(case.dtype)
        return dq.astype(low), self.fold_group(dk, case).astype(low), self.fold_group(dv, case).astype(low)

    def fold_group(self, x: np.ndarray, case: Case) -> np.ndarray:
        """dK or dV per query head [B, Hq, S, D] summed over each kv head's group of query heads."""
        return x.reshape(case.B, case.Hkv, case.Hq // case.Hkv, *x.shape[2:]).sum(axis=2)


MUTANT_BASE = VariantKernel


# -- windows ---------------------------------------------------------------------------------------
@mutant("window_off_by_one")
class WindowOffByOne(VariantKernel):
    """The left edge exclusive: query i sees keys i - left + 1 ... (a window of `left` keys in all)."""

    def window_blocked(self, case):
        left, _ = self.window_sides(case)
        hide = super().window_blocked(case)
        if left >= 0:
            hide = hide | (np.arange(case.S) == self.place(case, self.window_offset(case)) - left)
        return hide


@mutant("window_as_w_w")
class WindowAsWW(VariantKernel):
    """The window's left size used for both sides: (w, 0) runs as (w, w)."""

    def window_sides(self, case):
        left, _ = super().window_sides(case)
        return left, left


@mutant("window_right_ignored")
class WindowRightIgnored(VariantKernel):
    """Only the left edge is enforced; keys after the query stay visible whatever window[1] says."""

    def window_sides(self, case):
        left, _ = super().window_sides(case)
        return left, -1


@mutant("window_top_left")
class WindowTopLeft(VariantKernel):
    """Causal is bottom-right as declared, but the window is centred on key i (top-left) when T != S."""

    def window_offset(self, case):
        return np.zeros(case.B, dtype=np.int64)


@mutant("window_drops_causal")
class WindowDropsCausal(VariantKernel):
    """A window replaces is_causal instead of joining it (the window's right side wins)."""

    def blocked(self, case):
        if case.window is None:
            return super().blocked(case)
        return BaseKernel.blocked(self, case.replace(is_causal=False)) | self.window_blocked(case)


# -- softcap ---------------------------------------------------------------------------------------
@mutant("softcap_s_tanh_s")
class SoftcapSTanhS(VariantKernel):
    """s * tanh(s) instead of c * tanh(s / c)."""

    def cap(self, s, c):
        return s * np.tanh(s)


@mutant("softcap_before_scale")
class SoftcapBeforeScale(VariantKernel):
    """The cap applied to the unscaled product, then scaled: scale * c * tanh(q.k / c)."""

    def scaled(self, case, raw, w):
        s = self.cap(raw, w(case.softcap)) if case.softcap else raw
        return s * w(self.scale(case))


@mutant("softcap_without_c")
class SoftcapWithoutC(VariantKernel):
    """tanh(s / c): the factor c forgotten, every score squeezed into (-1, 1)."""

    def cap(self, s, c):
        return np.tanh(s / c)


@mutant("softcap_after_alibi")
class SoftcapAfterAlibi(VariantKernel):
    """ALiBi added before the cap, so that the cap squeezes the position bias too."""

    def scores(self, case):
        if not (case.softcap and case.alibi_slopes is not None):
            return super().scores(case)
        plain = super().scores(case.replace(softcap=None, alibi_slopes=None))
        w = self.work(case)
        return self.cap(plain + self.alibi(case).astype(w), w(case.softcap)).astype(w)


# -- ALiBi -----------------------------------------------------------------------------------------
@mutant("alibi_pow2_slopes")
class AlibiPow2Slopes(VariantKernel):
    """Recomputes the slopes as 2^(-8 (h + 1) / H), right only when H is a power of two."""

    def slopes(self, case):
        h = np.arange(1, case.Hq + 1)
        return np.broadcast_to(2.0 ** (-8.0 * h / case.Hq), (case.B, case.Hq))


@mutant("alibi_kv_head_slope")
class AlibiKvHeadSlope(VariantKernel):
    """Under GQA, query head h takes the slope of its kv head's index, slopes[h // (Hq / Hkv)]."""

    def slopes(self, case):
        sl = super().slopes(case)
        g = case.Hq // case.Hkv
        return sl[:, np.arange(case.Hq) // g]


@mutant("alibi_first_batch_slopes")
class AlibiFirstBatchSlopes(VariantKernel):
    """Slopes [B, H] read as if they were [H]: every sequence gets the first sequence's slopes."""

    def slopes(self, case):
        sl = super().slopes(case)
        return np.broadcast_to(sl[0], sl.shape)


@mutant("alibi_causal_shortcut")
class AlibiCausalShortcut(VariantKernel):
    """+slope * (j - i): the row-shifted form that equals ALiBi only when no key lies after the query."""

    def distance(self, case):
        return (self.place(case, self.alibi_offset(case)) - np.arange(case.S)).astype(np.float64)


@mutant("alibi_top_left_distance")
class AlibiTopLeftDistance(VariantKernel):
    """The distance |i - j| without the S - T offset of the declared bottom-right alignment."""

    def alibi_offset(self, case):
        return np.zeros(case.B, dtype=np.int64)


# -- lse -------------------------------------------------------------------------------------------
@mutant("lse_base2")
class LseBase2(VariantKernel):
    """The exp2 kernel's internal log2-sum-exp2 returned as if it were the natural lse."""

    def lse(self, case):
        return super().lse(case) / math.log(2.0)


@mutant("lse_empty_zero")
class LseEmptyZero(VariantKernel):
    """0 on rows that see no key (log of an empty sum is -inf)."""

    def lse(self, case):
        out = super().lse(case)
        return np.where(np.isneginf(out), 0.0, out)


@mutant("lse_without_scale")
class LseWithoutScale(VariantKernel):
    """The row max kept unscaled in the lse: max(q.k) + log(sum exp(s - max s)) (FlashAttention's
    ``row_max * softmax_scale`` with the factor forgotten)."""

    def lse(self, case):
        q, k, v = self.operands(case)
        blocked = self.blocked(case)
        raw = np.where(blocked, -np.inf, self.raw_scores(case, q, k, v)).astype(np.float64)
        s = np.where(blocked, -np.inf, self.scores(case)).astype(np.float64)
        m_raw, m = raw.max(axis=-1), s.max(axis=-1)
        empty = np.isneginf(m)
        safe = np.where(empty, 0.0, m)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(empty, -np.inf, m_raw + np.log(np.exp(s - safe[..., None]).sum(axis=-1)))


@mutant("lse_gqa_kv_major")
class LseGqaKvMajor(VariantKernel):
    """Under GQA the lse rows written kv-major: query head (kv, g) lands at g * Hkv + kv."""

    def lse(self, case):
        out = super().lse(case)
        g = case.Hq // case.Hkv
        return out.reshape(case.B, case.Hkv, g, case.T).transpose(0, 2, 1, 3).reshape(out.shape)


# -- variable lengths ------------------------------------------------------------------------------
@mutant("varlen_global_offset")
class VarlenGlobalOffset(VariantKernel):
    """Causal, window and ALiBi positions from the batch's longest lengths (max_seqlen_k - max_seqlen_q)
    instead of each sequence's own S_b - T_b."""

    def offsets(self, case):
        tq, sk = self.lengths(case)
        return np.full(case.B, sk.max() - tq.max())


@mutant("varlen_keys_past_end")
class VarlenKeysPastEnd(VariantKernel):
    """Each sequence reads max_seqlen_k keys: past its own end, into what follows it in the packed batch."""

    def keys_hidden(self, case):
        tq, _ = self.lengths(case)
        return np.broadcast_to(
            np.arange(case.T)[None, None, :, None] >= tq[:, None, None, None], (case.B, 1, case.T, case.S)
        )
