"""Kernels with ONE injected cause each, for the likely-causes self-tests (tests/test_causes.py).

Plain functions with torch's SDPA signature (boolean mask True = may attend), certified through
``--impl=tests.cause_kernels:NAME``. :func:`reference` is right everywhere (the spec's zero rows and
finite gradients included); each other kernel departs from it in exactly one way, which
``likely causes`` must name first. Dropout is not implemented (the tests declare ``dropout=false``).
"""

from __future__ import annotations

import math

import torch

FILL = -1.0e4  # the finite fill of finite_fill (a common choice in older code)


def _work(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _safe_softmax(s: torch.Tensor) -> torch.Tensor:
    """softmax over the last axis; a row of -inf gives weights 0 (and a finite gradient)."""
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    d = e.sum(dim=-1, keepdim=True)
    return e / torch.where(d == 0, torch.ones_like(d), d)


def _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa, *, work=None, qk_in_input=False,
               bottom_right=False, fill=-math.inf, mean_v_rows=False):  # fmt: skip
    dtype = q.dtype
    work = work or _work(dtype)
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    raw = (q @ k.transpose(-2, -1)) if qk_in_input else (q.to(work) @ k.to(work).transpose(-2, -1))
    s = raw.to(work) * (scale if scale is not None else 1.0 / math.sqrt(D))
    blocked = torch.zeros(T, S, dtype=torch.bool)
    if is_causal:
        blocked = ~torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T if bottom_right else 0)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        blocked = blocked | ~attn_mask
    elif attn_mask is not None:
        s = s + attn_mask.to(work)
    s = s.masked_fill(blocked, fill) if math.isinf(fill) else s + torch.where(blocked, fill, 0.0).to(work)
    p = _safe_softmax(s)
    out = p @ v.to(work)
    if mean_v_rows:
        empty = torch.broadcast_to(blocked, s.shape).all(dim=-1, keepdim=True)
        out = torch.where(empty, v.to(work).mean(dim=-2, keepdim=True), out)
    return out.to(dtype)


def reference(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The spec's attention: float32 work for low precision, float64 for float64, -inf masks."""
    return _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa)


def float64_as_float32(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Computes float64 inputs in float32 (keras' NumPy backend, MLX, HF eager do)."""
    return _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa, work=torch.float32)


def no_upcast(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """QK^T in the input dtype: float16 products past 65504 overflow (000 §8 asks for the upcast)."""
    return _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa, qk_in_input=True)


def bottom_right_causal(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Aligns causal bottom-right when T != S (FlashAttention, MLX), not top-left as torch's signature."""
    return _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa, bottom_right=True)


def finite_fill(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Blocks keys by adding -1e4 instead of -inf: a row blocked entirely keeps its unmasked softmax."""
    return _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa, fill=FILL)


def mean_v_rows(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Gives a row blocked entirely the mean of V (jax's, keras' and MLX's convention)."""
    return _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa, mean_v_rows=True)
