"""Wrong kernels that misbehave only where two ordinary features meet.

Each is BaseKernel (tests/mutants.py) with one bug that fires only when both of its features are in
the case, written the way such a bug looks in a real kernel (a fast path, a template chosen by a size,
a pointer computed for the contiguous layout, a loop over tiles or heads); everywhere else it is the
correct base kernel. ``FEATURES`` names each mutant's two features as predicates on a case, and
tests/test_mutants_pairs.py checks that a mutant agrees with the oracle on every case that has only
one of them. The covering-array clauses (COVER-PAIRS-01, COVER-PAIRS-GRAD-02,
conformance/clauses/test_covering.py) claim them; the other clauses are not changed for them.

Long because it is one family: nineteen small classes and the table of their features.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from conformance.contract import Case, np_dtype
from tests.mutants import BaseKernel, mutant

Feature = Callable[[Case], bool]


def _mask_form(case: Case) -> tuple[int, ...] | None:
    return None if case.mask is None else np.shape(case.mask)


def _contiguous(case: Case) -> bool:
    return all(np.asarray(a).flags.c_contiguous for a in (case.query, case.key, case.value))


def _q_expanded(case: Case) -> bool:
    return any(np.asarray(case.query).strides[i] == 0 and case.query.shape[i] > 1 for i in (0, 1))


def _has_full_empty_row(case: Case) -> bool:
    return case.mask is not None and bool(np.asarray(case.mask).all(axis=-1).any())


def _leading_tile_blocked(case: Case) -> bool:
    return case.mask is not None and case.S > 32 and bool(np.asarray(case.mask)[..., :32].all())


class PairKernel(BaseKernel):
    """The base kernel with the output computed by :meth:`compute` (q, k, v already expanded to Hq),
    so that a mutant can change one step for one combination."""

    def compute(self, case: Case, q, k, v) -> np.ndarray:
        p = self.weights(case)
        with np.errstate(invalid="ignore"):
            return p @ v

    def forward(self, case: Case) -> np.ndarray:
        self.validate(case)
        q, k, v = self.operands(case)
        return self.finish(self.compute(case, q, k, v), case)


@mutant("pairs_gqa_mask_by_kv_head")
class GqaMaskByKvHead(PairKernel):
    """GQA x a mask with a head axis: the mask's head is indexed by the kv head (h // group), as a
    kernel that walks the mask with the K/V head pointer does."""

    def blocked(self, case):
        b = super().blocked(case)
        m = _mask_form(case)
        if case.is_gqa and m is not None and len(m) == 4 and m[1] == case.Hq > 1:
            g = case.Hq // case.Hkv
            mine = np.broadcast_to(np.asarray(case.mask), case.weights_shape)[:, np.arange(case.Hq) // g]
            b = np.broadcast_to(mine, case.weights_shape).copy()
            b |= super().blocked(case.replace(mask=None))
        return b


@mutant("pairs_batch_eq_heads_mask_axis")
class BatchEqHeadsMaskAxis(PairKernel):
    """B == H x a [B,1,T,S] mask: the kernel squeezes a 4-d mask with one singleton axis to 3-d and
    reads axis 0 as heads when its length is H, so with B == H the batch mask is applied per head."""

    def blocked(self, case):
        m = _mask_form(case)
        if m is not None and len(m) == 4 and m[1] == 1 and m[0] == case.B == case.Hq > 1 and m[2] > 1:
            swapped = np.swapaxes(np.asarray(case.mask), 0, 1)  # [1, H(=B), T, S]
            return super().blocked(case.replace(mask=swapped))
        return super().blocked(case)


@mutant("pairs_transposed_bias_layout")
class TransposedBiasLayout(PairKernel):
    """Non-contiguous Q x an additive M: for a strided Q the kernel works in [B, T, H, D] order and
    walks M with the same pointer arithmetic, i.e. reads M [B,H,T,S] as if it were [B,T,H,S]."""

    def compute(self, case, q, k, v):
        if case.bias is not None and not np.asarray(case.query).flags.c_contiguous and case.T > 1:
            bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
            wrong = np.ascontiguousarray(bias).reshape(case.B, case.T, case.Hq, case.S).transpose(0, 2, 1, 3)
            return super().compute(case.replace(bias=wrong), q, k, v)
        return super().compute(case, q, k, v)


@mutant("pairs_dv_causal_uses_dk")
class DvCausalDispatch(PairKernel):
    """Dv != Dk x causal: the causal specialisation is compiled for Dk == Dv only; a case with Dv != Dk
    is dispatched to the generic kernel, which has no is_causal argument, and the flag is lost."""

    def blocked(self, case):
        if case.is_causal and case.Dv != case.Dk:
            return super().blocked(case.replace(is_causal=False))
        return super().blocked(case)


@mutant("pairs_decode_gqa8_packed")
class DecodeGqa8Packed(PairKernel):
    """Decode (T = 1) x GQA 8:1 or more: the decode kernel packs the query heads of a group as rows of
    one tile of 4, and for groups of 8 writes the first tile's result to the second tile's heads too."""

    def compute(self, case, q, k, v):
        out = super().compute(case, q, k, v)
        g = case.Hq // case.Hkv
        if case.T == 1 and g >= 8:
            out = out.copy()
            for h in range(case.Hq):
                if h % g >= 4:
                    out[:, h] = out[:, h - 4]
        return out


@mutant("pairs_bf16_long_split")
class Bf16LongSplit(PairKernel):
    """bfloat16 x long keys (S > 256): the bf16 path splits the keys in two halves and averages the two
    halves' normalised outputs, instead of weighting them by their softmax denominators (lse)."""

    def compute(self, case, q, k, v):
        if case.dtype != "bfloat16" or case.S <= 256:
            return super().compute(case, q, k, v)
        p = self.weights(case)
        h = case.S // 2
        parts = []
        for sl in (slice(0, h), slice(h, None)):
            ps = p[..., sl]
            tot = ps.sum(axis=-1, keepdims=True)
            with np.errstate(invalid="ignore", divide="ignore"):
                parts.append(np.where(tot > 0, (ps / np.where(tot > 0, tot, 1)) @ v[..., sl, :], 0.0))
        return (parts[0] + parts[1]) / 2


@mutant("pairs_odd_t_padding_mask")
class OddTPaddingMask(PairKernel):
    """Odd T (> 1) x a [B,1,1,S] key padding mask: queries go in pairs of rows; the tail row of an odd
    T is done by a scalar loop that forgets the padding mask."""

    def blocked(self, case):
        b = super().blocked(case)
        m = _mask_form(case)
        if case.T > 1 and case.T % 2 == 1 and m is not None and len(m) == 4 and m[1] == m[2] == 1 and m[0] > 1:
            tail = super().blocked(case.replace(mask=None))
            b = b.copy()
            b[:, :, -1] = tail[:, :, -1]
        return b


@mutant("pairs_nonpositive_scale_causal")
class NonPositiveScaleCausal(PairKernel):
    """A custom scale <= 0 x causal: the causal triangle is filled with -1e30 *before* the scores are
    scaled, so a negative scale turns it into +1e30 (and zero into 0): the future is attended."""

    def weights(self, case):
        sc = case.effective_scale
        if not (case.is_causal and sc <= 0):
            return super().weights(case)
        q, k, v = self.operands(case)
        w = self.work(case)
        raw = self.raw_scores(case, q, k, v)
        raw = np.where(self.causal(case.T, case.S), -1e30, raw)
        scores = raw * w(sc)
        if case.bias is not None:
            bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
            scores = scores + np.where(np.isneginf(bias), 0.0, bias).astype(w)
        other = super().blocked(case.replace(is_causal=False))
        with np.errstate(invalid="ignore", over="ignore"):
            return self.softmax(scores.astype(w), other)


@mutant("pairs_zero_scale_mask")
class ZeroScaleMask(PairKernel):
    """Scale 0 x a boolean mask: a fast path for scale == 0 (every score equal, so the weights are
    uniform) returns the mean of V over all keys; it checks for an additive M and causal, not for the mask."""

    def compute(self, case, q, k, v):
        if case.scale == 0 and case.mask is not None and case.bias is None and not case.is_causal:
            return np.broadcast_to(v.mean(axis=-2, keepdims=True), case.out_shape).copy()
        return super().compute(case, q, k, v)


@mutant("pairs_large_negative_bias_fp32")
class LargeNegativeBiasFp32(PairKernel):
    """A finite large negative M x float32: the float32 path treats M <= -4096 as masked (-inf), a
    threshold carried over from fp16 code, so a row whose M is large and negative everywhere becomes a
    row blocked entirely (zeros) instead of the softmax of its scores (M constant along a row cancels)."""

    def blocked(self, case):
        b = super().blocked(case)
        if case.dtype == "float32" and case.bias is not None:
            bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
            b = b | (bias <= -4096)
        return b


@mutant("pairs_strided_many_heads")
class StridedManyHeads(PairKernel):
    """A non-contiguous input x more than 16 heads: strided inputs are gathered 16 heads at a time, and
    the chunk offset of the second chunk is not advanced, so heads 16.. use the query of heads 0.."""

    def operands(self, case):
        q, k, v = super().operands(case)
        if case.Hq > 16 and not _contiguous(case):
            q = q.copy()
            q[:, 16:] = q[:, : case.Hq - 16]
        return q, k, v


@mutant("pairs_expanded_bias_strides")
class ExpandedBiasStrides(PairKernel):
    """Q expanded (stride 0 along B or H) x an additive M: the kernel computes M's batch and head
    offsets with Q's strides, so along an axis where Q has stride 0 every item reads M's item 0."""

    def compute(self, case, q, k, v):
        zero = [i for i in (0, 1) if np.asarray(case.query).strides[i] == 0 and case.query.shape[i] > 1]
        if zero and case.bias is not None:
            bias = np.array(np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape))
            for i in zero:
                bias = np.broadcast_to(np.take(bias, [0], axis=i), case.weights_shape)
            return super().compute(case.replace(bias=bias), q, k, v)
        return super().compute(case, q, k, v)


@mutant("pairs_skipped_tile_dk_not8")
class SkippedTileDkNot8(PairKernel):
    """A leading tile of 32 keys blocked for every query x a head dim not a multiple of 8: the padded
    head-dim path skips the blocked tiles but its V pointer lags one tile, so the first visible tile's
    keys are paired with the last skipped tile's values."""

    def compute(self, case, q, k, v):
        if case.Dk % 8 and _leading_tile_blocked(case):
            m = np.asarray(case.mask)
            skipped = 1
            while (skipped + 1) * 32 < case.S and m[..., : (skipped + 1) * 32].all():
                skipped += 1
            start, n = skipped * 32, min(32, case.S - skipped * 32)
            v = v.copy()
            v[..., start : start + n, :] = v[..., start - 32 : start - 32 + n, :]  # the V pointer lags one tile
        return super().compute(case, q, k, v)


@mutant("pairs_one_key_padded_head_dim")
class OneKeyPaddedHeadDim(PairKernel):
    """One key (S = 1) x a head dim above 64 and not a multiple of 32: that template pads the key axis
    to 2 with a zero key that it does not mask, so the lone key shares its weight with a score-0 key."""

    def weights(self, case):
        if not (case.S == 1 and case.Dk > 64 and case.Dk % 32):
            return super().weights(case)
        q, k, v = self.operands(case)
        w = self.work(case)
        k2 = np.concatenate([k, np.zeros_like(k)], axis=-2)
        pad = case.replace(key=np.concatenate([case.key, np.zeros_like(case.key)], axis=-2))
        scores = self.raw_scores(pad, q, k2, None) * w(self.scale(case))
        if case.bias is not None:
            bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
            scores[..., :1] += np.where(np.isneginf(bias), 0.0, bias).astype(w)
        blocked = np.concatenate([self.blocked(case), np.zeros(case.weights_shape, dtype=bool)], axis=-1)
        with np.errstate(invalid="ignore", over="ignore"):
            return self.softmax(scores.astype(w), blocked)[..., :1]


@mutant("pairs_empty_row_several_tiles")
class EmptyRowSeveralTiles(PairKernel):
    """A row blocked entirely by the boolean mask x several key tiles (S > 64): the all-blocked guard
    is in the single-tile path only; with several tiles the running sum stays 0 and 0/0 is NaN."""

    def compute(self, case, q, k, v):
        out = super().compute(case, q, k, v)
        if case.S > 64 and _has_full_empty_row(case):
            rows = np.broadcast_to(np.asarray(case.mask), case.weights_shape).all(axis=-1)
            out = out.copy()
            out[rows] = np.nan
        return out


@mutant("pairs_many_batches_big_head_dim")
class ManyBatchesBigHeadDim(PairKernel):
    """B >= 5 x a head dim above 128: the large-head-dim kernel's grid holds 4 batch items, and items
    4.. index K by b % 4."""

    def operands(self, case):
        q, k, v = super().operands(case)
        if case.B >= 5 and case.Dk > 128:
            k = k[np.arange(case.B) % 4]
        return q, k, v


@mutant("pairs_tall_padding_ignored")
class TallPaddingIgnored(PairKernel):
    """T > S x a [B,1,1,S] key padding mask: for T > S the kernel swaps the roles of queries and keys to
    tile the longer axis, and its padding mask (assumed to be over the query axis) is dropped."""

    def blocked(self, case):
        m = _mask_form(case)
        if case.T > case.S and m is not None and len(m) == 4 and m[1] == m[2] == 1:
            return super().blocked(case.replace(mask=None))
        return super().blocked(case)


# -- backward: one feature x the backward itself ------------------------------------------------------
class PairGradKernel(BaseKernel):
    """The base backward with one hook per step a mutant changes."""

    def bwd_scale(self, case: Case) -> float:
        return self.scale(case)

    def bwd_weights(self, case: Case) -> np.ndarray:
        return self.backward_weights(case)

    def bwd_dp(self, case: Case, do: np.ndarray, v: np.ndarray) -> np.ndarray:
        return do @ np.swapaxes(v, -1, -2)

    def vjp(self, case: Case, grad_out: np.ndarray):
        self.validate(case)
        q, k, v = self.operands(case)
        p = self.bwd_weights(case)
        do = grad_out.astype(self.work(case))
        g = case.Hq // case.Hkv
        dp = self.bwd_dp(case, do, v)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        sc = self.bwd_scale(case)
        dq, dk, dv = ds @ k * sc, np.swapaxes(ds, -1, -2) @ q * sc, np.swapaxes(p, -1, -2) @ do

        def fold(x):
            return x.reshape(case.B, case.Hkv, g, *x.shape[2:]).sum(axis=2)

        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), fold(dk).astype(lowp), fold(dv).astype(lowp)


@mutant("pairs_grad_custom_scale")
class GradCustomScale(PairGradKernel):
    """A custom scale x the backward: the backward kernel recomputes P with the custom scale but
    multiplies dQ and dK by the default 1/sqrt(Dk)."""

    def bwd_scale(self, case):
        return case.Dk**-0.5


@mutant("pairs_grad_dv_gt_dk")
class GradDvGtDk(PairGradKernel):
    """Dv > Dk x the backward: dO V^T is accumulated in a buffer of the query's head dim, so only the
    first Dk columns of dO and V enter dP."""

    def bwd_dp(self, case, do, v):
        n = min(case.Dk, case.Dv)
        return do[..., :n] @ np.swapaxes(v[..., :n], -1, -2)


@mutant("pairs_grad_bias_dropped")
class GradBiasDropped(PairGradKernel):
    """An additive M x the backward: the backward recomputes P from the scores and the blocked set,
    and adds only M's -inf part (its finite values are lost), so P differs from the forward's."""

    def bwd_weights(self, case):
        if case.bias is None:
            return super().bwd_weights(case)
        only_inf = np.where(np.isneginf(np.asarray(case.bias, dtype=np.float64)), -np.inf, 0.0)
        return self.weights(case.replace(bias=only_inf))


def _has_bias_finite(case: Case) -> bool:
    if case.bias is None:
        return False
    b = np.asarray(case.bias, dtype=np.float64)
    return bool((np.isfinite(b) & (b != 0)).any())


# mutant -> (feature a, feature b, the direction the bug is in); feature b None: the backward itself is
# the second feature. The self-test checks: a case with only one of the two, the mutant is correct.
FEATURES: dict[str, tuple[Feature, Feature | None, str]] = {
    "pairs_gqa_mask_by_kv_head": (
        lambda c: c.is_gqa,
        lambda c: _mask_form(c) is not None and len(_mask_form(c)) == 4 and _mask_form(c)[1] == c.Hq > 1,
        "forward",
    ),
    "pairs_batch_eq_heads_mask_axis": (
        lambda c: c.B == c.Hq,
        lambda c: _mask_form(c) is not None and len(_mask_form(c)) == 4 and _mask_form(c)[1] == 1 < _mask_form(c)[2],
        "forward",
    ),
    "pairs_transposed_bias_layout": (
        lambda c: not np.asarray(c.query).flags.c_contiguous,
        lambda c: c.bias is not None,
        "forward",
    ),
    "pairs_dv_causal_uses_dk": (lambda c: c.Dv != c.Dk, lambda c: c.is_causal, "forward"),
    "pairs_decode_gqa8_packed": (lambda c: c.T == 1, lambda c: c.Hq // c.Hkv >= 8, "forward"),
    "pairs_bf16_long_split": (lambda c: c.dtype == "bfloat16", lambda c: c.S > 256, "forward"),
    "pairs_odd_t_padding_mask": (
        lambda c: c.T > 1 and c.T % 2 == 1,
        lambda c: _mask_form(c) is not None and len(_mask_form(c)) == 4 and _mask_form(c)[1:3] == (1, 1),
        "forward",
    ),
    "pairs_nonpositive_scale_causal": (lambda c: c.effective_scale <= 0, lambda c: c.is_causal, "forward"),
    "pairs_zero_scale_mask": (lambda c: c.scale == 0, lambda c: c.mask is not None, "forward"),
    "pairs_large_negative_bias_fp32": (
        lambda c: c.dtype == "float32",
        lambda c: c.bias is not None and bool((np.asarray(c.bias) <= -4096).any()),
        "forward",
    ),
    "pairs_strided_many_heads": (lambda c: not _contiguous(c), lambda c: c.Hq > 16, "forward"),
    "pairs_expanded_bias_strides": (_q_expanded, lambda c: c.bias is not None, "forward"),
    "pairs_skipped_tile_dk_not8": (lambda c: c.Dk % 8 != 0, _leading_tile_blocked, "forward"),
    "pairs_one_key_padded_head_dim": (lambda c: c.S == 1, lambda c: c.Dk > 64 and c.Dk % 32 != 0, "forward"),
    "pairs_empty_row_several_tiles": (lambda c: c.S > 64, _has_full_empty_row, "forward"),
    "pairs_many_batches_big_head_dim": (lambda c: c.B >= 5, lambda c: c.Dk > 128, "forward"),
    "pairs_tall_padding_ignored": (
        lambda c: c.T > c.S,
        lambda c: _mask_form(c) is not None and len(_mask_form(c)) == 4 and _mask_form(c)[1:3] == (1, 1),
        "forward",
    ),
    "pairs_grad_custom_scale": (lambda c: c.scale is not None and c.scale != c.Dk**-0.5, None, "backward"),
    "pairs_grad_dv_gt_dk": (lambda c: c.Dv > c.Dk, None, "backward"),
    "pairs_grad_bias_dropped": (_has_bias_finite, None, "backward"),
}
