"""The error model (harness.judge.tolerance, harness.judge.ensemble) against its own claims.

* Every same-precision ensemble member stays inside the first-order bound, forward, observed
  weights and backward, on varied cases (shapes, GQA, masks, causal, biases, large logits): the
  bound alone admits them, so the ensemble term is a safety net, not the thing that lets them pass.
* The members are honest, not exact: close to the oracle and, in float16, not equal to it.
* Allowances are never NaN (a NaN allowance would accept anything); an ill-conditioned row
  (|scores| ~ 2e9) gets an unbounded allowance below float64 and a finite one in float64, and an
  unbounded allowance still rejects NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import oracle
from conformance.clauses.test_mask_values import dominant_blocked_case
from conformance.contract import DTYPES, Declaration
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import probe_case
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare, ensemble, tolerance
from conformance.harness.spec.report import ClauseViolation

DECL = Declaration()


def _cases(dtype: str) -> list:
    rng = np.random.default_rng(11)
    out = []
    for i in range(12):
        B, Hkv, g = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(1, 3))
        T, S, D = int(rng.integers(1, 12)), int(rng.integers(1, 30)), int(rng.choice([1, 4, 16, 64]))
        mask = random_mask(i, (B, 1, T, S)) if i % 3 == 0 else None
        bias = 2.0 * rng.standard_normal((T, S)) if i % 4 == 1 else None
        out.append(
            random_case(
                i,
                B=B,
                Hq=Hkv * g,
                Hkv=Hkv,
                T=T,
                S=S,
                Dk=D,
                Dv=D,
                dtype=dtype,
                mask=mask,
                bias=bias,
                is_causal=bool(i % 2),
                magnitude=float(rng.choice([0.5, 1.0, 3.0])),
            )
        )
    return out


def _ratio(err: np.ndarray, bound: np.ndarray) -> float:
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.max(np.where(err > 0, err / bound, 0.0), initial=0.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ensemble_members_stay_inside_the_bound(dtype):
    worst: dict[str, float] = {}
    for case in _cases(dtype):
        fwd = compare.expected(case, DECL)
        rm = tolerance.row_model(case, fwd, tolerance.precision(dtype, dtype))
        ob = tolerance.forward_bound(case, fwd, rm)
        wb = tolerance.weights_bound(rm)
        for name, out in ensemble.forward_members(case).items():
            worst[name] = max(worst.get(name, 0.0), _ratio(tolerance.ensemble_error([out], fwd.out), ob))
        for name, out in ensemble.forward_members(probe_case(case)).items():
            err = tolerance.ensemble_error([out[..., : case.S]], fwd.weights)
            worst["weights " + name] = max(worst.get("weights " + name, 0.0), _ratio(err, wb))
        grad_out = np.random.default_rng(1).standard_normal(case.out_shape).astype(case.query.dtype)
        want = oracle.vjp(case, grad_out)
        bounds = tolerance.grad_bound(case, fwd, rm, ob, grad_out)
        for name, grads in ensemble.backward_members(case, grad_out).items():
            for what, got, exact, bound in zip("qkv", grads, want, bounds):
                key = f"d{what} {name}"
                worst[key] = max(worst.get(key, 0.0), _ratio(tolerance.ensemble_error([got], exact), bound))
    outside = {k: round(v, 3) for k, v in worst.items() if v > 1.0}
    assert not outside, f"members outside the first-order bound in {dtype}: {outside}"


def test_members_are_honest_not_exact():
    case = random_case(8, B=1, Hq=2, T=8, S=16, Dk=16, dtype="float16")
    exact = oracle.forward(case).out
    for name, out in ensemble.forward_members(case).items():
        err = float(np.abs(out - exact).max())
        assert 0 < err < 4e-3, f"{name}: {err}"  # about one float16 rounding of O(1) outputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_ill_conditioned_rows_are_unbounded_below_float64_and_never_nan(dtype):
    case = dominant_blocked_case(dtype, 200)
    grad_out = np.ones(case.out_shape, dtype=case.query.dtype)
    allowances = [
        compare.output_allowance(case),
        compare.weights_allowance(case),
        *compare.grad_allowance(case, grad_out),
    ]
    assert not any(np.isnan(a).any() for a in allowances)
    live = compare.expected(case, DECL).weights > 0
    if dtype == "float64":  # u * |s| = 1e-16 * 2e9: still well conditioned
        assert all(np.isfinite(a).all() for a in allowances)
    else:
        assert np.isinf(compare.weights_allowance(case)[live]).all()


class _NanOnVisible:
    """Exact weights except NaN on one visible row element: an unbounded allowance must still refuse it."""

    name = "nan-on-visible"
    declaration = DECL

    def forward(self, case):
        out = oracle.forward(case).out.copy()
        out[0, 0, 0, 0] = np.nan
        return out.astype(case.query.dtype)


def test_unbounded_allowance_still_requires_finite():
    case = dominant_blocked_case("float32", 200)
    with pytest.raises(ClauseViolation, match="NaN"):
        compare.assert_output_matches(GuardedAdapter(_NanOnVisible(), spec="nan-on-visible", timeout=0), case)


def test_nan_bound_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        tolerance.combine(np.array([1.0, np.nan]), None)


def test_backward_accumulated_in_the_working_dtype_is_admitted_and_needs_its_term(monkeypatch):
    """dK, dV accumulated in bfloat16 per 32 query rows (torch's CPU flash backward; tests/zoo_more2.py's
    zoo-bwd-accumulate-lowp) stay inside the allowance, and only because of the ROW_BLOCK term: without
    it the same kernel leaves the bound (V, dO >= 0, so the roundings cannot cancel)."""
    from tests.zoo_more2 import BwdAccumulateLowp

    kernel = BwdAccumulateLowp()

    def worst_dv_share() -> float:
        worst = 0.0
        for seed in range(4):
            case = random_case(seed, B=1, Hq=2, Hkv=2, T=256, S=24, Dk=32, dtype="bfloat16")
            case = case.replace(value=np.abs(case.value))
            do = np.abs(np.random.default_rng(seed).standard_normal(case.out_shape)).astype(case.query.dtype)
            got = kernel.vjp(case, do)[2]
            fwd = compare.expected(case, DECL)
            rm = tolerance.row_model(case, fwd, tolerance.precision("bfloat16", "bfloat16"))
            bound = tolerance.grad_bound(case, fwd, rm, tolerance.forward_bound(case, fwd, rm), do)[2]
            worst = max(worst, _ratio(np.abs(got - oracle.vjp(case, do)[2]), bound))
        return worst

    assert worst_dv_share() <= 1.0
    monkeypatch.setattr(tolerance, "ROW_BLOCK", 10**9)  # one block: no accumulation term
    assert worst_dv_share() > 1.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_bound_depends_on_the_scale_magnitude_not_its_sign(dtype):
    """(Q, -c) and (-Q, +c) give the same scores, so their first-order bounds must be equal. The
    bound once multiplied magnitudes by the signed scale: with scale = -0.5 its dot-product and dQ/dK
    terms turned negative and correct kernels (torch-sdpa float32/float64, jax) failed SCALE-NEGATIVE-05
    by about 1.2x (found by a held-out mutant round)."""
    case = random_case(17, B=1, Hq=2, Hkv=1, T=5, S=7, Dk=8, Dv=8, dtype=dtype, scale=-0.5)
    mirror = case.replace(query=-np.asarray(case.query), scale=0.5)
    g = np.random.default_rng(18).standard_normal(case.out_shape)
    bounds = []
    for c in (case, mirror):
        fwd = compare.expected(c, DECL)
        rm = tolerance.row_model(c, fwd, tolerance.precision(c.dtype, c.dtype))
        out = tolerance.forward_bound(c, fwd, rm)
        bounds.append([out, tolerance.weights_bound(rm), *tolerance.grad_bound(c, fwd, rm, out, g)])
    for neg, pos in zip(*bounds):
        assert np.all(neg >= 0)
        np.testing.assert_allclose(neg, pos, rtol=1e-12, atol=0)
