"""Deliberately wrong KV-cache kernels: functions with ``flash_attn_with_kvcache``'s signature.

The bugs live in the lowering only a KV-cache kernel does (cache lengths, block tables, page sizes,
appending, split-KV merges), so these mutants are functions called through the kvcache adapter, as
a user's kernel would be. Each gathers its sequence's keys from the cache with one bug, then runs
the NumPy reference's dense ``flash_attn_func`` on them (so the attention itself is right); the
correct gather is :func:`gather`, and :func:`kvcache` with no bug passes every clause.
"""

from __future__ import annotations

import numpy as np

from implementations.flash_attn_kvcache import FLASH_ATTN_KVCACHE_DEFAULTS, FlashAttnKVCacheFunctionAdapter
from implementations.numpy_flash import flash_attn_func
from tests.mutants import MUTANTS


def gather(cache, table, b: int, L: int, page: int, bug: str = "") -> np.ndarray:
    """Key (or value) positions 0..L-1 of sequence b from a contiguous or paged cache, [L, Hkv, D]."""
    if table is None:
        return cache[b, :L]
    rows = []
    for pos in range(L):
        if bug == "table_ignored":  # blocks assumed allocated in order: 1 + b * width + page index
            blk = 1 + b * table.shape[1] + pos // page
        elif bug == "page_16":  # a kernel built for 16-slot pages indexes the table by pos // 16
            blk = int(table[b, pos // 16])
        else:
            blk = int(table[b, pos // page])
        rows.append(cache[blk, pos % page])
    return np.stack(rows) if rows else cache[0, :0]


def _merge(parts, bug: str = ""):
    lses = np.stack([p[1] for p in parts])
    top = lses.max(axis=0)
    safe = np.where(np.isneginf(top), 0.0, top)
    w = np.exp2(lses - safe) if bug == "exp2_merge" else np.exp(lses - safe)  # natural lse, base-2 weights
    total = w.sum(axis=0)
    out = sum(wi[:, None] * p[0] for wi, p in zip(w, parts)) / np.where(total > 0, total, 1.0)[:, None]
    with np.errstate(divide="ignore"):
        return out, np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)


def kvcache(bug: str = ""):
    """A ``flash_attn_with_kvcache`` with the given bug ('' for none)."""

    def fn(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, num_splits=0, **kw):
        import torch

        lse_wanted = kw.pop("return_softmax_lse", False)
        page = int(k_cache.shape[1])
        table = None if block_table is None else block_table.numpy().astype(np.int64)
        lens = cache_seqlens.numpy().astype(np.int64)
        new = 0 if k is None else int(k.shape[1])
        for b in range(q.shape[0]):  # append the new keys
            for t in range(new):
                pos = int(lens[b]) + t - (1 if bug == "append_wrong_slot" else 0)
                row, slot = (b, pos) if table is None else (int(table[b, pos // page]), pos % page)
                k_cache[row, slot], v_cache[row, slot] = k[b, t], v[b, t]
        kc = k_cache.float().numpy() if k_cache.dtype != torch.float64 else k_cache.numpy()
        vc = v_cache.float().numpy() if v_cache.dtype != torch.float64 else v_cache.numpy()
        outs, lses = [], []
        for b in range(q.shape[0]):
            L = int(lens[b]) + (0 if bug == "append_not_visible" else new)
            if bug == "ignores_cache_seqlens":
                L = kc.shape[1] if table is None else table.shape[1] * page
            keys, vals = (torch.from_numpy(np.ascontiguousarray(gather(c, table, b, L, page, bug))) for c in (kc, vc))
            keys, vals = keys.to(q.dtype)[None], vals.to(q.dtype)[None]
            chunks = np.array_split(np.arange(L), max(int(num_splits), 1)) if L and num_splits > 1 else [None]
            parts = []
            for c in chunks:
                kk, vv = (keys, vals) if c is None else (keys[:, c], vals[:, c])
                res = flash_attn_func(q[b : b + 1], kk, vv, return_attn_probs=True, **kw)
                parts.append((res[0][0].double().numpy().reshape(q.shape[1], -1), res[1][0].double().numpy()))
            if len(parts) == 1:
                outs.append(res[0][0])
                lses.append(res[1][0])
                continue
            heads = q.shape[2]
            merged = [
                _merge([(p[0].reshape(q.shape[1], heads, -1)[:, h], p[1][h]) for p in parts], bug) for h in range(heads)
            ]
            outs.append(torch.from_numpy(np.stack([m[0] for m in merged], axis=1)).to(q.dtype))
            lses.append(
                torch.from_numpy(np.stack([m[1] for m in merged])).to(torch.promote_types(q.dtype, torch.float32))
            )
        out = torch.stack(outs)
        return (out, torch.stack(lses)) if lse_wanted else out

    return fn


def _register(name: str, bug: str) -> None:
    if name in MUTANTS:
        raise ValueError(f"mutant name {name!r} is registered twice")
    MUTANTS[name] = lambda: FlashAttnKVCacheFunctionAdapter(kvcache(bug), name, FLASH_ATTN_KVCACHE_DEFAULTS)


for _name, _bug in (
    ("kv_ignores_cache_seqlens", "ignores_cache_seqlens"),
    ("kv_block_table_ignored", "table_ignored"),
    ("kv_page_size_confusion", "page_16"),
    ("kv_append_not_visible", "append_not_visible"),
    ("kv_append_wrong_slot", "append_wrong_slot"),
    ("kv_split_merge_wrong", "exp2_merge"),
):
    _register(_name, _bug)
