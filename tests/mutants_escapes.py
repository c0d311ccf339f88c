"""Wrong kernels that a covering array of value classes reached, and still let through.

Each is the NumPy base kernel (tests/mutants.py) with one bug of a shape the pair coverage missed
while counting the pair it needs as reached:

* a pair reached only where a third value hides it (S = 1 makes dQ and dK zero whatever Dk is);
* a threshold inside a value class (one finite large negative M, -8192, stood for the whole class);
* dropout, left out of the covering array (and judged elsewhere through V = I probes only);
* state carried between calls of the same shapes, forward and backward (every covering row had
  shapes of its own);
* a mask rank the mask forms never built (3-D).

Each is correct whenever its trigger is false (see its docstring). Counted where a pair can show a bug,
with classes across their ranges, dropout and repeated calls in the array and every mask rank, the
covering clauses catch each one (their ``kills``; ``tests/test_escapes.py``); no other clause changed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.mutants import BaseKernel, mutant
from tests.mutants_features import DropoutKernel
from tests.mutants_pairs import PairGradKernel

ESCAPES: dict[str, Callable[[], object]] = {}


def escape(name: str) -> Callable[[type], type]:
    """Register a mutant (tests.mutants.MUTANTS: the covering clauses claim it) and list it as an escape."""

    def register(cls: type) -> type:
        mutant(name)(cls)
        ESCAPES[name] = lambda: cls(name)
        return cls

    return register


def _shapes(case) -> tuple:
    return (case.query.shape, case.key.shape, case.value.shape, case.dtype)


@escape("escape_grad_dq_head_dim_over_192")
class GradDqHeadDimOver192(PairGradKernel):
    """Hidden pair (Dk above 192 x the backward): the backward template for head dims above 192 keeps
    dQ's accumulator in a tile of 192 columns, so dQ[..., 192:] stays zero. Seen only where dQ is not
    zero anyway: not at S = 1, scale 0, or rows that see one key."""

    def vjp(self, case, grad_out):
        dq, dk, dv = super().vjp(case, grad_out)
        if case.Dk > 192:
            dq = dq.copy()
            dq[..., 192:] = 0
        return dq, dk, dv


@escape("escape_bias_threshold_1e6")
class BiasThreshold1e6(BaseKernel):
    """A threshold inside a class (finite large negative M): a finite M at or below -1e6 is read as a
    blocked key (the kernel's test for the masked entries of an additive mask), so a row whose M is
    that negative on every key gives the all-blocked fill instead of the softmax of its scores."""

    def blocked(self, case):
        b = super().blocked(case)
        if case.bias is not None:
            bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
            b = b | (bias <= -1e6)
        return b


@escape("escape_dropout_gqa_value_head")
class DropoutGqaValueHead(DropoutKernel):
    """Dropout x GQA: the training (dropout) forward maps query head h to value head h % Hkv instead
    of h // (Hq / Hkv). The weights are right, so a V = I probe (every value head the same) cannot see
    it, and the backward is a separate, correct kernel."""

    def forward(self, case):
        if not (case.dropout_p > 0 and case.is_gqa):
            return super().forward(case)
        self.validate(case)
        _, _, v = self.operands(case)  # v expanded to Hq: index h holds value head h // g
        g = case.Hq // case.Hkv
        v = v[:, (np.arange(case.Hq) % case.Hkv) * g]
        with np.errstate(invalid="ignore"):
            return self.finish(self.drop(case, self.weights(case)) @ v, case)


@escape("escape_cache_causal_large_head_dim")
class CacheCausalLargeHeadDim(BaseKernel):
    """A per-shape cache in the forward: the kernel for head dims of 64 and more is specialised on
    the first call of each (Q, K, V shapes, dtype) with is_causal baked in, and reused for later calls
    of those shapes whatever their is_causal."""

    def __init__(self, name="escape_cache_causal_large_head_dim"):
        super().__init__(name)
        self._causal: dict = {}

    def blocked(self, case):
        if case.Dk >= 64:
            case = case.replace(is_causal=self._causal.setdefault(_shapes(case), case.is_causal))
        return super().blocked(case)


@escape("escape_cache_grad_scale_large_head_dim")
class CacheGradScaleLargeHeadDim(PairGradKernel):
    """A per-shape cache in the backward: the backward for head dims of 64 and more is built on the
    first backward call of each (Q, K, V shapes, dtype) with that call's scale, and dQ, dK of later
    calls of those shapes are scaled by it."""

    def __init__(self, name="escape_cache_grad_scale_large_head_dim"):
        super().__init__(name)
        self._scale: dict = {}

    def bwd_scale(self, case):
        if case.Dk >= 64:
            return self._scale.setdefault(_shapes(case), self.scale(case))
        return self.scale(case)


@escape("escape_mask_3d_as_batch")
class Mask3dAsBatch(BaseKernel):
    """A 3-D mask read as [B, T, S] (``mask.unsqueeze(1)``, the convention of some model code): a
    [H, T, S] mask is applied per batch item instead of per head (and fails to broadcast when H is
    neither 1 nor B). 4-D and 2-D masks are read right."""

    def blocked(self, case):
        m = case.mask
        if m is not None and np.ndim(m) == 3:
            case = case.replace(mask=np.asarray(m)[:, None])
        return super().blocked(case)
