"""The case space: the drawn configurations, their coverage cells, and fail-fast order.

* ``harness.cases.strategies.configs`` draws only what a declaration admits, and its rows blocked entirely
  respect the declared policies (it never draws a case whose fill the declaration leaves undefined);
* a failing drawn clause prints a shrunk case whose shape, mask and values are small and readable;
* ``harness.run.coverage`` classifies cases into the cells the issue names ("padding [B,1,1,S] x
  T == S", "float -inf row", "GQA 8:1 x decode T = 1", ...), admits cells by declaration, lists the
  admitted cells a run never reached, and sums the same counts under pytest-xdist as serially;
* ``harness.run.ordering`` runs the cheap broad clauses first, and those clauses catch the typical bugs.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import oracle
from conformance.contract import Declaration
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases import strategies
from conformance.harness.cases.build import random_case
from conformance.harness.records import coverage_tables
from conformance.harness.run import coverage, ordering
from tests.clause_runner import load_clauses, run_clause
from tests.mutants import MUTANTS

pytest_plugins = ["pytester"]
CLAUSES = load_clauses()
CLAUSE_DIR = Path(__file__).resolve().parents[1] / "conformance" / "clauses"

DECLARATIONS = {
    "everything": Declaration(gqa=True, float_mask=True, grad=True),
    "article (no GQA, float mask, custom scale)": Declaration(gqa=False, float_mask=False, custom_scale=False),
    "jax-like (Dk == Dv, mean-v / nan fills)": Declaration(
        gqa=True, float_mask=True, requires_dk_eq_dv=True, all_blocked="mean-v", all_blocked_float_mask="nan"
    ),
    "bottom-right, nan fill, max head dim 16": Declaration(
        gqa=True, float_mask=True, causal_alignment="bottom-right", all_blocked="nan", max_head_dim=16
    ),
}


def _draw_all(
    decl: Declaration, n: int, *, grad: bool = False, sp: strategies.Space = strategies.CI_SPACE, dtype: str = "float32"
) -> list:
    drawn = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None)
    @given(data=st.data())
    def collect(data):
        drawn.append(data.draw(strategies.configs(decl, dtype, sp=sp, grad=grad)))

    collect()
    return drawn


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_draws_only_what_the_declaration_admits(name):
    decl = DECLARATIONS[name]
    admitted = set(coverage.admitted(decl))
    for d in _draw_all(decl, 40):
        assert not decl.not_supported_reasons(d.case), (name, d)
        outside = set(coverage.cells_of(d.case)) - admitted
        assert not outside, (name, outside, d)


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_rows_blocked_entirely_only_where_the_fill_is_declared(name):
    """Every all-blocked row was meant (its label says so), and none appears where the declaration
    leaves the fill undefined: both mask kinds with differing fills, -inf under causal, NaN in a VJP."""
    decl = DECLARATIONS[name]
    for grad in (False, True):
        for d in _draw_all(decl, 30, grad=grad):
            c = d.case
            empty = oracle.forward(c, causal_alignment=decl.causal_alignment).all_blocked
            allowed = strategies.empty_rows_allowed(
                decl, has_mask=c.mask is not None, has_bias=c.bias is not None, is_causal=c.is_causal, grad=grad
            )
            if not allowed:
                assert not empty.any(), (name, grad, d)
            if empty.any() and not (c.is_causal and decl.causal_alignment == "bottom-right" and c.T > c.S):
                assert d.empty_rows, ("rows blocked entirely that were not drawn on purpose", d)


def test_space_reaches_the_named_features():
    """The drawn space itself (200 examples, one declaration) reaches every feature it is meant to draw."""
    decl = DECLARATIONS["everything"]
    seen = Counter(f for d in _draw_all(decl, 200) for f in coverage.features_of(d.case))
    meant = [f for f in coverage.FEATURES if f not in ("dropout", "long keys S >= 4096")]
    # tile tails are drawn rarely on purpose (the ci profile stays cheap); the rest must all appear
    missing = [f for f in meant if not seen[f] and "tile-tail" not in f]
    assert not missing, missing


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_compiling_kernels_meet_few_structures(name):
    """A kernel that compiles per shape (``compiles_per_shape=True``) gets the ci profile's few
    structures: every drawn case keys one of at most len(COMPILING_STRUCTURES) compiled programs,
    and each is still admitted by the declaration, across the declared dtypes (each draws its share)."""
    decl = DECLARATIONS[name]
    sp = strategies.space_for(SimpleNamespace(declaration=decl.replace(compiles_per_shape=True)))
    assert sp.structures == strategies.COMPILING_STRUCTURES
    assert strategies.space_for(SimpleNamespace(declaration=decl)) is strategies.CI_SPACE
    keys = set()
    # each declared dtype draws from its share of the structures (harness.cases.space.share)
    drawn = [d for dtype in decl.dtypes for d in _draw_all(decl, 30, sp=sp, dtype=dtype)]
    for d in drawn:
        c = d.case
        assert not decl.not_supported_reasons(c), d
        shapes = tuple(None if a is None else np.shape(a) for a in (c.query, c.key, c.value, c.mask, c.bias))
        keys.add((shapes, c.is_causal, c.scale))
    assert 3 <= len(keys) <= len(strategies.COMPILING_STRUCTURES), keys


def _cells(case) -> set[str]:
    return set(coverage.cells_of(case))


def test_cells_the_issue_names():
    padding = np.zeros((3, 1, 1, 7), dtype=bool)
    padding[1, ..., 4:] = True
    case = random_case(1, B=3, Hq=2, T=7, S=7, mask=padding)
    assert "bool mask padding [B,1,1,S] × T == S" in _cells(case)

    bias = np.zeros((2, 1, 4, 6))
    bias[1, 0, 2, :] = -np.inf
    case = random_case(2, B=2, Hq=2, T=4, S=6, bias=bias)
    assert {"row blocked entirely: float -inf × T < S", "float mask [B,1,T,S] × T < S"} <= _cells(case)

    case = random_case(3, B=2, Hq=8, Hkv=1, T=1, S=5)
    assert {"GQA 8:1 × decode T = 1", "MQA (Hkv = 1 < Hq) × decode T = 1", "GQA 8:1 × T < S"} <= _cells(case)

    case = random_case(4, T=5, S=5, mask=np.zeros((5, 5), dtype=bool), is_causal=True)
    assert {"causal + bool mask × T == S", "bool mask [T,S] × T == S"} <= _cells(case)

    base = random_case(5, B=2, Hq=2, T=3, S=1, Dk=33, Dv=5)
    stride0 = base.replace(key=np.broadcast_to(base.key[:1], base.key.shape))
    assert {"broadcast (stride 0) input × S = 1", "tile-tail head dim (31..129) × T > S", "Dk != Dv × S = 1"} <= _cells(
        stride0
    )
    transposed = base.replace(query=np.ascontiguousarray(base.query.swapaxes(1, 2)).swapaxes(1, 2))
    assert "non-contiguous input × T > S" in _cells(transposed)
    assert not coverage.cells_of(base.replace(query=np.zeros((2, 3))))  # a bad-input case is in no cell


def test_admitted_cells_follow_the_declaration():
    full = set(coverage.admitted(DECLARATIONS["everything"]))
    article = set(coverage.admitted(DECLARATIONS["article (no GQA, float mask, custom scale)"]))
    jax_like = set(coverage.admitted(DECLARATIONS["jax-like (Dk == Dv, mean-v / nan fills)"]))
    assert "GQA 8:1 × decode T = 1" in full and not any("GQA" in c for c in article)
    assert not any(c.startswith(("float mask", "custom scale")) for c in article)
    assert not any(c.startswith("Dk != Dv") for c in jax_like)
    assert "bool mask [B,1,T,S] × decode T = 1" not in full  # reads as [B,1,1,S] at T = 1


def test_table_lists_admitted_cells_never_reached():
    decl = DECLARATIONS["everything"]
    reached = Counter({"causal × T == S": 3, "GQA 8:1 × decode T = 1": 1, "not a cell": 5})
    rec = coverage_tables.cells_table(reached, decl)
    assert rec["reached"] == 2 and rec["admitted"] == len(coverage.admitted(decl))
    assert "GQA 8:1 × decode T = 1" not in rec["not_reached"] and "causal × T < S" in rec["not_reached"]
    assert rec["rows"]["causal"]["T == S"] == 3 and rec["rows"]["GQA 8:1"]["T < S"] == 0
    assert rec["rows"]["bool mask [B,1,T,S]"]["decode T = 1"] is None
    text = "\n".join(coverage_tables.cells_markdown(rec))
    assert "| causal | **0** | 3 |" in text and "never reached in this run: " in text and "causal × T < S" in text


def test_guarded_calls_count_cells():
    impl = GuardedAdapter(MUTANTS["base"](), spec="base", timeout=0)
    impl.forward(random_case(6, B=2, Hq=8, Hkv=1, T=1, S=4))
    assert impl.cells["GQA 8:1 × decode T = 1"] == 1
    impl.begin()
    assert not impl.cells


@pytest.mark.parametrize("clause_id,mutant", [("ORACLE-AGREE-01", "batch_mask_mixup")])
def test_a_failure_shrinks_to_a_small_readable_case(clause_id, mutant):
    """The falsifying example hypothesis prints (``Drawn.__repr__``) is small: few elements, every one
    drawn (none from a seed), values k/4 with |k| <= 8, the mask as 0/1."""
    impl = GuardedAdapter(MUTANTS[mutant](), spec=mutant, timeout=0)
    with pytest.raises(AssertionError) as info:
        CLAUSES[clause_id].func(impl=impl, dtype="float32")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    printed = notes[notes.index("Draw 1 (case): ") :]
    head, *rest = printed.splitlines()
    arrays = [line for line in rest if line.startswith("  ") and " = " in line]
    sizes = dict(re.findall(r"\b(B|Hq|Hkv|T|S|Dk|Dv)=(\d+)", head))
    assert max(int(v) for v in sizes.values()) <= 8, head
    assert "drawn seed" not in printed
    numbers = [float(x) for line in arrays for x in re.findall(r"-?\d+\.\d*|-?\d+", line.rsplit(" = ", 1)[1])]
    assert numbers and all(abs(x) <= 2 for x in numbers), printed
    assert sum(x != 0 for x in numbers) <= 8, printed  # shrunk: a handful of nonzero entries
    assert all(len(line) <= 240 for line in arrays), printed


def _item(clause_id: str | None):
    func = CLAUSES[clause_id].func if clause_id else (lambda: None)
    return SimpleNamespace(function=func, name=clause_id or "self-test")


def test_order_runs_first_clauses_first_and_keeps_self_tests_in_place():
    ids = ["LONG-SEQ-CI-03", None, "ORACLE-AGREE-01", "GQA-EXPAND-02", "WORKED-EXAMPLE-01", None, "MASK-SENSE-07"]
    out = [i.name for i in ordering.order([_item(c) for c in ids])]
    assert out[1] == "self-test" and out[5] == "self-test"
    clauses = [n for n in out if n != "self-test"]
    assert clauses == ["WORKED-EXAMPLE-01", "MASK-SENSE-07", "GQA-EXPAND-02", "ORACLE-AGREE-01", "LONG-SEQ-CI-03"]


def test_order_names_only_known_clauses():
    unknown = [c for c in ordering.FIRST + ordering.LAST if c not in CLAUSES]
    assert not unknown, unknown


TYPICAL_BUGS = (
    "no_scaling",
    "scale_by_dk",
    "softmax_query_axis",
    "mask_sense_inverted",
    "mask_after_softmax",
    "causal_off_by_one",
    "gqa_wrong_mapping",
    "ignore_custom_scale",
    "no_upcast",
    "mask_ignored_when_causal",
    "padding_mask_as_query_rows",
)


@pytest.mark.parametrize("mutant", TYPICAL_BUGS)
def test_the_first_clauses_catch_typical_bugs(mutant):
    """Fail fast rests on this: a typical bug fails one of the FIRST clauses (cheap, hand-built), so
    ``pytest -x`` stops there instead of after the slow clauses."""
    for cid in ordering.FIRST:
        info = CLAUSES[cid]
        dtype = "float16" if mutant == "no_upcast" else "float32"
        d = dtype if "dtype" in info.func.__code__.co_varnames else None
        if run_clause(info, MUTANTS[mutant](), d, shrink=False).startswith("failed"):
            return
    pytest.fail(f"no clause of ordering.FIRST catches {mutant}")


@pytest.mark.usefixtures("restore_hypothesis_profile")
def test_cells_are_summed_the_same_under_xdist(pytester, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", str(CLAUSE_DIR.parents[1]))
    args = [str(CLAUSE_DIR / "test_combinations.py"), "--impl=tests.mutants:BaseKernel", "-p", "no:cacheprovider"]
    lines = []
    for extra in ([], ["-n", "2"]):
        result = pytester.runpytest_subprocess(*args, *extra)
        found = [ln for ln in result.outlines if "admitted cells reached" in ln]
        assert found, result.stdout.str()[-2000:]
        lines.append(found[0])
    assert lines[0] == lines[1]
    assert int(re.search(r": (\d+)/", lines[0]).group(1)) > 0
