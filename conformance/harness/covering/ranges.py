"""How far each value class reaches, and the concrete sizes and values one covering row takes from it.

Why: a class stood for by one representative tests that representative only. A kernel that reads a
finite M past some threshold as blocked passes every row whose "finite large negative" is -8192; one
that mishandles a scale above 1 passes a custom scale of 0.3; a GQA mapping written h % Hkv instead
of h // g passes every ratio drawn with one kv head. So each class states its range and its
extremes, and the k-th row of a plan that holds a class takes the k-th of its candidates: the
extremes first, then seeded draws from inside the range (ci: one; thorough: three). Everything is a
pure function of the row, the declaration and k, so every pytest-xdist worker builds the same cases.

Which candidate one row takes, and what happens when it does not fit, is ``harness.covering.draws``.

Per-row ranges that fit inside one case are drawn there instead: a finite large negative M puts a
ladder of magnitudes on several rows of one case (1e4 up to finfo(dtype).max), a mask with "some keys
blocked" gives its rows scattered keys, and runs at the start (left padding), middle (a hole) and end.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from conformance.contract import np_dtype
from conformance.harness.cases.profiles import profile_name
from conformance.harness.covering.table import LEADING_TILE, TILE

MASK_PATTERNS = ("scattered", "a run at the start", "a run in the middle", "a run at the end")


def seeded(*parts: object) -> np.random.Generator:
    """A generator seeded by ``parts`` (stable across processes: crc32, not Python's salted hash)."""
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def draws() -> int:
    """Seeded draws per class besides its extremes: ci one, thorough three."""
    return 3 if profile_name() == "thorough" else 1


_n_draws = draws


def _ints(lo: int, hi: int, key: tuple, ok=lambda n: True) -> list[int]:
    """[lo, hi] (the extremes) and seeded draws strictly between them that satisfy ``ok``."""
    out = [lo] if lo == hi else [lo, hi]
    if hi - lo < 2:
        return out
    rng = seeded(*key)
    for _ in range(_n_draws()):
        for _try in range(64):
            n = int(rng.integers(lo + 1, hi))
            if ok(n):
                out.append(n)
                break
    return out


def floats(lo: float, hi: float, key: tuple, log: bool = False) -> list[float]:
    """[lo, hi] (the extremes) and seeded draws between them (three significant digits)."""
    return _floats(lo, hi, key, log, draws())


@functools.lru_cache(maxsize=1 << 10)
def _floats(lo: float, hi: float, key: tuple, log: bool, n: int) -> list[float]:
    rng = seeded(*key)
    draws = []
    for _ in range(n):
        u = rng.random()
        x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if log else lo + u * (hi - lo)
        draws.append(float(f"{x:.3g}"))
    return [lo, hi, *draws]


HEADS = {
    "1:1": [(2, 2), (4, 4)],
    "2:1": [(4, 2), (2, 1), (8, 4)],
    "3:1": [(3, 1), (6, 2)],
    "8:1": [(8, 1), (16, 2)],
    "more than 16 heads": None,  # 17:17, 32:32 and draws between
}
FIXED_DK = {"8": 8, "1": 1, "64": 64, "128": 128, "160": 160, "256": 256}


def candidates(param: str, value: str, z: dict[str, int]) -> list:
    """The concrete members of class ``value`` of ``param``, extremes first; ``z`` holds the sizes
    chosen so far (T's range depends on S, Dv's on Dk, B = H on the heads)."""
    return _candidates(param, value, z.get("S", 0), z.get("Dk", 0), z.get("Hq", 0), _n_draws())


@functools.lru_cache(maxsize=1 << 14)
def _candidates(param: str, value: str, S: int, dk: int, hq: int, n_draws: int) -> list:
    z = {"S": S, "Dk": dk, "Hq": hq}
    key = (param, value)
    if param == "B":
        return {"1": [1], "2": [2], "5 or more": _ints(5, 8, key), "equal to H": [z.get("Hq", 3)]}[value]
    if param == "heads":
        return HEADS[value] or [(n, n) for n in _ints(17, 32, key)]
    if param == "S":
        lo, hi = {
            "< 16": (3, 15),
            "1": (1, 1),
            "a tile tail": (33, 63),
            "several tiles": (65, 256),
            "long": (257, 1040),
        }[value]
        return _ints(lo, hi, key)
    if param == "T":
        S = z["S"]
        if value == "< S":
            return _ints(2, max(2, S - 1), (*key, S))
        if value == "> S":
            return _ints(S + 1, S + min(S, 64), (*key, S))
        if value == "odd":
            return _ints(3, 63, key, lambda n: n % 2 == 1)
        return {"1": [1], "= S": [S], "past a tile": _ints(TILE + 1, 130, key)}[value]
    if param == "Dk":
        if value == "not a multiple of 8":
            return _ints(3, 63, key, lambda n: n % 8 != 0)
        if value == "above 64, not a multiple of 32":
            return _ints(65, 250, key, lambda n: n % 32 != 0)
        return [FIXED_DK[value]]
    if param == "Dv":
        dk = z["Dk"]
        if value == "< Dk":
            return [max(1, dk // 2), 1, *_ints(1, max(1, dk - 1), (*key, dk))[2:]]
        return {"= Dk": [dk], "> Dk": _ints(dk + 8, 2 * dk + 8, (*key, dk))}[value]
    raise KeyError(param)


@dataclass(frozen=True)
class Concrete:
    """What one row took from each of its classes: sizes, scale, dropout p, and the per-row draws."""

    B: int
    Hq: int
    Hkv: int
    T: int
    S: int
    Dk: int
    Dv: int
    scale: float | None = None
    dropout_p: float = 0.0
    bias_sigma: float = 0.5  # finite small M: N(0, sigma)
    neg_magnitudes: tuple[float, ...] = ()  # finite large negative M: one magnitude per row it fills
    inf_fraction: float = 0.3  # -inf on some keys
    pattern_offset: int = 0  # some keys blocked: which pattern the first mask row gets
    lead_tiles: int = 1  # leading keys blocked over a whole tile: how many tiles of 32
    which_row: str = "first"  # rows blocked entirely / -inf on whole rows: first, last or a middle row
    magnitude: float = 1.0  # Q and K are drawn N(0, magnitude^2): scaled scores of order 1 whatever scale * sqrt(Dk)
    picks: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(B=self.B, Hq=self.Hq, Hkv=self.Hkv, T=self.T, S=self.S, Dk=self.Dk, Dv=self.Dv)


def resolvable(dtype: str) -> float:
    """The largest |M| whose rounding to the working dtype still leaves the scores a row adds to it
    readable (u |M| <= 0.05; harness.judge.tolerance's u_b |bias| term): past it the error model lets a
    correct kernel return a uniform row, and only NaN or inf can fail."""
    u = 2.0 ** -{"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}[dtype]
    return 0.05 / u


@functools.lru_cache(maxsize=1 << 12)
def ladder(dtype: str, n: int, key: tuple, extremes: bool = True) -> tuple[float, ...]:
    """``n`` magnitudes of a finite large negative M, one per row: 1e4, finfo(dtype).max and 0.7 x it
    (what transformers and XLA fill with), then seeded log-uniform draws from 1e4 to where the dtype
    can still read the scores (:func:`resolvable`; 1e4 to the dtype's max when nothing past 1e4 is).

    Without ``extremes`` (a backward row) the ladder stops at what the dtype resolves: past it the
    error model's bound on dQ and dK is not finite (an infinite weight error times a zero in a GEMM),
    so those rows would check nothing; the forward rows meet the extremes."""
    top = float(np.finfo(np_dtype(dtype)).max)
    hi = min(max(resolvable(dtype), 2e4), top)
    out = [1e4, top, 0.7 * top] if extremes else [1e4, hi]
    rng = seeded("ladder", dtype, *key)
    while len(out) < n:
        out.append(float(f"{math.exp(math.log(1e4) + rng.random() * (math.log(hi) - math.log(1e4))):.3g}"))
    return tuple(out[:n])


def _pattern(row: np.ndarray) -> str:
    idx = np.flatnonzero(row)
    if idx.size == 0 or idx.size == row.size:
        return "none" if idx.size == 0 else "all"
    if idx[-1] - idx[0] + 1 != idx.size:
        return "scattered"
    return (
        "a run at the start"
        if idx[0] == 0
        else "a run at the end"
        if idx[-1] == row.size - 1
        else "a run in the middle"
    )


def taken(case, classes: dict[str, str]) -> dict[str, list[str]]:
    """What each class of ``case`` took (sizes, the scale, dropout's p, M's magnitudes, the mask's
    shape and row patterns), as the certificate lists the values each class took."""
    out: dict[str, list[str]] = {
        "B": [str(case.B)],
        "heads": [f"{case.Hq}:{case.Hkv}"],
        "S": [str(case.S)],
        "T": [str(case.T)],
        "Dk": [str(case.Dk)],
        "Dv": [str(case.Dv)],
    }
    if case.scale is not None:
        out["scale"] = [f"{case.scale:g}"]
    if case.dropout_p:
        out["dropout"] = [f"p = {case.dropout_p:g}"]
    if case.mask is not None:
        m = np.asarray(case.mask)
        zero = [i for i, (n, s) in enumerate(zip(m.shape, m.strides)) if s == 0 and n > 1]
        out["mask form"] = [str(list(m.shape)) + (f", stride 0 on axis {zero}" if zero else "")]
        if classes.get("mask content") != LEADING_TILE:
            flat = m.reshape(-1, m.shape[-1])
            out["mask content"] = sorted({_pattern(r) for r in flat[:64]} - {"none", "all"})
        else:
            out["mask content"] = [f"first {int(np.argmin(m.reshape(-1, m.shape[-1])[0]))} keys"]
    if case.bias is not None:
        b = np.asarray(case.bias, dtype=np.float64).reshape(-1, case.S)
        kind = classes.get("additive M")
        if kind == "finite large negative on whole rows":
            rows = b[(b <= -1e4).all(axis=-1)]
            out["additive M"] = sorted({f"{r.max():.3g}" for r in rows}, key=float)
        elif kind == "finite small":
            out["additive M"] = [f"sd {b.std():.2g}"]
        elif kind == "-inf on some keys":
            out["additive M"] = [f"{np.isneginf(b).mean():.0%} -inf"]
    return out
