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


def lowered_cache(case: Case, form: CacheForm) -> dict[str, Any]:
    """The case's keys and values in ``form`` as NumPy arrays: ``k_cache``, ``v_cache``, ``k``, ``v``
    (None without append), ``cache_seqlens`` int32 [B], ``block_table`` int32 [B, max_blocks] or None."""
    sk = np.full(case.B, case.S) if case.seqlens_k is None else np.asarray(case.seqlens_k, dtype=np.int64)
    new = int(form.append)
    if new and (sk < new).any():
        raise ValueError(f"append={new} is more than a sequence's key length {sk.tolist()}")
    rng = np.random.default_rng(np.random.SeedSequence([form.seed, 7]))
    key = np.swapaxes(np.asarray(case.key), 1, 2)  # [B, S, Hkv, D]
    value = np.swapaxes(np.asarray(case.value), 1, 2)
    dt = key.dtype

    def filler(shape: tuple[int, ...]) -> np.ndarray:
        return (rng.standard_normal(shape) * FILLER).astype(dt)

    page = form.page_size
    capacity = max(int(sk.max(initial=0)), 1)
    if page is not None:
        capacity = -(-capacity // page) * page
    kc = filler((case.B, capacity, case.Hkv, case.Dk))
    vc = filler((case.B, capacity, case.Hkv, case.Dv))
    for b in range(case.B):
        n = int(sk[b]) - new
        kc[b, :n], vc[b, :n] = key[b, :n], value[b, :n]
    out: dict[str, Any] = {"cache_seqlens": (sk - new).astype(np.int32), "block_table": None}
    if new:
        out["k"] = np.ascontiguousarray(np.stack([key[b, sk[b] - new : sk[b]] for b in range(case.B)]))
        out["v"] = np.ascontiguousarray(np.stack([value[b, sk[b] - new : sk[b]] for b in range(case.B)]))
    else:
        out["k"] = out["v"] = None
    if page is None:
        out["k_cache"], out["v_cache"] = kc, vc
        return out
    per_seq = capacity // page
    n_blocks = 1 + case.B * per_seq  # block 0: the null block
    ids = rng.permutation(np.arange(1, n_blocks))
    table = np.zeros((case.B, per_seq), dtype=np.int32)
    kp = filler((n_blocks, page, case.Hkv, case.Dk))
    vp = filler((n_blocks, page, case.Hkv, case.Dv))
    for b in range(case.B):
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
        q = to_torch(np.ascontiguousarray(np.swapaxes(case.query, 1, 2)), self.device)
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
        return to_numpy(out.transpose(1, 2))

    def forward_with_lse(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        import torch

        from implementations._torch import to_numpy

        res = self._call(case, want_lse=True)
        if not isinstance(res, (tuple, list)) or len(res) < 2:
            raise TypeError(f"return_softmax_lse=True returned {type(res).__name__}, not (out, softmax_lse)")
        return to_numpy(res[0].transpose(1, 2)), res[1].detach().cpu().to(torch.float64).numpy().copy()
