"""§7.3 and §8 of 000_f3dcd408372d9e02.txt: dropout acts on the softmax weights, before V.

Checked from outside, with no access to the kernel's private keep mask: the weights are observed
(returned by the kernel, or through V = I), and a weight the kernel dropped reads as exactly 0. The
statistical checks assume what every dropout kernel promises: each weight is kept independently
with probability 1 - p, and different seeds give independent masks. Their false-positive rates are
stated per clause and hold for any correct kernel under that assumption. Here: each weight's fate,
p = 0 and p = 1, and the seed; the rate and the mean over seeds are test_dropout_statistics.py.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import check, fail

ORDER = Source("000", "§7.3 Mask 应加在 softmax 之前", "QK^T / sqrt(dk) → 加 Mask → softmax → dropout → 乘 V")
RETURNED = Source(
    "000", "§8 最小 PyTorch 实现", "返回的权重已经经过 dropout；启用训练态 dropout 后，单次计算的行和不保证为 1。"
)
INVERTED = Source("000", "§8 最小 PyTorch 实现", "weights = F.dropout(weights, p=dropout_p, training=training)")
NO_DROPOUT = Source("000", "§12 误区二：softmax 对错维度", "有有效 Key 且未启用 dropout 时，每个 Query 的权重和为 1")

ALPHA = 1e-6  # false-positive rate of every statistical check in this module


def dropout_case(dtype: str, seed: int, p: float, *, B: int = 2, Hq: int = 2, T: int = 32, S: int = 16, **kw) -> Case:
    """A case with dropout_p = ``p`` (head dims 8; ``kw`` as harness.cases.build.random_case takes them).
    Small logits (magnitude 0.5) keep every weight near 1/S, far above the rounding tolerance, so a
    kept weight can never be mistaken for a dropped one."""
    return random_case(seed, B=B, Hq=Hq, T=T, S=S, Dk=8, dtype=dtype, dropout_p=p, magnitude=0.5, **kw)


def check_kept_weights(impl: GuardedAdapter, case: Case, w: np.ndarray, context: str) -> tuple[np.ndarray, np.ndarray]:
    """The observed weights ``w`` of ``case`` under dropout: blocked ones exactly 0, and each one kept on a
    row that sees a key is the undropped weight / (1 - p) within the error model (``context`` follows
    "under dropout" in a failure). Returns (kept, visible): the kept and the visible positions."""
    p = case.dropout_p
    plain = case.replace(dropout_p=0.0)
    want = compare.expected(plain, impl.declaration)
    live = ~want.all_blocked[..., None]
    compare.assert_blocked_zero(w, want.blocked & live, case, f" under dropout{context}")
    allowed = compare.weights_allowance(plain, impl.declaration) / (1.0 - p)
    visible = ~want.blocked & live
    kept = (w != 0) & visible
    scaled = want.weights / (1.0 - p)
    bad = kept & (np.abs(w - scaled) > allowed)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        fail(
            f"{int(bad.sum())} of {int(kept.sum())} kept weights under dropout{context} are not undropped/(1-p): "
            f"first at {list(idx)} got {w[idx]:.6g}, undropped {want.weights[idx]:.6g}, expected {scaled[idx]:.6g} "
            f"(ratio {w[idx] / want.weights[idx]:.4g}, should be 1/(1-p) = {1 / (1 - p):.4g}; allowed |err| "
            f"{allowed[idx]:.3g})",
            case,
        )
    return kept, visible


def binomial_tails(k: int, n: int, p: float) -> tuple[float, float]:
    """(P(X <= k), P(X >= k)) for X ~ Binomial(n, p), summed in log space.

    The log pmf is walked from i = 0 by its ratio log((n - i) / (i + 1)) + log(p / (1 - p)), one
    cumulative sum over all n + 1 terms: against lgamma term by term (math.fsum of the pmf) the tails
    agree to 1e-9 relative for n up to 40 000, far below the 1e-6 level the clauses decide at, at a
    thirtieth of the cost."""
    i = np.arange(n, dtype=np.float64)
    step = np.log(n - i) - np.log1p(i) + (math.log(p) - math.log1p(-p))
    logs = n * math.log1p(-p) + np.concatenate(([0.0], np.cumsum(step)))
    top = float(logs.max())
    pmf = np.exp(logs - top)
    scale = math.exp(top)
    return float(pmf[: k + 1].sum()) * scale, float(pmf[k:].sum()) * scale


# `duplicates` pairs this declaration with DROPOUT-RATE-02's (test_dropout_statistics.py): alike in
# shape only, two clauses.
@clause(
    "DROPOUT-VALUES-01",
    "with dropout each observed weight is exactly 0 (dropped) or its undropped value / (1 - p); blocked keys stay 0; "
    "enough weights survive for the check to have power",
    ORDER,
    requires=["dropout"],
    kills=["dropout_no_rescale", "dropout_before_softmax", "dropout_drops_everything"],
    fpr="1e-6: too few survivors is decided by the exact lower binomial tail of the kept count (1510 visible "
    "weights, keep probability 0.7) at 1e-6",
    tolerance="a kept weight w' must satisfy |w' - w/(1-p)| <= the error model's weight allowance for w, divided by (1-p)",
)
def test_dropout_values(impl, dtype):
    p = 0.3
    case = impl.admit(dropout_case(dtype, 60, p, mask=random_mask(60, (2, 1, 32, 16), p_blocked=0.25)))
    w = observe_weights(impl, case)
    kept, visible = check_kept_weights(impl, case, w, " (mask before softmax, §7.3)")
    # The value check looks only at survivors: a kernel that drops (nearly) every weight would pass it
    # vacuously, so the survivors must be as many as a keep probability of 1 - p gives (one-sided).
    n_visible, survivors = int(visible.sum()), int(kept.sum())
    lower_tail, _ = binomial_tails(survivors, n_visible, 1.0 - p)
    check(
        lower_tail > ALPHA,
        f"only {survivors} of {n_visible} visible weights survived dropout_p = {p} (expected about "
        f"{n_visible * (1 - p):.0f}; P(kept <= {survivors}) = {lower_tail:.3g} <= {ALPHA:g}): too few survivors "
        "for the kept values to be checked",
        case,
    )


@clause(
    "DROPOUT-EDGES-03",
    "dropout_p = 0 applies no dropout whatever the seed; dropout_p = 1 gives all-zero weights and output",
    NO_DROPOUT,
    requires=["dropout"],
    kills=["dropout_p1_nan", "dropout_keep_prob_swapped"],
)
def test_dropout_edges(impl, dtype):
    none = dropout_case(dtype, 62, 0.0, T=4, S=8)
    impl.require(none)
    first = compare.assert_output_matches(impl, none)
    other = impl.forward(none.replace(seed=63))
    if impl.declaration.deterministic:
        check(
            np.array_equal(first, other),
            "with dropout_p = 0 the seed must not matter, but two seeds gave different "
            "outputs (declared deterministic: bitwise equality expected)",
            none,
        )
    w = observe_weights(impl, none)
    check(bool(np.all(w > 0)), f"dropout_p = 0 dropped {int(np.count_nonzero(w == 0))} weights", none)
    full = dropout_case(dtype, 64, 1.0, T=4, S=8)
    impl.require(full)
    out = np.asarray(impl.forward(full), dtype=np.float64)
    check(
        bool(np.all(out == 0)),
        f"dropout_p = 1 must give an all-zero output; got {int(np.isnan(out).sum())} NaN, "
        f"max |out| {np.nanmax(np.abs(out)) if np.isfinite(out).any() else float('nan'):.3g}",
        full,
    )
    wf = observe_weights(impl, full)
    check(
        bool(np.all(wf == 0)), f"dropout_p = 1 must drop every weight; {int(np.count_nonzero(wf != 0))} are not 0", full
    )


@clause(
    "DROPOUT-SEED-04",
    "the same seed reproduces the same dropout; a different seed draws a different mask",
    RETURNED,
    requires=["dropout"],
    kills=["dropout_ignores_seed"],
    fpr="< 1e-400: two independent masks over n = 2048 weights agree with probability (p^2+(1-p)^2)^n, p = 0.3",
)
def test_dropout_seed(impl, dtype):
    case = dropout_case(dtype, 65, 0.3)
    impl.require(case)
    a = observe_weights(impl, case)
    b = observe_weights(impl, case)
    # the V = I probe is built anew for each observation, so its memory differs: bits only under layout_invariant
    if impl.declaration.deterministic and impl.declaration.layout_invariant:
        check(
            np.array_equal(a, b),
            f"the same seed gave different weights in {int((a != b).sum())} places "
            "(declared deterministic and layout_invariant: bitwise equality expected)",
            case,
        )
    else:
        check(
            np.array_equal(a == 0, b == 0),
            f"the same seed dropped different weights in {int(((a == 0) != (b == 0)).sum())} places",
            case,
        )
    c = observe_weights(impl, case.replace(seed=66))
    check(
        not np.array_equal(a == 0, c == 0),
        "seeds 65 and 66 dropped exactly the same weights: the seed is ignored",
        case,
    )
