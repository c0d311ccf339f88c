"""keras 3's NumPy-backend ``dot_product_attention`` as a plain torch-SDPA-signature function, as a
user would wrap it (layout and type conversion only: [B, H, T, D] <-> [B, T, N, H], bfloat16 through
float32 since NumPy has none, the output cast back to the input dtype). ``likely causes``
on it must name float64 first (keras computes float64 in float32). tests/test_causes_keras.py."""

from __future__ import annotations

import numpy as np
import torch

from implementations import _keras

keras, nn, UNAVAILABLE = _keras.load("numpy")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()


def keras_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    q, k, v = (np.swapaxes(_np(x), 1, 2) for x in (query, key, value))
    mask = bias = None
    if attn_mask is not None:
        m = _np(attn_mask)
        mask, bias = (m, None) if m.dtype == np.bool_ else (None, m)
    out = nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=bool(is_causal))
    return torch.from_numpy(np.ascontiguousarray(np.swapaxes(np.asarray(out), 1, 2))).to(query.dtype)
