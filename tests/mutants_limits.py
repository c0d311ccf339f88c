"""Kernels wrong only past a count's limit: a CUDA launch grid's 65 535, a 16-bit key index, the integers a
half-precision dtype holds exactly.

Each is the correct NumPy base of ``tests/mutants.py`` with one hook changed, right on every size below its
limit (so every other clause passes it) and wrong past it; claimed by the LIMITS-* clauses
(``conformance/clauses/test_limits.py``, ``test_limits_grid.py``), which judge them by structure: every slice
computed, a key a row may not see leaves the row bitwise unchanged, a key a row must see counts.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import np_dtype
from tests.mutants import BaseKernel, mutant

GRID_LIMIT = 65535  # CUDA's gridDim.y / gridDim.z
KEY_LIMIT = 65535  # a key index held in 16 bits (uint16's largest)


@mutant("grid_slices_past_65535_zero")
class GridSlicesPast65535Zero(BaseKernel):
    """Launches one program per (batch, head) slice on a grid axis capped at 65 535 and never loops over the
    rest: slices past the 65 535th (flattened b * Hq + h) are never computed and stay 0 (the output is
    zero-initialised)."""

    def forward(self, case):
        out = super().forward(case)
        flat = out.reshape(case.B * case.Hq, *out.shape[2:])
        flat[GRID_LIMIT:] = 0
        return out


@mutant("causal_positions_in_input_dtype")
class CausalPositionsInInputDtype(BaseKernel):
    """Builds the causal comparison from positions held in the input dtype (an ``arange`` created with the
    query's dtype): bfloat16 holds the integers exactly up to 256, float16 up to 2048; past that, positions
    round together and query i sees key i + 1 (256 sees 257 in bfloat16, 2048 sees 2049 in float16)."""

    def blocked(self, case):
        self._dtype = case.dtype
        return super().blocked(case)

    def causal(self, T, S):
        dtype = getattr(self, "_dtype", "float32")
        if dtype not in ("float16", "bfloat16"):
            return super().causal(T, S)
        i = np.arange(T).astype(np_dtype(dtype)).astype(np.float64)
        j = np.arange(S).astype(np_dtype(dtype)).astype(np.float64)
        return j[None, :] > i[:, None]


@mutant("keys_past_65535_dropped")
class KeysPast65535Dropped(BaseKernel):
    """Walks the key axis with a 16-bit counter: keys past the 65 535th never take part (as if blocked)."""

    def blocked(self, case):
        b = super().blocked(case)
        if case.S > KEY_LIMIT:
            b = b.copy()
            b[..., KEY_LIMIT:] = True
        return b
