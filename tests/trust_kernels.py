"""Kernels with ONE real-world bug each, that earlier versions of the suite certified or misdiagnosed.

Plain functions with torch's SDPA signature (a boolean mask means True = may attend), certified through
``--impl=tests.trust_kernels:NAME`` by tests/test_trust.py. :func:`_attention` is right everywhere (the
spec's zero rows, -inf masks, float32 work for low precision, float64 kept); each kernel departs from
it in exactly one way, each taken from a library or a kernel seen in the wild (:func:`validate` refuses
the invalid calls 000 §8 rules out, as the suite's default declaration asks):

- :func:`shared_dropout`: one dropout keep-mask for every batch item and head, and no scale argument
  and Dk == Dv required (a fused kernel's limits); the V = I probe once needed a scale to observe its
  weights, and DROPOUT-INDEPENDENT-06 became not applicable;
- :func:`huge_on_causal_decode`: about 1e30 in float32 outputs of causal decode (T = 1) with several
  heads, a wrong index in one launch configuration; right elsewhere; :func:`slips_and_huge` has
  besides a float32 output 2^-10 too large everywhere, so that rounding-size failures come first;
- :func:`clipped_softmax`: shifted scores clipped at -64 before exp (a "safe" exp), so every blocked key
  gets weight e^-64 ~ 1.6e-28 instead of 0;
- :func:`causal_finite_triangle`: is_causal applied as an additive -1e4 upper triangle, as code written
  for float16 masks does: a key is blocked only while the scores stay far below 1e4.

Written apart from the suite's oracle and from ``implementations/``; torch is imported when called.
"""

from __future__ import annotations

import math

CLIP = -64.0  # clipped_softmax: the floor of the shifted scores
HUGE = 1.0e30  # huge_on_causal_decode's output
FILL = -1.0e4  # causal_finite_triangle's additive causal fill


def validate(q, k, v, attn_mask, dropout_p, enable_gqa, skip: frozenset = frozenset()) -> None:
    """000 §8's preconditions as torch's SDPA signature meets them (RuntimeError / ValueError / TypeError),
    each named as in conformance.contract.PRECONDITIONS; ``skip`` leaves those out (the precondition
    mutants of tests/mutants_preconditions.py)."""

    def check(name: str, ok: bool, message: str, error: type = ValueError) -> None:
        if name not in skip and not ok:
            raise error(message)

    check("rank", all(x.dim() == 4 for x in (q, k, v)), "query, key and value must be 4-D")
    if any(x.dim() != 4 for x in (q, k, v)):
        return
    check("integer", all(x.is_floating_point() for x in (q, k, v)), "query, key and value must be floating", TypeError)
    check("mixed-dtype", k.dtype == q.dtype and v.dtype == q.dtype, "query, key and value must share a dtype")
    check("batch", k.shape[0] == q.shape[0] and v.shape[0] == q.shape[0], "batch sizes differ")
    hq, hkv = q.shape[1], k.shape[1]
    check("heads", hkv > 0 and hq % hkv == 0 and v.shape[1] == hkv, "query heads must be a multiple of key heads")
    check("gqa-flag", hq == hkv or enable_gqa, "query and key heads differ without enable_gqa")
    check("feature", k.shape[-1] == q.shape[-1], "query and key feature dims differ")
    check("kv-length", k.shape[-2] == v.shape[-2], "key and value lengths differ")
    if attn_mask is not None:
        check("mask-larger", attn_mask.dim() <= 4, "attn_mask has more dims than the attention weights")
        full = (q.shape[0], hq, q.shape[-2], k.shape[-2])
        fits = all(a in (1, b) for a, b in zip(attn_mask.shape[::-1], full[::-1]))
        check("mask-shape", fits, "attn_mask does not broadcast to [B, H, T, S]")
    check("dropout-range", 0.0 <= dropout_p <= 1.0, "dropout_p must lie in [0, 1]")


def _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, *, clip=None, causal_fill=None,
               shared_dropout=False, skip=frozenset()):  # fmt: skip
    import torch

    validate(q, k, v, attn_mask, dropout_p, enable_gqa, skip)
    dtype = q.dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    T, S = q.shape[-2], k.shape[-2]
    s = (q.to(work) @ k.to(work).transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    blocked = torch.zeros(T, S, dtype=torch.bool)
    if is_causal and causal_fill is None:
        blocked = ~torch.ones(T, S, dtype=torch.bool).tril()
    elif is_causal:
        s = s + torch.where(~torch.ones(T, S, dtype=torch.bool).tril(), causal_fill, 0.0).to(work)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        blocked = blocked | ~attn_mask
    elif attn_mask is not None:
        s = s + attn_mask.to(work)
    s = s.masked_fill(blocked, -math.inf)
    m = s.amax(dim=-1, keepdim=True) if S else s.new_zeros((*s.shape[:-1], 1))  # S = 0: rows without keys
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    shifted = s - m
    if clip is not None:
        shifted = shifted.clamp(min=clip)
    e = torch.exp(shifted)
    d = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(d == 0, torch.ones_like(d), d)
    if dropout_p > 0:
        shape = (T, S) if shared_dropout else p.shape
        keep = torch.rand(shape) >= dropout_p
        p = torch.where(keep, p / (1.0 - dropout_p), torch.zeros_like(p)) if dropout_p < 1 else torch.zeros_like(p)
    return (p @ v.to(work)).to(dtype)


def reference(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The spec's attention; dropout with an independent keep-mask per weight."""
    return _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def shared_dropout(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """One dropout keep-mask [T, S] shared by every batch item and head; no scale argument; Dk == Dv."""
    if scale is not None:
        raise TypeError("shared_dropout() takes no scale: it always divides by sqrt(Dk)")
    if q.shape[-1] != v.shape[-1]:
        raise ValueError(f"shared_dropout() needs Dk == Dv, got {q.shape[-1]} and {v.shape[-1]}")
    return _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, shared_dropout=True)


def huge_on_causal_decode(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Right, except float32 causal decode (T = 1) with more than one head: every output is 1e30."""
    import torch

    out = _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if is_causal and q.shape[-2] == 1 and q.shape[-3] > 1 and q.dtype == torch.float32:
        return torch.full_like(out, HUGE)
    return out


def slips_and_huge(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """huge_on_causal_decode, and every other float32 output (1 + 2^-10) times too large: a slip of a few
    hundred float32 ulps on every case, which a clause meets before the 1e30."""
    import torch

    out = huge_on_causal_decode(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if q.dtype == torch.float32 and not bool((out == HUGE).all()):
        return out * (1.0 + 2.0**-10)
    return out


def clipped_softmax(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """exp(max(s - max s, -64)): a blocked key's -inf becomes -64, weight e^-64 / sum instead of 0."""
    return _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, clip=CLIP)


def causal_finite_triangle(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """is_causal as an additive -1e4 on the strict upper triangle, not a -inf (or a blocked set)."""
    return _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, causal_fill=FILL)
