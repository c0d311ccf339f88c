"""Every head dim and length across its range, not a few representatives: the sizes where kernels change path.

A kernel picks its code by size: a head-dim template per multiple of 16 or 32, a tail loop for the
last partial tile of keys or queries, a split of the key axis past 256 or 1024, a launch grid over
batch items and heads. Each path is right on the sizes a casual test tries and wrong past or between
its thresholds (a head dim of 72 is above 64 and a multiple of 8, but of neither 16 nor 32). The
covering array (COVER-PAIRS-*) meets each size class in pairs with everything else; these clauses
walk the sizes themselves, one small case each, so a bug keyed on a residue or a boundary shows
wherever it lies: every head dim from 1 to 17, every residue modulo 8, 16 and 32 above 64, and the
two neighbours of every power of two up to the declared maximum; key and query lengths from 1 to 17,
around every tile boundary from 32 to 2048 and at each residue of 8 and 16 past two tiles (queries under causal, so the causal tile skipping
meets every boundary); batch sizes and head counts up to 33 and 64 with grouped heads.

The sizes are dealt over the declared dtypes, each walked once per run, the boundaries (both
neighbours of 16, 32, 64, 128, 256, 1024) in every dtype. Kernels that compile a program per shape
(``compiles_per_shape``) walk the boundaries only, dealt too (``harness.cases.buckets.spread``).
"""

from __future__ import annotations

from conformance.clauses.common import key_padding
from conformance.contract import DTYPES, Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

SHAPE = Source("000", "§4 完整 Shape 检查", "注意力权重最后两维是 Query 长度 × Key 长度；")
HEAD_DIM = Source("000", "§5 为什么要按维度缩放", "除以 $\\sqrt{d_k}$ 后，方差重新回到约 1 的量级：")

POWERS = (32, 64, 128, 256, 512, 1024, 2048)
# head dims: 1..16, then around each power of two, and every residue of 8 mod 16 and of 16 mod 32 above 64
HEAD_DIMS = sorted(
    set(range(1, 18))
    | {n + d for n in (32, 64, 128, 256) for d in (-1, 0, 1)}
    | {24, 40, 48, 56, 72, 80, 88, 96, 104, 112, 120, 136, 144, 152, 160, 176, 192, 200, 208, 224, 240}
)
HEAD_DIM_BOUNDARIES = sorted({1, 2, 3, 8, 15, 16, 17, 63, 64, 65, 72, 80, 96, 127, 128, 129, 160, 255, 256})
# lengths: 1..17, around each tile boundary, and the residues of 8 mod 16 and 16 mod 32 past two tiles
LENGTHS = sorted(
    set(range(1, 18))
    | {n + d for n in (*POWERS, 48, 96, 192, 384, 768) for d in (-1, 0, 1)}
    | {72, 80, 88, 104, 112, 120, 136, 144, 160, 176, 200, 208, 240, 272, 300, 336, 400, 464, 520, 600, 700, 800, 900}
)
LENGTH_BOUNDARIES = sorted({1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025})
MAX_CAUSAL = 257  # T = S under causal up to here (one tile past 256): the oracle's T x S work stays small
# (B, Hq, Hkv): a launch grid over batch items and heads, grouped heads among them
GRIDS = [
    *((b, 2, 2) for b in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33)),
    *((1, h, h) for h in (1, 3, 5, 7, 9, 16, 17, 31, 32, 33, 64)),
    (2, 8, 1), (2, 12, 4), (1, 32, 8), (3, 16, 2), (1, 64, 8), (2, 33, 11), (4, 6, 3),
]  # fmt: skip
GRID_BOUNDARIES = [(1, 2, 2), (9, 2, 2), (17, 2, 2), (1, 17, 17), (1, 64, 64), (2, 8, 1), (1, 32, 8)]


def _values(impl: GuardedAdapter, dtype: str, every: list, boundaries: list) -> list:
    """What this dtype's run walks: the values dealt round robin over the declared dtypes, so that each is
    walked once per run (all of them where one dtype is declared), the boundaries in every dtype; for a
    kernel compiling per shape, the boundaries alone, dealt."""
    if buckets.bucketed(impl):
        return buckets.spread(impl, dtype, boundaries)
    declared = [d for d in DTYPES if d in impl.declaration.dtypes]
    if dtype not in declared:
        return every
    k, n = declared.index(dtype), len(declared)
    return sorted({*every[k::n], *boundaries}, key=every.index)


def _check_all(impl: GuardedAdapter, cases: list[Case]) -> None:
    """Each case the declaration takes against the oracle; not applicable only if it takes none."""
    taken = [c for c in cases if impl.supports(c)]
    if not taken:
        impl.require(cases[0])
    for case in taken:
        compare.assert_output_matches(impl, case)


@clause(
    "SWEEP-HEAD-DIMS-01",
    "every head dim from 1 to 16, each residue of 8 and 16 above 64 and both neighbours of every power of two up to "
    "the declared maximum (Dk = Dv) gives the oracle's output",
    HEAD_DIM,
    kills=["head_dim_residue_72", "head_dim_tail_over_64"],
)
def test_head_dims(impl, dtype):
    dims = _values(impl, dtype, HEAD_DIMS, HEAD_DIM_BOUNDARIES)
    limit = impl.declaration.max_head_dim
    cases = [
        random_case(2000 + d, B=1, Hq=2, T=3, S=7, Dk=d, dtype=dtype, label=f"head dim {d}")
        for d in dims
        if limit is None or d <= limit
    ]
    _check_all(impl, cases)


@clause(
    "SWEEP-KEY-LENGTHS-02",
    "every key length from 1 to 17 and both neighbours of every tile boundary up to 2049 gives the oracle's output, "
    "with and without a key padding mask",
    SHAPE,
    kills=["keys_tail_tile_dropped_at_96", "split_kv_past_1024_loses_last"],
)
def test_key_lengths(impl, dtype):
    lengths = _values(impl, dtype, LENGTHS, LENGTH_BOUNDARIES)
    cases = []
    for i, s in enumerate(lengths):
        case = random_case(2300 + s, B=1, Hq=2, T=2, S=s, Dk=8, dtype=dtype, label=f"S = {s}")
        if i % 2 and s > 2 and impl.declaration.bool_mask:  # every other length with padding: the masked path too
            case = case.replace(mask=key_padding([s - s // 3], s), label=f"S = {s}, padded")
        cases.append(case)
    _check_all(impl, cases)


@clause(
    "SWEEP-QUERY-LENGTHS-03",
    "every query length from 1 to 17 and both neighbours of every tile boundary gives the oracle's output: under "
    "is_causal with T = S up to 257, and against 16 keys up to 2049 queries",
    SHAPE,
    kills=["causal_tail_rows_unmasked", "query_tail_tile_dropped"],
)
def test_query_lengths(impl, dtype):
    lengths = _values(impl, dtype, LENGTHS, LENGTH_BOUNDARIES)
    decl = impl.declaration
    cases = []
    for t in lengths:
        if t <= MAX_CAUSAL and decl.causal:
            cases.append(
                random_case(
                    2600 + t, B=1, Hq=2, T=t, S=t, Dk=8, dtype=dtype, is_causal=True, label=f"T = S = {t}, causal"
                )
            )
        cases.append(random_case(2900 + t, B=1, Hq=2, T=t, S=16, Dk=8, dtype=dtype, label=f"T = {t}, S = 16"))
    _check_all(impl, cases)


@clause(
    "SWEEP-BATCH-HEADS-04",
    "batch sizes up to 33 and head counts up to 64, grouped heads among them (8:1, 3:1, 4:1), give the oracle's output: "
    "every batch item and head of a launch grid",
    SHAPE,
    kills=["grid_drops_batch_past_16", "heads_past_32_wrap"],
)
def test_batch_and_heads(impl, dtype):
    grids = _values(impl, dtype, GRIDS, GRID_BOUNDARIES)
    cases = [
        random_case(
            3200 + 7 * b + h + hkv,
            B=b,
            Hq=h,
            Hkv=hkv,
            T=3,
            S=5,
            Dk=8,
            dtype=dtype,
            label=f"B = {b}, Hq = {h}, Hkv = {hkv}",
        )
        for b, h, hkv in grids
    ]
    _check_all(impl, cases)
