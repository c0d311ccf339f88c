"""Kernels wrong at sizes no hand-picked case lands on: a residue of the head dim, the tail tile of the keys
or the queries, a split past 1024 keys, a launch grid past 16 batch items or 32 heads.

Each is the base kernel (tests/mutants.py) with one size-keyed path, as production kernels pick a
template by head dim and tile their loops; each is right on every size the covering array's classes
took in earlier runs (65, 250, 33, 63, ...) and wrong only where its own arithmetic of sizes says so.
Claimed by the SWEEP-* clauses (conformance/clauses/test_size_sweep.py), which walk the sizes.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.contract import Case
from tests.mutants import BaseKernel, mutant


@mutant("head_dim_residue_72")
class HeadDimResidue72(BaseKernel):
    """The head-dim template pads Dk to a multiple of 16 and takes the default scale of the padded dim:
    1/sqrt(80) at Dk = 72 (Dk > 64, Dk = 8 mod 16); right at 65, 250, 128 and every multiple of 16."""

    def scale(self, case: Case) -> float:
        if case.scale is None and case.Dk > 64 and case.Dk % 16 == 8:
            return 1.0 / math.sqrt(case.Dk + 8)
        return super().scale(case)


@mutant("head_dim_tail_over_64")
class HeadDimTailOver64(BaseKernel):
    """Above 64 the dot product runs in chunks of 32 features and its tail loop starts one chunk late: the
    last Dk mod 32 features are dropped when that remainder is a multiple of 8."""

    def raw_scores(self, case: Case, q, k, v):
        rest = case.Dk % 32
        if case.Dk > 64 and rest and rest % 8 == 0:
            keep = case.Dk - rest
            return q[..., :keep] @ np.swapaxes(k[..., :keep], -1, -2)
        return super().raw_scores(case, q, k, v)


@mutant("keys_tail_tile_dropped_at_96")
class KeysTailTileDroppedAt96(BaseKernel):
    """Past two tiles of 32 keys, a partial last tile whose length is a multiple of 16 is never loaded
    (the loop bound rounds down in steps of 32 there): S = 80, 112, 144, ... lose their last keys."""

    def blocked(self, case: Case) -> np.ndarray:
        b = super().blocked(case)
        rest = case.S % 32
        if case.S > 64 and rest and rest % 16 == 0:
            b = b.copy()
            b[..., case.S - rest :] = True
        return b


@mutant("split_kv_past_1024_loses_last")
class SplitKvPast1024LosesLast(BaseKernel):
    """Past 1024 keys the key axis is split in two and the second split's bound is off by one: the last
    key is never read."""

    def blocked(self, case: Case) -> np.ndarray:
        b = super().blocked(case)
        if case.S > 1024:
            b = b.copy()
            b[..., -1] = True
        return b


@mutant("causal_tail_rows_unmasked")
class CausalTailRowsUnmasked(BaseKernel):
    """Causal masking runs per full tile of 64 query rows; the rows of a partial last tile (T > 64, T not a
    multiple of 64) see every key."""

    def causal(self, T: int, S: int) -> np.ndarray:
        c = super().causal(T, S)
        rest = T % 64
        if T > 64 and rest:
            c = c.copy()
            c[T - rest :] = False
        return c


@mutant("query_tail_tile_dropped")
class QueryTailTileDropped(BaseKernel):
    """The grid over query tiles of 48 rows rounds down: the rows of a partial last tile (T > 48) are never
    written (zeros)."""

    def finish(self, out: np.ndarray, case: Case) -> np.ndarray:
        rest = case.T % 48
        if case.T > 48 and rest:
            out = out.copy()
            out[..., case.T - rest :, :] = 0
        return super().finish(out, case)


@mutant("grid_drops_batch_past_16")
class GridDropsBatchPast16(BaseKernel):
    """The launch grid's batch axis is capped at 16 programs: items from the 17th on are never computed."""

    def finish(self, out: np.ndarray, case: Case) -> np.ndarray:
        if case.B > 16:
            out = out.copy()
            out[16:] = 0
        return super().finish(out, case)


@mutant("heads_past_32_wrap")
class HeadsPast32Wrap(BaseKernel):
    """Head indices are kept in 5 bits: query head h >= 32 reads key/value head (h mod 32) of its group."""

    def expand(self, x: np.ndarray, hq: int) -> np.ndarray:
        full = super().expand(x, hq)
        if hq > 32:
            return full[:, np.arange(hq) % 32]
        return full
