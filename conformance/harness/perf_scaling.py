"""Memory scaling from peaks measured at S, 2S, 4S (T = S): linear, quadratic, or in between.

FlashAttention-style kernels avoid storing the T x S matrix (003_648455d5abd16778.txt: "通过重计算和在线
归一化避免保存完整矩阵"), so with T = S their extra memory grows like S (inputs' copies, the output,
O(S) statistics and fixed-size tiles); a kernel that materialises the scores grows like S^2. The
exponent is read from the last doubling, 2S -> 4S, where the quadratic term dominates any constant
or linear part: ``log2(peak(4S) / peak(2S))``, and by least squares over all points; the steeper of
the two decides (one noisy reading can flatten a single step, rarely both). Thresholds, with the
reasons:

* exponent <= LINEAR_MAX (1.3): linear (or less). A linear kernel with a fixed workspace lands
  below 1; 1.3 leaves room for page granularity and allocator rounding at the smallest size.
* exponent >= QUADRATIC_MIN (1.6): quadratic. A kernel holding one T x S float32 matrix next to
  O(S D) inputs already shows > 1.7 at the sizes used (S D << S^2 once S >> D).
* in between: superlinear, reported as such (neither claim is confirmed).

Peaks below one page (4 KiB) are raised to a page, so a kernel that allocates nothing is linear.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

LINEAR_MAX = 1.3
QUADRATIC_MIN = 1.6
PAGE = 4096

LINEAR, QUADRATIC, SUPERLINEAR, UNMEASURED = "linear", "quadratic", "superlinear", "unmeasured"


@dataclass
class Scaling:
    sizes: list[int]
    peaks: list[int | None]
    exponent: float | None  # from the last doubling
    fit_exponent: float | None  # least squares over every point
    verdict: str
    matrix_bytes: int | None = None  # one [B, H, T, S] matrix in the working dtype at the largest size

    def as_dict(self) -> dict:
        return asdict(self)

    def sentence(self) -> str:
        if self.verdict == UNMEASURED or self.exponent is None:
            return "memory scaling not measured"
        pts = ", ".join(f"S={s}: {_mib(p)}" for s, p in zip(self.sizes, self.peaks))
        cmp = f"; one T x S matrix at S={self.sizes[-1]} is {_mib(self.matrix_bytes)}" if self.matrix_bytes else ""
        return (
            f"peak extra memory grows {self.verdict} in S (exponent {self.exponent:.2f} over the last doubling, "
            f"{self.fit_exponent:.2f} fitted; {pts}{cmp})"
        )


def _mib(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.2f} MiB"


def classify(sizes: list[int], peaks: list[int | None], matrix_bytes: int | None = None) -> Scaling:
    """The scaling of ``peaks`` over ``sizes`` (each step a doubling or more)."""
    pts = [(s, max(PAGE, int(p))) for s, p in zip(sizes, peaks) if p is not None]
    if len(pts) < 2:
        return Scaling(list(sizes), list(peaks), None, None, UNMEASURED, matrix_bytes)
    (s1, p1), (s2, p2) = pts[-2], pts[-1]
    exponent = math.log(p2 / p1) / math.log(s2 / s1)
    xs = [math.log(s) for s, _ in pts]
    ys = [math.log(p) for _, p in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    fit = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else exponent
    steepest = max(exponent, fit)  # a noisy last step must not hide a quadratic trend (nor fake one)
    if steepest <= LINEAR_MAX:
        verdict = LINEAR
    elif steepest >= QUADRATIC_MIN:
        verdict = QUADRATIC
    else:
        verdict = SUPERLINEAR
    return Scaling(list(sizes), list(peaks), round(exponent, 3), round(fit, 3), verdict, matrix_bytes)
