"""harness.judge.dropout_vjp: the lift of a dropout mask into the values gives the dropped gradient.

DROPOUT-GRAD-01 trusts that lifting Z into the values (row t: undropped attention over Z_t * V) and
summing the rows' VJPs is the gradient of O = (P * Z) V. Here that is checked against torch's
autograd of the dropped formula itself, in float64, on cases with GQA, a mask, is_causal (both
alignments), an additive bias with -inf and a custom scale; and the allowance is checked to be tight
enough to see a 1 % error (float32) and to refuse what it cannot represent.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import oracle
from conformance.contract import Declaration
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge.dropout_vjp import dropout_vjp, keep_scale_for, lift

torch = pytest.importorskip("torch")


def _case(dtype: str):
    B, Hq, Hkv, T, S = 2, 4, 2, 5, 7
    bias = np.random.default_rng(3).standard_normal((B, 1, T, S)) * 0.5
    bias[0, 0, 1, 2] = -np.inf
    return random_case(
        11,
        B=B,
        Hq=Hq,
        Hkv=Hkv,
        T=T,
        S=S,
        Dk=8,
        Dv=6,
        dtype=dtype,
        mask=random_mask(12, (B, 1, T, S), 0.3),
        bias=bias,
        is_causal=True,
        scale=0.4,
        dropout_p=0.75,
        magnitude=0.5,
    )


def _keep_scale(case, alignment: str) -> np.ndarray:
    blocked, _ = oracle.blocked_and_bias(case, alignment)
    keep = np.random.default_rng(13).random(case.weights_shape) >= case.dropout_p
    return np.where(keep & ~blocked, 1.0 / (1.0 - case.dropout_p), 0.0)


def _torch_dropped_vjp(case, z: np.ndarray, grad_out: np.ndarray, alignment: str):
    """Autograd of O = (softmax(QK^T s + M) * Z) V in float64: the dropped formula, written directly."""
    q, k, v = (
        torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (case.query, case.key, case.value)
    )
    g = case.Hq // case.Hkv
    blocked, bias = oracle.blocked_and_bias(case, alignment)
    s = q @ k.repeat_interleave(g, dim=1).transpose(-1, -2) * case.effective_scale + torch.tensor(bias)
    p = torch.softmax(s.masked_fill(torch.tensor(blocked), -float("inf")), dim=-1)
    out = (p * torch.tensor(z)) @ v.repeat_interleave(g, dim=1)
    out.backward(torch.tensor(np.asarray(grad_out, dtype=np.float64)))
    return q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_lifted_vjp_is_the_dropped_gradient(dtype, alignment):
    case = _case(dtype)
    z = _keep_scale(case, alignment)
    grad_out = np.random.default_rng(14).standard_normal(case.out_shape)
    decl = Declaration(causal_alignment=alignment)
    want, allowed = dropout_vjp(case, z, grad_out, decl)
    ref = _torch_dropped_vjp(case, z, grad_out, alignment)
    for name, got, exact, allow in zip(("dq", "dk", "dv"), want, ref, allowed):
        assert np.allclose(got, exact, rtol=1e-12, atol=1e-12), name
        assert np.all(np.isfinite(allow)) and np.all(allow > 0), name


def test_allowance_sees_a_one_percent_error_in_float32():
    case = _case("float32")
    z = _keep_scale(case, "top-left")
    grad_out = np.random.default_rng(15).standard_normal(case.out_shape)
    want, allowed = dropout_vjp(case, z, grad_out, Declaration())
    for name, w, a in zip(("dq", "dk", "dv"), want, allowed):
        big = np.abs(w) > 1e-3
        assert np.all(0.01 * np.abs(w[big]) > a[big]), name


def test_keep_scale_reads_the_observed_weights():
    w = np.array([[[[0.0, 0.5, 0.0, 0.25]]]])
    blocked = np.array([[[[False, False, True, False]]]])
    assert keep_scale_for(w, blocked, 0.5).tolist() == [[[[0.0, 2.0, 0.0, 2.0]]]]
    with pytest.raises(ValueError):
        keep_scale_for(w, blocked, 1.0)


def test_lift_refuses_a_scale_the_dtype_cannot_hold():
    case = _case("float32").replace(dropout_p=0.3)
    z = _keep_scale(case, "top-left")  # 1 / 0.7: Z * V rounds in float32
    with pytest.raises(ValueError, match="power of 2"):
        lift(case, z)
