"""Arrays drawn as bytes: query/key/value values, boolean masks and additive biases, and their display.

Values and masks are drawn by hypothesis element by element, as small dyadic numbers (integers / 4
in [-2, 2], exact in every dtype, bfloat16 included), so a failure shrinks to a small mask and small
numbers that a person can read; only arrays too large to draw element-wise (rare tile-tail lengths)
are filled from a drawn seed.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

BIAS_VALUES: tuple[float, ...] = (0.0, -1.0, 1.0, -0.5, 0.5, -2.0, 2.0, float("-inf"))
VALUE_STEP = 0.25  # values are k * VALUE_STEP with |k| <= VALUE_UNITS: dyadic, exact in every dtype
VALUE_UNITS = 8
ELEMENTWISE_MAX = 512  # arrays up to this many elements are drawn element by element (shrinkable)


def _drawn(draw, shape: tuple[int, ...], decode, rest) -> np.ndarray:
    """An array whose first ``ELEMENTWISE_MAX`` elements (in C order) are decoded from bytes that
    hypothesis draws (``decode(uint8 array)``, byte 0 decoding to the simplest value), and whose
    remaining ones ``rest(rng, count)`` fills from a drawn seed.

    One byte string per array, not one choice per element: the shrinker lowers each byte towards 0
    just the same, at a fraction of the cost of hundreds of separate choices. Its length may exceed
    the array (up to the cap), so when the shrinker tries a smaller shape the drawn bytes still fit
    (an exact length would make them misfit, and the smaller shape look like a pass), and the bytes
    past the array are dropped in one step; a shape beyond the cap adds one seed, so a smaller shape
    is never a longer example.
    """
    from conformance.harness.cases.build import rng_for

    n = int(np.prod(shape))
    m = min(n, ELEMENTWISE_MAX)
    raw = draw(st.binary(min_size=m, max_size=ELEMENTWISE_MAX))
    head = decode(np.frombuffer(raw, dtype=np.uint8)[:m])
    if n <= ELEMENTWISE_MAX:
        return head.reshape(shape)
    tail = rest(rng_for(draw(st.integers(0, 2**31 - 1))), n - ELEMENTWISE_MAX)
    return np.concatenate([head, tail.astype(head.dtype)]).reshape(shape)


def _zigzag(raw: np.ndarray) -> np.ndarray:
    """Bytes to integers in [-VALUE_UNITS, VALUE_UNITS]: 0, -1, 1, -2, 2, ... (0 first, small next)."""
    u = raw.astype(np.int64) % (2 * VALUE_UNITS + 1)
    return np.where(u % 2 == 1, -(u + 1) // 2, u // 2)


def values(draw, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Dyadic values k/4, |k| <= 8 (each drawn one shrinks to 0)."""
    from conformance.harness.cases.build import cast

    units = _drawn(draw, shape, _zigzag, lambda rng, n: rng.integers(-VALUE_UNITS, VALUE_UNITS + 1, size=n))
    return cast(units.astype(np.float64) * VALUE_STEP, dtype)


def lifted(v: np.ndarray, dtype: str) -> np.ndarray:
    """``v`` plus 0.25 * (1 + (key + column) % 3): V for a case with rows blocked entirely, whose fill
    must stay visible when the drawn values shrink to 0 (then the mean of V would be zeros, and every
    key alike). Dyadic, so exact in every dtype."""
    from conformance.harness.cases.build import cast

    s, d = np.indices(v.shape[-2:])
    return cast(np.asarray(v, dtype=np.float64) + VALUE_STEP * (1 + (s + d) % 3), dtype)


def mask_bits(draw, shape: tuple[int, ...]) -> np.ndarray:
    """True = blocked; each drawn bit shrinks to False (visible)."""
    return _drawn(draw, shape, lambda raw: raw % 2 == 1, lambda rng, n: rng.random(n) < 0.3)


def bias_values(draw, shape: tuple[int, ...]) -> np.ndarray:
    """Values of the additive M from BIAS_VALUES, -inf included; each drawn one shrinks to 0."""
    values = np.asarray(BIAS_VALUES)
    return _drawn(
        draw, shape, lambda raw: values[raw % len(values)], lambda rng, n: values[rng.integers(0, len(values), n)]
    )


def show(a: np.ndarray) -> str:
    a = np.asarray(a)
    if a.size > ELEMENTWISE_MAX:
        return f"<{'x'.join(map(str, a.shape))} array: {ELEMENTWISE_MAX} elements drawn, the rest from a drawn seed>"
    vals = a if a.dtype.kind in "bi" else a.astype(np.float64)
    text = np.array2string(vals, separator=", ", max_line_width=10_000, threshold=ELEMENTWISE_MAX + 1)
    return " ".join(text.split())


# -- mask geometry and memory layouts ----------------------------------------------------------
LAYOUTS: tuple[str, ...] = ("contiguous", "non-contiguous", "broadcast")


def form_shape(form: str, B: int, H: int, T: int, S: int) -> tuple[int, ...]:
    sizes = {"B": B, "H": H, "T": T, "S": S, "1": 1}
    return tuple(sizes[x] for x in form.strip("[]").split(","))


def rows_of(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape[:-1]))


def own_index(shape: tuple[int, ...], b: int, h: int, t: int) -> tuple[int, ...]:
    """The row of a broadcastable mask of ``shape`` that full row (b, h, t) reads."""
    full = (b, h, t)[-(len(shape) - 1) :]
    return tuple(0 if n == 1 else int(i) for n, i in zip(shape[:-1], full))


def relayout(x: np.ndarray, layout: str, source_axis: int | None) -> np.ndarray:
    """The same values in another memory layout: transposed storage, or stride 0 along an axis.

    Transposed storage swaps two of the B, H, T axes that are longer than 1 (e.g. a [B,T,H,D]
    buffer viewed as [B,H,T,D]); the last axis keeps stride 1, as fused kernels require of any
    tensor. With fewer than two such axes no permutation is non-contiguous, and the array stays.
    """
    if layout == "non-contiguous":
        axes = [i for i in range(3) if x.shape[i] > 1]
        if len(axes) < 2:
            return x
        a, b = axes[0], axes[-1]
        return np.ascontiguousarray(np.swapaxes(x, a, b)).swapaxes(a, b)
    if layout == "broadcast" and source_axis is not None:
        return np.broadcast_to(np.take(x, [0], axis=source_axis), x.shape)
    return x


def broadcast_axis(n_batch: int, n_heads: int) -> int | None:
    return 0 if n_batch > 1 else (1 if n_heads > 1 else None)
