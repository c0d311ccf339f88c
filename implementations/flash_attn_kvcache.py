"""Certify a plain function with FlashAttention 2's KV-cache signature (``--signature=flash-attn-kvcache``).

``fn(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, softmax_scale=None,
causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, num_splits=0,
return_softmax_lse=False)``, as ``flash_attn.flash_attn_with_kvcache`` (its rotary, cache_batch_idx
and cache_leftpad arguments are not used). Queries are dense ``[B, T, H, D]``; sequence b attends to
the first ``cache_seqlens[b]`` slots of its cache plus the new keys ``k`` / ``v`` (``[B, T_new, Hkv,
D]``) that the function appends there itself, causal aligned bottom-right on that length.

The adapter lowers a case (per-sequence key lengths ``seqlens_k``, dense queries) to the form its
``Case.kv_form`` names (:class:`conformance.contract.CacheForm`): a contiguous cache ``[B, capacity,
Hkv, D]``, or pages ``[num_blocks, page_size, Hkv, D]`` placed at shuffled block ids of a block table
``[B, max_blocks]`` (int32), block 0 a null block that no sequence owns and that unused table
entries point at; the last ``append`` keys of every sequence go in as ``k`` / ``v``. Slots past a
sequence's length, and the null block, hold large random values: a kernel that reads them is wrong
by a visible amount. The function may (and FlashAttention does) write into the caches: they are the
adapter's copies, never the case's arrays. The result and the lse ``[B, H, T]`` come back in the
contract's layout. There is no backward (FlashAttention's ``Note: Does not support backward pass.``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conformance.contract import CacheForm, Case, Declaration, NotApplicable
from implementations.flash_attn_function import FLASH_ATTN_DEFAULTS, TorchFunctionAdapter

FLASH_ATTN_KVCACHE_DEFAULTS = FLASH_ATTN_DEFAULTS.replace(
    grad=False,
    kv_lengths=True,
    paged_kv=True,
    kv_append=True,
    notes="plain function with FlashAttention 2's flash_attn_with_kvcache signature",
)
FILLER = 1.0e3  # magnitude of what sits in cache slots no sequence owns


def _whole(x: np.ndarray) -> np.ndarray:
    """[.., H, S, D] -> [.., S, H, D], contiguous: an array as a cache every slot of which is a key."""
    return np.ascontiguousarray(np.swapaxes(np.asarray(x), -3, -2))


def lowered_cache(case: Case, form: CacheForm) -> dict[str, Any]:
    """The case's keys and values in ``form`` as NumPy arrays: ``k_cache``, ``v_cache``, ``k``, ``v``
    (None without append), ``cache_seqlens`` int32 [B], ``block_table`` int32 [B, max_blocks] or None.

    Each cache is built from its own array's batch, length, heads, feature dim and dtype, so that a key
    and a value that differ in any (a precondition clause's bad input) reach the function as caches that
    differ so, for the function to refuse; a key or value that is not 4-D is handed over as the whole
    contiguous cache, in its own rank. For a valid case the two coincide and nothing changes."""
    key, value = np.asarray(case.key), np.asarray(case.value)
    if key.ndim != 4 or value.ndim != 4:
        lead = key.shape[-4] if key.ndim >= 4 else 1
        lens = np.full(lead, key.shape[-2], dtype=np.int32)
        return {"k_cache": _whole(key), "v_cache": _whole(value), "k": None, "v": None, "cache_seqlens": lens,
                "block_table": None}  # fmt: skip

    def lengths(x: np.ndarray) -> np.ndarray:
        given = case.seqlens_k
        return np.full(x.shape[0], x.shape[2]) if given is None else np.asarray(given, dtype=np.int64)

    sk, sv = lengths(key), lengths(value)
    new = int(form.append)
    if new and (sk < new).any():
        raise ValueError(f"append={new} is more than a sequence's key length {sk.tolist()}")
    rng = np.random.default_rng(np.random.SeedSequence([form.seed, 7]))
    key, value = _whole(key), _whole(value)  # [B, S, Hkv, D]

    def filler(shape: tuple[int, ...], like: np.ndarray) -> np.ndarray:
        return (rng.standard_normal(shape) * FILLER).astype(like.dtype)

    page = form.page_size
    if page is not None and (key.shape[:3] != value.shape[:3] or (sk != sv).any()):
        page = None  # no one block table holds a key and a value of different batch, length or heads
    capacity = max(int(sk.max(initial=0)), 1)
    capacity_v = max(int(sv.max(initial=0)), 1)
    if page is not None:
        capacity = capacity_v = -(-capacity // page) * page
    kc = filler((key.shape[0], capacity, *key.shape[2:]), key)
    vc = filler((value.shape[0], capacity_v, *value.shape[2:]), value)
    for b in range(key.shape[0]):
        kc[b, : int(sk[b]) - new] = key[b, : int(sk[b]) - new]
    for b in range(value.shape[0]):
        vc[b, : int(sv[b]) - new] = value[b, : int(sv[b]) - new]
    out: dict[str, Any] = {"cache_seqlens": (sk - new).astype(np.int32), "block_table": None}
    if new:
        out["k"] = np.ascontiguousarray(np.stack([key[b, sk[b] - new : sk[b]] for b in range(key.shape[0])]))
        out["v"] = np.ascontiguousarray(np.stack([value[b, sv[b] - new : sv[b]] for b in range(value.shape[0])]))
    else:
        out["k"] = out["v"] = None
    if page is None:
        out["k_cache"], out["v_cache"] = kc, vc
        return out
    per_seq = capacity // page
    n_seq = key.shape[0]  # the key's sequences, each a row of the table (the query's count, for a valid case)
    n_blocks = 1 + n_seq * per_seq  # block 0: the null block
    ids = rng.permutation(np.arange(1, n_blocks))
    table = np.zeros((n_seq, per_seq), dtype=np.int32)
    kp = filler((n_blocks, page, *key.shape[2:]), key)
    vp = filler((n_blocks, page, *value.shape[2:]), value)
    for b in range(n_seq):
        used = -(-int(sk[b]) // page)  # pages this sequence needs, the appended keys included
        for p in range(used):
            blk = int(ids[b * per_seq + p])
            table[b, p] = blk
            kp[blk], vp[blk] = kc[b, p * page : (p + 1) * page], vc[b, p * page : (p + 1) * page]
    out.update(k_cache=kp, v_cache=vp, block_table=table)
    return out


class FlashAttnKVCacheFunctionAdapter(TorchFunctionAdapter):
    """Wraps ``fn`` with ``flash_attn_with_kvcache``'s signature into the adapter contract."""

    signature = "kvcache"

    def __init__(
        self,
        fn: Callable,
        name: str,
        declaration: Declaration = FLASH_ATTN_KVCACHE_DEFAULTS,
        device: str = "cpu",
    ) -> None:
        super().__init__(fn, name, declaration, device)

    def _call(self, case: Case, want_lse: bool):
        import torch

        from implementations._torch import to_torch

        if case.mask is not None or case.bias is not None:
            raise NotApplicable("the kvcache signature has no mask or bias argument")
        if case.seqlens_q is not None:
            raise NotApplicable("the kvcache signature has dense queries: no per-sequence query lengths")
        form = case.kv_form or CacheForm()
        parts = lowered_cache(case, form)
        q = to_torch(_whole(case.query), self.device)  # [B, T, H, D]; another rank stays that rank
        kwargs: dict[str, Any] = {
            "cache_seqlens": to_torch(parts["cache_seqlens"], self.device),
            "softmax_scale": case.scale,
            "causal": bool(case.is_causal),
        }
        if parts["k"] is not None:
            kwargs["k"] = to_torch(parts["k"], self.device)
            kwargs["v"] = to_torch(parts["v"], self.device)
        if parts["block_table"] is not None:
            kwargs["block_table"] = to_torch(parts["block_table"], self.device)
        kwargs.update(self._variant_kwargs(case))
        if form.splits:
            kwargs["num_splits"] = int(form.splits)
        if want_lse:
            kwargs["return_softmax_lse"] = True
        k_cache = to_torch(parts["k_cache"], self.device)
        v_cache = to_torch(parts["v_cache"], self.device)
        with torch.no_grad():
            return self.fn(q, k_cache, v_cache, **kwargs)

    def forward(self, case: Case) -> np.ndarray:
        from implementations._torch import to_numpy

        res = self._call(case, want_lse=False)
        out = res[0] if isinstance(res, (tuple, list)) else res
        return to_numpy(out.transpose(-3, -2))

    def forward_with_lse(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        import torch

        from implementations._torch import to_numpy

        res = self._call(case, want_lse=True)
        if not isinstance(res, (tuple, list)) or len(res) < 2:
            raise TypeError(f"return_softmax_lse=True returned {type(res).__name__}, not (out, softmax_lse)")
        return to_numpy(res[0].transpose(-3, -2)), res[1].detach().cpu().to(torch.float64).numpy().copy()
