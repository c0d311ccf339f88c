"""The oracle's forward-mode derivative (``oracle.jvp``) and its second order (``oracle.vjp_jvp``), float64,
held to central finite differences of the oracle's forward and VJP, and the second order to torch's
float64 double backward of an attention written here from the formula (independent of the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance import oracle
from conformance.harness.cases.build import random_case, random_mask


def _cases():
    B, H, T, S, D = 2, 2, 4, 7, 8
    plain = random_case(5, B=B, Hq=H, T=T, S=S, Dk=D, dtype="float64", label="plain")
    mask = random_mask(5, (B, 1, 1, S), p_blocked=0.3)
    mask[..., 0] = False
    bias = np.random.default_rng(6).standard_normal((1, H, T, S))
    bias[0, 0, 1, 2] = -np.inf
    gqa = random_case(7, B=B, Hq=4, Hkv=2, T=T, S=S, Dk=D, Dv=6, dtype="float64", label="gqa")
    blocked = np.zeros((B, 1, 1, S), dtype=bool)
    blocked[0, ..., :2] = True  # with causal: query 0 and 1 of item 0 see no key
    return [
        plain,
        plain.replace(mask=mask, label="padding"),
        plain.replace(is_causal=True, label="causal"),
        plain.replace(bias=bias, mask=mask, label="bias + mask"),
        gqa.replace(is_causal=True, scale=0.3, label="gqa causal scale"),
        plain.replace(mask=blocked, is_causal=True, label="rows all blocked"),
    ]


def _tangents(case, seed, bias=True):
    rng = np.random.default_rng(seed)
    t = {n: rng.standard_normal(getattr(case, n).shape) for n in ("query", "key", "value")}
    if bias and case.bias is not None:
        t["bias"] = rng.standard_normal(np.shape(case.bias))
    return t


def _moved(case, t, h):
    changes = {n: np.asarray(getattr(case, n)) + h * t[n] for n in ("query", "key", "value") if n in t}
    if "bias" in t:
        changes["bias"] = np.asarray(case.bias) + h * t["bias"]  # -inf stays -inf
    return case.replace(**changes)


def _central(f, case, t, h=1e-4):
    """Fourth-order central difference (Richardson) of f along t."""
    fp, fm = f(_moved(case, t, h)), f(_moved(case, t, -h))
    f2p, f2m = f(_moved(case, t, 2 * h)), f(_moved(case, t, -2 * h))
    return [(8 * (a - b) - (c - d)) / (12 * h) for a, b, c, d in zip(fp, fm, f2p, f2m)]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.label)
def test_jvp_is_the_derivative_of_the_forward(case):
    for only in (None, "query", "key", "value", "bias"):
        t = _tangents(case, 1)
        if only is not None:
            if only not in t:
                continue
            t = {only: t[only]}
        _, got = oracle.jvp(case, t)
        (want,) = _central(lambda c: [oracle.forward(c).out], case, t)
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-9, err_msg=f"{case.label}, tangent {only}")


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.label)
def test_vjp_jvp_is_the_derivative_of_the_vjp(case):
    g = np.random.default_rng(2).standard_normal(case.out_shape)
    w = _tangents(case, 3, bias=False)
    got = oracle.vjp_jvp(case, g, w)
    want = _central(lambda c: oracle.vjp(c, g), case, w)
    for a, b, n in zip(got, want, ("dQ", "dK", "dV")):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-9, err_msg=f"{case.label}: {n}")


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.label)
def test_vjp_jvp_is_torch_float64_double_backward(case):
    torch = pytest.importorskip("torch")
    g = np.random.default_rng(2).standard_normal(case.out_shape)
    w = _tangents(case, 3, bias=False)
    blocked, bias = oracle.blocked_and_bias(case)
    q, k, v = (torch.tensor(np.asarray(getattr(case, n)), requires_grad=True) for n in ("query", "key", "value"))
    rep = case.Hq // case.Hkv
    s = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) * case.effective_scale + torch.tensor(bias)
    s = s.masked_fill(torch.tensor(blocked), -torch.inf)
    empty = torch.tensor(blocked.all(-1, keepdims=True))
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    out = p @ v.repeat_interleave(rep, 1)
    grads = torch.autograd.grad(out, (q, k, v), torch.tensor(g), create_graph=True)
    phi = sum((gr * torch.tensor(w[n])).sum() for gr, n in zip(grads, ("query", "key", "value")))
    want = torch.autograd.grad(phi, (q, k, v))
    for a, b, n in zip(oracle.vjp_jvp(case, g, w), want, ("dQ", "dK", "dV")):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{case.label}: {n}")
