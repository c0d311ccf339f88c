"""Bugs that fire only past a size: head dims past 128, masks past a workspace, causal over many tiles,
a row's maximum in a late key tile, batches of more than 8 sequences, long decode histories, and a
backward tiled over keys.

Kernels change code path with size: a second head-dim tile, a streaming path once T x S outgrows a
workspace, tile skipping under is_causal once there is more than one tile, split-KV for long decode,
a launch grid over (batch, head) programs. Each path is right on the small shapes a casual test
tries and wrong past its threshold; the held-out mutants in ``tests/mutants_heldout.py`` are such
kernels, and no other clause reached their thresholds when these were written. Every case here is
small in the other dimensions (B = H = 1, a few query rows, narrow heads) so that the whole module
stays cheap in the ci profile, and uses only a few distinct shapes (each is a compilation for a
jitted kernel).
"""

from __future__ import annotations

from conformance.clauses.common import key_padding, supported
from conformance.clauses.test_causal import DECODE
from conformance.clauses.test_gradients import CHECK_GRADS as CHECK_AT_SIZES
from conformance.clauses.test_gradients import cotangent
from conformance.clauses.test_long_sequence import TILED
from conformance.clauses.test_varlen import PADDING
from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import cast, random_case, random_mask, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause

ONLINE = Source("003", "逐步推导", "FlashAttention 通过重计算和在线归一化避免保存完整矩阵。")


def _run_supported(impl: GuardedAdapter, cases: list[Case]) -> None:
    """Compare every case the kernel declares it supports; not applicable only if none is."""
    for case in supported(impl, cases):
        compare.assert_output_matches(impl, case)


@clause(
    "SIZE-HEAD-DIM-01",
    "head dims past 128 (256, and Dk = 192 != Dv = 136), up to the declared max_head_dim, give the oracle's output: "
    "every output column and every part of the dot product counts, scaled once",
    CHECK_AT_SIZES,
    kills=["head_dim_over_128_truncated", "qk_split_over_128_unscaled"],
)
def test_head_dims_past_128(impl, dtype):
    dims = ((256, 256), (192, 136))  # one Dk == Dv shape for kernels that need it; each is a compilation
    cases = [
        random_case(900 + i, B=1, Hq=2, T=3, S=9, Dk=Dk, Dv=Dv, dtype=dtype, label=f"Dk={Dk} Dv={Dv}")
        for i, (Dk, Dv) in enumerate(dims)
    ]
    _run_supported(impl, cases)


@clause(
    "SIZE-MASK-TILES-02",
    "a boolean mask is applied when T x S is past 2**16 (a streaming path), and is_causal blocks exactly the "
    "future over many key tiles (T = S = 260)",
    TILED,
    kills=["mask_ignored_past_workspace", "causal_skips_diagonal_tile"],
)
def test_mask_and_causal_over_many_tiles(impl, dtype):
    T = S = 260  # T x S = 67600 > 2**16 (2**20 would cost ~1.5 s per dtype and adapter)
    big = random_case(910, B=1, Hq=1, T=T, S=S, Dk=4, dtype=dtype, label="boolean mask, T x S past 2**16")
    cases = [
        big.replace(mask=random_mask(910, (1, 1, T, S), p_blocked=0.5)),
        random_case(911, B=1, Hq=1, T=T, S=S, Dk=4, dtype=dtype, is_causal=True, label="causal T = S = 260"),
    ]
    _run_supported(impl, cases)


def _late_maximum(dtype: str, seed: int = 920) -> Case:
    """T = 64, S = 300: every query's largest score (about +110 after scaling) sits at key 290, in a
    late key tile, far above the first tiles' scores (about +-5); a second large score at key 150."""
    rng = rng_for(seed)
    T, S, D = 64, 300, 8
    q = rng.standard_normal((1, 1, T, D))
    q[..., 0] = 4.0 + 0.25 * rng.standard_normal(T)
    k = rng.standard_normal((1, 1, S, D))
    k[..., 290, 0] = 78.0
    k[..., 150, 0] = 70.0
    v = rng.standard_normal((1, 1, S, D))
    return Case(
        cast(q, dtype), cast(k, dtype), cast(v, dtype), seed=seed, label="row maximum at key 290 of 300, ~110 above"
    )


@clause(
    "SIZE-ONLINE-MAX-03",
    "a row whose maximum score lies in a late key tile (key 290 of 300), ~110 above the first tiles' scores, "
    "gives the oracle's finite output: the running maximum and the running sum are both updated",
    ONLINE,
    kills=["row_max_from_first_tile@float32", "online_rescale_missed_after_256@float32"],
)
def test_late_row_maximum(impl, dtype):
    _run_supported(impl, [_late_maximum(dtype)])


@clause(
    "SIZE-BATCH-04",
    "a batch of 12 sequences with 6 heads (72 (batch, head) programs) and a [B,1,1,S] key padding mask of each "
    "sequence's own length gives the oracle's output for every sequence and head",
    PADDING,
    kills=["padding_mask_batch_past_8", "grid_wraps_past_64_programs"],
)
def test_many_sequences(impl, dtype):
    lengths = [10, 1, 7, 3, 9, 2, 8, 4, 6, 5, 1, 10][::-1]  # items 8.. differ from items 0..
    case = random_case(930, B=12, Hq=6, T=2, S=10, Dk=8, dtype=dtype, label="B = 12, H = 6, padding per sequence")
    _run_supported(impl, [case.replace(mask=key_padding(lengths, 10))])


@clause(
    "SIZE-DECODE-05",
    "decode (T = 1) against long key histories (S = 600, 2100), padded per sequence and with grouped heads: "
    "the single query's output is the oracle's (split-KV parts weighted by their share of the exp-sum)",
    DECODE,
    kills=["decode_split_kv_equal_weights@float32", "pv_accumulated_in_bf16@bfloat16"],
)
def test_long_decode(impl, dtype):
    S = 600
    padded = random_case(940, B=3, Hq=2, T=1, S=S, Dk=8, dtype=dtype, magnitude=2.0, label="decode, S = 600 padded")
    cases = [
        padded.replace(mask=key_padding([S, 301, 17], S)),
        random_case(941, B=1, Hq=4, Hkv=2, T=1, S=2100, Dk=8, dtype=dtype, magnitude=2.0, label="decode GQA, S = 2100"),
    ]
    _run_supported(impl, cases)


@clause(
    "SIZE-GRAD-06",
    "dQ, dK and dV match the oracle's VJP past query and key tile boundaries (T = 70, S = 129) and over 24 (batch, head) programs",
    CHECK_AT_SIZES,
    requires=["grad"],
    kills=["grad_tiled_drops_key_tail", "grad_grid_wraps_past_16"],
)
def test_backward_past_a_size(impl, dtype):
    cases = [
        random_case(951, B=1, Hq=2, T=70, S=129, Dk=8, dtype=dtype, label="backward, T = 70, S = 129"),
        random_case(952, B=3, Hq=8, T=2, S=9, Dk=8, dtype=dtype, label="backward, B x H = 24"),
    ]
    for i, case in enumerate(supported(impl, cases)):
        compare.assert_vjp_matches(impl, case, cotangent(case, 960 + i))
