"""The rows of the performance profile: one fixed (B, Hq, Hkv, T, S, D, dtype, is_causal) each.

The seed fixes the shape of every measurement (003_648455d5abd16778.txt, 工程实现: "验证时应固定 B、h、
T_q、T_k、d、dtype、is_causal，分别检查输出容差、反向梯度、峰值显存和延迟") and keeps decode apart from
prefill ("Decode 阶段 T_q=1，瓶颈与长序列 Prefill 不同，不能用一组 benchmark 概括两者"), so a row is a
frozen shape and the two kinds are separate grids, reported separately and never averaged together:

* **prefill**: T = S from 256 up, head dims 64 and 128, causal on and off;
* **decode**: T = 1 against a cache of S = 1 024 up to 32 768 keys, with the seed's GQA example
  Q = [B, 32, 1, 128], K = V = [B, 8, S, 128] (causal off: a decode query sees the whole cache).

Grids (``--perf-grid``): ``tiny`` is the feature's own self-test (seconds), ``quick`` the CI-sized
CPU profile, ``full`` the issue's whole ladder (T = S to 16 384, S to 32 768), which on a CPU is cut
by the per-row time budget and on every device by the memory estimate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from conformance.contract import Case, np_dtype
from conformance.harness.cases.build import cast, rng_for

PREFILL, DECODE = "prefill", "decode"
GRIDS = ("tiny", "quick", "full")


@dataclass(frozen=True)
class Row:
    kind: str  # PREFILL or DECODE
    B: int
    Hq: int
    Hkv: int
    T: int
    S: int
    D: int
    dtype: str
    causal: bool

    @property
    def key(self) -> str:
        """A stable id: ``prefill B1 H8/8 T2048 S2048 D64 float32 causal``."""
        causal = " causal" if self.causal else ""
        return (
            f"{self.kind} B{self.B} H{self.Hq}/{self.Hkv} T{self.T} S{self.S} D{self.D} {self.dtype}{causal}"
        ).strip()

    def as_dict(self) -> dict:
        return asdict(self)

    def flops(self) -> int:
        """Multiply-adds x 2 of the two GEMMs (Q K^T and P V), causal masking not discounted."""
        return 4 * self.B * self.Hq * self.T * self.S * self.D

    def input_bytes(self) -> int:
        item = np_dtype(self.dtype).itemsize
        return item * self.B * (self.Hq * self.T * self.D + 2 * self.Hkv * self.S * self.D)

    def matrix_bytes(self) -> int:
        """Bytes of one [B, Hq, T, S] score matrix in the working dtype: what a tiled kernel avoids."""
        return np_dtype(self.dtype).itemsize * self.B * self.Hq * self.T * self.S


@dataclass(frozen=True)
class GridSpec:
    prefill_sizes: tuple[int, ...]
    prefill_dims: tuple[int, ...]
    prefill_heads: int
    decode_sizes: tuple[int, ...]
    decode_heads: tuple[int, int]  # (Hq, Hkv)
    decode_dim: int
    batch: int = 1
    causal: tuple[bool, ...] = (False, True)


SPECS: dict[str, GridSpec] = {
    "tiny": GridSpec((64, 128, 256), (32,), 1, (256, 512), (4, 2), 32),
    "quick": GridSpec((256, 512, 1024, 2048), (64,), 2, (1024, 4096, 16384), (32, 8), 128),
    "full": GridSpec(
        (256, 512, 1024, 2048, 4096, 8192, 16384),
        (64, 128),
        8,
        (1024, 2048, 4096, 8192, 16384, 32768),
        (32, 8),
        128,
    ),
}


def rows(grid: str, dtypes: list[str], *, gqa: bool = True) -> list[Row]:
    """Every row of ``grid`` for ``dtypes``: prefill first (by D, causal, S), then decode (by S).

    ``gqa=False`` keeps the decode grid's shapes but with Hkv = Hq (the cache then holds 32 heads),
    so a kernel without GQA support is still profiled in decode; the row says so by its heads.
    """
    spec = SPECS[grid]
    out = []
    for dtype in dtypes:
        for D in spec.prefill_dims:
            for causal in spec.causal:
                for n in spec.prefill_sizes:
                    out.append(Row(PREFILL, spec.batch, spec.prefill_heads, spec.prefill_heads, n, n, D, dtype, causal))
        hq, hkv = spec.decode_heads
        for S in spec.decode_sizes:
            out.append(Row(DECODE, spec.batch, hq, hkv if gqa else hq, 1, S, spec.decode_dim, dtype, False))
    return out


def case_for(row: Row, seed: int = 0) -> Case:
    """Standard-normal inputs of the row's shape and dtype (drawn in float32 to keep big rows cheap)."""
    rng = rng_for(seed + row.S + 7 * row.D)

    def draw(*shape: int) -> np.ndarray:
        return cast(rng.standard_normal(shape, dtype=np.float32), row.dtype)

    return Case(
        query=draw(row.B, row.Hq, row.T, row.D),
        key=draw(row.B, row.Hkv, row.S, row.D),
        value=draw(row.B, row.Hkv, row.S, row.D),
        is_causal=row.causal,
        seed=seed,
        label=row.key,
    )


def estimated_bytes(row: Row, linear: bool) -> int:
    """A generous estimate of what one call of the row needs: inputs, their copies, the output, and
    (unless the kernel claims linear memory) a few [B, H, T, S] float32 matrices."""
    base = 4 * row.input_bytes()
    if linear:
        return base
    return base + 4 * row.B * row.Hq * row.T * row.S * 4
