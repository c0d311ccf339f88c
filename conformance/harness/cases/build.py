"""Case builders: deterministic inputs from a seed, already rounded to the working dtype.

Inputs are drawn in float64 and rounded to the working dtype *before* the oracle sees them, so the
oracle computes exactly on the numbers the kernel receives; what remains is the kernel's own error.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, np_dtype
from conformance.oracle import causal_blocked


def rng_for(seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np_dtype(dtype))


def random_case(
    seed: int = 0,
    *,
    B: int = 2,
    Hq: int = 2,
    Hkv: int | None = None,
    T: int = 3,
    S: int = 5,
    Dk: int = 8,
    Dv: int | None = None,
    dtype: str = "float32",
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    magnitude: float = 1.0,
    label: str = "",
) -> Case:
    """Standard-normal Q, K, V (times ``magnitude``) in the spec's layout."""
    rng = rng_for(seed)
    Hkv = Hq if Hkv is None else Hkv
    Dv = Dk if Dv is None else Dv
    q = rng.standard_normal((B, Hq, T, Dk)) * magnitude
    k = rng.standard_normal((B, Hkv, S, Dk)) * magnitude
    v = rng.standard_normal((B, Hkv, S, Dv))
    return Case(
        query=cast(q, dtype),
        key=cast(k, dtype),
        value=cast(v, dtype),
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        scale=scale,
        dropout_p=dropout_p,
        seed=seed,
        label=label,
    )


def random_mask(seed: int, shape: tuple[int, ...], p_blocked: float = 0.4, keep_one: bool = True) -> np.ndarray:
    """A boolean mask (True = blocked) with no structure a kernel could exploit.

    With ``keep_one`` every row keeps at least one visible key (position chosen at random), so the
    mask never creates all-blocked rows unless a clause asks for them.
    """
    rng = rng_for(seed + 7919)
    m = rng.random(shape) < p_blocked
    if keep_one:
        flat = m.reshape(-1, shape[-1])
        keep = rng.integers(0, shape[-1], size=flat.shape[0])
        flat[np.arange(flat.shape[0]), keep] = False
    return m


def causal_mask(T: int, S: int, alignment: str = "top-left") -> np.ndarray:
    return causal_blocked(T, S, alignment)
