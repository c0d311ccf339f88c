"""Mutants whose bug fires only on a combination the hand-picked cases used to miss.

Each was a class of real bug that passed the whole suite before the combination clauses existed:

* is_causal together with a mask, given to a plain function through its own arguments. These
  mutants are plain functions with torch's SDPA signature, wrapped in the same
  :class:`implementations.function.FunctionAdapter` a user's function gets, so the adapter (not
  an emulation) decides what reaches them; :func:`applies_both` is their correct counterpart.
* a ``[B,1,1,S]`` key padding mask in self-attention (T == S);
* a row blocked entirely by the additive ``-inf`` of M (not by a boolean mask);
* dropout masks that are not independent across heads, batch items, query rows or RNG offsets; a
  dropout path that forgets is_causal or the all-blocked guard;
* keys dropped only past 16384 (the 4096 one is tests/mutants_scale.py's).

The torch functions import torch only when called, so this module loads where torch is missing.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case
from tests.mutants import BaseKernel, mutant
from tests.mutants_features import DropoutKernel


# -- is_causal + mask through a plain function's own arguments --------------------------------------
def _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )


def applies_both(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Correct: accepts is_causal with attn_mask and applies both (top-left triangle, torch's sense:
    a boolean mask means True = may attend), by folding the triangle into the mask itself."""
    import torch

    if is_causal and attn_mask is not None:
        T, S = query.shape[-2], key.shape[-2]
        visible = torch.ones(T, S, dtype=torch.bool, device=query.device).tril()
        if attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & visible
        else:
            attn_mask = attn_mask.masked_fill(~visible, float("-inf"))
        is_causal = False
    return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def drops_causal_with_mask(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Takes both, but a mask switches the causal part off (the mask is assumed to contain it)."""
    if attn_mask is not None:
        is_causal = False
    return applies_both(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def drops_mask_with_causal(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Takes both, but is_causal selects a causal-only path that never reads the mask."""
    if is_causal:
        attn_mask = None
    return applies_both(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class _FunctionMutant:
    """A torch-signature function behind the real FunctionAdapter (built when the mutant is made)."""

    fn = staticmethod(applies_both)

    def __new__(cls, name: str = "function-applies-both"):
        from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter

        return FunctionAdapter(cls.fn, name=name, declaration=FUNCTION_DEFAULTS)


@mutant("fn_drops_causal_with_mask")
class FnDropsCausalWithMask(_FunctionMutant):
    fn = staticmethod(drops_causal_with_mask)


@mutant("fn_drops_mask_with_causal")
class FnDropsMaskWithCausal(_FunctionMutant):
    fn = staticmethod(drops_mask_with_causal)


# -- padding in self-attention ------------------------------------------------------------------------
@mutant("padding_along_queries_when_square")
class PaddingAlongQueriesWhenSquare(BaseKernel):
    """When T == S, a [B,1,1,S] key padding mask is read along the query axis ([B,1,S,1]): the
    padded positions block whole query rows instead of key columns. Any T != S case is right."""

    def blocked(self, case):
        m = None if case.mask is None else np.asarray(case.mask, dtype=bool)
        if m is None or m.ndim != 4 or m.shape[1:3] != (1, 1) or case.T != case.S:
            return super().blocked(case)
        return super().blocked(case.replace(mask=np.swapaxes(m, -1, -2)))


# -- rows blocked entirely by the additive M ------------------------------------------------------------
@mutant("nan_on_all_blocked_bias")
class NanOnAllBlockedBias(BaseKernel):
    """Adds M's -inf to the scores and guards only rows a *boolean* mask empties: a row that is all
    -inf in M goes through softmax(-inf, ..., -inf) = NaN, while boolean all-blocked rows give 0."""

    def blocked(self, case):
        return super().blocked(case.replace(bias=None))

    def weights(self, case):
        q, k, v = self.operands(case)
        w = self.work(case)
        scores = self.raw_scores(case, q, k, v) * w(self.scale(case))
        if case.bias is not None:
            scores = scores + np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape).astype(w)
        with np.errstate(invalid="ignore", over="ignore"):
            return self.softmax(scores.astype(w), self.blocked(case))


# -- dropout structure --------------------------------------------------------------------------------
@mutant("dropout_mask_shared_across_heads")
class DropoutMaskSharedAcrossHeads(DropoutKernel):
    """One [B,1,T,S] keep mask broadcast over the heads (the RNG offset ignores the head index)."""

    def keep(self, case):
        B, H, T, S = case.weights_shape
        return np.broadcast_to(self.rng(case).random((B, 1, T, S)) >= case.dropout_p, (B, H, T, S))


@mutant("dropout_mask_shared_across_batch")
class DropoutMaskSharedAcrossBatch(DropoutKernel):
    """One [1,H,T,S] keep mask broadcast over the batch items (the offset ignores the batch index)."""

    def keep(self, case):
        B, H, T, S = case.weights_shape
        return np.broadcast_to(self.rng(case).random((1, H, T, S)) >= case.dropout_p, (B, H, T, S))


@mutant("dropout_mask_shared_across_rows")
class DropoutMaskSharedAcrossRows(DropoutKernel):
    """One keep vector per (b, h), reused by every query row (a per-row RNG offset of zero)."""

    def keep(self, case):
        B, H, T, S = case.weights_shape
        return np.broadcast_to(self.rng(case).random((B, H, 1, S)) >= case.dropout_p, (B, H, T, S))


@mutant("dropout_rng_offset_overlap")
class DropoutRngOffsetOverlap(DropoutKernel):
    """Each (b, h) slice reads T*S numbers of one stream starting at offset (b*H + h) * T*S/2: the
    per-slice offset increment is half what it must be, so consecutive slices share half their draws
    (shifted), while every slice alone, and every aligned pair of positions, looks independent."""

    def keep(self, case):
        B, H, T, S = case.weights_shape
        n = T * S
        step = max(1, n // 2)
        stream = self.rng(case).random(step * (B * H - 1) + n)
        slices = [stream[i * step : i * step + n] for i in range(B * H)]
        return np.stack(slices).reshape(B, H, T, S) >= case.dropout_p


@mutant("causal_ignored_under_dropout")
class CausalIgnoredUnderDropout(DropoutKernel):
    """A separate dropout code path that never applies is_causal (right without dropout)."""

    def blocked(self, case):
        if case.dropout_p > 0:
            return super().blocked(case.replace(is_causal=False))
        return super().blocked(case)


@mutant("dropout_nan_on_all_blocked")
class DropoutNanOnAllBlocked(DropoutKernel):
    """The dropout path lacks the all-blocked guard: with dropout_p > 0 an empty row is NaN."""

    def softmax(self, scores, blocked):
        if not getattr(self, "_dropping", False):
            return super().softmax(scores, blocked)
        s = np.where(blocked, -np.inf, scores)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def weights(self, case: Case):
        self._dropping = case.dropout_p > 0
        try:
            return super().weights(case)
        finally:
            self._dropping = False


# -- long sequences -----------------------------------------------------------------------------------
@mutant("drop_keys_beyond_16384")
class DropKeysBeyond16384(BaseKernel):
    """A fixed key buffer of 16384 rows: keys past it are silently ignored (4096 is not enough to see it)."""

    def blocked(self, case):
        b = super().blocked(case).copy()
        b[..., 16384:] = True
        return b
