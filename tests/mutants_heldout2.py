"""Held-out mutants, round 2: wrong kernels written as the evaluator would, in classes round 1 missed.

Round 1 (``tests/mutants_heldout.py``) aimed at state between calls, sizes, combinations and the
backward. These aim at what neither it nor the other mutant modules represented: the scale's
special values (1.0 taken for "unset", a scale split as sqrt over Q and K, a scale stored in
bfloat16), an lse from a pass of its own (softcap left out, rounded to the input dtype), variable
lengths at the batch's edges (the last sequence, a sequence with no keys, cu_seqlens_q reused for
the keys), window and causal edge cases, softcap after a finite mask fill, ALiBi past 8 heads,
a GQA backward specialised for 8:1, low-precision accumulators (P V, dQ), a decode tail tile,
memory layouts seen only by the backward (K, the output cotangent), variant arguments baked into
a compiled kernel (slopes, window, softcap, the additive mask), in-place edits of the caller's
masks, and (round 2b) the variants' backward (ALiBi, sinks, a window top-left in the backward only,
the softcap's derivative at the biased score), the additive mask's per-head broadcast, and
(round 2c) declared bitwise tiers kept on the plain path only (batch invariance, a GQA backward),
(round 2d) the caller's additive M under softcap and in the lse, dropout masks shared in a GQA group.

Each class is one bug; its docstring says where it is wrong and where it is right. Run one at a
time through every clause (``pytest conformance/clauses --impl=tests.mutants_heldout2:Class -x``):

* ``@mutant``: survived the suite as it was, and is claimed by the clause written for it
  (``conformance/clauses/test_backward_paths.py``, ``test_scale_sign.py``, ``test_lse_scores.py``,
  ``test_varlen_lengths.py``, ``test_variant_state.py``, ``test_variant_grads_bias.py``,
  ``test_declared_tiers.py``, ``test_variants_with_bias.py``);
  or, when an existing clause caught it, claimed by that clause's ``kills`` (checked by
  ``tests/test_clauses_bite.py`` like every kill);
* ``@not_caught``: not caught, with the reason (the error model admits it, or the clause that would
  catch it is in a module of another owner).

Long (a catalogue: one small class per bug, no shared logic beyond the correct base kernels).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from conformance.contract import np_dtype
from tests.mutants import BaseKernel, mutant
from tests.mutants_features import BatchDependentReduction, BatchInvariantKernel, DropoutKernel, GradKernel
from tests.mutants_heldout import blocking_part_of_bias
from tests.mutants_variants import VariantKernel

NOT_CAUGHT: dict[str, tuple[str, type]] = {}


def not_caught(name: str, why: str) -> Callable[[type], type]:
    """A held-out wrong kernel the suite does not catch, kept with the reason (not registered: no clause
    claims it); the report of the round says who can close the gap."""

    def record(cls: type) -> type:
        NOT_CAUGHT[name] = (why, cls)
        cls.mutant_name = name
        return cls

    return record


def _bf16(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np_dtype("bfloat16")).astype(np.float64)


# -- the scale's special values -------------------------------------------------------------------------
@mutant("scale_one_means_default")
class ScaleOneMeansDefault(BaseKernel):
    """``if not scale or scale == 1.0: scale = 1 / sqrt(d)``: an API whose signature defaulted the
    scale to 1.0 meaning "unset" keeps treating an explicit 1.0 as the default."""

    def scale(self, case):
        if case.scale is None or case.scale == 1.0:
            return case.Dk**-0.5
        return case.scale


@mutant("scale_split_sqrt_qk")
class ScaleSplitSqrtQk(BaseKernel):
    """Applies the scale as sqrt(scale) on Q and on K (to keep both in float16's range): exact for
    scale >= 0; a negative custom scale gives sqrt(negative) = NaN everywhere."""

    def raw_scores(self, case, q, k, v):
        with np.errstate(invalid="ignore"):
            r = np.sqrt(np.float64(case.effective_scale))
        return (q * r) @ np.swapaxes(k * r, -1, -2)

    def weights(self, case):
        self._unit = True
        try:
            return super().weights(case)
        finally:
            self._unit = False

    def scale(self, case):
        return 1.0 if getattr(self, "_unit", False) else case.effective_scale

    def vjp(self, case, grad_out):
        self._unit = False
        return super().vjp(case, grad_out)


@mutant("scale_magnitude_only")
class ScaleMagnitudeOnly(BaseKernel):
    """An adapter over a kernel whose only knob is the head dim of its 1/sqrt(d) passes a custom scale as
    the equivalent head dim d = 1 / scale**2: exact for every scale >= 0 (0 gives d = inf, scale 0), and
    a negative scale comes back positive."""

    def scale(self, case):
        if case.scale is None:
            return super().scale(case)
        with np.errstate(divide="ignore"):
            d = np.float64(1.0) / np.float64(case.scale) ** 2
        return float(1.0 / np.sqrt(d))


@mutant("scale_stored_bf16")
class ScaleStoredBf16(BaseKernel):
    """The kernel's parameter block stores the softmax scale as bfloat16 for every input dtype: 1/sqrt(Dk)
    is exact for Dk = 4, 16, 64, 256 and off by up to 0.4 % for Dk = 8, 12, 5 or a custom 0.3."""

    def scale(self, case):
        return float(_bf16(case.effective_scale))


@mutant("causal_before_scale")
class CausalBeforeScale(BaseKernel):
    """Writes is_causal's -inf into the raw scores QK^T and multiplies by the scale afterwards (a fused kernel
    masking its tile before scaling it): right for every positive scale; a scale of 0 gives -inf * 0 = NaN in
    every causal row, a negative one +inf at the future keys (torch 2.13's CPU flash path with is_causal)."""

    def weights(self, case):
        if not case.is_causal:
            return super().weights(case)
        q, k, v = self.operands(case)
        w = self.work(case)
        raw = np.where(self.causal(case.T, case.S), -np.inf, self.raw_scores(case, q, k, v))
        with np.errstate(invalid="ignore", over="ignore"):
            scores = raw * w(self.scale(case))
            if case.bias is not None:
                bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
                scores = scores + np.where(np.isneginf(bias), 0.0, bias).astype(w)
            p = self.softmax(scores.astype(w), self.blocked(case.replace(is_causal=False)))
        return np.where(self.blocked(case).all(axis=-1, keepdims=True), 0.0, p)  # rows blocked entirely: zeros


@mutant("mask_before_scale")
class MaskBeforeScale(BaseKernel):
    """Adds the mask (a boolean mask as -inf, M as it is) to QK^T and multiplies the sum by the scale:
    softmax(scale (QK^T + M)) V. Right for a scale of 1 and, for -inf alone, every positive scale; a finite
    M is scaled too, and a scale of 0 gives NaN at every blocked key, a negative one +inf."""

    def weights(self, case):
        q, k, v = self.operands(case)
        w = self.work(case)
        shape = case.weights_shape
        added = np.zeros(shape)
        if case.mask is not None:
            added = np.where(np.broadcast_to(np.asarray(case.mask, dtype=bool), shape), -np.inf, added)
        if case.bias is not None:
            added = added + np.broadcast_to(np.asarray(case.bias, dtype=np.float64), shape)
        with np.errstate(invalid="ignore", over="ignore"):
            scores = (self.raw_scores(case, q, k, v) + added.astype(w)) * w(self.scale(case))
            p = self.softmax(scores.astype(w), self.blocked(case.replace(mask=None, bias=None)))
        return np.where(self.blocked(case).all(axis=-1, keepdims=True), 0.0, p)  # rows blocked entirely: zeros


@mutant("causal_before_scale_backward")
class CausalBeforeScaleBackward(CausalBeforeScale):
    """The forward is right; the backward recomputes the weights with is_causal's -inf written before the
    scale (a backward kernel of its own, masking its tile before scaling it): NaN in dV for a scale of 0."""

    def weights(self, case):
        return BaseKernel.weights(self, case)

    def backward_weights(self, case):
        return CausalBeforeScale.weights(self, case)


# -- lse from a pass of its own ---------------------------------------------------------------------------
@mutant("lse_ignores_softcap")
class LseIgnoresSoftcap(VariantKernel):
    """The lse comes from a separate max/sum pass over the scaled scores that never applies the
    softcap (the output does): right without softcap."""

    def lse(self, case):
        return super().lse(case.replace(softcap=None))


@mutant("lse_ignores_alibi")
class LseIgnoresAlibi(VariantKernel):
    """The lse's separate statistics pass adds no ALiBi bias (the output's main loop does): right
    without ALiBi."""

    def lse(self, case):
        return super().lse(case.replace(alibi_slopes=None))


@not_caught(
    "lse_in_input_dtype",
    "admitted by the lse allowance's max(u_w |lse|, eta) term (harness.judge.lse): "
    "an lse stored in the input dtype is inside the error model",
)
class LseInInputDtype(VariantKernel):
    """The lse buffer is allocated like the query (``empty_like(q[..., 0])``): float16/bfloat16 lse
    rounded to the input dtype (an lse of 7.3 off by 0.002 in float16, 0.03 in bfloat16), then widened."""

    def forward_with_lse(self, case):
        out, lse = super().forward_with_lse(case)
        if case.dtype in ("float16", "bfloat16"):
            with np.errstate(over="ignore"):
                lse = lse.astype(np_dtype(case.dtype)).astype(lse.dtype)
        return out, lse


# -- variable lengths at the batch's edges ---------------------------------------------------------------
@mutant("varlen_last_sequence_short")
class VarlenLastSequenceShort(VariantKernel):
    """The last sequence's key range ends at ``cu_seqlens_k[-1] - 1`` (an exclusive bound written as
    inclusive for the final program only): its last key is never read; every other sequence is right."""

    def lengths(self, case):
        tq, sk = super().lengths(case)
        if case.is_varlen and case.B > 1 and sk[-1] > 1:
            sk = sk.copy()
            sk[-1] -= 1
        return tq, sk


@mutant("varlen_keys_use_query_lengths")
class VarlenKeysUseQueryLengths(VariantKernel):
    """The self-attention fast path (max_seqlen_q == max_seqlen_k) passes cu_seqlens_q for the keys too:
    right when every sequence has as many keys as queries."""

    def lengths(self, case):
        tq, sk = super().lengths(case)
        if case.is_varlen and tq.max() == sk.max():
            return tq, tq.copy()
        return tq, sk


@mutant("varlen_empty_sequence_unwritten")
class VarlenEmptySequenceUnwritten(VariantKernel):
    """A program whose sequence has no keys returns early without writing its rows: the output buffer
    (``empty``, recycled by the allocator) keeps the previous sequence's rows there."""

    def forward(self, case):
        out = super().forward(case)
        if not case.is_varlen:
            return out
        _, sk = self.lengths(case)
        out = out.copy()
        for b in range(1, case.B):
            if sk[b] == 0:
                out[b] = out[b - 1]
        return out


# -- windows and causal at their edges --------------------------------------------------------------------
@mutant("window_left_zero_unbounded")
class WindowLeftZeroUnbounded(VariantKernel):
    """``if window_left:`` for ``if window_left >= 0:``: a left size of 0 (only the query's own key on
    the left) is taken as unbounded."""

    def window_sides(self, case):
        left, right = super().window_sides(case)
        return (left if left else -1), right


@mutant("window_right_exclusive")
class WindowRightExclusive(VariantKernel):
    """The right edge exclusive when right > 0: query i sees keys up to i + right - 1 (the left edge,
    and right = 0, are right)."""

    def window_sides(self, case):
        left, right = super().window_sides(case)
        return left, (right - 1 if right > 0 else right)


@mutant("causal_offset_clamped_at_zero")
class CausalOffsetClampedAtZero(VariantKernel):
    """Bottom-right causal with the offset clamped, ``max(S - T, 0)``: when T > S the first T - S rows
    see key 0 instead of nothing (they are top-left aligned); right whenever T <= S."""

    def offsets(self, case):
        return np.maximum(super().offsets(case), 0)


@mutant("window_ignored_when_causal")
class WindowIgnoredWhenCausal(VariantKernel):
    """is_causal selects the causal-only kernel, which never reads window_size: causal + window (w, 0)
    is plain causal attention."""

    def blocked(self, case):
        if case.is_causal and case.window is not None:
            return super().blocked(case.replace(window=None))
        return super().blocked(case)


# -- softcap and ALiBi ------------------------------------------------------------------------------------
@mutant("softcap_after_finite_mask")
class SoftcapAfterFiniteMask(VariantKernel):
    """Masks with a finite fill (``masked_fill(-1e4)``) and then caps: the fill becomes -c, so a blocked
    key keeps weight exp(-c - max) instead of 0 (with c = 4, several percent)."""

    def weights(self, case):
        if not case.softcap:
            return super().weights(case)
        s = self.scores(case.replace(softcap=None))
        w = self.work(case)
        blocked = self.blocked(case)
        s = self.cap(np.where(blocked, w(-1e4), s), w(case.softcap)).astype(w)
        empty = blocked.all(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", over="ignore"):
            p = self.softmax(s, np.zeros_like(blocked))
        return np.where(empty, 0.0, p)


@mutant("alibi_reversed_past_8_heads")
class AlibiReversedPast8Heads(VariantKernel):
    """For more than 8 heads the slopes are read from the end of the table (a kernel that builds the
    geometric slopes itself for H <= 8 and indexes the caller's table backwards otherwise)."""

    def slopes(self, case):
        sl = super().slopes(case)
        return sl[:, ::-1] if case.Hq > 8 else sl


# -- low-precision accumulators ---------------------------------------------------------------------------
@mutant("pv_accumulated_in_bf16")
class PvAccumulatedInBf16(BaseKernel):
    """bfloat16 inputs: the output accumulator of P V over key tiles of 16 is kept in bfloat16 (each
    tile's partial sum rounded to 8 bits and added in bfloat16); exact with one key tile."""

    def forward(self, case):
        if case.dtype != "bfloat16" or case.S <= 16:
            return super().forward(case)
        self.validate(case)
        _, _, v = self.operands(case)
        p = self.weights(case)
        acc = np.zeros(p.shape[:-1] + (v.shape[-1],))
        with np.errstate(invalid="ignore"):
            for s0 in range(0, case.S, 16):
                acc = _bf16(acc + _bf16(p[..., s0 : s0 + 16] @ v[..., s0 : s0 + 16, :]))
        return self.finish(acc, case)


@not_caught(
    "grad_dq_accumulated_low_precision",
    "admitted by the gradient error model: at S = 129 ... 2048 it uses 0.05-0.14 of the dQ allowance "
    "(a correct kernel 0.01-0.04)",
)
class GradDqAccumulatedLowPrecision(GradKernel):
    """float16/bfloat16: dQ is accumulated over key tiles of 16 in the input dtype (the tile loop's
    register accumulator declared as the element type); exact with one key tile."""

    def vjp(self, case, grad_out):
        dq, dk, dv = super().vjp(case, grad_out)
        if case.dtype not in ("float16", "bfloat16") or case.S <= 16:
            return dq, dk, dv
        q, k, v = self.operands(case)
        p = self.backward_weights(case)
        do = grad_out.astype(self.work(case))
        ds = self.softmax_backward(p, do @ np.swapaxes(v, -1, -2))
        low = np_dtype(case.dtype)
        acc = np.zeros(dq.shape, dtype=low)
        for s0 in range(0, case.S, 16):
            part = (ds[..., s0 : s0 + 16] @ k[..., s0 : s0 + 16, :] * self.dq_scale(case)).astype(low)
            acc = (acc + part).astype(low)
        return acc, dk, dv


@mutant("grad_dk_group8_tiled")
class GradDkGroup8Tiled(GradKernel):
    """A backward specialised for 8 query heads per kv head sums dK over heads kv, kv + Hkv, ... (a
    strided group, the tile mapping) instead of the 8 consecutive heads; every other ratio is right,
    and so is 8:1 with a single kv head."""

    def fold_dk(self, x, case):
        g = case.Hq // case.Hkv
        if g != 8:
            return super().fold_dk(x, case)
        return x.reshape(case.B, g, case.Hkv, *x.shape[2:]).sum(axis=1)


# -- decode ---------------------------------------------------------------------------------------------
@mutant("decode_tail_lanes_read_last_key")
class DecodeTailLanesReadLastKey(BaseKernel):
    """Decode (T = 1) over key tiles of 16: the out-of-range lanes of the last partial tile load the
    clamped index S - 1 and are not masked, so the last key counts 16 - S % 16 extra times. Right
    when S <= 16 (a separate one-tile path), when S is a multiple of 16, and for T > 1."""

    def softmax(self, scores, blocked):
        S = scores.shape[-1]
        if scores.shape[-2] != 1 or S <= 16 or S % 16 == 0:
            return super().softmax(scores, blocked)
        extra = 16 - S % 16
        s = scores.copy()
        s[..., -1] = s[..., -1] + np.log1p(extra)  # the last key's weight counted 1 + extra times
        return super().softmax(s, blocked)


# -- layouts seen only by the backward ---------------------------------------------------------------------
@mutant("grad_key_read_as_contiguous")
class GradKeyReadAsContiguous(GradKernel):
    """The backward reads K's raw memory as if it were C-contiguous (the forward handles strides)."""

    def vjp(self, case, grad_out):
        k = np.asarray(case.key)
        raw = k.ravel(order="K").reshape(k.shape)
        return super().vjp(case.replace(key=raw), grad_out)


@mutant("grad_out_read_as_contiguous")
class GradOutReadAsContiguous(GradKernel):
    """The backward reads the output cotangent dO's raw memory as if it were C-contiguous: right for
    the contiguous dO an autograd graph usually hands over, wrong for a transposed or strided view
    (dO of an output that was transposed back to [B, T, H, D] by the caller)."""

    def vjp(self, case, grad_out):
        g = np.asarray(grad_out)
        return super().vjp(case, g.ravel(order="K").reshape(g.shape))


# -- variant arguments baked into a compiled kernel -----------------------------------------------------
@mutant("alibi_slopes_baked_per_head_count")
class AlibiSlopesBakedPerHeadCount(VariantKernel):
    """The slopes are compiled into the kernel as constants, one kernel per (Hq, dtype): a later call
    with other slopes and as many heads gets the first call's slopes."""

    def __init__(self, name="alibi_slopes_baked_per_head_count"):
        super().__init__(name)
        self._slopes: dict = {}

    def slopes(self, case):
        sl = super().slopes(case)
        return self._slopes.setdefault((case.Hq, case.B, case.dtype), sl.copy())


@mutant("window_baked_per_shape")
class WindowBakedPerShape(VariantKernel):
    """The window is a compile-time constant of a kernel cached by (T, S, dtype, causal): the first
    window a shape meets is applied to every later call of that shape."""

    def __init__(self, name="window_baked_per_shape"):
        super().__init__(name)
        self._window: dict = {}

    def window_sides(self, case):
        sides = super().window_sides(case)
        return self._window.setdefault((case.T, case.S, case.dtype, case.is_causal), sides)


@mutant("softcap_baked_per_shape")
class SoftcapBakedPerShape(VariantKernel):
    """The softcap is a compile-time constant of a kernel cached by (shapes, dtype): the first cap a
    shape meets is applied to every later call of that shape (a call without softcap included)."""

    def __init__(self, name="softcap_baked_per_shape"):
        super().__init__(name)
        self._cap: dict = {}

    def scaled(self, case, raw, w):
        key = (case.weights_shape, case.Dk, case.dtype)
        cap = self._cap.setdefault(key, case.softcap) if case.softcap else case.softcap
        return super().scaled(case.replace(softcap=cap), raw, w)


@mutant("bias_cached_by_shape")
class BiasCachedByShape(BaseKernel):
    """Converts the additive M once per (its shape, the case's shape, dtype) into its internal layout
    and reuses the conversion: a new M of the same shape is never read."""

    def __init__(self, name="bias_cached_by_shape"):
        super().__init__(name)
        self._bias: dict = {}

    def weights(self, case):
        if case.bias is not None:
            key = (np.shape(case.bias), case.weights_shape, case.dtype)
            case = case.replace(bias=self._bias.setdefault(key, np.array(case.bias, copy=True)))
        return super().weights(case)


# -- the caller's masks edited in place ----------------------------------------------------------------
@mutant("causal_folded_into_mask_in_place")
class CausalFoldedIntoMaskInPlace(BaseKernel):
    """With is_causal and a full [.., T, S] boolean mask, folds the triangle into the caller's mask in
    place (``attn_mask.logical_or_(causal)``) before computing: the answer is right, the caller's
    mask is not what it was."""

    def forward(self, case):
        m = case.mask
        if case.is_causal and isinstance(m, np.ndarray) and m.dtype == bool and m.flags.writeable:
            if m.shape[-2:] == (case.T, case.S):
                np.logical_or(m, self.causal(case.T, case.S), out=m)
        return super().forward(case)


@mutant("bias_neg_inf_clamped_in_place")
class BiasNegInfClampedInPlace(BaseKernel):
    """Replaces the additive M's -inf by the dtype's most negative finite value in the caller's array
    (to "avoid NaN"), then computes from its own copy taken before: right, and the caller's M changed."""

    def forward(self, case):
        b = case.bias
        if isinstance(b, np.ndarray) and b.flags.writeable and np.isneginf(b).any():
            orig = b.copy()
            b[np.isneginf(b)] = np.finfo(b.dtype).min
            return super().forward(case.replace(bias=orig))
        return super().forward(case)


# -- dropout ---------------------------------------------------------------------------------------------
@mutant("dropout_rate_capped_half")
class DropoutRateCappedHalf(DropoutKernel):
    """Caps the drop probability at 0.5 (``p = min(p, 0.5)``, a guard against a keep probability that
    underflows the RNG threshold) while still scaling by 1/(1 - p) of the caller's p; p = 1 has its
    own all-zero path, and every p <= 0.5 is right."""

    def keep(self, case):
        p = case.dropout_p if case.dropout_p >= 1.0 else min(case.dropout_p, 0.5)
        return self.rng(case).random(case.weights_shape) >= p


# -- results that alias the kernel's own memory -------------------------------------------------------
@mutant("returns_view_of_arena")
class ReturnsViewOfArena(BaseKernel):
    """Allocates one growing arena per dtype and returns a view of its first elements as the result:
    every call is right when it returns, and any later call, of any shape, overwrites it."""

    def __init__(self, name="returns_view_of_arena"):
        super().__init__(name)
        self._arena: dict = {}

    def finish(self, out, case):
        res = super().finish(out, case)
        arena = self._arena.get(res.dtype)
        if arena is None or arena.size < res.size:
            arena = np.empty(max(res.size, 4096), dtype=res.dtype)
            self._arena[res.dtype] = arena
        view = arena[: res.size].reshape(res.shape)
        np.copyto(view, res)
        return view


# -- round 2b: the variants' backward and the additive mask's broadcast ---------------------------------
@mutant("grad_alibi_ignored")
class GradAlibiIgnored(VariantKernel):
    """The backward recomputes P without the ALiBi bias (the forward adds it): the weights the
    gradients flow through are the unbiased ones."""

    def backward_case(self, case):
        return case.replace(alibi_slopes=None)


@mutant("grad_sinks_ignored")
class GradSinksIgnored(VariantKernel):
    """The backward recomputes P with the plain softmax, without the sink in the normaliser (the
    forward has it): P rows sum to 1 in the backward, to less in the forward."""

    def backward_case(self, case):
        return case.replace(sinks=None)


@mutant("softcap_grad_at_biased_score")
class SoftcapGradAtBiasedScore(VariantKernel):
    """The backward evaluates the cap's derivative 1 - tanh(s / c)^2 at the score with the ALiBi bias
    added (the quantity it has in registers), not at the scaled product the cap was applied to."""

    def vjp(self, case, grad_out):
        self._vjp_case = case
        return super().vjp(case, grad_out)

    def cap_grad(self, s, c):
        case = getattr(self, "_vjp_case", None)
        if case is not None and case.alibi_slopes is not None:
            s = s + self.alibi(case)
        return super().cap_grad(s, c)


@mutant("grad_window_top_left")
class GradWindowTopLeft(VariantKernel):
    """The backward's window is aligned top-left (centred on key i) when T != S; the forward's is
    bottom-right as declared."""

    def vjp(self, case, grad_out):
        self._in_backward = True
        try:
            return super().vjp(case, grad_out)
        finally:
            self._in_backward = False

    def window_offset(self, case):
        if getattr(self, "_in_backward", False):
            return np.zeros(case.B, dtype=np.int64)
        return super().window_offset(case)


@mutant("grad_bias_ignored_in_backward")
class GradBiasIgnoredInBackward(GradKernel):
    """The backward recomputes P from the scores with the additive M's -inf entries (as blocked keys)
    but without its finite values."""

    def backward_weights(self, case):
        if case.bias is None:
            return super().backward_weights(case)
        return super().weights(blocking_part_of_bias(case))


@mutant("bias_head0_for_all_heads")
class BiasHead0ForAllHeads(BaseKernel):
    """Reads head 0's slice of a per-head additive M for every head (the bias indexed by batch only)."""

    def weights(self, case):
        b = case.bias
        if b is None or np.ndim(b) < 3 or np.shape(b)[-3] == 1:
            return super().weights(case)
        b = np.asarray(b)
        return super().weights(case.replace(bias=np.broadcast_to(b[..., :1, :, :], b.shape)))


@mutant("lse_window_ignored")
class LseWindowIgnored(VariantKernel):
    """The lse's statistics pass runs over every key of the row, without the sliding window."""

    def lse(self, case):
        return super().lse(case.replace(window=None))


# -- round 2c: declared bitwise tiers kept on the plain path only -----------------------------------------
@mutant("batch_variant_under_mask")
class BatchVariantUnderMask(BatchInvariantKernel):
    """Declares batch_invariant and is, on the plain path; the masked / causal path packs the batch and
    splits the P V reduction over keys in chunks sized from the batch (a split-K heuristic keyed on B),
    so with a padding mask an item's bits change with the batch around it."""

    def forward(self, case):
        if case.mask is None and not case.is_causal:
            return super().forward(case)
        return BatchDependentReduction.forward(self, case)  # the B-keyed split-K, on this path only


@mutant("gqa_backward_atomic_order")
class GqaBackwardAtomicOrder(GradKernel):
    """Declares deterministic; the GQA backward adds each query head's dK into its kv head with atomics,
    in whatever order the heads finish (a random order here): the group's sums differ in their last
    bits from call to call. Without GQA (one head per kv head) nothing is summed and it repeats."""

    def fold_dk(self, x, case):
        g = case.Hq // case.Hkv
        if g == 1:
            return super().fold_dk(x, case)
        parts = x.reshape(case.B, case.Hkv, g, *x.shape[2:])
        acc = np.zeros_like(parts[:, :, 0])
        for i in np.random.default_rng().permutation(g):
            acc = acc + parts[:, :, i]
        return acc


# -- round 2d: the additive mask under the variants, dropout under GQA, empty rows in a variant backward ---
@mutant("softcap_after_bias")
class SoftcapAfterBias(VariantKernel):
    """Adds the caller's additive M to the scaled product and caps the sum (``tanh((s + M) / c) c``):
    the cap squeezes the user's bias too; right without an additive M."""

    def scores(self, case):
        if not (case.softcap and case.bias is not None):
            return super().scores(case)
        w = self.work(case)
        plain = super().scores(case.replace(softcap=None, alibi_slopes=None))  # scaled product + finite M
        s = self.cap(plain, w(case.softcap))
        if case.alibi_slopes is not None:
            s = s + self.alibi(case).astype(w)
        return s.astype(w)


@mutant("lse_ignores_bias")
class LseIgnoresBias(VariantKernel):
    """The lse's statistics pass sees the additive M's -inf entries (as blocked keys) but not its finite
    values: right without a finite additive mask."""

    def lse(self, case):
        if case.bias is None:
            return super().lse(case)
        return super().lse(blocking_part_of_bias(case))


@mutant("dropout_mask_per_kv_head")
class DropoutMaskPerKvHead(DropoutKernel):
    """Under GQA the keep mask is drawn per kv head and shared by the query heads of its group (the RNG
    offset computed from the kv head index); without GQA every head has its own."""

    def keep(self, case):
        shape = (case.B, case.Hkv, case.T, case.S)
        bits = self.rng(case).random(shape) >= case.dropout_p
        return np.repeat(bits, case.Hq // case.Hkv, axis=1)


@mutant("grad_variant_empty_rows_nan")
class GradVariantEmptyRowsNan(VariantKernel):
    """The variants' backward recomputes P with a plain softmax: a row that sees no key (bottom-right
    causal with T > S, a (0, 0) window past the keys) is 0/0 = NaN there, and its dQ with it; the
    forward guards it."""

    def vjp(self, case, grad_out):
        self._in_backward = True
        try:
            return super().vjp(case, grad_out)
        finally:
            self._in_backward = False

    def softmax(self, scores, blocked):
        if not getattr(self, "_in_backward", False):
            return super().softmax(scores, blocked)
        s = np.where(blocked, -np.inf, scores)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
