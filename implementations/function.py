"""Certify a plain function with the signature of ``torch.nn.functional.scaled_dot_product_attention``.

This is how most kernel authors arrive: they have ``my_attention(query, key, value, attn_mask=None,
dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)`` and no adapter. The semantics are
torch's: a boolean ``attn_mask`` means True = may attend (the suite's blocked masks are inverted
here), a float mask is added to the scores, ``is_causal`` is top-left aligned, ``enable_gqa`` maps
query head h to kv head h // (Hq // Hkv). ``dropout_p`` draws from torch's global generator, which is
seeded from the case before every call with dropout (and left alone without), so forward and backward
see the same dropout mask. The function receives the case's own memory and presentation
(implementations/_torch.py: ``Arguments``, ``forward``, ``vjp``): strides and offsets, one buffer or one
object behind two arguments, which inputs ask for a gradient, the autograd context.

What the signature cannot say (all-blocked-row policy, causal alignment, missing gradient, dtypes,
and ``mask_sense=blocked`` for a function whose boolean mask means True = blocked, as in
``nn.MultiheadAttention``) comes from ``--declare KEY=VALUE`` on the command line; the defaults claim everything the
signature can express plus the spec's all-blocked policy (zeros) and bitwise repeatability.

``is_causal`` together with a mask reaches the function through its own arguments (``is_causal=True``
and ``attn_mask``), so a function that drops one of the two when both are given is caught
(CAUSAL-WITH-MASK-ARGS-05). Some functions refuse the combination: torch 2.13's SDPA takes it on its
flash path and raises "Explicit attn_mask should not be set when is_causal=True" on the math path
(dropout, Dk != Dv). ``Declaration.causal_with_mask`` decides: True passes both and any error is the
function's; False always folds the causal part into the mask (in the declared alignment) with
``is_causal=False``; None (the default) passes both and, when the call rejects the combination with
a declared ``rejects_with`` class (or NotApplicable), calls again with the causal part folded.
Those refusals are recorded in ``combination_refusals``. A boolean mask together with an additive
bias is folded into one float mask with ``-inf``.

A function wrapped by ``torch.compile`` is called with dynamo's recompile limits raised
(``_torch.compiled_throughout``): under the default limit it would run eagerly after its eighth input
structure, and the certification would test the eager function. Such a function compiles a program
per structure: ``--declare compiles_per_shape=true`` (or ``--discover``) takes the ci profile's
shapes from a few buckets.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from conformance.contract import PRESENTATION_ATTRIBUTES, TRANSFORMS, Case, Declaration, NotApplicable, capabilities

FUNCTION_DEFAULTS = Declaration(
    **capabilities(bias_grad=True),  # a float attn_mask gets its gradient, as torch's SDPA gives it
    mask_sense="attend",
    # Every presentation reaches the function (implementations/_torch.py: Arguments, forward, vjp).
    presents=frozenset(PRESENTATION_ATTRIBUTES),
    masks_combined=True,  # sdpa_kwargs folds a boolean mask and an additive M into one attn_mask
    gqa_flag=True,  # grouped heads are valid only with enable_gqa=True, as in torch's SDPA
    notes="plain function with the torch SDPA signature",
)


class FunctionAdapter:
    """Wraps ``fn`` (torch tensors in, a tensor out) into the adapter contract."""

    def __init__(self, fn: Callable, name: str, declaration: Declaration = FUNCTION_DEFAULTS, device: str = "cpu"):
        self.fn = fn
        self.name = name
        self.device = device
        self.combination_refusals: list[str] = []  # "Type: message" of each refused is_causal + mask call
        try:
            params = inspect.signature(fn).parameters
            self._accepts_gqa = "enable_gqa" in params or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
            )
        except (TypeError, ValueError):  # builtins without a signature: assume torch's
            self._accepts_gqa = True
        # without an enable_gqa parameter there is no GQA flag to call it without
        self.declaration = declaration.replace(device=device, gqa_flag=declaration.gqa_flag and self._accepts_gqa)

    def contexts(self) -> tuple[str, ...]:
        """The caller's contexts this adapter applies around its kernel (Presentation.context), from torch's API."""
        from implementations import _torch_contexts

        return _torch_contexts.names(self.device)

    def unavailable_reason(self) -> str | None:
        try:
            import torch
        except ImportError as exc:
            return f"torch is not importable ({exc}); plain SDPA-signature functions are called with torch tensors"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            return "no CUDA device: torch.cuda.is_available() is False"
        return None

    def _invoke(self, case: Case, args, fold_causal: bool):
        from implementations._torch import compiled_throughout, manual_seed, sdpa_kwargs

        decl = self.declaration
        kwargs = sdpa_kwargs(
            case,
            self.device,
            decl.causal_alignment,
            half_bias="query",
            mask_sense=decl.mask_sense,
            fold_causal=fold_causal,
            args=args,
        )
        if self._accepts_gqa and "enable_gqa" not in kwargs:
            kwargs["enable_gqa"] = False
        if case.dropout_p:  # only then: a kernel must leave the caller's generator alone without dropout
            manual_seed(case.seed)
        with compiled_throughout(self.fn):
            return self.fn(*args.qkv(case), **kwargs)

    def _rejects_combination(self, exc: Exception) -> bool:
        """A refusal of is_causal + attn_mask: NotApplicable, or a class the function declares it
        rejects invalid input with (matched by MRO name, bare or module-qualified)."""
        if isinstance(exc, NotApplicable):
            return True
        names = {n for cls in type(exc).__mro__ for n in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")}
        return bool(names & set(self.declaration.rejects_with))

    def _call(self, case: Case, args):
        both = case.is_causal and (case.mask is not None or case.bias is not None)
        mode = self.declaration.causal_with_mask
        if not both or mode is False:
            return self._invoke(case, args, fold_causal=True)
        try:
            return self._invoke(case, args, fold_causal=False)
        except Exception as exc:  # judged just below; anything else propagates
            if mode is True or not self._rejects_combination(exc):
                raise
            self.combination_refusals.append(f"{type(exc).__name__}: {exc}")
        return self._invoke(case, args, fold_causal=True)

    def forward(self, case: Case) -> np.ndarray:
        from implementations import _torch

        return _torch.forward(case, self.device, lambda args: self._call(case, args))

    def vjp(self, case: Case, grad_out: np.ndarray):
        from implementations import _torch

        return _torch.vjp(case, grad_out, self.device, lambda args: self._call(case, args))

    # the transforms a caller applies to the function (conformance/contract.py; implementations/_torch.py)
    transforms = frozenset(TRANSFORMS)

    def jvp(self, case: Case, tangents: dict):
        from implementations import _torch

        return _torch.jvp(case, tangents, self.device, lambda args: self._call(case, args))

    def vjp_vjp(self, case: Case, grad_out: np.ndarray, w: tuple):
        from implementations import _torch

        return _torch.vjp_vjp(case, grad_out, w, self.device, lambda args: self._call(case, args))

    def jvp_vjp(self, case: Case, grad_out: np.ndarray, tangents: dict):
        from implementations import _torch

        return _torch.jvp_vjp(case, grad_out, tangents, self.device, lambda args: self._call(case, args))

    def vmap_forward(self, cases: list) -> np.ndarray:
        from implementations import _torch

        return _torch.vmap_forward(cases, self.device, lambda args: self._call(cases[0], args))

    def vmap_vjp(self, cases: list, grad_outs: list) -> tuple:
        from implementations import _torch

        return _torch.vmap_vjp(cases, grad_outs, self.device, lambda args: self._call(cases[0], args))

    def fake_forward(self, case: Case) -> tuple:
        from implementations import _torch

        return _torch.fake_forward(case, self.device, lambda args: self._call(case, args))
