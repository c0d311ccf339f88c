"""The tolerance rule: how far from the float64 oracle a correct kernel may land.

Rule (one for every numeric clause), for each element i of a result in dtype d:

    allowed_i = FUDGE * max(ref_err, ATOL[d]) + RTOL[d] * |expected_i|

``ref_err`` is the greatest distance from the oracle of :func:`conformance.oracle.emulate`, a plain
same-precision kernel (float32 scores and softmax, probabilities rounded to d before P·V, output
rounded to d), measured on *this very case*. Why this rule:

* It follows PyTorch's test_transformers (``fudge * max(|ref_hp - ref_lp|, default_atol)``) and
  FlashAttention's (error <= 2x that of a same-precision reference): the allowance is sized by the
  error an honest kernel makes on the same inputs, so it grows with the logit and value scale of
  the case instead of being one constant that is too loose for small values and too tight for large.
* FUDGE = 4, not 2: FlashAttention compares kernels that all round P the same way; a conformance
  suite also meets kernels that keep P in float32 and reorder reductions differently (tiles, online
  softmax), each worth up to about one more ulp of the result. Mutants that this suite must catch
  (wrong axis, wrong scale, mask after softmax, no upcast) miss by orders of magnitude more.
* ATOL and RTOL are floors in the spirit of ``torch.testing.assert_close``'s per-dtype table: they
  matter only where the reference happens to round exactly (ref_err = 0), and the relative term
  covers one or two rounding steps at the element's own magnitude.

Gradients use the same rule with the emulated reference replaced by the dtype's floor scaled by
the magnitude of the oracle's gradient (see :func:`grad_allowed`): there is no same-precision
backward reference here, and backward kernels accumulate over T or S, so the floor grows with the
reduction length.
"""

from __future__ import annotations

import math

import numpy as np

FUDGE = 4.0
ATOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
RTOL = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def describe(dtype: str) -> str:
    return (
        f"|err| <= {FUDGE:g}*max(ref_err, {ATOL[dtype]:g}) + {RTOL[dtype]:g}*|expected| "
        f"(ref_err: same-precision reference vs float64 oracle on this case; {dtype})"
    )


def allowed(expected: np.ndarray, ref: np.ndarray | None, dtype: str) -> tuple[np.ndarray, float]:
    """Per-element allowance and the ref_err it was sized from."""
    e = np.asarray(expected, dtype=np.float64)
    ref_err = 0.0
    if ref is not None:
        with np.errstate(invalid="ignore"):
            d = np.abs(np.asarray(ref, dtype=np.float64) - e)
        d = d[np.isfinite(d)]
        ref_err = float(d.max()) if d.size else 0.0
    base = FUDGE * max(ref_err, ATOL[dtype])
    with np.errstate(invalid="ignore"):
        return base + RTOL[dtype] * np.where(np.isfinite(e), np.abs(e), 0.0), ref_err


def grad_allowed(expected: np.ndarray, dtype: str, reduction: int) -> np.ndarray:
    """Allowance for a gradient whose elements are sums of ``reduction`` terms.

    Error of a length-n reduction of values of magnitude m in dtype d grows like sqrt(n)*eps*m for
    an honest kernel; the low-precision backward also rounds dS and P to d. The rule:
    ``FUDGE * (eps_d * sqrt(n) * max|expected| + ATOL[d]) + RTOL[d] * |expected|``.
    """
    e = np.asarray(expected, dtype=np.float64)
    scale = float(np.max(np.abs(e))) if e.size else 0.0
    eps = EPS[dtype] * (4.0 if dtype in ("float16", "bfloat16") else 1.0)
    base = FUDGE * (eps * math.sqrt(max(reduction, 1)) * scale + ATOL[dtype])
    return base + RTOL[dtype] * np.abs(e)
