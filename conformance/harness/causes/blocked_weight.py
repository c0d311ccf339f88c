"""Blocked keys with a small non-zero weight: a rule broken by a tiny amount, measured on the failing output.

The spec gives a blocked key weight exactly 0 (000 §7.3: the mask is added before softmax as -inf; §8:
``masked_fill(mask, float("-inf"))``). A kernel that clips the shifted scores before ``exp`` (a "safe"
exp at -64), or adds a large finite fill, gives every blocked key a weight of 1e-28 or so: invisible in
most outputs, fatal where a blocked V slot is huge, and read by a precision hypothesis as "float64
computed in float32" or "not upcast" because its errors are small. So before any precision hypothesis
the failing output is tested against "blocked keys get weight w": on every row that sees a key and
blocks some, the weights the kernel would have used are (1 - n w) times the oracle's on the visible
keys and w on each of the n blocked ones, so its output is ``o + w (sum of blocked V - n o)``; w is
read per row off the element that change moves most (in units of its allowance) and the hypothesis
holds when w >= 0 then explains every element within the allowance where the oracle's answer does not.
A floor on ``exp`` lifts the visible keys whose weight is below w as well; they count among the lifted.
For a V = I probe the output is the weights, and w is read at the blocked positions themselves.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, Declaration
from conformance.harness.judge.expected import expected, output_allowance
from conformance.harness.spec.report import abs_error

BLOCKED_WEIGHT = "blocked keys get a non-zero weight"  # the likely-causes feature of a failure it explains


def _direction(lifted: np.ndarray, v: np.ndarray, o: np.ndarray) -> np.ndarray:
    """How the output moves per unit of w when the keys ``lifted`` ([B, H, T, S]) get weight w each:
    their V summed, less the weight they take from the others (n w times the output)."""
    n = lifted.sum(axis=-1, keepdims=True)
    return np.einsum("bhts,bhsd->bhtd", lifted.astype(np.float64), v) - n * o


def _read_w(delta: np.ndarray, d: np.ndarray, allowed: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row, w read off the element ``d`` moves most in units of its allowance (for a V = I probe, a
    blocked position, where the oracle's weight is exactly 0); 0 where negative or undefined (a row that
    needs w < 0 then fails the check of the whole output)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        at = np.argmax(np.abs(d) / np.maximum(allowed, np.finfo(np.float64).tiny), axis=-1)[..., None]
        w = (np.take_along_axis(delta, at, -1) / np.take_along_axis(d, at, -1))[..., 0]
    return np.where(rows & np.isfinite(w), np.maximum(w, 0.0), 0.0)


def measure(case: Case, out: np.ndarray, decl: Declaration) -> float | None:
    """The largest weight the kernel's ``out`` for ``case`` gives a blocked key, when "blocked keys get
    weight w" explains the failing output (see the module docstring); None when it does not."""
    out = np.asarray(out, dtype=np.float64)
    if out.shape != tuple(case.out_shape) or case.has_variant or case.dropout_p > 0:
        return None
    want = expected(case, decl)
    blocked = np.broadcast_to(np.asarray(want.blocked, dtype=bool), case.weights_shape)
    rows = ~np.asarray(want.all_blocked, dtype=bool) & blocked.any(axis=-1)  # [B, H, T]: see keys, block some
    if not rows.any():
        return None
    allowed = output_allowance(case, decl)
    allowed = np.where(np.isfinite(allowed), allowed, np.finfo(np.float64).max)
    o = np.asarray(want.out, dtype=np.float64)
    if np.all(abs_error(out, o)[rows] <= allowed[rows]):
        return None  # the oracle's answer explains these rows: nothing to explain
    v = np.asarray(case.value, dtype=np.float64)
    v = np.repeat(v, case.Hq // case.Hkv, axis=1) if case.Hkv and case.Hq % case.Hkv == 0 else v
    w = _read_w(out - o, _direction(blocked, v, o), allowed, rows)
    # A floor on exp (the clipped softmax) lifts the visible keys whose weight is below w to w too.
    floored = blocked | (np.asarray(want.weights, dtype=np.float64) < w[..., None])
    d = _direction(floored, v, o)
    w = _read_w(out - o, d, allowed, rows)
    if np.any(w * floored.sum(axis=-1) >= 1):
        return None
    fitted = o + w[..., None] * d
    if not np.all(abs_error(out, fitted)[rows] <= allowed[rows]):
        return None
    return float(w.max()) if w.max() > 0 else None
