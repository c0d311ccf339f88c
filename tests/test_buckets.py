"""Shape buckets (conformance/harness/cases/buckets.py): what a kernel compiling per shape is spared, and
that a clause still catches its mutants when the mutant says it compiles per shape.

The mutant self-tests (test_clauses_bite.py) run kernels that do not compile per shape, so they see
every clause's own shapes; here the same mutants run declaring ``compiles_per_shape=True``, where the
ci profile spreads a clause's shapes over the dtypes, and must still fail the clause in some dtype.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.contract import DTYPES, Declaration
from conformance.harness.cases import buckets
from tests.clause_runner import dtypes_for, load_clauses, run_clause


def _adapter(compiles: bool, dtypes=DTYPES):
    return SimpleNamespace(declaration=Declaration(dtypes=frozenset(dtypes), compiles_per_shape=compiles))


class CompilingPerShape:
    """``inner`` declaring ``compiles_per_shape=True``: the clauses treat it as they treat jax."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.declaration = inner.declaration.replace(compiles_per_shape=True)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_not_bucketed_keeps_everything():
    plain = _adapter(False)
    items = ["a", "b", "c", "d", "e"]
    assert all(buckets.spread(plain, d, items) == items for d in DTYPES)
    own = dict(B=3, Hq=2, T=4, S=9, Dk=5)
    assert buckets.dims(plain, "cross", **own) == {**own, "Hkv": 2, "Dv": 5}


@pytest.mark.parametrize("n_items", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("dtypes", [DTYPES, ("float32", "float16"), ("bfloat16",)])
def test_spread_checks_every_item_and_every_dtype(n_items, dtypes):
    """Each item runs in some declared dtype, each declared dtype runs at least one item, and no
    item runs twice unless a dtype would otherwise run nothing."""
    impl = _adapter(True, dtypes)
    items = list(range(n_items))
    per_dtype = {d: buckets.spread(impl, d, items) for d in dtypes}
    ran = [i for got in per_dtype.values() for i in got]
    assert set(ran) == set(items)
    assert all(per_dtype.values())
    assert len(ran) == max(n_items, len(dtypes))


def test_palette_shapes_are_of_their_class_and_shared():
    impl = _adapter(True)
    for cls, shape in buckets.PALETTE.items():
        own = {k: v for k, v in shape.items() if k in ("B", "Hq", "T", "S", "Dk")}
        assert buckets.dims(impl, cls, **own) == shape
    assert buckets.dims(impl, "self", B=1, Hq=3, T=9, S=9, Dk=16) == buckets.PALETTE["self"]


def test_dims_refuses_sizes_outside_the_class():
    with pytest.raises(ValueError):
        buckets.dims(_adapter(False), "self", B=1, Hq=1, T=3, S=4, Dk=8)
    with pytest.raises(ValueError):
        buckets.dims(_adapter(True), "decode", B=1, Hq=4, Hkv=2, T=1, S=4, Dk=8)  # GQA: not in the palette


# (clause, mutant) pairs of the clauses that spread their shapes or take the palette's; each mutant is
# one the clause claims.
SPREAD_KILLS = [
    ("XATTN-SHAPES-01", "kv_truncated_to_query_length"),
    ("XATTN-TILE-TAILS-02", "drop_key_tail_tile32"),
    ("XATTN-TILE-TAILS-02", "drop_query_tail_tile32"),
    ("XATTN-HEAD-DIMS-03", "scale_from_padded_head_dim"),
    ("SHAPE-OUT-01", "output_length_s"),
    ("SHAPE-WEIGHTS-02", "weights_transposed"),
    ("CAUSAL-ALIGN-02", "causal_bottom_right"),
    ("CAUSAL-DECODE-03", "causal_bottom_right"),
    ("CAUSAL-WITH-MASK-04", "mask_ignored_when_causal"),
    ("CAUSAL-WITH-MASK-ARGS-05", "mask_ignored_when_causal"),
    ("GQA-MAP-01", "gqa_wrong_mapping"),
    ("GQA-EXPAND-02", "gqa_first_kv_head_only"),
    ("MASK-BROADCAST-05", "mask_2d_as_padding"),
    ("MASK-BROADCAST-05", "mask_head0_for_all_heads"),
    ("FLOAT-MASK-ADD-12", "bias_as_boolean"),
    ("FLOAT-MASK-ADD-12", "bias_scaled"),
    ("MASK-PADDING-SELF-14", "padding_along_queries_when_square"),
    ("GRAD-VJP-01", "grad_no_softmax_row_term"),
    ("GRAD-VJP-01", "grad_dq_missing_scale"),
    ("GRAD-GQA-02", "grad_dk_not_summed_over_group"),
    ("SCALE-EQUIV-04", "scale_zero_means_default"),
    ("SCALE-EQUIV-04", "custom_scale_times_default"),
    # clauses on the palette's shapes (buckets.dims)
    ("SOFTMAX-AXIS-01", "softmax_query_axis"),
    ("SELF-CONSISTENT-01", "stale_result_cache"),
    ("SELF-CONSISTENT-01", "reused_accumulator"),
    ("INPUTS-LAYOUT-02", "assumes_c_contiguous"),
    ("SCALE-CUSTOM-03", "ignore_custom_scale"),
    ("DETERMINISM-01", "nondeterministic_noise"),
    ("MASK-BEFORE-SOFTMAX-01", "mask_after_softmax"),
    ("MASK-ALL-FALSE-08", "mask_times_neg_inf"),
    ("MASK-ALL-FALSE-08", "mask_sense_inverted"),
    ("MASK-BEFORE-SOFTMAX-01", "mask_sense_inverted"),
]


@pytest.mark.parametrize("clause_id, mutant", SPREAD_KILLS, ids=[f"{c}-{m}" for c, m in SPREAD_KILLS])
def test_spread_clauses_still_kill(clause_id, mutant):
    clauses = load_clauses()
    from tests.mutants import MUTANTS

    info = clauses[clause_id]
    assert mutant in info.kills
    results = [run_clause(info, CompilingPerShape(MUTANTS[mutant]()), d, shrink=False) for d in dtypes_for(info)]
    assert any(r.startswith("failed") for r in results), results
    base = [run_clause(info, CompilingPerShape(MUTANTS["base"]()), d) for d in dtypes_for(info)]
    assert all(r == "passed" for r in base), base


# The drawn clauses under buckets: each dtype draws from its own share of the structures
# (space.space_for(impl, dtype)) with the structure's own layout; a mutant that only one structure's
# features expose (a stride-0 head axis, a single key, GQA with a mask) must still fail in some dtype.
# (Measured once beyond these, 2026-12-03: every other kill these clauses claim holds on the shares too,
# but head_dim_one_unit_scale (GRAD-VJP-SPACE-04) and v_read_transposed_when_square (META-PERMUTE-01),
# which no bucketed structure exposes, before this change as after it.)
DRAWN_KILLS = [
    ("ORACLE-AGREE-01", "stride0_collapsed_on_head_axis"),
    ("ORACLE-AGREE-01", "gqa_wrong_mapping"),
    ("GRAD-VJP-SPACE-04", "grad_dq_missing_scale"),
    ("META-ROW-SHIFT-02", "softmax_no_max_subtraction"),
]


@pytest.mark.parametrize("clause_id, mutant", DRAWN_KILLS, ids=[f"{c}-{m}" for c, m in DRAWN_KILLS])
def test_drawn_clauses_still_kill_on_each_dtypes_share_of_structures(clause_id, mutant):
    from tests.mutants import MUTANTS

    info = load_clauses()[clause_id]
    assert any(k.split("@")[0] == mutant for k in info.kills)
    results = [run_clause(info, CompilingPerShape(MUTANTS[mutant]()), d, shrink=False) for d in dtypes_for(info)]
    assert any(r.startswith("failed") for r in results), results


def test_each_dtype_draws_its_own_share_of_the_structures():
    from conformance.harness.cases import strategies

    impl = _adapter(True)
    shares = [strategies.space_for(impl, d).structures for d in DTYPES]
    dealt = [s for share in shares for s in share]
    assert len(dealt) == len(set(dealt)) and set(dealt) == set(strategies.COMPILING_STRUCTURES)
    assert all(shares) and strategies.space_for(impl).structures == strategies.COMPILING_STRUCTURES
    one = _adapter(True, ("bfloat16",))
    assert strategies.space_for(one, "bfloat16").structures == strategies.COMPILING_STRUCTURES
    assert strategies.space_for(_adapter(False), "float32").structures is None
