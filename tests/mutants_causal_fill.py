"""Mutants for CAUSAL-EXACT-ZERO-06: is_causal applied as a finite score instead of a blocked set.

A causal mask built as an additive -1e4 upper triangle (float16-era code) or written over the scores
with ``masked_fill(triu, -1e9)`` is right while the scores stay far below the fill, which every
ordinary case does: only a future key scoring far above the visible ones shows it.
"""

from __future__ import annotations

import numpy as np

from tests.mutants import BaseKernel, mutant


class _FiniteCausal(BaseKernel):
    """is_causal as a finite score at the strict upper triangle instead of a blocked set."""

    def causal(self, T: int, S: int) -> np.ndarray:
        return np.zeros((T, S), dtype=bool)

    def raw_scores(self, case, q, k, v):
        raw = super().raw_scores(case, q, k, v)
        if not case.is_causal:
            return raw
        tri = np.triu(np.ones((case.T, case.S), dtype=bool), 1)
        return self.fill(raw, tri, self.scale(case))


@mutant("causal_additive_neg1e4")
class CausalAdditiveNeg1e4(_FiniteCausal):
    """Causal as an additive -1e4 upper triangle (a float16-era causal mask): a future key whose score
    exceeds the visible ones by ~1e4 keeps its weight."""

    def fill(self, raw, tri, scale):
        return raw + np.where(tri, -1e4 / scale, 0.0).astype(raw.dtype)


@mutant("causal_replace_neg1e9")
class CausalReplaceNeg1e9(_FiniteCausal):
    """Causal as ``masked_fill(triu, -1e9)``: right while every visible score is above -1e9."""

    def fill(self, raw, tri, scale):
        return np.where(tri, raw.dtype.type(-1e9 / scale), raw)
