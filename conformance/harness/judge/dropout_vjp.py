"""The oracle's gradient for one known dropout mask, and its allowance, by lifting the mask into V.

Why a lift and not a second backward formula: inverted dropout with keep-scale Z (Z_ts = 1/(1 - p)
where the weight is kept, 0 where dropped) computes, for query row t,

    O_t = sum_s P_ts Z_ts v_s = sum_s P_ts (Z_ts v_s),

which is *undropped* attention of row t (the same q_t, the same keys, the same softmax P_t) over
its own values Z_t ⊙ V. So a case with a known mask is, row by row, a dropout-free case: item
(b, h, t) of the lifted case has the one query q_bht, the keys of its kv head and the values
Z_bht[:, None] * V. Its VJP is the oracle's own (``oracle.vjp``, through ``expected_vjp``), and so
is its allowance (``grad_allowance``: the GRAD clauses' first-order bound of a FlashAttention-style
backward and the same-precision ensemble), computed on the very numbers the dropped backward
handles: dP_t = Z_t ⊙ (dO_t V^T), D_t = rowsum(dO_t * O_t) with the dropped O_t, dS_t = P_t (dP_t - D_t).
The real gradients are sums over rows:

    dQ_t = the lifted dQ of item t,
    dK   = sum over t (and over the query heads of a GQA group) of the lifted dK_t,
    dV   = sum over t (and the group) of Z_t ⊙ dVrow_t, dVrow_t the lifted gradient of Z_t ⊙ V.

Their allowances add the lifted items' allowances (each item's includes its own rounding into the
working dtype, which a kernel accumulating in float32 does not make: conservative) and the
accumulation's error, gamma(T g) times the sum of the absolute contributions and their allowances,
then one rounding of the sum into the working dtype (``tolerance``'s precisions).

The lift is exact when Z_t ⊙ V is representable in the case dtype, i.e. when 1/(1 - p) is a power of
two (p = 1/2, 3/4, ...); :func:`lift` refuses other masks rather than round them silently.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.contract import Case, Declaration, np_dtype
from conformance.harness.judge import tolerance
from conformance.harness.judge.expected import expected_vjp, grad_allowance


def keep_scale_for(weights: np.ndarray, blocked: np.ndarray, p: float) -> np.ndarray:
    """Z from observed dropped weights: 1/(1 - p) where a visible weight is nonzero, else 0."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"dropout_p={p}: the keep-scale of a mask needs 0 < p < 1")
    kept = (np.asarray(weights) != 0) & ~blocked
    return np.where(kept, 1.0 / (1.0 - p), 0.0)


def lift(case: Case, keep_scale: np.ndarray, causal_alignment: str = "top-left") -> Case:
    """The dropout-free case whose item (b, h, t) is query row t of head h over values Z_bht ⊙ V.

    The blocked set (mask, causal in ``causal_alignment``, -inf bias) becomes each item's boolean
    mask and the finite bias its bias, so the lifted case sees exactly what row t saw.
    """
    B, Hq, T, S = case.weights_shape
    n = B * Hq * T
    g = Hq // case.Hkv
    z = np.asarray(keep_scale, dtype=np.float64)
    if z.shape != (B, Hq, T, S):
        raise ValueError(f"keep_scale has shape {z.shape}, the case's weights {(B, Hq, T, S)}")
    dt = np_dtype(case.dtype)
    k = np.repeat(np.asarray(case.key), g, axis=1)
    v = np.repeat(np.asarray(case.value).astype(np.float64), g, axis=1)
    k_items = np.broadcast_to(k[:, :, None], (B, Hq, T, S, case.Dk)).reshape(n, 1, S, case.Dk)
    v_exact = v[:, :, None] * z[..., None]  # [B, Hq, T, S, Dv]
    v_items = v_exact.astype(dt)
    if not np.array_equal(v_items.astype(np.float64), v_exact):
        raise ValueError("Z * V is not representable in the case dtype: use a dropout_p with 1/(1-p) a power of 2")
    blocked, bias = oracle.blocked_and_bias(case, causal_alignment)
    return Case(
        query=np.ascontiguousarray(np.asarray(case.query).reshape(n, 1, 1, case.Dk)),
        key=np.ascontiguousarray(k_items),
        value=np.ascontiguousarray(v_items.reshape(n, 1, S, case.Dv)),
        mask=blocked.reshape(n, 1, 1, S) if blocked.any() else None,
        bias=bias.reshape(n, 1, 1, S) if case.bias is not None else None,
        scale=case.scale,
        label=f"{case.label} lifted: one item per (b, h, t), values Z ⊙ V".strip(),
    )


def _per_row(case: Case, x: np.ndarray) -> np.ndarray:
    """Lifted [B*Hq*T, 1, S, D] -> [B, Hq, T, S, D]."""
    return x.reshape(case.B, case.Hq, case.T, case.S, x.shape[-1])


def _fold_rows(case: Case, x: np.ndarray) -> np.ndarray:
    """Sum over query rows, then over the query heads of each kv head: [B, Hq, T, S, D] -> [B, Hkv, S, D]."""
    return oracle.fold_query_heads(x.sum(axis=2), case.Hkv)


def dropout_vjp(
    case: Case, keep_scale: np.ndarray, grad_out: np.ndarray, decl: Declaration
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """((dQ, dK, dV), (their allowances)) in float64 for ``case`` under the mask ``keep_scale``.

    ``grad_out`` is the cotangent [B, Hq, T, Dv]; ``decl`` supplies the conventions and rule dtype.
    """
    lifted = lift(case, keep_scale, decl.causal_alignment)
    n = case.B * case.Hq * case.T
    do = np.ascontiguousarray(np.asarray(grad_out).reshape(n, 1, 1, case.Dv))
    dq_t, dk_t, dv_t = expected_vjp(lifted, do, decl)
    aq_t, ak_t, av_t = grad_allowance(lifted, do, decl)
    z = np.asarray(keep_scale, dtype=np.float64)[..., None]
    prec = tolerance.precision(case.dtype, decl.tolerance_dtype(case))
    terms = case.T * (case.Hq // case.Hkv)  # contributions summed into one dK or dV element

    def summed(parts: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        exact = _fold_rows(case, parts)
        pre = _fold_rows(case, allowed) + prec.gamma(terms) * _fold_rows(case, np.abs(parts) + allowed)
        return exact, pre + prec.rounding(np.abs(exact) + pre)

    dk, ak = summed(_per_row(case, dk_t), _per_row(case, ak_t))

    def kept(x: np.ndarray) -> np.ndarray:  # a dropped key adds exactly 0, even where its row's allowance is inf
        with np.errstate(invalid="ignore"):
            return np.where(z > 0, z * x, 0.0)

    dv, av = summed(kept(_per_row(case, dv_t)), kept(_per_row(case, av_t)))
    shape = case.query.shape
    return (dq_t.reshape(shape), dk, dv), (aq_t.reshape(shape), ak, av)
