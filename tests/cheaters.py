"""Kernels that try to earn CONFORMS without being checked: the verdict's negative controls.

Each is a plain function with torch's SDPA signature (the way most kernel authors arrive), so the
controls go through the same adapter as a real user's function. tests/test_verdict.py requires
that none of them gets CONFORMS and that each run exits non-zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from conformance.contract import NotApplicable


def refuse_everything(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    raise NotApplicable("this kernel takes nothing")


def refuse_most(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Correct on the cases it takes; refuses masks, causal, a custom scale, GQA and T != S."""
    if attn_mask is not None or is_causal or scale is not None or query.shape[1] != key.shape[1]:
        raise NotApplicable("not this one")
    if query.shape[-2] != key.shape[-2]:
        raise NotApplicable("T != S")
    return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p)


def zeros(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Right shape and dtype, wrong everything else."""
    return torch.zeros(*query.shape[:-1], value.shape[-1], dtype=query.dtype)
