"""Self-tests of the combination clauses' machinery.

* The function adapter passes is_causal and the mask through the function's own arguments, folds
  only on a declared or rejected combination, and never hides a crash behind a fold.
* The correct torch-signature function passes the combination clauses, and the function mutants
  are killed *because* both arguments reach them: folded, they would pass.
* The dropout-structure statistics are exact: the agreement counts and their binomial bounds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance.clauses import test_dropout_structure as ds
from conformance.harness.cases.build import random_case, random_mask
from tests.clause_runner import load_clauses, run_clause

CLAUSES = load_clauses()


def _causal_masked_case(dropout_p: float = 0.0, Dv: int = 8):
    mask = random_mask(5, (1, 1, 4, 6), p_blocked=0.3)
    mask[..., 0] = False
    return random_case(5, B=1, Hq=2, T=4, S=6, Dk=8, Dv=Dv, mask=mask, is_causal=True, dropout_p=dropout_p)


def _adapter(fn, **decl):
    pytest.importorskip("torch", reason="plain SDPA-signature functions are called with torch tensors")
    from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter

    return FunctionAdapter(fn, name=getattr(fn, "__name__", "fn"), declaration=FUNCTION_DEFAULTS.replace(**decl))


class _Recorder:
    """A correct function that records what it was called with; optionally refuses the combination."""

    def __init__(self, refuse_with: type[Exception] | None = None):
        self.calls: list[tuple[bool, bool]] = []
        self.refuse_with = refuse_with

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        from tests.mutants_combos import applies_both

        self.calls.append((bool(is_causal), attn_mask is not None))
        if self.refuse_with is not None and is_causal and attn_mask is not None:
            raise self.refuse_with("is_causal together with attn_mask is not supported")
        return applies_both(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _oracle_out(case):
    from conformance.oracle import forward

    return forward(case).out


def test_function_gets_both_when_it_accepts_them():
    fn = _Recorder()
    adapter = _adapter(fn)
    case = _causal_masked_case()
    out = adapter.forward(case)
    assert fn.calls == [(True, True)]
    assert adapter.combination_refusals == []
    np.testing.assert_allclose(out, _oracle_out(case), atol=1e-5)


def test_a_rejected_combination_is_folded_and_recorded():
    fn = _Recorder(refuse_with=RuntimeError)
    adapter = _adapter(fn)
    case = _causal_masked_case()
    out = adapter.forward(case)
    assert fn.calls == [(True, True), (False, True)]
    assert adapter.combination_refusals == ["RuntimeError: is_causal together with attn_mask is not supported"]
    np.testing.assert_allclose(out, _oracle_out(case), atol=1e-5)


def test_a_crash_on_the_combination_is_not_folded_away():
    """Only a documented rejection class (rejects_with) or NotApplicable counts as a refusal."""
    adapter = _adapter(_Recorder(refuse_with=IndexError))
    with pytest.raises(IndexError):
        adapter.forward(_causal_masked_case())


def test_declared_false_always_folds_and_declared_true_never_does():
    fn = _Recorder()
    _adapter(fn, causal_with_mask=False).forward(_causal_masked_case())
    assert fn.calls == [(False, True)]
    with pytest.raises(RuntimeError):
        _adapter(_Recorder(refuse_with=RuntimeError), causal_with_mask=True).forward(_causal_masked_case())


def test_torch_sdpa_refuses_the_combination_on_its_math_path_and_is_folded():
    """torch 2.13 takes is_causal with attn_mask on its CPU flash path and raises on the math path
    (here: Dk != Dv); the adapter folds there and the answer is still the union."""
    pytest.importorskip("torch")
    import torch.nn.functional as F

    adapter = _adapter(F.scaled_dot_product_attention)
    flash = _causal_masked_case()
    np.testing.assert_allclose(adapter.forward(flash), _oracle_out(flash), atol=1e-5)
    math_path = _causal_masked_case(Dv=16)
    np.testing.assert_allclose(adapter.forward(math_path), _oracle_out(math_path), atol=1e-5)
    assert any("is_causal" in r for r in adapter.combination_refusals), adapter.combination_refusals


@pytest.mark.parametrize(
    "clause_id",
    [
        "CAUSAL-WITH-MASK-ARGS-05",
        "CAUSAL-WITH-MASK-04",
        "MASK-OR-CAUSAL-09",
        "MASK-PADDING-SELF-14",
        "ALL-BLOCKED-FLOAT-04",
        "DROPOUT-BLOCKED-07",
    ],
)
def test_the_correct_function_passes(clause_id):
    from tests.mutants_combos import applies_both

    verdict = run_clause(CLAUSES[clause_id], _adapter(applies_both), "float32")
    assert verdict == "passed", verdict


@pytest.mark.parametrize("name", ["fn_drops_causal_with_mask", "fn_drops_mask_with_causal"])
def test_function_mutants_are_caught_only_through_their_own_arguments(name):
    """Killed when both reach the function; folded by the adapter, the same function passes, so the
    kill is evidence that the combination is tested through the function's arguments."""
    from tests import mutants_combos

    fn = {
        "fn_drops_causal_with_mask": mutants_combos.drops_causal_with_mask,
        "fn_drops_mask_with_causal": mutants_combos.drops_mask_with_causal,
    }[name]
    info = CLAUSES["CAUSAL-WITH-MASK-ARGS-05"]
    assert run_clause(info, _adapter(fn), "float32", shrink=False).startswith("failed: ")
    assert run_clause(info, _adapter(fn, causal_with_mask=False), "float32") == "passed"


def test_declare_causal_with_mask():
    from conformance.harness.calls import registry

    assert registry.parse_declare(["causal_with_mask=false"]) == {"causal_with_mask": False}
    assert registry.parse_declare(["causal_with_mask=none"]) == {"causal_with_mask": None}


# -- dropout statistics ---------------------------------------------------------------------------------
def test_lagged_agreements_match_a_direct_count():
    rng = np.random.default_rng(0)
    x, y = rng.random(64) < 0.5, rng.random(64) < 0.5
    direct = [int(np.sum(x == np.roll(y, -d))) for d in range(64)]
    assert ds.lagged_agreements(x, y).tolist() == direct


def test_binomial_tails_are_exact():
    n = 40
    lower, upper = ds.binomial_log_sf_table(n)
    pmf = [math.comb(n, k) / 2**n for k in range(n + 1)]
    for k in (0, 7, 20, 33, 40):
        assert math.isclose(math.exp(lower[k]), sum(pmf[: k + 1]), rel_tol=1e-12)
        assert math.isclose(math.exp(upper[k]), sum(pmf[k:]), rel_tol=1e-12)


def test_agreement_bounds_hold_their_level():
    n, level = 1024, 1e-6 / ds.N_TESTS
    lo, hi = ds.agreement_bounds(n, level)
    lower, upper = ds.binomial_log_sf_table(n)
    assert math.exp(lower[lo]) <= level / 2 < math.exp(lower[lo + 1])
    assert math.exp(upper[hi]) <= level / 2 < math.exp(upper[hi - 1])
    assert lo + hi == n  # symmetric, as Binomial(n, 1/2) is


def test_independent_masks_are_not_rejected():
    """Masks drawn independently at p = 1/2 stay inside the bounds (a false positive here would have
    probability < 1e-6 per draw)."""
    lo, hi = ds.agreement_bounds(ds.N_SLICE, 1e-6 / ds.N_TESTS)
    rng = np.random.default_rng(1)
    for _ in range(20):
        x, y = rng.random(ds.N_SLICE) < 0.5, rng.random(ds.N_SLICE) < 0.5
        agree = ds.lagged_agreements(x, y)
        assert lo < agree.min() and agree.max() < hi


def test_dropout_binomial_tails_match_exact_sums():
    """The clauses' binomial tails (a cumulative sum of log pmf ratios) against exact integer sums."""
    from fractions import Fraction

    from conformance.clauses.test_dropout import binomial_tails

    n, p = 60, Fraction(3, 10)
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    for k in (0, 5, 18, 40, 60):
        lower, upper = binomial_tails(k, n, 0.3)
        assert math.isclose(lower, float(sum(pmf[: k + 1])), rel_tol=1e-11)
        assert math.isclose(upper, float(sum(pmf[k:])), rel_tol=1e-11)
