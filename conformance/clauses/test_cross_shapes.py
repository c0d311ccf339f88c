"""§4 and §6.2 of 000_f3dcd408372d9e02.txt: cross-attention shapes, degenerate sizes, tile tails.

A kernel that is right on the shapes its author tried can still be wrong at T != S, at B = H = S = 1,
at a sequence length one past a tile boundary, or at a head dim that is not a multiple of 8. These
clauses run each shape the kernel declares it supports and report the others as not applicable
only when *none* is supported, so that a kernel limited to Dk == Dv (FlashAttention, jax) is still
checked on every shape it takes. A kernel that compiles per shape runs, in the ci profile, each
shape in one of its dtypes (``buckets.spread``): every shape once per run instead of once per dtype.
"""

from __future__ import annotations

from conformance.contract import Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

CROSS = Source("000", "§6.2 Cross-Attention", "因此，实现注意力时不能把 $K$ 、 $V$ 强行 reshape 成 Query 的长度 $T$ 。")
KEY_AXIS = Source("003", "输入与输出", "Softmax 沿最后一维 T_k 归一化。")
HEAD_DIM = Source(
    "003",
    "工程实现",
    "融合 kernel 有 dtype、设备、head dimension、Mask 等限制；不能仅凭调用了同一个 API 就断言实际使用了 FlashAttention。",
)

# (B, Hq, T, S, Dk, Dv): each breaks an assumption some kernel makes.
CROSS_SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (2, 2, 3, 7, 8, 8),  # T < S
    (1, 3, 7, 3, 8, 8),  # T > S, B = 1
    (2, 1, 4, 1, 8, 8),  # H = 1, S = 1: one key, weight 1
    (1, 1, 1, 1, 8, 8),  # everything 1
    (2, 2, 3, 5, 8, 6),  # Dk > Dv (§9's sizes)
    (2, 2, 5, 3, 4, 16),  # Dk < Dv
)

# (T, S) one below or one above the tile sizes kernels use (32, 64, 128), for queries and keys
# alike, and one S > 1000. Four shapes rather than all twelve pairings: every extra shape is another
# compilation for a jitted kernel, and a dropped tail shows at any of them.
TILE_TAILS: tuple[tuple[int, int], ...] = ((33, 31), (63, 129), (129, 65), (3, 1031))

ODD_HEAD_DIMS: tuple[tuple[int, int], ...] = ((5, 5), (12, 12), (20, 20), (5, 12), (20, 12))


def _run_supported(impl, dtype: str, cases: list[Case]) -> None:
    """Compare every case the kernel declares it supports (for a kernel compiling per shape, in the
    ci profile, those of them that fall to ``dtype``); not applicable only if none is supported."""
    reasons = []
    supported = []
    for case in cases:
        why = impl.declaration.not_supported_reasons(case)
        if why:
            reasons.append(f"{case.describe()}: {'; '.join(why)}")
        else:
            supported.append(case)
    if not supported:
        impl.not_applicable("no shape of this clause is supported: " + " | ".join(reasons[:3]))
    for case in buckets.spread(impl, dtype, supported):
        compare.assert_output_matches(impl, case)  # a kernel refusing a declared shape fails (undeclared refusal)


@clause(
    "XATTN-SHAPES-01",
    "T != S both ways, Dk != Dv both ways, and B = 1, H = 1, S = 1 give the oracle's output",
    CROSS,
    kills=["kv_truncated_to_query_length", "output_length_s"],
)
def test_cross_attention_shapes(impl, dtype):
    cases = [
        random_case(
            400 + i, B=B, Hq=H, T=T, S=S, Dk=Dk, Dv=Dv, dtype=dtype, label=f"B={B} H={H} T={T} S={S} Dk={Dk} Dv={Dv}"
        )
        for i, (B, H, T, S, Dk, Dv) in enumerate(CROSS_SHAPES)
    ]
    _run_supported(impl, dtype, cases)


@clause(
    "XATTN-TILE-TAILS-02",
    "sequence lengths just below and above tile boundaries (31/33, 63/65, 127/129) and S > 1000: every key and every query row counts",
    KEY_AXIS,
    kills=["drop_key_tail_tile32", "drop_query_tail_tile32", "fp16_out_float32_past_t64@float16"],
)
def test_tile_tails(impl, dtype):
    cases = [
        random_case(410 + i, B=1, Hq=2, T=T, S=S, Dk=16, dtype=dtype, label=f"tile tail T={T} S={S}")
        for i, (T, S) in enumerate(TILE_TAILS)
    ]
    _run_supported(impl, dtype, cases)


@clause(
    "XATTN-HEAD-DIMS-03",
    "head dims that are not a multiple of 8 (5, 12, 20, and Dk != Dv among them), up to the declared max_head_dim, give the oracle's output",
    HEAD_DIM,
    kills=["scale_from_padded_head_dim"],
)
def test_odd_head_dims(impl, dtype):
    cases = [
        random_case(420 + i, B=2, Hq=2, T=4, S=6, Dk=Dk, Dv=Dv, dtype=dtype, magnitude=1.5, label=f"Dk={Dk} Dv={Dv}")
        for i, (Dk, Dv) in enumerate(ODD_HEAD_DIMS)
    ]
    _run_supported(impl, dtype, cases)
