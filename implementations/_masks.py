"""Mask arithmetic in NumPy shared by adapters whose kernels take one mask argument.

Only the suite's own convention goes in (``Case.mask`` True = blocked, ``Case.bias`` additive); each
adapter turns the result into its library's sense. Nothing here computes attention.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case


def causal_blocked(T: int, S: int, alignment: str = "top-left") -> np.ndarray:
    """[T, S] causal mask, True = blocked: query i sees keys j <= i (+ S - T when bottom-right)."""
    offset = 0 if alignment == "top-left" else S - T
    return np.arange(S)[None, :] > np.arange(T)[:, None] + offset


def blocked(case: Case, fold_causal: bool = False, alignment: str = "top-left") -> np.ndarray | None:
    """The case's boolean mask (True = blocked) in its own broadcast shape, the causal part OR-ed in
    when ``fold_causal`` (then at least [T, S])."""
    mask = None if case.mask is None else np.asarray(case.mask, dtype=bool)
    if fold_causal and case.is_causal:
        causal = causal_blocked(case.T, case.S, alignment)
        mask = causal if mask is None else (mask | causal)
    return mask


def bias_with(mask: np.ndarray | None, bias: np.ndarray, fill: float = -np.inf) -> np.ndarray:
    """The additive mask ``bias`` with the blocked entries of ``mask`` set to ``fill`` (float64)."""
    bias = np.asarray(bias, dtype=np.float64)
    return bias if mask is None else np.where(mask, fill, bias)


def bias_dtype(dtype: str) -> np.dtype:
    """A float mask's dtype for a case: float64 for float64, else float32 (exact for every bias the
    suite draws; rounding it to float16 would be the adapter's error, not the kernel's)."""
    return np.dtype(np.float64 if dtype == "float64" else np.float32)
