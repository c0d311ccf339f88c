"""Memory scaling from peaks measured at S, 2S, 4S (T = S): linear, quadratic, or in between.

FlashAttention-style kernels avoid storing the T x S matrix (003_648455d5abd16778.txt: "通过重计算和在线
归一化避免保存完整矩阵"), so with T = S their extra memory grows like S (inputs' copies, the output,
O(S) statistics and fixed-size tiles); a kernel that materialises the scores grows like S^2. The
deciding exponent is taken over the whole span, ``log(peak(4S) / peak(S)) / log 4``: a single noisy
reading in the middle cannot move it, and a kernel whose buffers grow in steps (torch's CPU flash
kernel picks its split sizes by S) is judged by where it ends up. The last doubling's exponent and
the least-squares one are reported too. The magnitude is the second witness: a kernel cannot hold a
[B, H, T, S] matrix of its working dtype (or one half as wide) in less than half that matrix's bytes.

* exponent <= LINEAR_MAX (1.3), or a peak at 4S under half of one T x S matrix: linear (or less):
  the T x S matrix of scores or probabilities is not stored. A linear kernel with a fixed workspace
  lands below 1; torch's CPU flash kernel, whose buffers step up between S = 512 and 1024, shows
  ~1.8 from 256 to 1024 but holds a quarter of a matrix at most (hence the second witness, and
  sizes from 512 up on a CPU).
* exponent >= QUADRATIC_MIN (1.6): quadratic. One T x S float32 matrix next to O(S D) inputs
  already shows > 1.7 from S = 512 to 2048. (A T x S boolean mask, a quarter of a float32 matrix,
  is not "the matrix" and is not what the claim is about.)
* otherwise: superlinear, reported as such (neither claim is confirmed).

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
    exponent: float | None  # over the whole span, S to 4S: the deciding one
    fit_exponent: float | None  # least squares over every point
    verdict: str
    matrix_bytes: int | None = None  # one [B, H, T, S] matrix in the working dtype at the largest size
    last_exponent: float | None = None  # the last doubling alone

    def as_dict(self) -> dict:
        return asdict(self)

    def sentence(self) -> str:
        if self.verdict == UNMEASURED or self.exponent is None:
            return "memory scaling not measured"
        pts = ", ".join(f"S={s}: {_mib(p)}" for s, p in zip(self.sizes, self.peaks))
        cmp = f"; one T x S matrix at S={self.sizes[-1]} is {_mib(self.matrix_bytes)}" if self.matrix_bytes else ""
        return (
            f"peak extra memory grows {self.verdict} in S (exponent {self.exponent:.2f} from S={self.sizes[0]} to "
            f"S={self.sizes[-1]}, {self.last_exponent:.2f} over the last doubling; {pts}{cmp})"
        )


def _mib(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.2f} MiB"


def classify(sizes: list[int], peaks: list[int | None], matrix_bytes: int | None = None) -> Scaling:
    """The scaling of ``peaks`` over ``sizes`` (each step a doubling or more)."""
    pts = [(s, max(PAGE, int(p))) for s, p in zip(sizes, peaks) if p is not None]
    if len(pts) < 2:
        return Scaling(list(sizes), list(peaks), None, None, UNMEASURED, matrix_bytes)
    (s0, p0), (s1, p1), (s2, p2) = pts[0], pts[-2], pts[-1]
    span = math.log(p2 / p0) / math.log(s2 / s0)
    last = math.log(p2 / p1) / math.log(s2 / s1)
    xs = [math.log(s) for s, _ in pts]
    ys = [math.log(p) for _, p in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    fit = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else span
    too_small = matrix_bytes is not None and p2 < matrix_bytes / 2
    if span <= LINEAR_MAX or too_small:
        verdict = LINEAR
    elif span >= QUADRATIC_MIN:
        verdict = QUADRATIC
    else:
        verdict = SUPERLINEAR
    exponent = span
    return Scaling(list(sizes), list(peaks), round(exponent, 3), round(fit, 3), verdict, matrix_bytes, round(last, 3))
