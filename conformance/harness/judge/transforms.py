"""The answers and allowances of the transform clauses (conformance/clauses/test_transforms.py): forward-mode
AD against ``oracle.jvp``, a double backward and forward-mode AD of the backward against ``oracle.vjp_jvp``'s
analytic second order (the gradient of <vjp(dO), w> is the tangent of vjp(dO) along w).

The error model is a first-order running error analysis of the formula the oracle evaluates, carried on
absolute values (the "absolute-value program": every signed quantity replaced by its magnitude, every
difference by a sum), which bounds what any evaluation order of the same formula can lose to rounding:

* an n-term inner product or row sum computed in unit roundoff u is off by at most gamma_n = n u times the
  sum of its terms' magnitudes; the chain of the transform has four such stages at most (scores; softmax
  row sum; the tangent's or cotangent's row sums; the final product), each of length at most
  max(Dk, Dv, S, T), so the count is ``n = 4 (max(Dk, Dv, S, T) + 4)``;
* the scores themselves are off by u times their magnitudes ``A_S = scale |Q||K|^T + |M|``, and a softmax
  weight moves by up to 2 u max A_S relative (its own score and the row's normaliser): every term holding P
  or its tangent carries the factor ``1 + 2 max A_S`` of its (b, h) row block;
* the result is rounded once more to the case's dtype (u_out |answer|), and the float64 oracle carries the
  same bound at float64's u.

So ``allowed = (n (1 + 2 max A_S) (u + u64) ) A + u_out |answer|``, A the absolute-value program of the
transform (below). It is generous (every gamma_n is a worst case; actual errors are ~sqrt(n) u) and
principled (it scales with the dtype and with the magnitudes of every factor), and it stays far below
the error of a missing term, which is of the order of A itself. ``u`` is the unit roundoff of the
precision the kernel declares it computes in (float64, or float32 under ``float64_computed_as=float32``;
float32, or the format ``float32_computed_as`` names).
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.contract import Case, Declaration

U = {"float64": 2.0**-53, "float32": 2.0**-24, "tf32": 2.0**-11, "float16": 2.0**-11, "bfloat16": 2.0**-8}
RULE = (
    "first-order running error analysis of the oracle's formula on absolute values: "
    "4 (max(Dk, Dv, S, T) + 4) (1 + 2 max|scores|) (u + u64) x the absolute-value program + u_out |answer| "
    "(harness.judge.transforms)"
)


def _u(case: Case, decl: Declaration) -> float:
    rule = decl.tolerance_dtype(case)
    if rule == "float32":
        return U.get(decl.computed_as("float32"), U["float32"])
    return U.get(rule, U["float32"])


def _conventions(case: Case, decl: Declaration) -> dict:
    """The fill the kernel declares for ``case``'s rows blocked entirely (an additive -inf row may have its
    own: ``Declaration.all_blocked_policy``) and its causal alignment."""
    return {"all_blocked": decl.all_blocked_policy(case), "causal_alignment": decl.causal_alignment}


def _abs_inputs(case: Case, tangents: dict):
    f = oracle._f64
    q, k, v = (
        np.abs(f(case.query)),
        oracle.expand_kv(np.abs(f(case.key)), case.Hq),
        oracle.expand_kv(np.abs(f(case.value)), case.Hq),
    )
    z = {n: np.zeros(np.shape(getattr(case, n))) for n in ("query", "key", "value")}
    t = {n: np.abs(f(tangents[n])) if tangents.get(n) is not None else z[n] for n in z}
    return q, k, v, t["query"], oracle.expand_kv(t["key"], case.Hq), oracle.expand_kv(t["value"], case.Hq)


def _factor(case: Case, decl: Declaration, fwd: oracle.Forward, rows: bool = False) -> tuple[float, np.ndarray]:
    """(n (u + u64), 1 + 2 max A_S per (b, h) block, broadcastable to [B, Hq, 1, 1]; with ``rows``, per query row
    ([B, Hq, T, 1]: a row's output and its tangent read that row's weights alone, so one row of huge scores,
    an M of finfo.min, leaves the others' allowance as it is)."""
    scale = abs(case.effective_scale)
    q, k = np.abs(oracle._f64(case.query)), oracle.expand_kv(np.abs(oracle._f64(case.key)), case.Hq)
    _, bias = oracle.blocked_and_bias(case, decl.causal_alignment)
    with np.errstate(invalid="ignore", over="ignore"):  # -inf where blocked: replaced by 0 below
        a_s = np.where(fwd.blocked, 0.0, np.einsum("bhtd,bhsd->bhts", q, k) * scale + np.abs(bias))
    n = 4 * (max(case.Dk, case.Dv, case.S, case.T) + 4)
    axes = -1 if rows else (-1, -2)
    return n * (_u(case, decl) + U["float64"]), 1.0 + 2.0 * a_s.max(axis=axes, keepdims=True, initial=0.0)


def expected_jvp(case: Case, tangents: dict, decl: Declaration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, tangent_out, allowed for tangent_out), float64."""
    fwd, dout = oracle.jvp(case, tangents, **_conventions(case, decl))
    q, k, v, tq, tk, tv = _abs_inputs(case, tangents)
    scale = abs(case.effective_scale)
    p = np.where(np.isnan(fwd.weights), 0.0, fwd.weights)
    a_ds = (np.einsum("bhtd,bhsd->bhts", tq, k) + np.einsum("bhtd,bhsd->bhts", q, tk)) * scale
    if tangents.get("bias") is not None:
        a_ds = a_ds + np.broadcast_to(np.abs(oracle._f64(tangents["bias"])), a_ds.shape)
    a_ds = np.where(fwd.blocked, 0.0, a_ds)
    a_dp = p * (a_ds + (p * a_ds).sum(axis=-1, keepdims=True))
    a = np.einsum("bhts,bhsd->bhtd", a_dp, v) + np.einsum("bhts,bhsd->bhtd", p, tv)
    nu, block = _factor(case, decl, fwd, rows=True)
    with np.errstate(invalid="ignore", over="ignore"):  # inf x 0: a row whose scores no dtype holds
        allowed = np.nan_to_num(nu * block * a, nan=np.inf) + U.get(case.dtype, U["float32"]) * np.abs(dout)
    return fwd.out, dout, allowed


def expected_vjp_vjp(
    case: Case, grad_out: np.ndarray, w: tuple, decl: Declaration
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """((d2q, d2k, d2v), their allowances), float64: the gradient of <vjp(grad_out), w> (oracle.vjp_jvp)."""
    names = ("query", "key", "value")
    tangents = dict(zip(names, w))
    want = oracle.vjp_jvp(case, grad_out, tangents, **_conventions(case, decl))
    fwd = oracle.forward(case, **_conventions(case, decl))
    q, k, v, wq, wk, wv = _abs_inputs(case, tangents)
    g = np.abs(oracle._f64(grad_out))
    scale = abs(case.effective_scale)
    p = np.where(np.isnan(fwd.weights), 0.0, fwd.weights)
    keep = ~(fwd.blocked | fwd.all_blocked[..., None])
    a_sd = np.where(keep, (np.einsum("bhtd,bhsd->bhts", wq, k) + np.einsum("bhtd,bhsd->bhts", q, wk)) * scale, 0.0)
    a_pd = p * (a_sd + (p * a_sd).sum(axis=-1, keepdims=True))
    a_dp = np.einsum("bhtd,bhsd->bhts", g, v)
    a_dpd = np.einsum("bhtd,bhsd->bhts", g, wv)
    a_r = (p * a_dp).sum(axis=-1, keepdims=True)
    a_rd = (a_pd * a_dp + p * a_dpd).sum(axis=-1, keepdims=True)
    a_ds = np.where(keep, p * (a_dp + a_r), 0.0)
    a_dsd = np.where(keep, a_pd * (a_dp + a_r) + p * (a_dpd + a_rd), 0.0)
    a_q = (np.einsum("bhts,bhsd->bhtd", a_dsd, k) + np.einsum("bhts,bhsd->bhtd", a_ds, wk)) * scale
    a_k = (np.einsum("bhts,bhtd->bhsd", a_dsd, q) + np.einsum("bhts,bhtd->bhsd", a_ds, wq)) * scale
    a_v = np.einsum("bhts,bhtd->bhsd", a_pd, g)
    nu, block = _factor(case, decl, fwd)
    u_out = U.get(case.dtype, U["float32"])
    fold = oracle.fold_query_heads
    # a kv head's block factor: the largest of its group's query heads
    kv_block = block.reshape(block.shape[0], case.Hkv, -1, 1, 1).max(axis=2)
    allowed = (
        nu * block * a_q + u_out * np.abs(want[0]),
        nu * kv_block * fold(a_k, case.Hkv) + u_out * np.abs(want[1]),
        nu * kv_block * fold(a_v, case.Hkv) + u_out * np.abs(want[2]),
    )
    return want, allowed
