"""Plain functions (torch's SDPA signature) whose boolean and -inf policies for rows blocked
entirely differ, as MLX's and keras' do, for tests/test_folded_masks.py.

``bool_mean_v_float_nan`` behaves as MLX's ``mx.fast.scaled_dot_product_attention`` does: blocked
keys of a boolean mask (and of ``is_causal``) are filled with ``finfo.min``, so a row a boolean mask
blocks entirely averages V (mean of V); an additive mask is added as it is, so a row of -inf gives
NaN; causal is aligned bottom-right and cannot be combined with a mask (ValueError). The suite hands
such a function a boolean mask together with an additive M as ONE additive mask, and folds the
causal part into it (implementations/_torch.sdpa_kwargs), so a row that causal empties when T > S
reaches it as -inf: its expected fill is NaN, the float policy, not the mean of V.
"""

from __future__ import annotations

import math

import torch


def bool_mean_v_float_nan(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    q, k, v = (x.to(work) for x in (query, key, value))
    if enable_gqa and k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    fill = torch.finfo(work).min
    if is_causal and attn_mask is not None:
        raise ValueError("is_causal cannot be combined with an explicit mask")
    if is_causal:
        T, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1 + S - T), fill)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, fill)
        else:
            s = s + attn_mask.to(work)
    if dropout_p:
        raise ValueError("no dropout")
    return (torch.softmax(s, dim=-1) @ v).to(query.dtype)
