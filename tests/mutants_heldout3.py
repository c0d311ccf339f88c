"""Held-out mutants, round 3: wrong kernels in classes neither round 1 nor round 2 wrote.

Round 1 (``tests/mutants_heldout.py``) aimed at sizes, state between calls and combinations; round 2
(``tests/mutants_heldout2.py``) at the scale's special values, the lse, varlen edges, the variants and
their backward, declared tiers. These aim at: caches keyed on ``id()`` of an input (Python reuses the
ids of freed arrays), fast paths for a degenerate size (B == 1, H == 1, S == 1, Dk == 1, T == 1) that
are wrong, masks read in a layout they are not in (a transposed view read as contiguous, a bit-packed
mask's tail), bugs only the backward has (the scale by Dv, a custom scale twice, empty rows uniform,
dropout under causal, head dim > 128, the GQA group under a window, a varlen batch with an empty
sequence, results in a reused workspace), KV-cache lengths and pages, an output
dtype that changes with T, and determinism lost only for long key axes.

Each class is one bug; its docstring says where it is wrong and where it is right. Run one at a
time through every clause (``pytest conformance/clauses --impl=tests.mutants_heldout3:Class -x``):

* ``@mutant``: claimed by the clause that catches it, so ``tests/test_clauses_bite.py`` checks the kill:
  an existing clause's ``kills`` (13 of them), or a clause written for the 10 that passed every clause
  (``conformance/clauses/test_size_paths.py``, ``test_backward_sizes.py``, ``test_reused_buffers.py``;
  and for the two ``id()``-keyed caches, which failed META-INDEPENDENT-05 / STATE-KEYS-01 only when the allocator
  reused a freed address, which hypothesis reported as flaky, STATE-INPLACE-06);
* ``@not_caught``: not caught, with the reason (none in this round).

Long (a catalogue: one small class per bug, no shared logic beyond the correct base kernels).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from implementations.flash_attn_kvcache import FLASH_ATTN_KVCACHE_DEFAULTS, FlashAttnKVCacheFunctionAdapter
from tests.mutants import BaseKernel, mutant
from tests.mutants_features import DropoutKernel, GradKernel
from tests.mutants_kvcache import kvcache
from tests.mutants_variants import VariantKernel

NOT_CAUGHT: dict[str, tuple[str, type]] = {}


def not_caught(name: str, why: str) -> Callable[[type], type]:
    """A held-out wrong kernel the suite does not catch, kept with the reason (not registered)."""

    def record(cls: type) -> type:
        NOT_CAUGHT[name] = (why, cls)
        cls.mutant_name = name
        return cls

    return record


# -- caches keyed on id() --------------------------------------------------------------------------------
@mutant("key_cache_by_id")
class KeyCacheById(BaseKernel):
    """Caches the converted K/V keyed on ``(id(key), id(value), shape, dtype)`` to skip the cast on a
    repeated call with the same tensors: right while the caller keeps its arrays alive, wrong once a
    freed array's id is reused by a new one of the same shape (stale K/V)."""

    def __init__(self, name: str = "key_cache_by_id"):
        super().__init__(name)
        self._cache: dict = {}

    def operands(self, case):
        key = (id(case.key), id(case.value), case.key.shape, case.value.shape, case.dtype, case.Hq)
        if key not in self._cache:
            self._cache[key] = super().operands(case)[1:]
        q = case.query.astype(self.work(case))
        return (q, *self._cache[key])


@mutant("mask_cache_by_id")
class MaskCacheById(BaseKernel):
    """Caches the expanded blocked-mask keyed on ``(id(mask), shape, is_causal)``: right for one mask
    object, stale when a new mask of the same shape lands at a freed mask's address."""

    def __init__(self, name: str = "mask_cache_by_id"):
        super().__init__(name)
        self._cache: dict = {}

    def blocked(self, case):
        if case.mask is None:
            return super().blocked(case)
        key = (id(case.mask), case.mask.shape, case.weights_shape, case.is_causal, id(case.bias))
        if key not in self._cache:
            self._cache[key] = super().blocked(case)
        return self._cache[key]


# -- fast paths for degenerate sizes ---------------------------------------------------------------------
@mutant("batch_one_head_zero_mask")
class BatchOneHeadZeroMask(BaseKernel):
    """B == 1 fast path squeezes the batch axis and takes the mask as ``mask[0, 0]`` (a [T, S] mask):
    right for [T, S], [1, 1, T, S] and any B > 1; wrong for a per-head mask with B == 1."""

    def blocked(self, case):
        if case.B == 1 and case.mask is not None and np.ndim(case.mask) == 4:
            return super().blocked(case.replace(mask=np.asarray(case.mask)[:1, :1]))
        return super().blocked(case)


@mutant("single_head_default_scale")
class SingleHeadDefaultScale(BaseKernel):
    """Hq == 1 takes a single-head GEMV path whose scale is hard-wired to 1/sqrt(Dk): right for the
    default scale and any Hq > 1, wrong for a custom scale with one head."""

    def scale(self, case):
        return case.Dk**-0.5 if case.Hq == 1 else case.effective_scale


@mutant("single_key_returns_v")
class SingleKeyReturnsV(BaseKernel):
    """S == 1: "softmax over one key is 1", so the output is V itself; right unless that key is blocked
    (the row is then all-blocked and must be 0)."""

    def forward(self, case):
        if case.S == 1:
            self.validate(case)
            _, _, v = self.operands(case)
            return self.finish(np.broadcast_to(v, case.out_shape).copy(), case)
        return super().forward(case)


@mutant("head_dim_one_unit_scale")
class HeadDimOneUnitScale(BaseKernel):
    """Dk == 1: "1/sqrt(1) = 1", the scale multiply is skipped; right with the default scale, wrong
    with a custom one."""

    def scale(self, case):
        return 1.0 if case.Dk == 1 else case.effective_scale


@mutant("decode_causal_noop")
class DecodeCausalNoop(BaseKernel):
    """T == 1: "a single query sees every key under causal" (true bottom-right, the decode convention),
    so causal is dropped; this kernel declares top-left, where query 0 sees key 0 only."""

    def blocked(self, case):
        if case.T == 1 and case.is_causal:
            return super().blocked(case.replace(is_causal=False))
        return super().blocked(case)


@mutant("decode_grad_dq_no_scale")
class DecodeGradDqNoScale(GradKernel):
    """A T == 1 backward path (a rank-1 update per key) forgets the scale on dQ; T > 1 is right."""

    def dq_scale(self, case):
        return 1.0 if case.T == 1 else self.scale(case)


# -- masks read in a layout they are not in --------------------------------------------------------------
@mutant("mask_read_contiguous")
class MaskReadContiguous(BaseKernel):
    """Reads a non-contiguous boolean mask's memory as if it were C-contiguous (``ravel(order='K')``):
    right for contiguous masks and stride-0 broadcasts, wrong for a transposed/sliced view."""

    def blocked(self, case):
        m = case.mask
        if isinstance(m, np.ndarray) and m.ndim >= 2 and not m.flags.c_contiguous and 0 not in m.strides:
            m = np.ravel(m, order="K").reshape(m.shape)
            return super().blocked(case.replace(mask=m))
        return super().blocked(case)


@mutant("expanded_mask_resized")
class ExpandedMaskResized(BaseKernel):
    """An expanded (stride-0) mask is materialised by repeating its own buffer (``np.resize`` of the
    base) instead of broadcasting: right for masks without a zero stride."""

    def blocked(self, case):
        m = case.mask
        if isinstance(m, np.ndarray) and m.ndim >= 1 and 0 in m.strides:
            base = m
            while isinstance(base.base, np.ndarray):
                base = base.base
            m = np.resize(np.ravel(base), m.shape).astype(m.dtype)
            return super().blocked(case.replace(mask=m))
        return super().blocked(case)


@mutant("bitpacked_mask_tail")
class BitpackedMaskTail(BaseKernel):
    """Packs the boolean mask into bits per row (``np.packbits``) and unpacks the last, partial byte
    from the wrong end: right when S is a multiple of 8, the tail keys' bits misplaced otherwise."""

    def blocked(self, case):
        m = case.mask
        if m is None or np.asarray(m).dtype != bool or case.S % 8 == 0:
            return super().blocked(case)
        full = np.broadcast_to(np.asarray(m), case.weights_shape)
        packed = np.packbits(full, axis=-1)
        bits = np.unpackbits(packed, axis=-1)
        tail = case.S % 8
        whole = case.S - tail
        m2 = np.concatenate([bits[..., :whole], bits[..., -8:][..., 8 - tail :]], axis=-1).astype(bool)
        return super().blocked(case.replace(mask=m2))


@mutant("float_mask_row0_key_padding")
class FloatMaskRowZeroKeyPadding(BaseKernel):
    """Takes an additive float mask for a key-padding mask and reads it from query row 0 only; right
    for masks constant along the query axis (padding), wrong for causal-like or per-row biases."""

    def blocked(self, case):
        if case.bias is not None and np.ndim(case.bias) >= 2:
            b = np.asarray(case.bias)
            b = np.broadcast_to(b[..., :1, :], b.shape)
            return super().blocked(case.replace(bias=b))
        return super().blocked(case)

    def weights(self, case):
        if case.bias is not None and np.ndim(case.bias) >= 2:
            b = np.asarray(case.bias)
            case = case.replace(bias=np.broadcast_to(b[..., :1, :], b.shape).copy())
        return super().weights(case)


# -- bugs only the backward has --------------------------------------------------------------------------
@mutant("grad_scale_by_sqrt_dv")
class GradScaleBySqrtDv(GradKernel):
    """The backward's dQ uses 1/sqrt(Dv) for the default scale (the forward is right): indistinguishable
    whenever Dk == Dv or a custom scale is given."""

    def dq_scale(self, case):
        return case.Dv**-0.5 if case.scale is None else case.scale


@mutant("grad_custom_scale_twice")
class GradCustomScaleTwice(GradKernel):
    """With a custom scale the backward pre-scales Q and still multiplies dQ by the scale (scale^2);
    right with the default scale (a path that passes 1/sqrt(d) through the kernel's own constant)."""

    def dq_scale(self, case):
        return case.scale * case.scale if case.scale is not None else self.scale(case)


@mutant("grad_empty_rows_uniform")
class GradEmptyRowsUniform(GradKernel):
    """The forward zeroes all-blocked rows, the backward recomputes P with a finite fill and gets a
    uniform 1/S row there, so dV gains do/S and dK a share; right for rows with a visible key."""

    def backward_weights(self, case):
        p = self.weights(case)
        empty = self.blocked(case).all(axis=-1, keepdims=True)
        return np.where(empty, np.asarray(1.0 / case.S, dtype=p.dtype), p)


@mutant("dropout_causal_grad_shifted")
class DropoutCausalGradShifted(DropoutKernel):
    """Dropout + causal: the backward skips the fully-masked tiles and so starts its Philox counter one
    step later (the mask drawn from seed + 1); right without causal, and the forward is right."""

    def backward_keep_scale(self, case):
        if case.is_causal and case.dropout_p > 0:
            return self.factor(case.replace(seed=case.seed + 1))
        return self.factor(case)


@mutant("grad_head_dim_over_128_zero")
class GradHeadDimOver128Zero(GradKernel):
    """The backward's template exists for head dims <= 128 only; past 128 dQ's columns beyond 128 stay
    zero (the forward is right at any head dim)."""

    def vjp(self, case, grad_out):
        dq, dk, dv = super().vjp(case, grad_out)
        if case.Dk > 128:
            dq = dq.copy()
            dq[..., 128:] = 0
        return dq, dk, dv


@mutant("grad_returns_workspace")
class GradReturnsWorkspace(GradKernel):
    """The backward writes dQ/dK/dV into a workspace kept per shape and returns it: right until the
    next backward of the same shapes overwrites what the caller holds."""

    def __init__(self, name: str = "grad_returns_workspace"):
        super().__init__(name)
        self._ws: dict = {}

    def vjp(self, case, grad_out):
        grads = super().vjp(case, grad_out)
        key = tuple((g.shape, g.dtype) for g in grads)
        if key not in self._ws:
            self._ws[key] = tuple(np.empty_like(g) for g in grads)
        for buf, g in zip(self._ws[key], grads):
            np.copyto(buf, g)
        return self._ws[key]


# -- variants: lse, windows under GQA, varlen backward --------------------------------------------
@mutant("lse_empty_positive")
class LseEmptyPositive(VariantKernel):
    """An lse of +inf on rows with no visible key (FA2's CUDA convention) while declaring -inf (the
    default); rows with a key are right."""

    def lse(self, case):
        lse = super().lse(case)
        return np.where(np.isneginf(lse), np.inf, lse)


@mutant("grad_window_gqa_wrong_group")
class GradWindowGqaWrongGroup(VariantKernel):
    """Under a window the backward's GQA fold reshapes as [B, g, Hkv] (heads interleaved) instead of
    [B, Hkv, g]: right without a window, and whenever g == 1 or Hkv == 1."""

    def fold_group(self, x, case):
        if case.window is None or case.Hq == case.Hkv:
            return super().fold_group(x, case)
        return x.reshape(case.B, case.Hq // case.Hkv, case.Hkv, *x.shape[2:]).sum(axis=1)


@mutant("varlen_grad_breaks_on_empty")
class VarlenGradBreaksOnEmpty(VariantKernel):
    """The varlen backward's loop over sequences ``break``s at an empty sequence instead of ``continue``:
    the gradients of every later sequence stay zero; right when no sequence is empty."""

    def vjp(self, case, grad_out):
        dq, dk, dv = super().vjp(case, grad_out)
        if not case.is_varlen:
            return dq, dk, dv
        tq, sk = self.lengths(case)
        empty = np.flatnonzero((tq == 0) | (sk == 0))
        if empty.size:
            first = int(empty[0])
            dq, dk, dv = dq.copy(), dk.copy(), dv.copy()
            for x in (dq, dk, dv):
                x[first + 1 :] = 0
        return dq, dk, dv


# -- KV caches: lengths and pages ------------------------------------------------------------------------
def _kv_wrapped(change: Callable) -> Callable:
    inner = kvcache("")

    def fn(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, **kw):
        seqlens = change(cache_seqlens.clone(), k_cache, block_table)
        return inner(q, k_cache, v_cache, k=k, v=v, cache_seqlens=seqlens, block_table=block_table, **kw)

    return fn


def _seqlens_off_after_first(lens, k_cache, table):
    lens[1:] = (lens[1:] - 1).clamp(min=0)
    return lens


def _partial_page_whole(lens, k_cache, table):
    if table is None:
        return lens
    page = int(k_cache.shape[1])
    cap = int(table.shape[1]) * page
    return ((lens + page - 1) // page * page).clamp(max=cap)


@mutant("kv_seqlens_off_after_first")
class KvSeqlensOffAfterFirst(FlashAttnKVCacheFunctionAdapter):
    """``cache_seqlens`` read through an exclusive prefix sum that is off by one for every batch item
    after the first (item 0 right, the others one key short)."""

    def __init__(self, name: str = "kv_seqlens_off_after_first"):
        super().__init__(_kv_wrapped(_seqlens_off_after_first), name, FLASH_ATTN_KVCACHE_DEFAULTS)


@mutant("kv_partial_page_read_whole")
class KvPartialPageReadWhole(FlashAttnKVCacheFunctionAdapter):
    """A paged kernel iterates whole pages and forgets to mask the last, partial page: the stale slots
    past ``cache_seqlens`` are attended; right for a contiguous cache or lengths on a page boundary."""

    def __init__(self, name: str = "kv_partial_page_read_whole"):
        super().__init__(_kv_wrapped(_partial_page_whole), name, FLASH_ATTN_KVCACHE_DEFAULTS)


# -- output dtype and determinism by size ----------------------------------------------------------------
@mutant("fp16_out_float32_past_t64")
class Float16OutFloat32PastT64(BaseKernel):
    """The multi-tile float16 path (T > 64) forgets the final cast and returns its float32 accumulator;
    values right, dtype wrong; T <= 64 and other dtypes are right."""

    def finish(self, out, case):
        if case.dtype == "float16" and case.T > 64:
            return out.astype(np.float32)
        return super().finish(out, case)


@mutant("split_k_atomics_past_512")
class SplitKAtomicsPast512(BaseKernel):
    """Past S = 512 keys the kernel splits the key axis over 8 workers whose float32 partial outputs are
    added with atomics in arrival order (random here): run to run differences of a rounding, while
    declaring deterministic; S <= 512 is bitwise reproducible."""

    def forward(self, case):
        if case.S <= 512 or case.dtype == "float64":
            return super().forward(case)
        self.validate(case)
        _, _, v = self.operands(case)
        p = self.weights(case).astype(np.float32)
        chunks = np.array_split(np.arange(case.S), 8)
        parts = [p[..., c] @ v[:, :, c].astype(np.float32) for c in chunks]
        order = np.random.default_rng(int.from_bytes(os.urandom(4), "little")).permutation(8)
        acc = np.zeros_like(parts[0])
        for i in order:
            acc = (acc + parts[i]).astype(np.float32)
        return self.finish(acc, case)


@mutant("remembers_last_causal")
class RemembersLastCausal(BaseKernel):
    """Keeps the causal flag of the last call that set one and applies it to the next call without a mask (a
    module-level "current mode" a decode loop sets)."""

    def __init__(self, name: str = "remembers_last_causal"):
        super().__init__(name)
        self._causal = False

    def forward(self, case):
        if case.is_causal:
            self._causal = True
        elif case.mask is None and self._causal:
            case = case.replace(is_causal=True)
        return super().forward(case)


@mutant("remembers_last_scale")
class RemembersLastScale(BaseKernel):
    """Keeps the last custom scale it was given and uses it for calls that give none."""

    def __init__(self, name: str = "remembers_last_scale"):
        super().__init__(name)
        self._scale = None

    def scale(self, case):
        if case.scale is not None:
            self._scale = case.scale
            return case.scale
        return self._scale if self._scale is not None else case.effective_scale
