"""A NumPy kernel with FlashAttention 2's ``flash_attn_func`` signature, written apart from the oracle.

The reference kernel for ``--signature=flash-attn``: a function a kernel author could have written,
shaped like FlashAttention's forward rather than like the formula. Each (batch, head) is computed on
its own, keys are visited in tiles with an online softmax (running max ``m``, running sum ``l``),
positions are derived per tile, and the variants are applied where FlashAttention applies them:
softcap on the scaled product, then the causal / sliding-window limits, then ALiBi, all relative to
the query's place on the key axis ``i + S - T`` (bottom-right). Scores and sums run in float32 for
half-precision inputs and float64 for float64; probabilities are rounded to the input dtype before
``P @ V``, as tensor-core kernels do. It shares no code with ``conformance.oracle`` or
``conformance.oracle_variants``: agreement between the two is evidence about both.

It takes torch tensors (what the flash-attn adapter and FlashAttention itself pass) or NumPy arrays,
and answers in the same kind; with ``return_attn_probs=True`` it returns ``(out, softmax_lse, None)``
(no probabilities), lse ``[B, H, T]`` in float32 (float64 for float64 inputs), ``-inf`` on rows that
see no key. It takes attention ``sinks`` [H] too (FlashInfer's / FA3's argument, not FA2's) and
declares them. It has no dropout and no backward: certify it with ``--declare grad=false``, as the
built-in ``numpy-flash-attn`` does.

Longer than 250 lines because it stands in for FlashAttention's signatures, which share one tiled
forward and one backward; split, the entry points would stop sharing them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from implementations.flash_attn_function import (
    FLASH_ATTN_DEFAULTS,
    FLASH_ATTN_VARLEN_DEFAULTS,
    FlashAttnFunctionAdapter,
    FlashAttnVarlenFunctionAdapter,
)
from implementations.flash_attn_kvcache import FLASH_ATTN_KVCACHE_DEFAULTS, FlashAttnKVCacheFunctionAdapter

TILE = 16


def _as_numpy(x: Any) -> tuple[np.ndarray, Any]:
    """(float array, how to convert a result back): torch tensors via float32/float64, exactly."""
    if hasattr(x, "detach"):
        import torch

        t = x.detach().cpu()
        wide = torch.float64 if t.dtype == torch.float64 else torch.float32
        return t.to(wide).numpy(), ("torch", t.dtype, x.device)
    a = np.asarray(x)
    return a, ("numpy", a.dtype, None)


def _back(a: np.ndarray, kind: Any) -> Any:
    how, dtype, device = kind
    if how == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)
    return a.astype(dtype)


def _round_to(p: np.ndarray, kind: Any) -> np.ndarray:
    """P rounded to the input dtype before P @ V (no-op for float32/float64)."""
    how, dtype, _ = kind
    if how == "torch":
        import torch

        if dtype in (torch.float16, torch.bfloat16):
            return torch.from_numpy(np.ascontiguousarray(p)).to(dtype).to(torch.float32).numpy()
        return p
    if np.dtype(dtype).itemsize < 4:
        return p.astype(dtype).astype(p.dtype)
    return p


_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})


def _dtype(x: Any) -> str:
    """The dtype of a torch tensor or NumPy array by its name ("float16", "bfloat16", "int32", ...)."""
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    return str(dtype).removeprefix("torch.")


def _check_arrays(rank: int, layout: str, **arrays: Any) -> list[tuple[int, ...]]:
    """The inputs' shapes, after refusing what FlashAttention's own checks refuse before a kernel runs
    (``TORCH_CHECK`` in its C++ entry points), here as ValueError / TypeError like the NumPy default kernel's:
    each array of ``rank`` dims, floating point, all of one dtype. Checked before anything is read or
    written, so a bad input can neither index past an array nor fill a cache."""
    for name, x in arrays.items():
        if len(x.shape) != rank:
            raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(x.shape)}")
    dtypes = {name: _dtype(x) for name, x in arrays.items()}
    if any(d not in _FLOATS for d in dtypes.values()):
        raise TypeError(f"inputs must be floating point (float16, bfloat16, float32, float64), got {dtypes}")
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"inputs must share one dtype, got {dtypes}")
    return [tuple(int(n) for n in x.shape) for x in arrays.values()]


def _check_heads(H: int, Hkv: int, Hv: int, D: int, Dk: int) -> None:
    """Key and value heads agree, the query's heads are a multiple of them, Q and K share the feature dim."""
    if Hv != Hkv:
        raise ValueError(f"k and v must have the same number of heads, got {Hkv} and {Hv}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"number of query heads {H} must be divisible by the number of kv heads {Hkv}")
    if Dk != D:
        raise ValueError(f"q and k must have the same head dim, got {D} and {Dk}")


def _check_dropout(dropout_p: float) -> None:
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1], got {dropout_p}")
    if dropout_p:
        raise NotImplementedError("this reference kernel has no dropout")


def _head(qh, kh, vh, cols, rows, *, scale, softcap, left, right, slope, acc_t, kind, sink=None):
    """One (sequence, head): an online softmax over tiles of the key positions ``cols``, queries at
    positions ``rows`` on the same axis. Returns (out [T, Dv], lse [T]), -inf where no key is seen.
    A ``sink`` logit starts the running max and sum (max = sink, sum = exp(0) = 1) and adds nothing
    to the accumulator: it is in every row's denominator and no numerator."""
    T, Dv = qh.shape[0], vh.shape[1]
    m = np.full(T, -np.inf if sink is None else sink, dtype=acc_t)
    l = np.zeros(T, dtype=acc_t) if sink is None else np.ones(T, dtype=acc_t)
    acc = np.zeros((T, Dv), dtype=acc_t)
    for t0 in range(0, len(cols), TILE):
        idx = np.arange(t0, min(t0 + TILE, len(cols)))
        s = (qh @ kh[idx].T) * acc_t(scale)
        if softcap:
            s = acc_t(softcap) * np.tanh(s / acc_t(softcap))
        rel = cols[idx][None, :] - rows[:, None]  # key position minus query position
        hide = np.zeros(s.shape, dtype=bool)
        if right >= 0:
            hide |= rel > right
        if left >= 0:
            hide |= rel < -left
        if slope is not None:
            s = s - acc_t(slope) * np.abs(rel).astype(acc_t)
        s = np.where(hide, -np.inf, s)
        m_new = np.maximum(m, s.max(axis=1))
        base = np.where(np.isneginf(m_new), 0.0, m_new).astype(acc_t)
        p = np.exp(s - base[:, None])
        alpha = np.exp(m - base)
        l = l * alpha + p.sum(axis=1)
        acc = acc * alpha[:, None] + _round_to(p, kind) @ vh[idx]
        m = m_new
    seen = l > 0
    out = np.where(seen[:, None], acc / np.where(seen, l, 1.0)[:, None], 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(np.where(seen, l, 1.0)), -np.inf)
    return out, lse


def _options(D, softmax_scale, causal, window_size):
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    left, right = (int(w) for w in window_size)
    if causal:
        right = 0  # FlashAttention: causal is the window (left, 0)
    return scale, left, right


def _setup(kind, dtype, B, T, H, Hkv, D, Dv, softmax_scale, causal, window_size, softcap, alibi_slopes):
    """What both reference kernels fix before their loops: the head grouping (checked), the accumulation
    dtype, the zeroed output and -inf lse, and ``options(b, h)``: the keyword arguments of :func:`_head`
    for one (sequence, head), i.e. scale, window, softcap, its ALiBi slope, dtype and the inputs' kind
    (one function, so that the two kernels cannot pass their heads different options)."""
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"number of query heads {H} must be divisible by the number of kv heads {Hkv}")
    scale, left, right = _options(D, softmax_scale, causal, window_size)
    slopes = None
    if alibi_slopes is not None:
        slopes = np.broadcast_to(np.asarray(_as_numpy(alibi_slopes)[0], dtype=np.float32), (B, H))
    acc_t = np.float64 if dtype == np.float64 else np.float32
    out = np.zeros((B, T, H, Dv), dtype=acc_t)
    lse = np.full((B, H, T), -np.inf, dtype=acc_t)

    def options(b: int, h: int) -> dict[str, Any]:
        slope = None if slopes is None else slopes[b, h]
        return dict(scale=scale, softcap=softcap, left=left, right=right, slope=slope, acc_t=acc_t, kind=kind)

    return H // Hkv, acc_t, out, lse, options


def flash_attn_func(
    q,
    k,
    v,
    # FA2's own keywords, as in flash_attn_varlen_func: each function stands in for FA2's API, so spells out its own
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    sinks=None,
):
    """FlashAttention 2's forward in NumPy: q [B, T, H, D], k and v [B, S, Hkv, D]; ``sinks`` [H]
    (not FA2's argument: FlashInfer's and FA3's) one logit per query head in every row's denominator."""
    (B, T, H, D), (Bk, S, Hkv, Dk), (Bv, Sv, Hv, _) = _check_arrays(4, "[B, L, H, D]", q=q, k=k, v=v)
    if Bk != B or Bv != B:
        raise ValueError(f"q, k and v must have the same batch size, got {B}, {Bk} and {Bv}")
    if Sv != S:
        raise ValueError(f"k and v must have the same length, got {S} and {Sv}")
    _check_heads(H, Hkv, Hv, D, Dk)
    _check_dropout(dropout_p)
    qn, kind = _as_numpy(q)
    kn, _ = _as_numpy(k)
    vn, _ = _as_numpy(v)
    B, T, H, D = qn.shape
    S, Hkv, Dv = kn.shape[1], kn.shape[2], vn.shape[3]
    group, acc_t, out, lse, options = _setup(
        kind, qn.dtype, B, T, H, Hkv, D, Dv, softmax_scale, causal, window_size, softcap, alibi_slopes
    )
    rows = np.arange(T) + (S - T)  # each query's place on the key axis (bottom-right)
    sink_logits = None if sinks is None else np.asarray(_as_numpy(sinks)[0], dtype=np.float32).reshape(H)
    for b in range(B):
        for h in range(H):
            kv = h // group
            out[b, :, h, :], lse[b, h] = _head(
                qn[b, :, h, :].astype(acc_t),
                kn[b, :, kv, :].astype(acc_t),
                vn[b, :, kv, :].astype(acc_t),
                np.arange(S),
                rows,
                **options(b, h),
                sink=None if sink_logits is None else sink_logits[h],
            )
    result = _back(out, kind)
    if return_attn_probs:
        return result, _lse_back(lse, kind), None
    return result


def _merge(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Split-KV combine: partial (out, lse) of disjoint key sets into the whole row's (out, lse)."""
    lses = np.stack([p[1] for p in parts])  # [n, T]
    top = lses.max(axis=0)
    safe = np.where(np.isneginf(top), 0.0, top)
    w = np.exp(lses - safe)  # 0 for parts that saw nothing
    total = w.sum(axis=0)
    out = sum(wi[:, None] * p[0] for wi, p in zip(w, parts))
    seen = total > 0
    out = np.where(seen[:, None], out / np.where(seen, total, 1.0)[:, None], 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, safe + np.log(np.where(seen, total, 1.0)), -np.inf)
    return out, lse


def _slot(pos: int, b: int, block_table, page: int) -> tuple[int, int]:
    """(cache row, slot) of key position ``pos`` of sequence ``b``."""
    if block_table is None:
        return b, pos
    return int(block_table[b, pos // page]), pos % page


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """FlashAttention 2's KV-cache forward in NumPy. New keys ``k`` / ``v`` are written into the
    caches (in place, as FlashAttention does) at ``cache_seqlens[b]`` onwards, through the block table
    when there is one; sequence b then attends to its first ``cache_seqlens[b] + T_new`` slots.
    ``num_splits > 1`` splits those keys into that many parts, each attended on its own and combined
    by their lse (flash-decoding). Rotary embeddings, ``cache_batch_idx`` and ``cache_leftpad`` are
    not implemented."""
    if rotary_cos is not None or rotary_sin is not None or cache_batch_idx is not None or cache_leftpad is not None:
        raise NotImplementedError("this reference kernel has no rotary, cache_batch_idx or cache_leftpad")
    new_kv = {} if k is None and v is None else {"k": k, "v": v}
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together")
    shapes = _check_arrays(4, "[B, L, H, D]", q=q, k_cache=k_cache, v_cache=v_cache, **new_kv)
    (B, T, H, D), (Bc, page, Hkv, Dk), (Bvc, page_v, Hv, Dv) = shapes[:3]
    if (Bvc, page_v) != (Bc, page):
        raise ValueError(f"k_cache and v_cache must have the same batch and length, got {(Bc, page)}, {(Bvc, page_v)}")
    _check_heads(H, Hkv, Hv, D, Dk)
    table = None if block_table is None else np.asarray(_as_numpy(block_table)[0], dtype=np.int64)
    if table is None and Bc != B:
        raise ValueError(f"k_cache must hold one cache per sequence: batch {Bc} against q's {B}")
    if table is not None and (table.ndim != 2 or table.shape[0] != B):
        raise ValueError(f"block_table must be [B, max_blocks] with B = {B}, got shape {table.shape}")
    if table is not None and table.size and (table.min() < 0 or table.max() >= Bc):
        raise ValueError(f"block_table must name blocks 0 .. {Bc - 1} of the paged caches")
    if new_kv:
        (Bn, new, Hn, Dn), (Bnv, new_v, Hnv, Dnv) = shapes[3:]
        if (Bn, Hn, Dn) != (B, Hkv, D) or (Bnv, new_v, Hnv, Dnv) != (B, new, Hkv, Dv):
            raise ValueError(f"k and v must be [B, T_new, Hkv, D] like the caches, got {shapes[3]} and {shapes[4]}")
    if cache_seqlens is None:
        lens = np.full(B, page if table is None else table.shape[1] * page)
    elif isinstance(cache_seqlens, int):
        lens = np.full(B, cache_seqlens)
    else:
        lens = np.asarray(_as_numpy(cache_seqlens)[0], dtype=np.int64)
        if lens.shape != (B,):
            raise ValueError(f"cache_seqlens must be [B] with B = {B}, got shape {lens.shape}")
    capacity = page if table is None else table.shape[1] * page
    new = int(k.shape[1]) if new_kv else 0
    if (lens < 0).any() or (lens + new > capacity).any():
        raise ValueError(f"cache_seqlens {lens.tolist()} plus {new} new keys must fit a cache of {capacity} slots")
    if new:
        for b in range(B):
            for t in range(new):
                row, slot = _slot(int(lens[b]) + t, b, table, page)
                k_cache[row, slot] = k[b, t]
                v_cache[row, slot] = v[b, t]
    qn, kind = _as_numpy(q)
    kc, _ = _as_numpy(k_cache)
    vc, _ = _as_numpy(v_cache)
    Hkv, Dv = kc.shape[2], vc.shape[3]
    group, acc_t, out, lse, options = _setup(
        kind, qn.dtype, B, T, H, Hkv, D, Dv, softmax_scale, causal, window_size, softcap, alibi_slopes
    )
    for b in range(B):
        L = int(lens[b]) + new
        where = [_slot(p, b, table, page) for p in range(L)]
        keys = np.array([kc[r, s_] for r, s_ in where]).reshape(L, Hkv, D).astype(acc_t)
        vals = np.array([vc[r, s_] for r, s_ in where]).reshape(L, Hkv, Dv).astype(acc_t)
        rows = np.arange(T) + (L - T)
        chunks = np.array_split(np.arange(L), max(int(num_splits), 1)) if L else [np.arange(0)]
        for h in range(H):
            kv = h // group
            opts = options(b, h)
            parts = [_head(qn[b, :, h, :].astype(acc_t), keys[c, kv], vals[c, kv], c, rows, **opts) for c in chunks]
            out[b, :, h, :], lse[b, h] = _merge(parts) if len(parts) > 1 else parts[0]
    result = _back(out, kind)
    if return_softmax_lse:
        return result, _lse_back(lse, kind)
    return result


def _lse_back(lse: np.ndarray, kind: Any) -> Any:
    """The lse in the caller's kind: NumPy as computed, torch float32 (float64 for float64 inputs) on
    the inputs' device, as FlashAttention returns it whatever the input dtype."""
    if kind[0] == "numpy":
        return lse
    import torch

    return _back(lse, ("torch", torch.float64 if lse.dtype == np.float64 else torch.float32, kind[2]))


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    # FA2's own keywords, as in flash_attn_func: each function stands in for FA2's API, so spells out its own
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """FlashAttention 2's varlen forward: q [total_q, H, D], k and v [total_k, Hkv, D] packed back to
    back, int32 cumulative lengths [B + 1]; each sequence is run on its own by :func:`flash_attn_func`
    (so its causal / window / ALiBi positions are its own). lse [H, total_q]."""
    (total_q, H, D), (total_k, Hkv, Dk), (total_v, Hv, _) = _check_arrays(3, "[total, H, D]", q=q, k=k, v=v)
    cq = np.asarray(_as_numpy(cu_seqlens_q)[0], dtype=np.int64)
    ck = np.asarray(_as_numpy(cu_seqlens_k)[0], dtype=np.int64)
    if cq.ndim != 1 or ck.ndim != 1 or len(cq) != len(ck) or len(cq) == 0:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must be [B + 1] for one B, got {cq.shape} and {ck.shape}")
    for name, cu, total in (("cu_seqlens_q", cq, total_q), ("cu_seqlens_k", ck, total_k)):
        if cu[0] != 0 or (np.diff(cu) < 0).any() or cu[-1] != total:
            raise ValueError(f"{name} must rise from 0 to the packed length {total}, got {cu.tolist()}")
    if total_v != total_k:
        raise ValueError(f"k and v must have the same packed length, got {total_k} and {total_v}")
    _check_heads(H, Hkv, Hv, D, Dk)
    _check_dropout(dropout_p)
    qn, kind = _as_numpy(q)
    kn, _ = _as_numpy(k)
    vn, _ = _as_numpy(v)
    B = len(cq) - 1
    slopes = None if alibi_slopes is None else np.broadcast_to(np.asarray(_as_numpy(alibi_slopes)[0]), (B, H))
    outs, lses = [], []
    for b in range(B):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        res = flash_attn_func(
            qn[None, qs],
            kn[None, ks],
            vn[None, ks],
            softmax_scale=softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(qn.shape[-1]),
            causal=causal,
            window_size=window_size,
            softcap=softcap,
            alibi_slopes=None if slopes is None else np.ascontiguousarray(slopes[b]),
            return_attn_probs=True,
        )
        outs.append(res[0][0])
        lses.append(res[1][0])
    out = np.concatenate(outs, axis=0) if outs else np.zeros((0, H, vn.shape[-1]), dtype=qn.dtype)
    lse = np.concatenate(lses, axis=1) if lses else np.zeros((H, 0), dtype=qn.dtype)
    result = _back(out, kind)
    if return_attn_probs:
        return result, _lse_back(lse, kind), None
    return result


class NumpyFlashAdapter(FlashAttnFunctionAdapter):
    """The built-in ``numpy-flash-attn``: :func:`flash_attn_func` through the flash-attn signature adapter."""

    def __init__(self) -> None:
        decl = FLASH_ATTN_DEFAULTS.replace(
            grad=False, sinks=True, notes="NumPy reference kernel with the flash-attn signature (and sinks)"
        )
        super().__init__(flash_attn_func, "numpy-flash-attn", decl)


class NumpyFlashVarlenAdapter(FlashAttnVarlenFunctionAdapter):
    """The built-in ``numpy-flash-attn-varlen``: :func:`flash_attn_varlen_func` through the varlen adapter."""

    def __init__(self) -> None:
        decl = FLASH_ATTN_VARLEN_DEFAULTS.replace(
            grad=False, notes="NumPy reference kernel with the flash-attn-varlen signature"
        )
        super().__init__(flash_attn_varlen_func, "numpy-flash-attn-varlen", decl)


class NumpyFlashKVCacheAdapter(FlashAttnKVCacheFunctionAdapter):
    """The built-in ``numpy-flash-attn-kvcache``: :func:`flash_attn_with_kvcache` through the kvcache adapter."""

    def __init__(self) -> None:
        decl = FLASH_ATTN_KVCACHE_DEFAULTS.replace(notes="NumPy reference kernel with the flash-attn-kvcache signature")
        super().__init__(flash_attn_with_kvcache, "numpy-flash-attn-kvcache", decl)
