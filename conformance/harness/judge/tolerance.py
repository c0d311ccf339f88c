"""The error model: how far from the float64 oracle a correct kernel may land, element by element.

There are no absolute floors. For each element i of a result (output, observed weight, dQ, dK, dV)
of a case computed in working dtype d:

    allowed_i = max( bound_i , C_ENS * ensemble_i )

``bound`` is a first-order running-error bound (Higham, *Accuracy and Stability of Numerical
Algorithms*, ch. 3) built from the case's own numbers; ``ensemble`` is the largest distance from the
oracle, on this element of this very case, of the valid same-precision formulations in
:mod:`conformance.harness.judge.ensemble` (max-subtract, exp(s - lse), exp2 with log2(e) in the scale,
online softmax over blocks of 3, 16 and 5 keys in reverse, split-KV with lse merge, P rounded or
kept; FlashAttention-style recomputing backward). The bound is what admits kernels the ensemble
does not contain; the ensemble is the measured safety net where first order is not enough (the
self-tests and docs/tolerance.md show that the members stay inside the bound on the suite's cases).

Precisions. ``u_w`` is the unit roundoff of the working dtype d (P, dS and results are stored in
it): float64 2^-53, float32 2^-24, float16 2^-11, bfloat16 2^-8. ``u_a`` that of the precision
scores, softmax and accumulations run in: float32 for float32/float16/bfloat16 (the spec's upcast,
000 §8), float64 for float64 (float32 for a kernel that declares ``float64_computed_as=float32``; its
float64 inputs are then rounded too). ``eta`` is the least absolute error a rounding can make: half
the smallest subnormal spacing of d (float16: 2^-25), or the smallest normal number of the compute
precision (float32: 2^-126) where that is larger, because flush-to-zero units (XLA on CPU, GPUs in
float32) drop subnormal weights (measured: jax returns 0 for weights of ~1e-39). It is the only
"floor", and it matters only where the exact value is ~0. ``gamma(n) = n u_a / (1 - n u_a)`` bounds a length-n
float sum in any order.

Forward, per query row with visible keys j (blocked keys carry exactly zero weight and no error):

* Exponent error. ``eps_row = gamma(Dk) max_j scale*sum_d |q_d k_jd| + u_b max_j |bias_j|
  + C_S u_a max_j |s_j| + u_a log(S)``. The dot product's rounding is gamma(Dk) times its absolute
  sum; u_b = u_w (0 for float64) is the bias rounded to the working dtype, as torch's SDPA signature
  passes a float mask in the query's dtype; C_S = 4 roundings of a quantity of size |s|: the product
  by the scale, the bias addition, the folded log2(e) constant (exp2 kernels) and the subtraction of
  the running max or of the lse (exp(s - lse), split-KV merges); log(S) is the lse's excess over the
  max. This is the "u |s|" term: at |s| ~ 2e9 it exceeds 1 and the row is ill-conditioned, so the
  model then allows what the formulation can do there (nothing is promised of visible weights).
* Relative error of every weight: ``omega = expm1(2 eps_row) + gamma(2S + 8)``. Ratios of weights
  move by at most exp(2 eps) whether the kernel normalises (max-subtract) or not (exp(s - lse),
  split-KV mass errors); the gamma term covers exp() and division (a few u_a each), the running-sum
  rescales of an online softmax (one per block, at most S) and the split merge.
* ``bound_out = omega WV + [2 u_w (1+omega) WV + 2 eta N] + gamma(S)(1+omega) WV + u_a |o| + round(u_w)``
  with WV = sum_j w_j |v_j| and N = sum over visible j of |v_j|: the weights' error; P rounded to d
  before P·V and, once more, partial outputs stored in d before a split-KV merge (vLLM's paged
  attention v2 keeps them in the output dtype) or exp(s - m) stored in d before it is normalised (a
  two-pass softmax): two roundings of at most u_w WV, or, where the value is subnormal, eta |v_j|
  each (measured: zoo-two-pass-e-stored, float16, 1.21 x the bound with one eta N on a drawn case
  of ORACLE-AGREE-01 whose output, 2.1e-6, came from subnormal weights); the P·V accumulation; the
  final division; the output's own rounding
  ``max(u_w (|o| + pre), eta)``. The ``omega WV`` term uses |v_j|, not
  |v_j - o|, because non-normalising formulations (exp(s - lse), split merges) err in total mass.
* Observed weights (V = I): ``bound_w = (omega + 3 u_w + u_a)(1 + omega) w + 3 eta``: P rounded, a
  stored partial output, the output's rounding; the division by l after P·V.

Backward (FlashAttention's recomputation, with dS rounded to d before its GEMMs), elementwise
absolute bounds carried through dV = P^T dO, dP = dO V^T, D = rowsum(dO * O) or rowsum(P * dP)
(the larger bound: kernels use either; O is the kernel's *rounded* output, so D carries the forward
bound), dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q, with GQA groups summed (their bounds
add; each query head's share may be rounded to d first, as autograd through a repeat of K and V
does) and each result rounded to d. dK and dV may also be *accumulated* in d: torch's CPU flash
backward adds each block of query rows' share (qSplitSize 32, 64 or 256 rows by T) and each query
head's share of a GQA group into a float16/bfloat16 buffer (bit-exact emulation, 99 %+ of
elements). The model takes blocks of at least ROW_BLOCK = 32 rows: n = g ceil(T / 32) parts,
n - 1 rounded partial sums before the result's own rounding, each at most u_w times the sum of
the terms' magnitudes. Without it, torch-sdpa-flash used 1.016 (float16 dV,
g = 4, T = 8) and 1.004 (bfloat16 dV, g = 1, T = 256) of the allowance.
See :func:`grad_bound`.

Constants and why:

* C_ENS = 2: FlashAttention's acceptance rule (error <= 2x a same-precision reference); the
  ensemble only matters where it exceeds the bound.
* C_S = 4: the four roundings of size |s| listed above (each at most u_a |s|).
* The bound itself carries no fudge factor: each term is a worst case (gamma(n), not sqrt(n)),
  so a kernel that reorders or tiles its sums differently stays inside it; docs/tolerance.md
  (scripts/tolerance_report.py) measures the honest error of every zoo kernel and built-in adapter
  against it (ratio < 1 everywhere) and shows the uniform deviations it sees.

Long because it is one derivation: the bound's forward, weights and gradient parts share the
precisions and row model defined at the top, and read as one argument with the docstring above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from conformance import oracle
from conformance.contract import Case
from conformance.oracle import Forward, expand_kv, fold_query_heads

C_ENS = 2.0
C_S = 4.0
ROW_BLOCK = 32  # the fewest query rows a backward accumulates dK, dV over before storing them in d
P_ROUNDINGS = 2  # roundings between a weight and P·V, each u_w relative or eta absolute (e stored, then P)
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# Half the smallest subnormal: the smallest absolute error bound of a rounding into the dtype.
HALF_SUBNORMAL = {"float64": 2.0**-1075, "float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134}
# The smallest normal: what a flush-to-zero unit (XLA on CPU, most GPUs in float32) loses at once.
TINY = {"float64": 2.0**-1022, "float32": 2.0**-126}


@dataclass(frozen=True)
class Precision:
    """The precisions a kernel for (case dtype, rule dtype) works in; see the module docstring."""

    dtype: str  # the rule dtype (Declaration.tolerance_dtype)
    u_w: float
    u_a: float
    eta: float
    u_b: float  # rounding of the additive mask
    inputs_rounded: bool  # float64 inputs computed in float32
    # A declared formulation's extra roundings (harness.judge.formulation_error; defaults: none);
    # u_sum (below): the products' sums accumulated in the working dtype (``-sums``).
    # u_p, eta_p: P and dS rounded for their products (TF32, bfloat16 operands of a float32 case);
    # dp_rounded: dP = dO V^T stored in the working dtype (a backward through low-precision products);
    # ds_roundings, dq_roundings: further roundings of dS (a scale applied in the working dtype) and
    # of dQ (Q scaled in it); merges: normwise merges, each an absolute 3 u_a max|v| on the output.
    u_p: float | None = None
    eta_p: float | None = None
    dp_rounded: bool = False
    ds_roundings: int = 1
    dq_roundings: int = 1
    merges: int = 0
    u_sum: float | None = None  # the unit roundoff P V (and Q K^T) accumulate in, where not u_a

    def gamma_sum(self, n: np.ndarray | float) -> np.ndarray | float:
        """gamma(n) of a sum accumulated in ``u_sum`` (u_a unless a formulation declares another)."""
        u = self.u_a if self.u_sum is None else self.u_sum
        nu = np.asarray(n, dtype=np.float64) * u
        return nu / (1.0 - np.minimum(nu, 0.5))

    def gamma(self, n: np.ndarray | float) -> np.ndarray | float:
        nu = np.asarray(n, dtype=np.float64) * self.u_a
        return nu / (1.0 - np.minimum(nu, 0.5))

    def rounding(self, magnitude: np.ndarray) -> np.ndarray:
        """Bound on the error of rounding a value of the given magnitude into the working dtype:
        u_w relative, or eta absolute where the value is subnormal there."""
        with np.errstate(invalid="ignore", over="ignore"):
            return np.maximum(self.u_w * magnitude, self.eta)

    @property
    def p(self) -> float:
        """The unit roundoff of P and dS where they are rounded for a product (u_w unless declared)."""
        return self.u_w if self.u_p is None else self.u_p

    @property
    def eta_of_p(self) -> float:
        return self.eta if self.eta_p is None else self.eta_p

    def p_rounding(self, magnitude: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.maximum(self.p * magnitude, self.eta_of_p)


def precision(case_dtype: str, rule_dtype: str) -> Precision:
    u_w = UNIT_ROUNDOFF[rule_dtype]
    acc = "float64" if rule_dtype == "float64" else "float32"
    u_a = UNIT_ROUNDOFF[acc]
    eta = max(HALF_SUBNORMAL[rule_dtype], TINY[acc])
    return Precision(
        dtype=rule_dtype,
        u_w=u_w,
        u_a=u_a,
        eta=eta,
        u_b=0.0 if rule_dtype == "float64" else u_w,
        inputs_rounded=case_dtype == "float64" and rule_dtype != "float64",
    )


def _scaled(factor: np.ndarray, x: np.ndarray) -> np.ndarray:
    """factor * x with 0 where x == 0 (an infinite factor times nothing is nothing)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(x == 0, 0.0, factor * x)


@dataclass(frozen=True)
class RowModel:
    """Per-row quantities of the forward model, shared by the output, weights and gradient bounds."""

    prec: Precision
    weights: np.ndarray  # oracle weights, NaN -> 0
    visible: np.ndarray  # weights > 0 (or uniform fill of an empty row)
    omega: np.ndarray  # [B, Hq, T, 1] relative error bound of each weight, before rounding
    eps: np.ndarray  # [B, Hq, T] exponent error bound


def row_model(
    case: Case,
    fwd: Forward,
    prec: Precision,
    score_error: np.ndarray | None = None,
    magnitudes: np.ndarray | None = None,
) -> RowModel:
    """The row model of ``case``. A declared formulation (harness.judge.formulation_error) passes the
    ``score_error`` each key's score may carry into the softmax in place of the dot product's
    rounding, and the score ``magnitudes`` its roundings of size |s| act on (a fill's rows: the
    scores before the fill, which the row max cancels)."""
    q = np.asarray(case.query).astype(np.float64)
    k = expand_kv(np.asarray(case.key).astype(np.float64), case.Hq)
    scale = case.effective_scale
    kt = np.ascontiguousarray(np.swapaxes(k, -1, -2))
    absdot = (np.abs(q) @ np.abs(kt)) * abs(scale)  # a magnitude: a negative scale flips the dots, not it
    dots = (q @ kt) * scale
    bias = np.zeros(case.weights_shape)
    if case.bias is not None:
        b = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
        bias = np.where(np.isneginf(b), 0.0, b)
    s = dots + bias
    hidden = fwd.blocked
    gam_d = prec.gamma(case.Dk) * (1.0 + (2.0 if prec.inputs_rounded else 0.0)) + (
        2.0 * prec.u_a if prec.inputs_rounded else 0.0
    )
    dot_error = gam_d * absdot if score_error is None else score_error
    size = np.abs(s) if magnitudes is None else np.abs(magnitudes)
    with np.errstate(invalid="ignore", over="ignore"):
        per_key = dot_error + prec.u_b * np.abs(bias) + C_S * prec.u_a * size
    eps = np.where(hidden, 0.0, per_key).max(axis=-1) + prec.u_a * math.log(max(case.S, 1))
    eps = np.where(fwd.all_blocked, 0.0, eps)
    extra = 2 * case.S + 8 + (1 if prec.inputs_rounded else 0)
    with np.errstate(over="ignore"):
        omega = np.expm1(2.0 * eps) + prec.gamma(extra)
    w = np.nan_to_num(fwd.weights, nan=0.0)
    return RowModel(prec=prec, weights=w, visible=w > 0, omega=omega[..., None], eps=eps)


def forward_bound(case: Case, fwd: Forward, rm: RowModel) -> np.ndarray:
    """First-order bound on |out - oracle out| per element, [B, Hq, T, Dv]."""
    prec = rm.prec
    v = np.abs(expand_kv(np.asarray(case.value).astype(np.float64), case.Hq))
    wv = rm.weights @ v
    n_vis = rm.visible.astype(np.float64) @ v
    grow = 1.0 + rm.omega
    pre = (
        _scaled(rm.omega, wv)
        + _scaled(2 * prec.p * grow, wv)
        + P_ROUNDINGS * prec.eta_of_p * n_vis
        + _scaled(prec.gamma_sum(case.S) * grow, wv)
    )
    if prec.u_sum is not None:  # partial sums rounded in the working dtype: subnormal ones lose eta each
        pre = pre + case.S * prec.eta * (n_vis > 0)
    if prec.inputs_rounded:
        pre = pre + prec.u_a * wv
    if prec.merges:  # normwise merges: each an absolute error of a few u_a of the row's largest |v|
        vmax = np.max(np.where(rm.visible[..., None], v[:, :, None, :, :], 0.0), axis=-2, initial=0.0)
        pre = pre + 3 * prec.merges * prec.u_a * vmax
    o = np.abs(np.nan_to_num(fwd.out, nan=0.0))
    pre = pre + prec.u_a * o
    return pre + prec.rounding(o + pre)


def weights_bound(rm: RowModel) -> np.ndarray:
    """First-order bound on |observed weight - oracle weight| per element, [B, Hq, T, S]."""
    prec = rm.prec
    grow = 1.0 + rm.omega
    bound = _scaled((rm.omega + 2 * prec.p + prec.u_w + prec.u_a) * grow, rm.weights) + 3 * prec.eta_of_p * rm.visible
    if prec.merges:  # V = I: the row's largest |v| is 1
        bound = bound + 3 * prec.merges * prec.u_a * rm.visible.any(axis=-1, keepdims=True)
    return bound


def _score_grad(
    case: Case, fwd: Forward, rm: RowModel, out_bound: np.ndarray, do: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dS, its bound, P's bound as the backward has it): the score gradient dS = P (dP - D) of a
    FlashAttention-style backward (module docstring), shared by dQ, dK and the gradient of M."""
    prec = rm.prec
    v = expand_kv(np.asarray(case.value).astype(np.float64), case.Hq)
    p = rm.weights
    live = ~fwd.all_blocked[..., None]
    ir = 2.0 * prec.u_a if prec.inputs_rounded else 0.0  # inputs and dO rounded to float32
    # P as the kernel has it: recomputed (omega), then rounded to d for the GEMMs (u_w, eta).
    pi = _scaled(rm.omega + prec.p * (1.0 + rm.omega), p) + prec.eta_of_p * rm.visible
    vt = np.swapaxes(v, -1, -2)
    dp = do @ vt
    e_dp = (prec.gamma(case.Dv) + ir) * (np.abs(do) @ np.abs(vt))
    if prec.dp_rounded:  # dO V^T stored in the working dtype (a backward through its products)
        e_dp = e_dp + prec.rounding(np.abs(dp) + e_dp)
    o = np.nan_to_num(fwd.out, nan=0.0)
    d_exact = (p * dp).sum(axis=-1, keepdims=True)
    via_out = (np.abs(do) * out_bound).sum(axis=-1, keepdims=True) + (prec.gamma(case.Dv) + ir) * (
        np.abs(do) * np.abs(o)
    ).sum(axis=-1, keepdims=True)
    via_p = (_scaled(pi, np.abs(dp)) + p * e_dp).sum(axis=-1, keepdims=True) + prec.gamma(case.S) * (
        p * np.abs(dp)
    ).sum(axis=-1, keepdims=True)
    e_d = np.maximum(via_out, via_p)
    ds = p * (dp - d_exact)
    e_ds = _scaled(pi, np.abs(dp - d_exact)) + _scaled(p + pi, e_dp + e_d) + 2 * prec.u_a * np.abs(ds)
    for _ in range(prec.ds_roundings):  # dS rounded to d before dQ, dK (and scaled there, if declared)
        e_ds = e_ds + prec.p_rounding(np.abs(ds) + e_ds) * rm.visible
    e_ds = np.where(live & rm.visible, e_ds, 0.0)
    return ds, e_ds, pi


def bias_grad_bound(case: Case, fwd: Forward, rm: RowModel, out_bound: np.ndarray, grad_out: np.ndarray) -> np.ndarray:
    """First-order bound on the gradient of the additive M: dS (M is added after the scale), summed
    over the axes M is broadcast along (a sum of n terms: gamma(n) of their absolute sum), rounded to
    the dtype M is held in (at most the working dtype's unit roundoff)."""
    ds, e_ds, _ = _score_grad(case, fwd, rm, out_bound, np.asarray(grad_out).astype(np.float64))
    shape = np.shape(case.bias)
    summed = [ds.shape[i] for i in range(ds.ndim) if i < ds.ndim - len(shape) or shape[i - (ds.ndim - len(shape))] == 1]
    n = int(np.prod(summed)) if summed else 1

    def reduce(x: np.ndarray) -> np.ndarray:
        return oracle.reduced_to(x, shape)

    exact = np.abs(reduce(ds))
    pre = reduce(e_ds) + rm.prec.gamma(n) * reduce(np.abs(ds) + e_ds) + rm.prec.u_a * exact
    return pre + rm.prec.rounding(exact + pre)


def grad_bound(
    case: Case,
    fwd: Forward,
    rm: RowModel,
    out_bound: np.ndarray,
    grad_out: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First-order bounds on |dQ|, |dK|, |dV| errors of a FlashAttention-style backward.

    Every quantity is an elementwise absolute bound carried from product to product (running error
    analysis); products of two error terms are kept through the (1 + omega) factors only.
    """
    prec = rm.prec
    g = case.Hq // case.Hkv
    scale = case.effective_scale
    q = np.asarray(case.query).astype(np.float64)
    k = expand_kv(np.asarray(case.key).astype(np.float64), case.Hq)
    ir = 2.0 * prec.u_a if prec.inputs_rounded else 0.0  # inputs and dO rounded to float32
    do = np.asarray(grad_out).astype(np.float64)
    p = rm.weights
    ds, e_ds, pi = _score_grad(case, fwd, rm, out_bound, do)
    ads = np.abs(ds) + e_ds
    # dQ = scale dS K
    dq = (ds @ k) * scale
    pre_q = abs(scale) * (e_ds @ np.abs(k)) + (prec.gamma(case.S) + ir) * abs(scale) * (ads @ np.abs(k))
    pre_q = pre_q + prec.u_a * np.abs(dq)
    for _ in range(prec.dq_roundings - 1):  # dQ scaled in the working dtype after its product
        pre_q = pre_q + prec.rounding(np.abs(dq) + pre_q)
    e_dq = pre_q + prec.rounding(np.abs(dq) + pre_q)
    # dK = scale dS^T Q, dV = P^T dO, each summed over the query heads of a kv head's group
    dst = np.swapaxes(ds, -1, -2)
    dk_e = (dst @ q) * scale
    abs_k = abs(scale) * (np.swapaxes(ads, -1, -2) @ np.abs(q))  # sum of |terms|: bounds every partial sum
    pre_k = abs(scale) * (np.swapaxes(e_ds, -1, -2) @ np.abs(q)) + (prec.gamma(case.T) + ir) * abs_k
    pt = np.swapaxes(p, -1, -2)
    dv_e = pt @ do
    abs_v = (pt + np.swapaxes(pi, -1, -2)) @ np.abs(do)
    pre_v = np.swapaxes(pi, -1, -2) @ np.abs(do) + (prec.gamma(case.T) + ir) * abs_v
    # dK, dV accumulated in d over blocks of ROW_BLOCK query rows and over the g heads of a group
    n_parts = g * -(-case.T // ROW_BLOCK)

    def fold(x: np.ndarray) -> np.ndarray:
        return fold_query_heads(x, case.Hkv)

    out = []
    for exact_e, pre_e, abs_e in ((dk_e, pre_k, abs_k), (dv_e, pre_v, abs_v)):
        if g > 1:  # autograd through a repeat of K, V stores each query head's share in d before the sum
            pre_e = pre_e + prec.rounding(np.abs(exact_e) + pre_e)
        exact = fold(exact_e)
        pre = fold(pre_e) + prec.gamma(g) * fold(np.abs(exact_e) + pre_e) + prec.u_a * np.abs(exact)
        # accumulated in d: n_parts - 1 rounded partial sums before the result's own rounding (with GQA
        # one of them is the per-head store above)
        extra = n_parts - (2 if g > 1 else 1)
        if extra > 0 and prec.u_w > prec.u_a:
            pre = pre + extra * prec.rounding(fold(abs_e + pre_e))
        out.append(pre + prec.rounding(np.abs(exact) + pre))
    return e_dq, out[0], out[1]


def combine(bound: np.ndarray, ensemble_err: np.ndarray | None) -> np.ndarray:
    """allowed = max(bound, C_ENS * ensemble error); non-finite ensemble errors are ignored.

    A NaN bound would accept any answer (every comparison with NaN is false), so it is an error here.
    """
    if np.isnan(bound).any():
        raise ValueError("error model produced a NaN bound: a term multiplies an infinite factor by zero")
    if ensemble_err is None:
        return bound
    e = np.where(np.isfinite(ensemble_err), ensemble_err, 0.0)
    return np.maximum(bound, C_ENS * e)


def ensemble_error(members: list[np.ndarray], want: np.ndarray) -> np.ndarray:
    """Per element, the largest distance of a member from the oracle (NaN on both sides: 0)."""
    want = np.asarray(want, dtype=np.float64)
    worst = np.zeros(want.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for m in members:
            d = np.abs(np.asarray(m, dtype=np.float64) - want)
            worst = np.maximum(worst, np.where(np.isfinite(d), d, 0.0))
    return worst


def describe(dtype: str, what: str = "output") -> str:
    """The rule in one line, for failure reports."""
    return (
        f"|err| <= max(first-order bound, {C_ENS:g} x spread of the same-precision ensemble) for the {what} "
        f"of this case in {dtype} (harness.judge.tolerance; docs/tolerance.md)"
    )
