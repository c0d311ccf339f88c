"""The oracle is the single source of truth, so it is checked against computations that share none
of its code: the article's worked example, an element-by-element loop written from §2's per-query
formulas, central finite differences for the VJP, and the identities the conventions imply."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance import oracle
from conformance.contract import Case
from conformance.harness.cases.build import random_case, random_mask


def test_worked_example_from_003():
    q = np.array([1.0, 1.0]).reshape(1, 1, 1, 2)
    k = np.array([[1.0, 0.0], [0.0, 1.0]]).reshape(1, 1, 2, 2)
    v = np.array([[2.0, 0.0], [0.0, 4.0]]).reshape(1, 1, 2, 2)
    out = oracle.forward(Case(q, k, v)).out
    np.testing.assert_allclose(out.ravel(), [1.0, 2.0], rtol=0, atol=1e-15)
    blocked = oracle.forward(Case(q, k, v, mask=np.array([False, True]))).out
    np.testing.assert_allclose(blocked.ravel(), [2.0, 0.0], rtol=0, atol=1e-15)


def loop_attention(case: Case, alignment: str = "top-left") -> np.ndarray:
    """000 §2, one query at a time: s_j = q.k_j / sqrt(d_k), alpha = softmax(s), o = sum alpha_j v_j."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (case.query, case.key, case.value))
    B, Hq, T, _ = q.shape
    S, g = k.shape[2], Hq // k.shape[1]
    mask = None if case.mask is None else np.broadcast_to(case.mask, (B, Hq, T, S))
    out = np.zeros((B, Hq, T, v.shape[3]))
    for b in range(B):
        for h in range(Hq):
            for t in range(T):
                scores = []
                for j in range(S):
                    visible = mask is None or not mask[b, h, t, j]
                    if case.is_causal:
                        limit = t if alignment == "top-left" else t + S - T
                        visible = visible and j <= limit
                    if visible:
                        s = sum(q[b, h, t, i] * k[b, h // g, j, i] for i in range(q.shape[3]))
                        scores.append((j, s * case.effective_scale))
                if not scores:
                    continue  # the spec's all-blocked row: zeros
                top = max(s for _, s in scores)
                z = sum(math.exp(s - top) for _, s in scores)
                for j, s in scores:
                    out[b, h, t] += math.exp(s - top) / z * v[b, h // g, j]
    return out


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("T,S", [(3, 5), (5, 3), (4, 4)])
def test_forward_matches_per_query_loop(T, S, alignment):
    for seed in range(3):
        mask = random_mask(seed, (2, 1, T, S), p_blocked=0.4, keep_one=seed != 2)
        case = random_case(
            seed,
            B=2,
            Hq=4,
            Hkv=2,
            T=T,
            S=S,
            Dk=6,
            Dv=3,
            dtype="float64",
            mask=mask,
            is_causal=seed > 0,
            scale=None if seed < 2 else 0.3,
        )
        got = oracle.forward(case, causal_alignment=alignment).out
        np.testing.assert_allclose(got, loop_attention(case, alignment), rtol=1e-12, atol=1e-13)


def test_all_blocked_policies():
    case = random_case(
        1, B=1, Hq=1, T=2, S=3, Dk=4, dtype="float64", mask=np.array([[True, True, True], [False, True, False]])
    )
    zeros = oracle.forward(case, all_blocked="zeros")
    assert np.all(zeros.out[0, 0, 0] == 0) and np.all(zeros.weights[0, 0, 0] == 0)
    mean = oracle.forward(case, all_blocked="mean-v")
    np.testing.assert_allclose(mean.out[0, 0, 0], case.value[0, 0].mean(axis=0), rtol=1e-14)
    nan = oracle.forward(case, all_blocked="nan")
    assert np.all(np.isnan(nan.out[0, 0, 0])) and np.all(np.isfinite(nan.out[0, 0, 1]))


def test_minus_inf_bias_equals_boolean_mask():
    mask = random_mask(4, (1, 1, 3, 5))
    case = random_case(4, B=1, Hq=2, T=3, S=5, Dk=4, dtype="float64", mask=mask)
    bias = np.where(mask, -np.inf, 0.0)
    np.testing.assert_array_equal(oracle.forward(case).out, oracle.forward(case.replace(mask=None, bias=bias)).out)


def test_gqa_equals_repeated_heads():
    case = random_case(5, B=2, Hq=6, Hkv=2, T=3, S=4, Dk=5, Dv=2, dtype="float64")
    rep = case.replace(key=np.repeat(case.key, 3, axis=1), value=np.repeat(case.value, 3, axis=1))
    np.testing.assert_allclose(oracle.forward(case).out, oracle.forward(rep).out, rtol=0, atol=0)
    # head h reads kv head h // 3: head 4 must equal attention against kv head 1 alone
    single = Case(case.query[:, 4:5], case.key[:, 1:2], case.value[:, 1:2])
    np.testing.assert_allclose(oracle.forward(case).out[:, 4:5], oracle.forward(single).out, rtol=1e-15)


def _loss(case: Case, g: np.ndarray) -> float:
    return float((oracle.forward(case).out * g).sum())


@pytest.mark.parametrize("with_mask", [False, True])
def test_vjp_matches_central_differences(with_mask):
    mask = None
    if with_mask:
        mask = random_mask(6, (2, 1, 3, 4), p_blocked=0.4)
        mask[1, 0, 2] = True  # an all-blocked row: its gradient must be exactly zero
    case = random_case(6, B=2, Hq=4, Hkv=2, T=3, S=4, Dk=5, Dv=3, dtype="float64", mask=mask, is_causal=with_mask)
    g = np.random.default_rng(7).standard_normal(case.out_shape)
    grads = oracle.vjp(case, g)
    h = 1e-6
    for name, grad in zip(("query", "key", "value"), grads):
        x = getattr(case, name)
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[idx] += h
            minus[idx] -= h
            numeric[idx] = (_loss(case.replace(**{name: plus}), g) - _loss(case.replace(**{name: minus}), g)) / (2 * h)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8, err_msg=name)
    if with_mask:
        assert np.all(grads[0][1, :, 2] == 0)


def test_causal_alignment_geometry():
    tl = oracle.causal_blocked(2, 4, "top-left")
    br = oracle.causal_blocked(2, 4, "bottom-right")
    assert tl.tolist() == [[False, True, True, True], [False, False, True, True]]
    assert br.tolist() == [[False, False, False, True], [False, False, False, False]]
    assert oracle.causal_blocked(4, 4).tolist() == np.triu(np.ones((4, 4), dtype=bool), 1).tolist()
