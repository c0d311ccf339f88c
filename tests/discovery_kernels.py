"""Self-test kernels for discovery (conformance/harness/discovery*.py): torch-signature functions, ONE convention each.

Every kernel here is :func:`make`'s correct attention (torch's SDPA signature and semantics: a boolean
mask means True = may attend, is_causal top-left, enable_gqa h -> h // (Hq / Hkv), float32 compute for
low precision, float64 in float64, all-blocked rows 0 with a finite gradient) with one knob turned.
``tests/test_discover.py`` checks that discovery finds each knob: the conventions as a ``--declare``,
the behaviours no field allows (causal ignored when a mask is given, NaN on some all-blocked rows) as
findings; the product formed in the input dtype as its formulation (float16_computed_as ...). Written
apart from the suite's oracle and from ``implementations/``, so that a shared mistake cannot make them
agree. torch is imported when a kernel is called.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tests.trust_kernels import validate


@dataclass(frozen=True)
class Knobs:
    alignment: str = "top-left"  # or "bottom-right"
    sense: str = "attend"  # boolean mask True = may attend (torch's); "blocked" = True is blocked
    # rows a boolean mask / causal blocks entirely: zeros, mean-v, nan, nan-head1, or a fill that depends on
    # the case: mean-v-S8 (the mean of V when S is a multiple of 8, NaN otherwise: a tile path's own fill),
    # mean-v-float64 (the mean of V in float64, NaN in every other dtype)
    bool_fill: str = "zeros"
    float_fill: str = "zeros"  # rows an additive mask makes all -inf: zeros or nan
    float64_as_float32: bool = False
    upcast: bool = True  # float16 / bfloat16 converted to float32 before QK^T
    causal_with_mask: str = "apply"  # or "reject" (raise ValueError), "ignore" (drop is_causal), "assert" (crash)
    decode_drops_causal: bool = False  # is_causal ignored when T == 1 (as HF's sdpa_attention_forward does)
    own_error: bool = False  # invalid shapes rejected with the library's own class (as ORT's InvalidArgument)
    # every dtype's products take bfloat16 operands, accumulated in float32 (an inference precision hint)
    all_bfloat16: bool = False


class InvalidArgument(Exception):
    """A library's own rejection class, derived from none of ValueError, RuntimeError, TypeError."""


def _fill(p, dead, how: str, S: int, dtype=None):
    """Weights ``p`` with the rows ``dead`` ([B, H, T]) filled as ``how`` says (of inputs of ``dtype``)."""
    import torch

    if how == "mean-v-S8":
        how = "mean-v" if S % 8 == 0 else "nan"
    elif how == "mean-v-float64":
        how = "mean-v" if dtype == torch.float64 else "nan"
    p = p.masked_fill(dead[..., None], 0.0)
    if how == "mean-v":
        return torch.where(dead[..., None], torch.full_like(p, 1.0 / S), p)
    if how in ("nan", "nan-head1"):
        if how == "nan-head1":  # head 0's rows are guarded (zeros), the other heads' are not
            dead = dead & (torch.arange(p.shape[1]).view(1, -1, 1) >= 1)
        return torch.where(dead[..., None], torch.full_like(p, float("nan")), p)
    return p


def attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, knobs: Knobs):
    import torch
    import torch.nn.functional as F

    if attn_mask is not None and is_causal:
        if knobs.causal_with_mask == "reject":
            raise ValueError("this kernel does not take is_causal together with attn_mask")
        if knobs.causal_with_mask == "ignore":
            is_causal = False  # assumes the mask already holds the causal part
        assert knobs.causal_with_mask != "assert", "internal: the fused causal path takes no attn_mask"
    if knobs.own_error and (query.ndim != 4 or query.shape[-1] != key.shape[-1]):
        raise InvalidArgument(f"query {tuple(query.shape)} and key {tuple(key.shape)} do not make an attention")
    validate(query, key, value, attn_mask, dropout_p, enable_gqa)  # 000 §8's preconditions, as torch raises them
    dtype = query.dtype
    T, S, D = query.shape[-2], key.shape[-2], query.shape[-1]
    if knobs.decode_drops_causal and T == 1:
        is_causal = False  # a decode step sees every key: bottom-right there, top-left elsewhere
    if dtype == torch.float64 and not knobs.float64_as_float32:
        work = torch.float64
    else:
        work = torch.float32
    k, v = key, value
    if query.shape[1] != key.shape[1]:
        if not enable_gqa:
            raise RuntimeError("Hq != Hkv needs enable_gqa=True")
        k = k.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        v = v.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    c = 1.0 / math.sqrt(D) if scale is None else scale
    if knobs.all_bfloat16:
        work = torch.float32

        def low(x):
            return x.to(torch.bfloat16).to(work)
    else:

        def low(x):
            return x.to(work)

    if knobs.upcast or dtype not in (torch.float16, torch.bfloat16):
        s = (low(query) @ low(k).transpose(-2, -1)) * c
    else:
        s = (query @ k.transpose(-2, -1)).to(work) * c  # the product in the input dtype (000 §8's mistake)
    blocked = torch.zeros(s.shape, dtype=torch.bool)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        blocked = blocked | (~attn_mask if knobs.sense == "attend" else attn_mask)
    if is_causal:
        shift = 0 if knobs.alignment == "top-left" else S - T
        blocked = blocked | torch.ones(T, S, dtype=torch.bool).triu(1 + shift)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        s = s + attn_mask.to(work)
    s = s.masked_fill(blocked, float("-inf"))
    dead_bool = blocked.all(-1)
    dead = torch.isneginf(s).all(-1)
    p = torch.softmax(s.masked_fill(dead[..., None], 0.0), dim=-1)
    p = _fill(p, dead & ~dead_bool, knobs.float_fill, S)
    p = _fill(p, dead_bool, knobs.bool_fill, S, dtype)
    if dropout_p > 0:
        p = F.dropout(p, dropout_p, training=True)
    return (low(p) @ low(v)).to(dtype)


def make(name: str, **knobs) -> Callable:
    """A torch-signature function with ``knobs`` turned (see :class:`Knobs`)."""
    chosen = Knobs(**knobs)

    def fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, chosen)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"discovery self-test kernel: {chosen}"
    return fn


correct = make("correct")
bottom_right = make("bottom_right", alignment="bottom-right")
mask_blocked = make("mask_blocked", sense="blocked")
mean_v_rows = make("mean_v_rows", bool_fill="mean-v")
nan_neg_inf_rows = make("nan_neg_inf_rows", float_fill="nan")
float64_as_float32 = make("float64_as_float32", float64_as_float32=True)
no_upcast = make("no_upcast", upcast=False)
rejects_causal_with_mask = make("rejects_causal_with_mask", causal_with_mask="reject")
ignores_causal_with_mask = make("ignores_causal_with_mask", causal_with_mask="ignore")
asserts_causal_with_mask = make("asserts_causal_with_mask", causal_with_mask="assert")  # a crash, no rejection
nan_some_rows = make("nan_some_rows", bool_fill="nan-head1")
decode_drops_causal = make("decode_drops_causal", decode_drops_causal=True)
fill_by_length = make("fill_by_length", bool_fill="mean-v-S8")
fill_by_dtype = make("fill_by_dtype", bool_fill="mean-v-float64")
own_error = make("own_error", own_error=True)
all_bfloat16 = make("all_bfloat16", all_bfloat16=True)

# name -> (the --declare discovery must print, the start of the finding it must report, or None); each
# kernel here is also batch invariant (torch on CPU computes each batch item's products alone), which
# discovery measures and proposes over the plain function's default (``batch_invariant=false``).
_EXPECTED: dict[str, tuple[dict[str, str], str | None]] = {
    "correct": ({}, None),
    "bottom_right": ({"causal_alignment": "bottom-right"}, None),
    "mask_blocked": ({"mask_sense": "blocked"}, None),
    "mean_v_rows": ({"all_blocked": "mean-v", "all_blocked_float_mask": "zeros"}, None),
    "nan_neg_inf_rows": ({"all_blocked_float_mask": "nan"}, None),
    "float64_as_float32": ({"float64_computed_as": "float32"}, None),
    "no_upcast": ({"bfloat16_computed_as": "bfloat16-products", "float16_computed_as": "float16-products"}, None),
    "rejects_causal_with_mask": ({"causal_with_mask": "false"}, None),
    "ignores_causal_with_mask": ({}, "ignores is_causal when a mask is given"),
    "asserts_causal_with_mask": ({}, "is_causal with a boolean mask, T=S=4, passed together: raised AssertionError"),
    "nan_some_rows": ({}, "boolean all-blocked rows are filled in more than one way"),
    "decode_drops_causal": ({}, "the causal alignment differs between shapes"),
    "fill_by_length": ({}, "boolean all-blocked rows are filled differently by S or by dtype"),
    "fill_by_dtype": ({}, "boolean all-blocked rows are filled differently by S or by dtype"),
    "own_error": ({"rejects_with": "InvalidArgument,RuntimeError,TypeError,ValueError"}, None),
    # an inference precision hint: float32 declared as such, float16 and float64 found at bfloat16 too, and
    # nothing else (the convention probes read at bfloat16's thresholds where no dtype runs at its own)
    "all_bfloat16": ({"float32_computed_as": "bfloat16"}, "every dtype computed at bfloat16"),
}
EXPECTED = {name: ({**changes, "batch_invariant": "true"}, finding) for name, (changes, finding) in _EXPECTED.items()}


# -- kernels that break probes: discovery must turn each failure into evidence, never crash --------
def raises_always(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Rejects every call (as a kernel built for another device would)."""
    raise RuntimeError("no kernel image for this device")


def hangs_on_causal(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Correct, except that is_causal never returns in time (a deadlocked causal path)."""
    if is_causal:
        import time

        time.sleep(3.0)
    return correct(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
