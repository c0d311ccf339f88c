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
it imports only the contract. ``emulate`` is a second, *low-precision* reference used by the
tolerance rule only, never as an expected value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.contract import Case, np_dtype


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
    row_max = np.where(empty, 0.0, scores.max(axis=-1))
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
    q, k, v = _f64(case.query), _f64(case.key), _f64(case.value)
    g = case.Hq // case.Hkv
    ke, ve = expand_kv(k, case.Hq), expand_kv(v, case.Hq)
    do = _f64(grad_out)
    p = fwd.weights
    dv_e = np.einsum("bhts,bhtd->bhsd", p, do)
    dp = np.einsum("bhtd,bhsd->bhts", do, ve)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    ds = np.where(fwd.blocked | fwd.all_blocked[..., None], 0.0, ds)
    scale = case.effective_scale
    dq = np.einsum("bhts,bhsd->bhtd", ds, ke) * scale
    dk_e = np.einsum("bhts,bhtd->bhsd", ds, q) * scale

    def fold(x: np.ndarray) -> np.ndarray:  # sum the query heads that share a kv head
        b, _, s, d = x.shape
        return x.reshape(b, case.Hkv, g, s, d).sum(axis=2)

    return dq, fold(dk_e), fold(dv_e)


def emulate(case: Case, *, all_blocked: str = "zeros", causal_alignment: str = "top-left") -> np.ndarray:
    """A plain same-precision kernel, used only to size tolerances (see harness.tolerance).

    It models what a careful production kernel does in the working dtype: scores and softmax in
    float32 (float64 for float64 inputs), the probabilities rounded to the working dtype before the
    P·V product (as fused fp16/bf16 kernels feed their tensor cores), float32 accumulation, and
    the output rounded to the working dtype. Its distance from :func:`forward` is the rounding error
    an honest kernel can be expected to show on *this* case.
    """
    work = np.float64 if case.dtype == "float64" else np.float32
    lowp = np_dtype(case.dtype)
    q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
    k, v = expand_kv(k, case.Hq), expand_kv(v, case.Hq)
    blocked, bias = blocked_and_bias(case, causal_alignment)
    scores = (q @ np.swapaxes(k, -1, -2)) * work(case.effective_scale) + bias.astype(work)
    scores = np.where(blocked, -np.inf, scores).astype(work)
    empty = blocked.all(axis=-1)
    m = np.where(empty, 0.0, scores.max(axis=-1)).astype(work)
    e = np.exp(scores - m[..., None])
    denom = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    if all_blocked == "mean-v":
        p[empty] = work(1.0 / case.S)
    p = p.astype(lowp).astype(work)
    out = (p @ v).astype(lowp)
    if all_blocked == "nan":
        out = out.astype(np.float64)
        out[empty] = np.nan
    return out.astype(np.float64)
