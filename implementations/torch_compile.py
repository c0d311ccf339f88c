"""``torch.compile`` of ``torch.nn.functional.scaled_dot_product_attention`` (inductor), forward and backward.

What users ship when they compile a model: the SDPA call traced by dynamo and compiled by inductor
(C++ on the CPU, Triton on CUDA), one program per input structure (``dynamic=False``: shapes,
strides, dtypes and the scalar arguments are baked in, as inductor specializes best), the backward
compiled by AOTAutograd the first time a structure needs one. The translation of a Case is
torch-sdpa's (implementations/torch_sdpa.py: mask sense, causal folded into a mask given together
with one, a boolean mask and an additive M as one ``attn_mask``, GQA through ``enable_gqa``); only
the function called differs, so a difference between the two certificates is the compiler's.

Why the recompile limits are raised for every call (``_torch.compiled_throughout``): dynamo compiles
at most ``torch._dynamo.config.recompile_limit`` (8) programs for one function and then runs every
new structure *eagerly*, with a warning. A certification gives the kernel hundreds of structures;
under the default limit it would certify eager SDPA after the eighth.

Measured on this build (torch 2.13.0+cpu, gcc, 2 threads; ``python -m conformance.discover
--impl=torch-compile`` re-measures, ``tests/test_compiled_adapters.py`` checks the declaration): see
the declaration's notes. Compiling costs about 0.5 s per new structure without a mask and 3 s with
one (cold: gcc builds the mask's C++ kernel), 0.3 s from inductor's warm on-disk cache
(``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``): so it declares
``compiles_per_shape`` and the ci profile takes its shapes from a few buckets.
"""

from __future__ import annotations

import shutil
from typing import Any

import torch
import torch.nn.functional as F

from conformance.contract import Declaration
from implementations._torch import compiled_throughout
from implementations.torch_sdpa import _CPU, _CUDA, TorchSDPA

__all__ = ["TorchCompile", "cpu", "cuda"]


class TorchCompile(TorchSDPA):
    """torch-sdpa's translation, calling ``torch.compile(F.scaled_dot_product_attention)`` instead."""

    def __init__(self, name: str, declaration: Declaration, device: str = "cpu") -> None:
        super().__init__(name, declaration, device=device)
        self._compiled: Any = None

    def __repr__(self) -> str:
        return f"TorchCompile({self.name!r}, device={self.device!r})"

    # Forward AD, a double backward and vmap of a compiled function recompile it per transform and shape (minutes
    # on the CPU); torch-sdpa answers the transform clauses for the same function uncompiled.
    transforms: frozenset[str] = frozenset()

    def _probe(self) -> str | None:
        reason = super()._probe()
        if reason is None and self.device == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            return "no C++ compiler on PATH (g++, c++ or clang++): inductor compiles CPU kernels with one"
        return reason

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self._compiled is None:
            self._compiled = torch.compile(F.scaled_dot_product_attention, dynamic=False, fullgraph=True)
        with compiled_throughout():
            return self._compiled(q, k, v, **kwargs)


cpu = TorchCompile(
    "torch-compile",
    _CPU.replace(
        compiles_per_shape=True,
        notes=(
            "torch 2.13 CPU, torch.compile(F.scaled_dot_product_attention, dynamic=False, fullgraph=True), "
            "inductor; the recompile limits raised for every call (else dynamo runs eager after 8 shapes). "
            "Translation as torch-sdpa's. Declared as torch-sdpa's CPU declaration, re-measured by discovery."
        ),
    ),
)

cuda = TorchCompile(
    "torch-compile-cuda",
    _CUDA.replace(
        compiles_per_shape=True,
        notes=(
            "NOT measured by the author (no CUDA device): torch.compile of torch SDPA on CUDA (inductor, "
            "Triton); declared as torch-sdpa-cuda; re-checked by tests/test_compiled_adapters.py on a CUDA machine."
        ),
    ),
    device="cuda",
)
