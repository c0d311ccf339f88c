"""``--signature``: which calling convention a plain function named by ``--impl=module:function`` has.

Kernel authors arrive with a function, not an adapter, and the function has the signature of the
API it replaces. Each name here maps to the adapter that translates the contract's case into that
signature (``implementations/``), and only translates: a feature the signature has no argument for
is declared unsupported, never emulated. ``sdpa`` (the default) is
``torch.nn.functional.scaled_dot_product_attention``'s; ``flash-attn`` is FlashAttention 2's
``flash_attn_func`` (``[B, T, H, D]``, causal bottom-right, windows, softcap, ALiBi, lse);
``flash-attn-varlen`` its ``flash_attn_varlen_func`` (sequences packed with cumulative lengths);
``flash-attn-kvcache`` its ``flash_attn_with_kvcache`` (contiguous or paged caches, appends, splits).

A sub-plugin of the conformance plugin (it adds the option); the plugin passes the chosen name to
:func:`conformance.harness.calls.registry.resolve`. Adapter objects and classes ignore it: they bring
their own translation, so naming a signature for one is a usage error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest

OPT_SIGNATURE = "signature"
DEFAULT = "sdpa"

# name -> (adapter class "module:attr", what the signature is, in one line)
SIGNATURES: dict[str, tuple[str, str]] = {
    "sdpa": (
        "implementations.function:FunctionAdapter",
        "fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)",
    ),
    "flash-attn": (
        "implementations.flash_attn_function:FlashAttnFunctionAdapter",
        "fn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, "
        "alibi_slopes=None, deterministic=False, return_attn_probs=False), [B, T, H, D], causal bottom-right",
    ),
    "flash-attn-varlen": (
        "implementations.flash_attn_function:FlashAttnVarlenFunctionAdapter",
        "fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...the same as flash-attn), "
        "packed [total, H, D], int32 cumulative lengths",
    ),
    "flash-attn-kvcache": (
        "implementations.flash_attn_kvcache:FlashAttnKVCacheFunctionAdapter",
        "fn(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, softmax_scale=None, "
        "causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, num_splits=0, "
        "return_softmax_lse=False), contiguous or paged [num_blocks, page_size, Hkv, D] caches",
    ),
}


def adapter_class(signature: str) -> Callable[..., Any]:
    """The adapter class for ``signature``; constructed as ``cls(fn, name=..., device=...)``."""
    if signature not in SIGNATURES:
        raise ValueError(f"unknown signature {signature!r}; known: {', '.join(SIGNATURES)}")
    module, _, attr = SIGNATURES[signature][0].partition(":")
    return getattr(importlib.import_module(module), attr)


def wrap(fn: Callable, name: str, signature: str = DEFAULT, device: str = "cpu") -> Any:
    """``fn`` as an adapter, through the translation of ``signature``."""
    return adapter_class(signature)(fn, name=name, device=device)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sdpa-conformance")
    group.addoption(
        "--signature",
        choices=list(SIGNATURES),
        default=DEFAULT,
        help="the signature of a plain function given as --impl=module:function: "
        + "; ".join(f"{n}: {doc}" for n, (_, doc) in SIGNATURES.items()),
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(OPT_SIGNATURE) != DEFAULT and not config.getoption("impl"):
        raise pytest.UsageError("--signature needs --impl=module:function: it says how to call that function")
