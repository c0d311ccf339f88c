"""The error model of a declared formulation: what rounding it still leaves to the kernel.

Under a formulation (conformance/oracle_formulations.py) the expected answer is the oracle re-run
with the formulation's roundings, so the allowance is not the spec's error model around the spec's
answer but the error a kernel that follows the formulation can still make around *that* answer.
It is :mod:`harness.judge.tolerance`'s first-order bound with three changes, each a term the
formulation names:

* **The scores' error.** In place of the dot product's ``gamma(Dk) scale sum|q k|``, each key's score
  carries :func:`score_error`: the accumulation error before a rounding the formulation makes
  (``-products``: Q K^T rounded to the input dtype), then that rounding's *residual*
  (``oracle_formulations.rounding_residual``): 0 where the exact product lies farther from a
  rounding boundary than the accumulation can move it (the kernel's rounding then lands on the
  oracle's, and the float16 overflow, the bfloat16 loss of fine structure, are judged exactly),
  else that error plus one spacing of the dtype. Q times the scale in the input dtype and the fill
  added to a blocked score, and s + M rounded to the input dtype (``-masked``), are residuals of the
  same kind; a ``set`` fill is exact; an input rounded
  to a float32 case's operand format leaves only its ties (kernels break them differently).
  Roundings of size |s| (the ``C_S u_a |s|`` term) act on the scores before a fill: a row blocked
  entirely by an added fill keeps exact ratios where the kernel subtracts the row max, which cancels
  the fill; a kernel that subtracts an lse formed at the fill's magnitude (P recomputed as 1 where
  1/S is right) is not following the formulation.
* **P and dS** are rounded to the operand format (TF32, bfloat16, float16) for their products: the
  bound's P and dS roundings use its unit roundoff (``Precision.u_p``).
* **Sums in the input dtype** (``-sums``): Q K^T's and P V's accumulations carry gamma(n) in the
  input dtype's unit roundoff instead of float32's (``Precision.u_sum``).
* **Low-precision products in the backward** (autograd through float16 / bfloat16 matmuls): dP is
  stored in the input dtype, and dS (dQ) once more where the scale is applied there.
* **Normwise merges** (``normwise_merges``): each merge of two partial outputs (ring attention's
  sigmoid merge) errs by a few u_a of the row's largest |v|, absolutely (``Precision.merges``).

The ensemble's spread (``harness.judge.ensemble``) is taken around the spec's oracle, as the float32
part of the computation is the same; the larger of bound and 2 x spread is allowed, as always.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from conformance import oracle_formulations as of
from conformance.contract import Case, Declaration
from conformance.harness.judge import tolerance
from conformance.oracle import blocked_and_bias, expand_kv

# Half the smallest subnormal of each operand format: the least absolute error of rounding into it.
_HALF_SUBNORMAL = {"tf32": 2.0**-150, "bfloat16": 2.0**-134, "float16": 2.0**-25}


def precision(case: Case, decl: Declaration, f: of.Formulation) -> tolerance.Precision:
    """The precisions of ``case`` under ``f``: the spec's (``tolerance.precision``) with the
    formulation's P / dS format, backward roundings and merges."""
    base = tolerance.precision(case.dtype, decl.tolerance_dtype(case))
    changes: dict = {}
    if f.operands:
        changes["u_p"] = of.UNIT_ROUNDOFF[f.operands]
        changes["eta_p"] = max(base.eta, _HALF_SUBNORMAL[f.operands])
    if f.product:
        changes["dp_rounded"] = True
        changes["ds_roundings"] = 2 if f.scaled_rounded else 1
        changes["dq_roundings"] = 2 if f.rounds_query else 1
    if f.summed_in:
        changes["u_sum"] = of.UNIT_ROUNDOFF[f.summed_in]
    if f.normwise_merges:
        changes["merges"] = f.normwise_merges
    return dataclasses.replace(base, **changes)


def _gamma_dk(case: Case, prec: tolerance.Precision) -> float:
    """The dot product's relative error factor, as tolerance.row_model has it (its sum accumulated in
    the working dtype under ``-sums``)."""
    extra = 2.0 if prec.inputs_rounded else 0.0
    return float(prec.gamma_sum(case.Dk)) * (1.0 + extra) + (2.0 * prec.u_a if prec.inputs_rounded else 0.0)


def score_error(case: Case, decl: Declaration, f: of.Formulation, prec: tolerance.Precision):
    """([B, Hq, T, S] the error each score may carry into the softmax, the score magnitudes the
    softmax's own roundings act on), under formulation ``f``; see the module docstring."""
    alignment = decl.causal_alignment
    ops = of.operands(case, f)
    kt_abs = np.abs(np.swapaxes(ops.k, -1, -2))
    delta = _gamma_dk(case, prec) * (np.abs(ops.q) @ kt_abs)
    if f.operands:  # inputs at a tie of the operand format: a kernel may round them the other way
        q64, k64 = (np.asarray(x).astype(np.float64) for x in (case.query, case.key))
        tq = of.tie_residual(q64, f.operands)
        tk = expand_kv(of.tie_residual(k64, f.operands), case.Hq)
        delta = delta + tq @ kt_abs + np.abs(ops.q) @ np.abs(np.swapaxes(tk, -1, -2))
    if f.rounds_query:  # Q * scale rounded to the input dtype (the scale itself may be a number of it)
        sc = case.effective_scale
        q64 = np.asarray(case.query).astype(np.float64)
        slip = abs(sc - float(of.round_to(np.float64(sc), f.dtype))) + prec.u_a * abs(sc)
        r_q = of.rounding_residual(q64 * sc, slip * np.abs(q64), f.dtype)
        delta = delta + r_q @ kt_abs
    sc = abs(ops.scale_after)
    s = of.scores(case, f, ops)
    with np.errstate(over="ignore", invalid="ignore"):
        if not f.product:
            err = sc * delta
        elif f.scale_applied == "product":
            scaled = ops.raw * ops.scale_after
            err = of.rounding_residual(scaled, sc * delta + prec.u_a * np.abs(scaled), f.product)
        else:
            r = of.rounding_residual(ops.raw, delta, f.product)
            err = sc * r
            if f.scaled_rounded and ops.scale_after != 1.0:
                rounded = of.round_to(ops.raw, f.product) * ops.scale_after
                err = err + of.rounding_residual(rounded, err + prec.u_a * np.abs(rounded), f.product)
        bias = blocked_and_bias(case, alignment)[1]
        final, filled = of.filled_scores(case, f, s, alignment)
        if f.bias_rounded:  # s + M rounded to the input dtype: a kernel whose s is err away may round it the other way
            exact = s + of.round_to(bias, f.product)
            slip = of.rounding_residual(exact, err + prec.u_a * np.abs(exact), f.product)
            err = np.where(np.isfinite(exact), slip, 0.0)
        before = of.masked_scores(s, bias, f)  # the scores with the bias, before any fill
        if f.fill:
            mode, value = f.fill
            fill_err = 0.0 if mode == "set" else of.rounding_residual(before + value, err, f.fill_dtype)
            err = np.where(filled, fill_err, err)
        err = np.where(np.isneginf(final), 0.0, err)  # a key at -inf has weight 0 in both
    return err, np.where(np.isfinite(before), before, 0.0)
