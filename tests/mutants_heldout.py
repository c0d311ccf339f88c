"""Held-out mutants: wrong kernels written as the project's evaluator would, to find the suite's gaps.

Each class is one bug the way it ships in real kernels, aimed at a class of bug the other mutant
modules did not represent when these were written: state carried between calls (caches keyed by
too little, workspaces not zeroed, statistics saved by the forward for a later backward), bugs that
fire only past a size (head dims past 128, T x S past a workspace, many (batch, head) programs,
long decode histories, causal tile skipping), bugs on one path of a combination (GQA with a
per-head mask, a dtype-specific path), backward-only bugs (a tiled backward, dK's scale, the
backward's own mask), and layout or indexing mix-ups. Every one is correct on the cases a casual
test would try; see each docstring for where it is wrong. Each is claimed by the clause that
catches it (its ``kills``), and ``tests/test_clauses_bite.py`` checks every claimed kill.

Long (~300 lines) because it is a catalogue: one small class per bug, no shared logic beyond the
base kernels of ``tests.mutants`` and ``tests.mutants_features``.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import np_dtype
from tests.mutants import BaseKernel, mutant
from tests.mutants_features import GradKernel


# -- state carried between calls ------------------------------------------------------------------------
@mutant("mask_cache_by_shape")
class MaskCacheByShape(BaseKernel):
    """Builds the [B, H, T, S] blocked matrix once per (shapes, is_causal) and reuses it: a compiled
    mask keyed by the mask's *shape*, not its contents. A new mask of the same shape is never seen."""

    def __init__(self, name="mask_cache_by_shape"):
        super().__init__(name)
        self._masks: dict = {}

    def blocked(self, case):
        key = (case.weights_shape, np.shape(case.mask), np.shape(case.bias), case.is_causal)
        if key not in self._masks:
            self._masks[key] = super().blocked(case)
        return self._masks[key]


@mutant("causal_flag_cached_by_shape")
class CausalFlagCachedByShape(BaseKernel):
    """A kernel specialised per (T, S) and cached by shape: the first call of a shape fixes whether
    it is causal; a later call of that shape with the other is_causal gets the first one's kernel."""

    def __init__(self, name="causal_flag_cached_by_shape"):
        super().__init__(name)
        self._causal: dict = {}

    def blocked(self, case):
        first = self._causal.setdefault((case.T, case.S, case.dtype), case.is_causal)
        return super().blocked(case.replace(is_causal=first))


@mutant("scale_cached_by_head_dim")
class ScaleCachedByHeadDim(BaseKernel):
    """The scale baked into a kernel compiled per head dim: the first call's scale for a Dk is used
    for every later call with that Dk, whatever its own ``scale`` argument says."""

    def __init__(self, name="scale_cached_by_head_dim"):
        super().__init__(name)
        self._scale: dict = {}

    def scale(self, case):
        return self._scale.setdefault((case.Dk, case.dtype), case.effective_scale)


@mutant("grad_accumulator_not_zeroed")
class GradAccumulatorNotZeroed(GradKernel):
    """dK and dV accumulated with ``+=`` into buffers kept per shape (to sum a GQA group) and never
    zeroed between backward calls: the first backward of a shape is right, later ones add up."""

    def __init__(self, name="grad_accumulator_not_zeroed"):
        super().__init__(name)
        self._acc: dict = {}

    def fold_dk(self, x, case):
        folded = super().fold_dk(x, case)
        acc = self._acc.setdefault((folded.shape, case.dtype), np.zeros_like(folded))
        acc += folded
        return acc.copy()


@mutant("backward_uses_saved_forward_stats")
class BackwardUsesSavedForwardStats(GradKernel):
    """The forward saves its softmax weights (as autograd's ctx would) in the kernel object, keyed by
    shape; the backward reuses them instead of recomputing: right when the backward follows the
    forward of the same inputs, stale after a forward of other inputs of the same shape."""

    def __init__(self, name="backward_uses_saved_forward_stats"):
        super().__init__(name)
        self._saved: dict = {}

    def weights(self, case):
        p = super().weights(case)
        self._saved[(case.weights_shape, case.dtype)] = p
        return p

    def backward_weights(self, case):
        key = (case.weights_shape, case.dtype)
        return self._saved[key] if key in self._saved else super().weights(case)


@mutant("workspace_dtype_of_first_call")
class WorkspaceDtypeOfFirstCall(BaseKernel):
    """A score workspace allocated per shape in the dtype of the first call and reused: float64
    after a float32 call of the same shape is computed in float32 (and float32 after float16 in
    float16)."""

    def __init__(self, name="workspace_dtype_of_first_call"):
        super().__init__(name)
        self._ws: dict = {}

    def work(self, case):
        wd = super().work(case)
        first = self._ws.setdefault(case.weights_shape, wd if case.dtype in ("float32", "float64") else np.float16)
        return first if np.dtype(first).itemsize < np.dtype(wd).itemsize else wd


# -- past a size ----------------------------------------------------------------------------------------
@mutant("head_dim_over_128_truncated")
class HeadDimOver128Truncated(BaseKernel):
    """Value head dims up to 128 are one tile; past 128 the kernel writes only the first 128 output
    columns (the second column tile is never launched) and the rest stays zero."""

    def finish(self, out, case):
        if out.shape[-1] > 128:
            out = out.copy()
            out[..., 128:] = 0.0
        return super().finish(out, case)


@mutant("qk_split_over_128_unscaled")
class QkSplitOver128Unscaled(BaseKernel):
    """Dk past 128 is reduced in two chunks of the head dim, and the scale is applied to the first
    chunk's partial dot product only."""

    def raw_scores(self, case, q, k, v):
        if q.shape[-1] <= 128:
            return super().raw_scores(case, q, k, v)
        head = q[..., :128] @ np.swapaxes(k[..., :128], -1, -2)
        tail = q[..., 128:] @ np.swapaxes(k[..., 128:], -1, -2)
        return head + tail / self.scale(case)


@mutant("mask_ignored_past_workspace")
class MaskIgnoredPastWorkspace(BaseKernel):
    """When T x S exceeds 2**16 the kernel switches to a streaming path that applies is_causal and
    the additive M but never reads the boolean mask."""

    def blocked(self, case):
        if case.T * case.S > 2**16 and case.mask is not None:
            return super().blocked(case.replace(mask=None))
        return super().blocked(case)


@mutant("grid_wraps_past_64_programs")
class GridWrapsPast64Programs(BaseKernel):
    """One program per (b, h), with the grid capped at 64 programs: program b*H + h >= 64 reuses the
    program id modulo 64, so (b, h) slices past the 64th get an earlier slice's output."""

    def forward(self, case):
        out = super().forward(case)
        n = case.B * case.Hq
        if n <= 64:
            return out
        flat = out.reshape(n, *out.shape[2:])
        return flat[np.arange(n) % 64].reshape(out.shape)


@mutant("decode_split_kv_equal_weights")
class DecodeSplitKvEqualWeights(BaseKernel):
    """Decode (T = 1) with S >= 512 takes a split-KV path: four key chunks, each softmaxed on its
    own, merged by a plain mean instead of weighting each chunk by its share of the exp-sum."""

    def forward(self, case):
        if case.T != 1 or case.S < 512:
            return super().forward(case)
        self.validate(case)
        parts = []
        for idx in np.array_split(np.arange(case.S), 4):
            part = case.replace(
                key=case.key[:, :, idx],
                value=case.value[:, :, idx],
                mask=None if case.mask is None else np.broadcast_to(case.mask, case.weights_shape)[..., idx],
                bias=None if case.bias is None else np.broadcast_to(case.bias, case.weights_shape)[..., idx],
                is_causal=False,
            )
            parts.append(np.asarray(super().forward(part), dtype=np.float64))
        return self.finish(np.mean(parts, axis=0), case)


@mutant("causal_skips_diagonal_tile")
class CausalSkipsDiagonalTile(BaseKernel):
    """Causal tile skipping over key tiles of 64: a key tile is skipped when its start is >= the
    query tile's start (should be: > the query tile's last row), so every query tile past the first
    loses its own diagonal tile. Exact while T, S <= 64 (one tile, nothing skipped)."""

    TILE = 64

    def causal(self, T, S):
        b = super().causal(T, S)
        if S <= self.TILE:
            return b
        b = b.copy()
        for qt in range(self.TILE, T, self.TILE):
            b[qt : qt + self.TILE, qt : qt + self.TILE] = True
        return b


@mutant("online_rescale_missed_after_256")
class OnlineRescaleMissedAfter256(BaseKernel):
    """Online softmax over key tiles of 256 that rescales the running *output* when the running max
    grows but forgets the running *sum*: exact with one tile, wrong when a later tile holds a row's
    new maximum (S > 256)."""

    TILE = 256

    def softmax(self, scores, blocked):
        if scores.shape[-1] <= self.TILE:
            return super().softmax(scores, blocked)
        s = np.where(blocked, -np.inf, scores)
        m = np.full(s.shape[:-1], -np.inf)
        total = np.zeros(s.shape[:-1])
        for start in range(0, s.shape[-1], self.TILE):
            m = np.maximum(m, s[..., start : start + self.TILE].max(axis=-1))
            safe = np.where(np.isneginf(m), 0.0, m)
            total = total + np.exp(s[..., start : start + self.TILE] - safe[..., None]).sum(axis=-1)
        safe = np.where(np.isneginf(m), 0.0, m)
        p = np.exp(s - safe[..., None]) / np.where(total > 0, total, 1.0)[..., None]
        return np.where(blocked.all(axis=-1, keepdims=True), 0.0, p)


@mutant("fp16_normaliser_overflow_long_rows")
class Fp16NormaliserOverflowLongRows(BaseKernel):
    """float16 only: the softmax denominator is kept in float16 without the max subtracted when the
    row has more than 1024 keys (a long-row path), so exp-sums past 65504 overflow to inf."""

    def softmax(self, scores, blocked):
        if getattr(self, "_lowp", None) != "float16" or scores.shape[-1] <= 1024:
            return super().softmax(scores, blocked)
        s = np.where(blocked, -np.inf, scores)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(s).astype(np.float16)
            den = e.sum(axis=-1, keepdims=True, dtype=np.float16)
            p = (e / den).astype(np.float32)
        return np.where(blocked.all(axis=-1, keepdims=True), 0.0, p)

    def weights(self, case):
        self._lowp = case.dtype
        return super().weights(case)


# -- one path of a combination ------------------------------------------------------------------------
@mutant("gqa_per_head_mask_by_kv_head")
class GqaPerHeadMaskByKvHead(BaseKernel):
    """GQA kernel looping over kv heads and their group: a per-head mask [.., Hq, T, S] is indexed
    with the kv head (h // group) instead of the query head. Right without GQA or with a mask that
    is shared across heads."""

    def blocked(self, case):
        m = case.mask
        if m is None or not case.is_gqa or np.ndim(m) < 4 or np.shape(m)[1] == 1:
            return super().blocked(case)
        g = case.Hq // case.Hkv
        m = np.asarray(m, dtype=bool)
        return super().blocked(case.replace(mask=m[:, np.arange(case.Hq) // g]))


def blocking_part_of_bias(case):
    """``case`` with its additive M reduced to the -inf entries (they still block), its finite values
    dropped: what a code path that reads M as a mask only computes."""
    b = np.asarray(case.bias, dtype=np.float64)
    return case.replace(bias=np.where(np.isneginf(b), -np.inf, 0.0))


@mutant("bias_dropped_on_gqa_path")
class BiasDroppedOnGqaPath(BaseKernel):
    """The grouped-query path takes the boolean mask and is_causal but drops the additive M (its
    -inf entries still block): finite biases are lost under GQA only."""

    def weights(self, case):
        if case.is_gqa and case.bias is not None:
            case = blocking_part_of_bias(case)
        return super().weights(case)


@mutant("bf16_causal_bottom_right")
class Bf16CausalBottomRight(BaseKernel):
    """A separate bfloat16 kernel (the one with tensor-core tiles) that aligns causal bottom-right
    when T != S, while every other dtype follows the declared top-left alignment."""

    def blocked(self, case):
        if case.dtype == "bfloat16" and case.is_causal and case.T != case.S:
            b = super().blocked(case.replace(is_causal=False)).copy()
            i = np.arange(case.T)[:, None]
            j = np.arange(case.S)[None, :]
            return b | (j > i + case.S - case.T)
        return super().blocked(case)


@mutant("custom_scale_ignored_with_mask")
class CustomScaleIgnoredWithMask(BaseKernel):
    """The masked path calls an inner kernel without forwarding ``scale``: a custom scale is honoured
    when there is no mask, and replaced by 1/sqrt(Dk) when a boolean mask is given."""

    def scale(self, case):
        if case.mask is not None:
            return case.Dk**-0.5
        return super().scale(case)


# -- backward only ----------------------------------------------------------------------------------------
@mutant("grad_dk_missing_scale")
class GradDkMissingScale(GradKernel):
    """dK = dS^T Q without the scale (dQ has it, dV needs none)."""

    def vjp(self, case, grad_out):
        dq, dk, dv = super().vjp(case, grad_out)
        return dq, (np.asarray(dk, np.float64) / self.scale(case)).astype(dk.dtype), dv


@mutant("grad_tiled_drops_key_tail")
class GradTiledDropsKeyTail(GradKernel):
    """A backward tiled over keys in blocks of 64 whose loop bound is S // 64: dK and dV of the keys
    in the last partial tile stay zero (the forward is right). Exact while S <= 64 or S % 64 == 0."""

    def vjp(self, case, grad_out):
        dq, dk, dv = super().vjp(case, grad_out)
        if case.S > 64 and case.S % 64:
            dk, dv = dk.copy(), dv.copy()
            dk[..., (case.S // 64) * 64 :, :] = 0
            dv[..., (case.S // 64) * 64 :, :] = 0
        return dq, dk, dv


@mutant("grad_mask_ignored_in_backward")
class GradMaskIgnoredInBackward(GradKernel):
    """The backward recomputes P from the scores with is_causal but without the boolean mask."""

    def backward_weights(self, case):
        return super().weights(case.replace(mask=None))


@mutant("grad_causal_top_left_bottom_right")
class GradCausalBottomRightInBackward(GradKernel):
    """Forward top-left, as declared; the backward kernel recomputes P with bottom-right causal
    alignment, so dQ, dK, dV are wrong whenever is_causal and T != S."""

    def backward_weights(self, case):
        if not case.is_causal or case.T == case.S:
            return super().backward_weights(case)
        i = np.arange(case.T)[:, None]
        j = np.arange(case.S)[None, :]
        extra = np.broadcast_to(j > i + case.S - case.T, case.weights_shape)
        return super().weights(case.replace(is_causal=False, mask=self.blocked(case.replace(is_causal=False)) | extra))


@mutant("grad_dv_not_summed_over_group")
class GradDvNotSummedOverGroup(GradKernel):
    """GQA: dV of a kv head takes only its group's first query head (dK is summed right)."""

    def vjp(self, case, grad_out):
        dq, dk, _ = super().vjp(case, grad_out)
        _, _, v = self.operands(case)
        p = self.backward_weights(case)
        g = case.Hq // case.Hkv
        dv = np.swapaxes(p, -1, -2) @ grad_out.astype(self.work(case))
        return dq, dk, dv[:, ::g].astype(np_dtype(case.dtype))


# -- layout and indexing --------------------------------------------------------------------------------
@mutant("v_read_transposed_when_square")
class VReadTransposedWhenSquare(BaseKernel):
    """Guesses V's layout from its shape: a [.., S, Dv] value with S == Dv is taken to be stored
    [.., Dv, S] already (a 'pre-transposed' fast path) and transposed back."""

    def operands(self, case):
        q, k, v = super().operands(case)
        if v.shape[-1] == v.shape[-2] and v.shape[-1] > 1:
            v = np.swapaxes(v, -1, -2)
        return q, k, v


@mutant("batch_head_flat_index_swapped")
class BatchHeadFlatIndexSwapped(BaseKernel):
    """Writes program bh's output at h * B + b of a flat [B*H] buffer instead of b * H + h: right
    whenever B == 1 or H == 1."""

    def finish(self, out, case):
        B, H = out.shape[:2]
        flat = out.reshape(B * H, *out.shape[2:])
        order = (np.arange(H)[None, :] * B + np.arange(B)[:, None]).reshape(-1)
        res = np.empty_like(flat)
        res[order] = flat
        return super().finish(res.reshape(out.shape), case)


@mutant("lse_fp16_exp_normaliser")
class LseFp16ExpNormaliser(BaseKernel):
    """float16: normalises the unshifted exp-sum by exp(lse) computed in float16, which overflows
    once a row's log-sum-exp passes ~11 (scores of ordinary size times a sharp query)."""

    def softmax(self, scores, blocked):
        if getattr(self, "_lowp", None) != "float16":
            return super().softmax(scores, blocked)
        s = np.where(blocked, -np.inf, scores)
        m = s.max(axis=-1, keepdims=True)
        safe = np.where(np.isneginf(m), 0.0, m)
        e = np.exp(s - safe)
        lse = safe + np.log(np.where(e.sum(axis=-1, keepdims=True) > 0, e.sum(axis=-1, keepdims=True), 1.0))
        with np.errstate(over="ignore", invalid="ignore"):
            norm = np.exp(lse.astype(np.float16)).astype(np.float32)
            p = np.exp(s) / norm
        return np.where(blocked.all(axis=-1, keepdims=True), 0.0, np.nan_to_num(p, nan=0.0))

    def weights(self, case):
        self._lowp = case.dtype
        return super().weights(case)


# -- second round: more classes -------------------------------------------------------------------------
@mutant("padding_mask_batch_past_8")
class PaddingMaskBatchPast8(BaseKernel):
    """Key padding masks [B, 1, 1, S] are staged in a buffer of 8 rows: batch item b reads row
    b % 8, so batches of more than 8 sequences pad items 8.. with the first items' padding."""

    def blocked(self, case):
        m = case.mask
        if m is None or np.ndim(m) < 4 or np.shape(m)[0] <= 8:
            return super().blocked(case)
        m = np.asarray(m, dtype=bool)
        return super().blocked(case.replace(mask=m[np.arange(m.shape[0]) % 8]))


@mutant("grad_grid_wraps_past_16")
class GradGridWrapsPast16(GradKernel):
    """The backward launches one program per (b, h) with the grid capped at 16: dQ of slices past
    the 16th is an earlier slice's dQ. The forward is right."""

    def vjp(self, case, grad_out):
        dq, dk, dv = super().vjp(case, grad_out)
        n = case.B * case.Hq
        if n <= 16:
            return dq, dk, dv
        flat = dq.reshape(n, *dq.shape[2:])
        return flat[np.arange(n) % 16].reshape(dq.shape), dk, dv


@mutant("stride0_collapsed_on_head_axis")
class Stride0CollapsedOnHeadAxis(BaseKernel):
    """Spots a broadcast (stride-0) input and takes the shared-K/V fast path, i.e. reads one slice
    along the *head* axis, whichever axis was actually broadcast."""

    def operands(self, case):
        def fast(x):
            x = np.asarray(x)
            if x.ndim == 4 and 0 in x.strides and x.shape[1] > 1:
                return np.broadcast_to(x[:, :1], x.shape)
            return x

        return super().operands(case.replace(query=fast(case.query), key=fast(case.key), value=fast(case.value)))


@mutant("decode_path_drops_mask")
class DecodePathDropsMask(BaseKernel):
    """A decode kernel (T = 1) that assumes a single query attends to every key of the cache: the
    boolean mask (padding of a batched cache) is ignored when T == 1 and S > 1."""

    def blocked(self, case):
        if case.T == 1 and case.S > 1 and case.mask is not None:
            return super().blocked(case.replace(mask=None))
        return super().blocked(case)


@mutant("returns_persistent_workspace")
class ReturnsPersistentWorkspace(BaseKernel):
    """Returns its output workspace itself (one per shape and dtype) instead of a fresh array: each
    call is right when it returns, and the caller's earlier result changes under it at the next call."""

    def __init__(self, name="returns_persistent_workspace"):
        super().__init__(name)
        self._out: dict = {}

    def finish(self, out, case):
        res = super().finish(out, case)
        buf = self._out.setdefault((res.shape, res.dtype), np.empty_like(res))
        np.copyto(buf, res)
        return buf


@mutant("row_max_from_first_tile")
class SoftmaxDenominatorFromFirstTile(BaseKernel):
    """Split-K over keys for T x S past 2**14: the row max is taken over the first 128 keys only and
    used as if it were the row's, so a row whose maximum lies later overflows exp() when the later
    score is large (and is merely rescaled, hence right, when it is small)."""

    def softmax(self, scores, blocked):
        if scores.shape[-2] * scores.shape[-1] <= 2**14:
            return super().softmax(scores, blocked)
        s = np.where(blocked, -np.inf, scores)
        m = s[..., :128].max(axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0.0, m)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp((s - m).astype(np.float32))
            p = e / e.sum(axis=-1, keepdims=True)
        return np.where(blocked.all(axis=-1, keepdims=True), 0.0, p)
