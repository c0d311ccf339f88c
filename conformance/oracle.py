"""The float64 oracle: the suite's single source of truth.

Forward ``softmax(QK^T * scale + M) V`` (000_f3dcd408372d9e02.txt §3) and its analytic VJP, computed
in float64 on the values the kernel actually receives (the inputs already rounded to the working
dtype), and parameterised by the conventions a kernel may declare:

* ``all_blocked`` — what a query row whose keys are all blocked yields: the spec's ``"zeros"``
  (§8: "本实现明确约定该行的权重和输出为 0"), ``"nan"``, or ``"mean-v"`` (uniform weights over all S
  keys, i.e. the mean of V, which is what a finite fill such as ``jax.nn.dot_product_attention``'s
  produces);
* ``causal_alignment`` — ``"top-left"`` (query i sees keys j <= i) or ``"bottom-right"`` (query i
  sees keys j <= i + S - T, the KV-cache / FlashAttention convention).

GQA maps query head h to kv head ``h // (Hq // Hkv)``. The oracle is kept deliberately plain
(materialised [B,H,T,S] scores, one einsum per product) so that it can be read against the formula;
it imports only the contract. The same-precision formulations that size the allowances live in
``conformance.harness.judge.ensemble``, never here: nothing but float64 answers comes out of this module.

``forward_blocked`` is the same float64 forward for long sequences: keys in blocks with an online
(running max, running sum) softmax and queries in chunks, so its memory is O(chunk x block) rather
than O(B·H·T·S). The self-test (tests/test_oracle_blocked.py) holds it to ~1e-12 of :func:`forward`
on every convention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.contract import Case


@dataclass(frozen=True)
class Forward:
    out: np.ndarray  # [B, Hq, T, Dv] float64
    weights: np.ndarray  # [B, Hq, T, S] float64
    blocked: np.ndarray  # [B, Hq, T, S] bool, the union of mask, causal and -inf bias
    all_blocked: np.ndarray  # [B, Hq, T] bool


def causal_blocked(T: int, S: int, alignment: str = "top-left") -> np.ndarray:
    """[T, S] bool, True where query i may not see key j (§7.2: the strict upper triangle)."""
    offset = 0 if alignment == "top-left" else S - T
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    return j > i + offset


def expand_kv(x: np.ndarray, hq: int) -> np.ndarray:
    """Repeat kv heads so that query head h reads kv head h // (Hq // Hkv)."""
    hkv = x.shape[1]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    return np.repeat(x, hq // hkv, axis=1)


def fold_query_heads(x: np.ndarray, hkv: int) -> np.ndarray:
    """The adjoint of :func:`expand_kv`: sum the query heads that share a kv head ([B, Hq, N, D] -> [B, Hkv, N, D])."""
    b, hq, n, d = x.shape
    return x.reshape(b, hkv, hq // hkv, n, d).sum(axis=2)


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def blocked_and_bias(case: Case, causal_alignment: str = "top-left") -> tuple[np.ndarray, np.ndarray]:
    """The full [B,Hq,T,S] blocked mask and additive bias (finite part; -inf folded into blocked)."""
    shape = case.weights_shape
    blocked = np.zeros(shape, dtype=bool)
    if case.mask is not None:
        blocked |= np.broadcast_to(np.asarray(case.mask, dtype=bool), shape)
    if case.is_causal:
        blocked |= causal_blocked(case.T, case.S, causal_alignment)
    bias = np.zeros(shape)
    if case.bias is not None:
        b = np.broadcast_to(_f64(case.bias), shape)
        blocked |= np.isneginf(b)
        bias = np.where(np.isneginf(b), 0.0, b)
    return blocked, bias


def forward(case: Case, *, all_blocked: str = "zeros", causal_alignment: str = "top-left") -> Forward:
    q, k, v = _f64(case.query), _f64(case.key), _f64(case.value)
    k, v = expand_kv(k, case.Hq), expand_kv(v, case.Hq)
    blocked, bias = blocked_and_bias(case, causal_alignment)
    scores = np.einsum("bhtd,bhsd->bhts", q, k) * case.effective_scale + bias
    scores = np.where(blocked, -np.inf, scores)
    empty = blocked.all(axis=-1)
    row_max = np.where(empty, 0.0, scores.max(axis=-1, initial=-np.inf))  # S = 0: every row is empty
    e = np.exp(scores - row_max[..., None])
    denom = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    if all_blocked == "nan":
        weights[empty] = np.nan
    elif all_blocked == "mean-v":
        weights[empty] = 1.0 / case.S
    elif all_blocked != "zeros":
        raise ValueError(f"unknown all_blocked policy {all_blocked!r}")
    out = np.einsum("bhts,bhsd->bhtd", weights, v)
    return Forward(out=out, weights=weights, blocked=blocked, all_blocked=empty)


def vjp(
    case: Case,
    grad_out: np.ndarray,
    *,
    all_blocked: str = "zeros",
    causal_alignment: str = "top-left",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) for the cotangent ``grad_out``, analytic, float64.

    Rows with a fixed fill (all-blocked rows under "zeros" or "mean-v") do not depend on the scores,
    so their score gradient is exactly zero: the finite backward the spec asks for (§8).
    """
    fwd = forward(case, all_blocked=all_blocked, causal_alignment=causal_alignment)
    return backward(case, fwd, grad_out)


def backward(
    case: Case, fwd: Forward, grad_out: np.ndarray, *, score_derivative: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) from a forward's weights and blocked set: dV = P^T dO, dS = P (dP - rowsum(dP P)),
    zero on blocked positions and on rows with a fixed fill. ``score_derivative`` ([B, Hq, T, S]), when
    the final score is a function of the scaled product (a softcap), multiplies dS on its way back to
    that product; the variant oracle passes it."""
    q = _f64(case.query)
    ke = expand_kv(_f64(case.key), case.Hq)
    do = _f64(grad_out)
    dv_e = np.einsum("bhts,bhtd->bhsd", fwd.weights, do)
    ds = score_grad(case, fwd, grad_out)
    if score_derivative is not None:
        ds = ds * score_derivative
    scale = case.effective_scale
    dq = np.einsum("bhts,bhsd->bhtd", ds, ke) * scale
    dk_e = np.einsum("bhts,bhtd->bhsd", ds, q) * scale

    return dq, fold_query_heads(dk_e, case.Hkv), fold_query_heads(dv_e, case.Hkv)


def score_grad(case: Case, fwd: Forward, grad_out: np.ndarray) -> np.ndarray:
    """dS = P (dP - rowsum(dP P)) [B, Hq, T, S], dP = dO V^T: the gradient of the final scores, zero on
    blocked positions and on rows with a fixed fill. It is the gradient of the additive M too (M is
    added to the scaled scores), summed over the axes M is broadcast along (:func:`bias_grad`)."""
    ve = expand_kv(_f64(case.value), case.Hq)
    p = fwd.weights
    dp = np.einsum("bhtd,bhsd->bhts", _f64(grad_out), ve)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return np.where(fwd.blocked | fwd.all_blocked[..., None], 0.0, ds)


def bias_grad(case: Case, fwd: Forward, grad_out: np.ndarray) -> np.ndarray:
    """The gradient of the additive M, in M's own (broadcast) shape, float64."""
    return reduced_to(score_grad(case, fwd, grad_out), np.shape(case.bias))


def reduced_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` [B, H, T, S] summed over the axes an array of ``shape`` is broadcast along, in ``shape``:
    the gradient of a broadcast input."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return (x.sum(axis=axes, keepdims=True) if axes else x).reshape(shape)


# -- long sequences -------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockedForward:
    out: np.ndarray  # [B, Hq, T, Dv] float64
    logsumexp: np.ndarray  # [B, Hq, T] float64 over the visible scores; -inf on all-blocked rows
    all_blocked: np.ndarray  # [B, Hq, T] bool


DEFAULT_BLOCK = 512
DEFAULT_TILE_ELEMENTS = 1 << 22  # 32 MiB of float64 scores per tile


def _as4(x: np.ndarray) -> np.ndarray:
    """Left-pad a broadcastable mask or bias to rank 4 without copying."""
    x = np.asarray(x)
    if x.ndim > 4:
        raise ValueError(f"mask/bias of rank {x.ndim} does not broadcast to [B, H, T, S]")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _tile(x4: np.ndarray, t: slice, s: slice) -> np.ndarray:
    """The [.., t, s] part of a rank-4 broadcastable array (size-1 axes stay size 1)."""
    return x4[:, :, t if x4.shape[2] > 1 else slice(None), s if x4.shape[3] > 1 else slice(None)]


def forward_blocked(
    case: Case,
    *,
    all_blocked: str = "zeros",
    causal_alignment: str = "top-left",
    block: int | None = None,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> BlockedForward:
    """The float64 forward of :func:`forward` without materialising [B, H, T, S].

    Keys are visited ``block`` at a time with a running row max ``m`` and running denominator ``l``
    (the rescaling FlashAttention does, here in float64); queries are taken in chunks so that one
    tile of scores holds at most ``tile_elements`` numbers. GQA groups the query heads that share a
    kv head into one GEMM operand instead of repeating K and V. Peak memory is the float64 copies
    of the inputs plus a few tiles, so S = 16384 fits in tens of MiB. ``block=None`` takes
    DEFAULT_BLOCK keys, or more when few queries leave room in the tile (fewer Python steps).
    """
    if all_blocked not in ("zeros", "nan", "mean-v"):
        raise ValueError(f"unknown all_blocked policy {all_blocked!r}")
    B, Hq, Hkv, T, S, Dk, Dv = case.B, case.Hq, case.Hkv, case.T, case.S, case.Dk, case.Dv
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    g = Hq // Hkv
    if block is None:
        block = max(DEFAULT_BLOCK, tile_elements // max(1, B * Hq * T))
    block = max(1, min(int(block), S))
    chunk = max(1, min(T, tile_elements // max(1, B * Hq * block)))
    scale = case.effective_scale
    q, v = _f64(case.query) * scale, _f64(case.value)  # scale folded into Q: one pass fewer per tile
    kt = np.ascontiguousarray(np.swapaxes(case.key, -1, -2), dtype=np.float64)  # [B, Hkv, Dk, S], for BLAS
    mask4 = None if case.mask is None else _as4(np.asarray(case.mask, dtype=bool))
    bias4 = None if case.bias is None else _as4(_f64(case.bias))
    offset = 0 if causal_alignment == "top-left" else S - T
    out = np.empty((B, Hq, T, Dv))
    lse = np.empty((B, Hq, T))
    for t0 in range(0, T, chunk):
        t1 = min(t0 + chunk, T)
        n, ts = t1 - t0, slice(t0, t1)
        qg = q[:, :, ts].reshape(B, Hkv, g * n, Dk)  # the g query heads of one kv head, stacked
        m = np.full((B, Hq, n), -np.inf)
        l = np.zeros((B, Hq, n))
        acc = np.zeros((B, Hkv, g * n, Dv))
        for s0 in range(0, S, block):
            s1 = min(s0 + block, S)
            ss = slice(s0, s1)
            s = np.matmul(qg, kt[..., ss]).reshape(B, Hq, n, s1 - s0)
            if bias4 is not None:
                s += _tile(bias4, ts, ss)
            if mask4 is not None:
                np.copyto(s, -np.inf, where=_tile(mask4, ts, ss))
            if case.is_causal:
                np.copyto(s, -np.inf, where=np.arange(s0, s1)[None, :] > np.arange(t0, t1)[:, None] + offset)
            m_new = np.maximum(m, s.max(axis=-1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            s -= safe[..., None]
            np.exp(s, out=s)
            alpha = np.exp(m - safe)  # 0 where m was -inf (nothing visible seen yet)
            l *= alpha
            l += s.sum(axis=-1)
            acc *= alpha.reshape(B, Hkv, g * n)[..., None]
            acc += np.matmul(s.reshape(B, Hkv, g * n, s1 - s0), v[:, :, ss])
            m = m_new
        acc = acc.reshape(B, Hq, n, Dv)
        live = l > 0
        np.divide(acc, l[..., None], out=acc, where=live[..., None])
        out[:, :, ts] = acc
        with np.errstate(divide="ignore"):
            lse[:, :, ts] = np.where(live, m + np.log(np.where(live, l, 1.0)), -np.inf)
    empty = np.isneginf(lse)
    if empty.any():
        if all_blocked == "zeros":
            out[empty] = 0.0
        elif all_blocked == "nan":
            out[empty] = np.nan
        else:  # mean-v: uniform weights over all S keys
            mean_v = np.repeat(v.mean(axis=2), g, axis=1)  # [B, Hq, Dv]
            out[empty] = np.broadcast_to(mean_v[:, :, None, :], out.shape)[empty]
    return BlockedForward(out=out, logsumexp=lse, all_blocked=empty)


# -- transforms: forward mode and the second order --------------------------------------------------
def _tangent(tangents: dict, name: str, like: np.ndarray) -> np.ndarray:
    t = tangents.get(name)
    return np.zeros_like(like) if t is None else _f64(t)


def jvp(
    case: Case,
    tangents: dict,
    *,
    all_blocked: str = "zeros",
    causal_alignment: str = "top-left",
) -> tuple[Forward, np.ndarray]:
    """The forward and its tangent along ``tangents`` ({"query", "key", "value", "bias"}: arrays of those
    inputs' shapes, a missing one 0), analytic, float64: the forward-mode derivative (JVP).

    dS = scale (dQ K^T + Q dK^T) + dM on the visible scores; dP = P (dS - rowsum(P dS)); dO = dP V + P dV.
    A blocked key contributes nothing (its weight is 0 whatever its score's tangent); a row with a fixed
    fill (all blocked under "zeros" or "mean-v") has weights that do not depend on the scores, so its
    tangent is P dV (0 under "zeros", the mean of dV under "mean-v"); under "nan" it is NaN.
    """
    fwd = forward(case, all_blocked=all_blocked, causal_alignment=causal_alignment)
    q, k, v = _f64(case.query), expand_kv(_f64(case.key), case.Hq), expand_kv(_f64(case.value), case.Hq)
    tq = _tangent(tangents, "query", q)
    tk = expand_kv(_tangent(tangents, "key", _f64(case.key)), case.Hq)
    tv = expand_kv(_tangent(tangents, "value", _f64(case.value)), case.Hq)
    scale = case.effective_scale
    ds = (np.einsum("bhtd,bhsd->bhts", tq, k) + np.einsum("bhtd,bhsd->bhts", q, tk)) * scale
    if tangents.get("bias") is not None:
        ds = ds + np.broadcast_to(_f64(tangents["bias"]), ds.shape)
    fixed = fwd.blocked | fwd.all_blocked[..., None]
    ds = np.where(fixed, 0.0, ds)
    p = fwd.weights
    dp = p * (ds - (p * ds).sum(axis=-1, keepdims=True))
    dp = np.where(fixed, 0.0, dp)
    dout = np.einsum("bhts,bhsd->bhtd", dp, v) + np.einsum("bhts,bhsd->bhtd", p, tv)
    return fwd, dout


def vjp_jvp(
    case: Case,
    grad_out: np.ndarray,
    tangents: dict,
    *,
    all_blocked: str = "zeros",
    causal_alignment: str = "top-left",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The second order a double backward computes: the gradient with respect to Q, K, V of
    <vjp(grad_out), w> (w = ``tangents``' query, key, value), which is the directional derivative of
    the VJP along w (the Hessian of <O, grad_out> is symmetric). Analytic, float64: forward mode over
    :func:`backward`'s formulas, with dot marking the derivative along w:

    Sd = scale (wQ K^T + Q wK^T); Pd = P (Sd - rowsum(P Sd)); dP = dO V^T, dPd = dO wV^T;
    r = rowsum(P dP), rd = rowsum(Pd dP + P dPd); dS = P (dP - r), dSd = Pd (dP - r) + P (dPd - rd);
    dQd = scale (dSd K + dS wK); dKd = scale (dSd^T Q + dS^T wQ); dVd = Pd^T dO; zero on blocked scores
    and on rows with a fixed fill, dK and dV summed over each GQA group. tests/test_oracle_transforms.py
    holds it to a central finite difference of :func:`vjp` and to torch's float64 double backward.
    """
    fwd = forward(case, all_blocked=all_blocked, causal_alignment=causal_alignment)
    q, k, v = _f64(case.query), expand_kv(_f64(case.key), case.Hq), expand_kv(_f64(case.value), case.Hq)
    wq = _tangent(tangents, "query", q)
    wk = expand_kv(_tangent(tangents, "key", _f64(case.key)), case.Hq)
    wv = expand_kv(_tangent(tangents, "value", _f64(case.value)), case.Hq)
    do = _f64(grad_out)
    scale = case.effective_scale
    fixed = fwd.blocked | fwd.all_blocked[..., None]
    p = fwd.weights
    sd = np.where(fixed, 0.0, (np.einsum("bhtd,bhsd->bhts", wq, k) + np.einsum("bhtd,bhsd->bhts", q, wk)) * scale)
    pd = np.where(fixed, 0.0, p * (sd - (p * sd).sum(axis=-1, keepdims=True)))
    dp = np.einsum("bhtd,bhsd->bhts", do, v)
    dpd = np.einsum("bhtd,bhsd->bhts", do, wv)
    r = (p * dp).sum(axis=-1, keepdims=True)
    rd = (pd * dp + p * dpd).sum(axis=-1, keepdims=True)
    ds = np.where(fixed, 0.0, p * (dp - r))
    dsd = np.where(fixed, 0.0, pd * (dp - r) + p * (dpd - rd))
    dqd = (np.einsum("bhts,bhsd->bhtd", dsd, k) + np.einsum("bhts,bhsd->bhtd", ds, wk)) * scale
    dkd = (np.einsum("bhts,bhtd->bhsd", dsd, q) + np.einsum("bhts,bhtd->bhsd", ds, wq)) * scale
    dvd = np.einsum("bhts,bhtd->bhsd", pd, do)
    return dqd, fold_query_heads(dkd, case.Hkv), fold_query_heads(dvd, case.Hkv)
