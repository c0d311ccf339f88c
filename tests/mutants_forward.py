"""Mutant kernels for the mask-kind, causal, cross-shape, scale-equivalence, GQA and precision clauses.

Each overrides one hook of :class:`tests.mutants.BaseKernel` with a bug that a real kernel could
ship: a wrong broadcast of a mask axis, a finite fill instead of ``-inf``, a bias misread as a
boolean, a dropped partial tile, a wrong causal alignment, a kv head mapping that reads one head,
a softmax without its max subtraction, float64 computed in float32. The base kernel passes every
clause, so each of these fails only because of its own bug.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.contract import Case
from tests.mutants import BaseKernel, mutant


def _mask(case: Case) -> np.ndarray | None:
    return None if case.mask is None else np.asarray(case.mask, dtype=bool)


# -- masks -------------------------------------------------------------------------------------------
@mutant("mask_head0_for_all_heads")
class MaskHead0ForAllHeads(BaseKernel):
    """Reads head 0's slice of a per-head mask for every head (a kernel that indexes the mask by
    batch only, as if every mask were [B, 1, T, S])."""

    def blocked(self, case):
        m = _mask(case)
        if m is None or m.ndim < 3 or m.shape[-3] == 1:
            return super().blocked(case)
        return super().blocked(case.replace(mask=np.broadcast_to(m[..., :1, :, :], m.shape)))


@mutant("padding_mask_as_query_rows")
class PaddingMaskAsQueryRows(BaseKernel):
    """§7.1's trap: a [B,1,1,S] key padding mask squeezed back to [B,S] and broadcast from the
    trailing axes, i.e. read as a [T,S] mask; silently "works" when B == T."""

    def blocked(self, case):
        m = _mask(case)
        if m is None or m.ndim != 4 or m.shape[1:3] != (1, 1) or m.shape[0] == 1:
            return super().blocked(case)
        return super().blocked(case.replace(mask=m.reshape(m.shape[0], m.shape[3])))


@mutant("mask_2d_as_padding")
class Mask2dAsPadding(BaseKernel):
    """The reverse confusion: any 2-D mask is taken for a [B,S] key padding mask and expanded with
    ``[:, None, None, :]``, so a [T,S] mask's rows are applied to batch items (when T == B)."""

    def blocked(self, case):
        m = _mask(case)
        if m is None or m.ndim != 2:
            return super().blocked(case)
        return super().blocked(case.replace(mask=m[:, None, None, :]))


@mutant("mask_transposed_square")
class MaskTransposedSquare(BaseKernel):
    """Indexes the mask as [S, T] instead of [T, S]; invisible on symmetric masks and when T != S
    would not broadcast, so it only shows with an asymmetric square mask."""

    def blocked(self, case):
        m = _mask(case)
        if m is None or m.shape[-1] != m.shape[-2] or m.ndim < 2:
            return super().blocked(case)
        return super().blocked(case.replace(mask=np.swapaxes(m, -1, -2)))


@mutant("mask_times_neg_inf")
class MaskTimesNegInf(BaseKernel):
    """Turns the boolean mask into an additive one as ``mask * -inf``: 0 * -inf is NaN, so every
    visible position becomes NaN, even for an all-False mask."""

    def softmax(self, scores, blocked):
        with np.errstate(invalid="ignore"):
            add = blocked.astype(scores.dtype) * scores.dtype.type(-np.inf)
        return super().softmax(scores + add, np.zeros_like(blocked))


@mutant("additive_fill_neg1e4")
class AdditiveFillNeg1e4(BaseKernel):
    """Adds -1e4 at blocked positions instead of -inf (a float16-era habit): a blocked key whose
    score exceeds the visible ones by ~1e4 keeps its weight."""

    def softmax(self, scores, blocked):
        return super().softmax(scores + np.where(blocked, -1e4, 0.0).astype(scores.dtype), np.zeros_like(blocked))


@mutant("replace_fill_neg1e9")
class ReplaceFillNeg1e9(BaseKernel):
    """``masked_fill(mask, -1e9)``: correct while every visible score is above -1e9, wrong below.
    All-blocked rows are still zeroed so that only the finite fill is on trial."""

    def softmax(self, scores, blocked):
        empty = blocked.all(axis=-1, keepdims=True)
        p = super().softmax(np.where(blocked, scores.dtype.type(-1e9), scores), np.zeros_like(blocked))
        return np.where(empty, 0.0, p)


@mutant("causal_mask_and")
class CausalMaskAnd(BaseKernel):
    """Combines the causal triangle and the padding mask with AND instead of OR (§9)."""

    def blocked(self, case):
        m = _mask(case)
        if m is None or not case.is_causal:
            return super().blocked(case)
        shape = case.weights_shape
        return np.broadcast_to(m, shape) & np.broadcast_to(self.causal(case.T, case.S), shape)


@mutant("bias_as_boolean")
class BiasAsBoolean(BaseKernel):
    """Treats an additive float mask as boolean: nonzero = blocked, zero = visible."""

    def weights(self, case):
        if case.bias is None:
            return super().weights(case)
        bias = np.asarray(case.bias, dtype=np.float64) != 0
        m = bias if case.mask is None else (bias | _mask(case))
        return super().weights(case.replace(bias=None, mask=m))


@mutant("bias_scaled")
class BiasScaled(BaseKernel):
    """Adds the float mask before scaling, so M is multiplied by 1/sqrt(Dk) too."""

    def weights(self, case):
        if case.bias is None:
            return super().weights(case)
        return super().weights(case.replace(bias=np.asarray(case.bias, dtype=np.float64) * case.effective_scale))


@mutant("bias_clamped_neg1e4")
class BiasClampedNeg1e4(BaseKernel):
    """Clamps -inf in the additive mask to -1e4 to "avoid NaN": a blocked key whose score exceeds
    the visible ones by more than 1e4 is attended to."""

    def weights(self, case):
        if case.bias is None:
            return super().weights(case)
        bias = np.asarray(case.bias, dtype=np.float64)
        return super().weights(case.replace(bias=np.where(np.isneginf(bias), -1e4, bias)))


# -- causal ------------------------------------------------------------------------------------------
@mutant("causal_sees_future")
class CausalSeesFuture(BaseKernel):
    """Blocks the strict lower triangle instead of the upper one (tril/triu mixed up)."""

    def causal(self, T, S):
        return np.tril(np.ones((T, S), dtype=bool), -1)


@mutant("causal_bottom_right")
class CausalBottomRight(BaseKernel):
    """Aligns the causal mask bottom-right (query i sees keys j <= i + S - T) while declaring the
    default top-left alignment."""

    def causal(self, T, S):
        return np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T)


@mutant("declares_bottom_right_runs_top_left")
class DeclaresBottomRightRunsTopLeft(BaseKernel):
    """Declares bottom-right alignment (the KV-cache convention) but runs torch's top-left one."""

    def __init__(self, name="declares_bottom_right_runs_top_left"):
        super().__init__(name)
        self.declaration = self.declaration.replace(causal_alignment="bottom-right")


@mutant("mask_ignored_when_causal")
class MaskIgnoredWhenCausal(BaseKernel):
    """With is_causal set, drops the explicit mask (an adapter that picks one of the two)."""

    def blocked(self, case):
        if case.is_causal and case.mask is not None:
            return super().blocked(case.replace(mask=None))
        return super().blocked(case)


# -- cross attention and shapes -----------------------------------------------------------------------
@mutant("kv_truncated_to_query_length")
class KvTruncatedToQueryLength(BaseKernel):
    """§6.2's error: K and V forced to the query length T (keys beyond T are never read)."""

    def blocked(self, case):
        b = super().blocked(case)
        if case.S > case.T:
            b = b.copy()
            b[..., case.T :] = True
        return b


@mutant("drop_key_tail_tile32")
class DropKeyTailTile32(BaseKernel):
    """A kernel tiled over keys in blocks of 32 whose loop bound is S // 32 once there is more than
    one tile: the last partial tile of keys is never visited. Right when S <= 32 (one tile, handled
    by a separate path) and when S is a multiple of 32, so only a shape past one tile with a partial
    tail (S = 33, 40, 129, ...) shows it."""

    TILE = 32

    def blocked(self, case):
        b = super().blocked(case)
        if case.S > self.TILE and case.S % self.TILE:
            b = b.copy()
            b[..., (case.S // self.TILE) * self.TILE :] = True
        return b


@mutant("drop_query_tail_tile32")
class DropQueryTailTile32(BaseKernel):
    """Tiled over queries in blocks of 32 with loop bound T // 32 once there is more than one tile:
    the rows of the last partial tile stay zero. Right when T <= 32 or T is a multiple of 32."""

    TILE = 32

    def forward(self, case):
        out = super().forward(case)
        if case.T > self.TILE and case.T % self.TILE:
            out = out.copy()
            out[:, :, (case.T // self.TILE) * self.TILE :, :] = 0
        return out


@mutant("scale_from_padded_head_dim")
class ScaleFromPaddedHeadDim(BaseKernel):
    """Pads the head dim to a multiple of 8 (as fused kernels do) and takes 1/sqrt of the padded
    width: right for Dk = 8, 16, ..., wrong for Dk = 5, 12, 20."""

    def scale(self, case):
        if case.scale is not None:
            return case.scale
        return 1.0 / math.sqrt(-(-case.Dk // 8) * 8)


# -- scale -------------------------------------------------------------------------------------------
@mutant("scale_zero_means_default")
class ScaleZeroMeansDefault(BaseKernel):
    """``scale = scale or 1/sqrt(Dk)``: an explicit scale of 0 is silently replaced."""

    def scale(self, case):
        return case.scale or 1.0 / math.sqrt(case.Dk)


@mutant("custom_scale_times_default")
class CustomScaleTimesDefault(BaseKernel):
    """Multiplies by the custom scale *and* by 1/sqrt(Dk) (the default applied unconditionally)."""

    def scale(self, case):
        d = 1.0 / math.sqrt(case.Dk)
        return d if case.scale is None else case.scale * d


# -- GQA ---------------------------------------------------------------------------------------------
@mutant("gqa_first_kv_head_only")
class GqaFirstKvHeadOnly(BaseKernel):
    """Every query head reads kv head 0 (K broadcast from a [B, 1, S, D] slice)."""

    def expand(self, x, hq):
        return np.repeat(x[:, :1], hq, axis=1)


@mutant("gqa_ratio_unchecked")
class GqaRatioUnchecked(BaseKernel):
    """Invents a head mapping when Hq is not a multiple of Hkv (ceil ratio, truncated) instead of
    rejecting the shapes."""

    def validate(self, case):
        check = getattr(super(), "validate", None)
        if check is not None and case.Hkv and case.Hq % case.Hkv == 0:
            check(case)

    def expand(self, x, hq):
        return np.repeat(x, -(-hq // x.shape[1]), axis=1)[:, :hq]


# -- precision ---------------------------------------------------------------------------------------
@mutant("softmax_no_row_max")
class SoftmaxNoMaxSubtraction(BaseKernel):
    """exp(s) / sum exp(s) without subtracting the row max: exp overflows to inf, inf/inf = NaN."""

    def softmax(self, scores, blocked):
        s = np.where(blocked, -np.inf, scores)
        empty = blocked.all(axis=-1, keepdims=True)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(np.where(empty, 0.0, s).astype(scores.dtype))
            p = e / e.sum(axis=-1, keepdims=True)
        return np.where(empty, 0.0, p)


@mutant("float64_in_float32")
class Float64InFloat32(BaseKernel):
    """Accepts and returns float64 but computes in float32 (a silent downcast on the way in)."""

    def work(self, case):
        return np.float32
