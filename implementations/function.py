"""Certify a plain function with the signature of ``torch.nn.functional.scaled_dot_product_attention``.

This is how most kernel authors arrive: they have ``my_attention(query, key, value, attn_mask=None,
dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)`` and no adapter. The semantics are
torch's: a boolean ``attn_mask`` means True = may attend (the suite's blocked masks are inverted
here), a float mask is added to the scores, ``is_causal`` is top-left aligned, ``enable_gqa`` maps
query head h to kv head h // (Hq // Hkv). ``dropout_p`` draws from torch's global generator, which is
seeded from the case before every call, so forward and backward see the same dropout mask.

What the signature cannot say (all-blocked-row policy, causal alignment, missing gradient, dtypes,
and ``mask_sense=blocked`` for a function whose boolean mask means True = blocked, as in
``nn.MultiheadAttention``) comes from ``--declare KEY=VALUE`` on the command line; the defaults claim everything the signature
can express plus the spec's all-blocked policy (zeros) and bitwise repeatability.

``is_causal`` combined with a mask is not accepted by torch's SDPA, so such cases pass the causal
part folded into the mask (in the declared alignment) and ``is_causal=False``; a boolean mask
together with an additive bias is likewise folded into one float mask with ``-inf``.
"""

from __future__ import annotations

import inspect
from typing import Callable

import numpy as np

from conformance.contract import Case, Declaration

FUNCTION_DEFAULTS = Declaration(
    grad=True,
    dropout=True,
    gqa=True,
    bool_mask=True,
    float_mask=True,
    causal=True,
    custom_scale=True,
    mask_sense="attend",
    notes="plain function with the torch SDPA signature",
)


class FunctionAdapter:
    """Wraps ``fn`` (torch tensors in, a tensor out) into the adapter contract."""

    def __init__(self, fn: Callable, name: str, declaration: Declaration = FUNCTION_DEFAULTS, device: str = "cpu"):
        self.fn = fn
        self.name = name
        self.declaration = declaration.replace(device=device)
        self.device = device
        try:
            params = inspect.signature(fn).parameters
            self._accepts_gqa = "enable_gqa" in params or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
            )
        except (TypeError, ValueError):  # builtins without a signature: assume torch's
            self._accepts_gqa = True

    def unavailable_reason(self) -> str | None:
        try:
            import torch
        except ImportError as exc:
            return f"torch is not importable ({exc}); plain SDPA-signature functions are called with torch tensors"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            return "no CUDA device: torch.cuda.is_available() is False"
        return None

    def _call(self, case: Case, q, k, v):
        import torch

        from implementations._torch import sdpa_kwargs

        decl = self.declaration
        kwargs = sdpa_kwargs(case, self.device, decl.causal_alignment, half_bias="query", mask_sense=decl.mask_sense)
        if self._accepts_gqa and "enable_gqa" not in kwargs:
            kwargs["enable_gqa"] = False
        torch.manual_seed(case.seed)
        return self.fn(q, k, v, **kwargs)

    def forward(self, case: Case) -> np.ndarray:
        import torch

        from implementations._torch import qkv, to_numpy

        with torch.no_grad():
            return to_numpy(self._call(case, *qkv(case, self.device)))

    def vjp(self, case: Case, grad_out: np.ndarray):
        from implementations._torch import qkv, to_numpy, to_torch

        q, k, v = qkv(case, self.device, requires_grad=True)
        out = self._call(case, q, k, v)
        out.backward(to_torch(grad_out, self.device))
        return tuple(to_numpy(t.grad) for t in (q, k, v))
