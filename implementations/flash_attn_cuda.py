"""FlashAttention 2's own CUDA package (``flash_attn``) through the flash-attn signature adapters.

``flash-attn-cuda``, ``flash-attn-cuda-varlen`` and ``flash-attn-cuda-kvcache`` are
``flash_attn.flash_attn_func``, ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` on the
first CUDA device, translated by the same adapters as any user's function with those signatures.
What the signatures cannot say is declared from FlashAttention 2's documentation and source
(Dao-AILab/flash-attention, flash_attn_interface.py and csrc/flash_attn): float16 and bfloat16 only,
head dims up to 256 with Dk == Dv, an lse of +inf on rows that see no key (softmax.h writes INFINITY
when the row sum is 0), paged caches with pages that are multiples of 256 ("page_block_size must be
a multiple of 256"), no backward for the KV-cache call. Importing this module imports ``flash_attn``:
where it is missing, or there is no CUDA device, the three are unavailable with that reason.

Not yet run on a CUDA machine by this project: the declarations above are the documented ones, and
a certification run (``pytest --impl=flash-attn-cuda``) is what tests them.
"""

from __future__ import annotations

from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

from conformance.contract import LOW_PRECISION
from implementations.flash_attn_function import (
    FLASH_ATTN_DEFAULTS,
    FLASH_ATTN_VARLEN_DEFAULTS,
    FlashAttnFunctionAdapter,
    FlashAttnVarlenFunctionAdapter,
)
from implementations.flash_attn_kvcache import FLASH_ATTN_KVCACHE_DEFAULTS, FlashAttnKVCacheFunctionAdapter

FA2 = dict(
    dtypes=LOW_PRECISION,
    max_head_dim=256,
    requires_dk_eq_dv=True,
    lse_empty="+inf",
    page_size_multiple=256,
    notes="FlashAttention 2 CUDA package (flash_attn)",
)


class FlashAttnCuda(FlashAttnFunctionAdapter):
    def __init__(self) -> None:
        super().__init__(flash_attn_func, "flash-attn-cuda", FLASH_ATTN_DEFAULTS.replace(**FA2), device="cuda")


class FlashAttnCudaVarlen(FlashAttnVarlenFunctionAdapter):
    def __init__(self) -> None:
        decl = FLASH_ATTN_VARLEN_DEFAULTS.replace(**FA2)
        super().__init__(flash_attn_varlen_func, "flash-attn-cuda-varlen", decl, device="cuda")


class FlashAttnCudaKVCache(FlashAttnKVCacheFunctionAdapter):
    def __init__(self) -> None:
        decl = FLASH_ATTN_KVCACHE_DEFAULTS.replace(**FA2)
        super().__init__(flash_attn_with_kvcache, "flash-attn-cuda-kvcache", decl, device="cuda")
