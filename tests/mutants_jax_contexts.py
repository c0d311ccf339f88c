"""jax kernels keyed on a switch of their caller's: jax's 64-bit mode, jax.jit disabled, the default matmul precision.

Each is the real jax adapter (implementations/jax_attention.py, jax.nn.dot_product_attention) whose call reads
jax's configuration at call time, inside the caller's context, and takes a wrong path under one switch only; right
everywhere else (CONTEXT-SWITCHES-01 walks the switches the adapter applies). jax is imported when a mutant is
built, so that this module loads where jax is not installed.
"""

from __future__ import annotations

from typing import Any

from conformance.contract import Case
from tests.mutants import mutant


def _keyed(name: str, when: Any, wrong: Any) -> Any:
    """The jax adapter whose arguments are ``wrong(case)`` while ``when(jax)`` holds."""
    import pytest

    jax = pytest.importorskip("jax")
    from implementations.jax_attention import JaxAttention, xla

    class Keyed(JaxAttention):
        def _args(self, case: Case) -> tuple[list[Any], dict[str, Any]]:
            return super()._args(wrong(case) if when(jax) else case)

    return Keyed(name, "xla", xla.declaration, transforms=xla.transforms)


class _Jax:
    """A mutant of the jax adapter: ``when`` reads jax's configuration, ``wrong`` is the path taken then."""

    @staticmethod
    def when(jax: Any) -> bool:  # pragma: no cover
        raise NotImplementedError

    @staticmethod
    def wrong(case: Case) -> Case:  # pragma: no cover
        raise NotImplementedError

    def __new__(cls, name: str = "jax-mutant"):
        return _keyed(name, cls.when, cls.wrong)


@mutant("jax_x64_off_drops_mask")
class JaxX64OffDropsMask(_Jax):
    """With jax's 64-bit mode off (jax's default, the mode a float32 or 16-bit caller runs in), a 32-bit path that
    drops the boolean mask and causal."""

    @staticmethod
    def when(jax: Any) -> bool:
        return not jax.config.jax_enable_x64

    @staticmethod
    def wrong(case: Case) -> Case:
        return case.replace(mask=None, is_causal=False)


@mutant("jax_jit_off_forgets_scale")
class JaxJitOffForgetsScale(_Jax):
    """Under jax.disable_jit() (a caller debugging op by op), an eager path that forgets the 1/sqrt(Dk) scale."""

    @staticmethod
    def when(jax: Any) -> bool:
        return bool(jax.config.jax_disable_jit)

    @staticmethod
    def wrong(case: Case) -> Case:
        return case.replace(scale=1.0)


@mutant("jax_matmul_precision_drops_bias")
class JaxMatmulPrecisionDropsBias(_Jax):
    """With a default matmul precision set (jax.default_matmul_precision), a fast path that drops the additive M
    and causal."""

    @staticmethod
    def when(jax: Any) -> bool:
        return jax.config.jax_default_matmul_precision is not None

    @staticmethod
    def wrong(case: Case) -> Case:
        return case.replace(bias=None, is_causal=False)
