"""Long key sequences in every run: one S >= 4096 and one S >= 16384 case, a handful of queries.

The long-sequence clauses of test_long_sequence.py (LONG-SEQ-01/02) are thorough-only; without
these, a kernel that mishandles keys past 4096 or 16384 (a fixed key buffer, a tail tile dropped,
an index that wraps) certifies in the default profile. What makes the check cheap enough for ci:
few queries (the cost is T x S, and the bug classes are in the key range, not the query range),
head dim 16, one batch item, and the blocked float64 oracle
(:func:`conformance.oracle.forward_blocked`), whose memory stays O(block) however long S is. Each
query singles out one *needle* key (the first past 4096, the first past 16384, one in the tail
tile, the last), so losing that key moves the query's output by O(1), far outside the allowance.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.contract import Case
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation

ALL_KEYS = Source(
    "000",
    "§2 从单个 Query 到公式",
    "\\alpha_j = \\frac{\\exp(s_j / \\sqrt{d_k})}{\\sum_{m=1}^{S}\\exp(s_m / \\sqrt{d_k})}",
)
CI_LENGTHS = (4096 + 17, 16384 + 5)


def needles_for(S: int) -> tuple[int, ...]:
    """Key indices a kernel with a key-range bug would lose: past each power-of-two buffer size up to
    S, in the last partial tile of 64, and the very last key."""
    picks = [j for j in (4096, 8192, 16384) if j < S] + [S - 2 - (S % 64), S - 1]
    return tuple(dict.fromkeys(picks))


def long_case(dtype: str, S: int, *, gqa: bool, seed: int = 420) -> Case:
    """One query per needle (T = len(needles)): the u_t are orthogonal with |u_t| = sqrt(D); query t
    is u_t plus a little noise, needle t's key is 3 u_t, so query t scores its needle ~3 sqrt(D) = 12
    (the other needles ~0, ordinary keys ~N(0, 1)): the needle takes most of the weight against the
    S - 1 others (e^12 against ~1.6 S), the rest is a real mixture, and losing it moves the output
    by O(1)."""
    needles = needles_for(S)
    rng = rng_for(seed + S)
    B, Hq, D = 1, 2, 16
    Hkv = 1 if gqa else Hq
    T = len(needles)
    u = np.linalg.qr(rng.standard_normal((D, T)))[0].T * np.sqrt(D)
    q = 0.25 * rng.standard_normal((B, Hq, T, D)) + u[None, None]
    k = rng.standard_normal((B, Hkv, S, D))
    v = rng.standard_normal((B, Hkv, S, D))
    for t, j in enumerate(needles):
        k[:, :, j] = 3.0 * u[t]
    return Case(
        cast(q, dtype),
        cast(k, dtype),
        cast(v, dtype),
        seed=seed,
        label=f"S={S}, query t reads needle key {list(needles)}[t]" + (", GQA Hkv=1" if gqa else ""),
    )


@clause(
    "LONG-SEQ-CI-03",
    "with S = 4096 + 17 and S = 16384 + 5, a key past 4096, past 16384, in the last partial tile, or the last one, "
    "which dominates a query's scores dominates its output (a few queries, in every profile)",
    ALL_KEYS,
    dtypes=["float32", "float16"],
    kills=[
        "fp16_normaliser_overflow_long_rows@float16",
        "drop_keys_beyond_4096",
        "drop_keys_beyond_16384",
        "low_precision_running_sum@float16",
    ],
    tolerance="the error model (harness.judge.tolerance) against forward_blocked, the blocked float64 oracle",
)
def test_long_keys_ci(impl, dtype):
    decl = impl.declaration
    for S in CI_LENGTHS:
        case = long_case(dtype, S, gqa=decl.gqa)
        impl.require(case)
        out = impl.forward(case)
        if compare.formulated(case, decl):  # a declared formulation: the oracle re-run under it
            want = compare.expected(case, decl)
        else:
            want = oracle.forward_blocked(
                case, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment
            )
        try:
            compare.assert_close(out, want.out, case=case, decl=decl)
        except ClauseViolation as exc:
            raise ClauseViolation(f"{exc}\n  needles (query t reads key): {list(needles_for(S))}", case) from None
