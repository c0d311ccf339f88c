"""Mutants of the performance claims: the evidence for MEM-SCALING-01 and BACKEND-01.

Their numbers are right (each is the correct base kernel's arithmetic); what is wrong is a claim:
linear memory from a kernel that materialises T x S, a backend that is not the one that ran, a
backend declared with nothing to show for it, and the case the seed warns about, calling the same
API and assuming FlashAttention ran (003_648455d5abd16778.txt, 工程实现).
"""

from __future__ import annotations

from tests.mutants import BaseKernel, mutant


@mutant("materialises_declares_linear")
class MaterialisesDeclaresLinear(BaseKernel):
    """Declares FlashAttention-style linear memory, but forms the [B, H, T, S] scores and weights."""

    def __init__(self, name: str = "materialises_declares_linear"):
        super().__init__(name)
        self.declaration = self.declaration.replace(memory_scaling="linear")


@mutant("reports_other_backend")
class ReportsOtherBackend(BaseKernel):
    """Declares its tiled path, while its own report says the dense one ran."""

    def __init__(self, name: str = "reports_other_backend"):
        super().__init__(name)
        self.declaration = self.declaration.replace(backend="numpy-tiled")


@mutant("declares_backend_without_report")
class DeclaresBackendWithoutReport(BaseKernel):
    """Declares ``backend=flash`` and offers no way to see which kernel ran."""

    kernel_ran = None  # no report: the claim rests on the name of the API alone

    def __init__(self, name: str = "declares_backend_without_report"):
        super().__init__(name)
        self.declaration = self.declaration.replace(backend="flash")


@mutant("torch_math_declares_flash")
class TorchMathDeclaresFlash:
    """torch's SDPA with the MATH backend forced, declared as FlashAttention: the same API, another kernel."""

    def __init__(self, name: str = "torch_math_declares_flash"):
        from implementations.torch_sdpa import cpu_math

        self.name = name
        self._inner = cpu_math
        self.declaration = cpu_math.declaration.replace(backend="flash")

    def forward(self, case):
        return self._inner.forward(case)

    def vjp(self, case, grad_out):
        return self._inner.vjp(case, grad_out)

    def kernel_ran(self, case):
        return self._inner.kernel_ran(case)
