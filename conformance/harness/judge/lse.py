"""The log-sum-exp a kernel returns beside its output, against the variant oracle's.

FlashAttention returns ``softmax_lse`` [B, Hq, T] (its backward and split-KV merges live on it), and
the bugs are conventions: base 2 (the kernel works in exp2 and forgets to convert), the head axis in
the kv-major order under GQA, and the value on a row that sees no key (``-inf`` by the definition,
``+inf`` in FlashAttention 2's kernels, a large finite negative number in jax's). A kernel declares
``lse_base`` and ``lse_empty``; the oracle's natural-log lse is converted to the declared base and
compared under a first-order bound, and a mismatch says which known convention the values follow
instead.

Allowance per row (the harness's error model, :mod:`conformance.harness.judge.tolerance`, on the lowered
case): ``eps_row + gamma(2S + 8) + u_a |lse| + max(u_w |lse|, eta)``. ``eps_row`` bounds the error of
every visible score, hence of their log-sum-exp; ``gamma(2S + 8)`` the relative error of the sum of
exponentials (one log away from an absolute error of the same size); ``u_a |lse|`` the addition of
the row max and the log; the last term storing the lse in the working dtype (FlashAttention keeps
it in float32, which the bound also covers).
"""

from __future__ import annotations

import math

import numpy as np

from conformance import oracle_variants
from conformance.contract import LSE_LARGE_NEGATIVE_MAX, Case, Declaration
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.judge import compare, tolerance
from conformance.harness.spec.report import ClauseViolation, mismatch_report

LN2 = math.log(2.0)


def _forward(case: Case, decl: Declaration) -> oracle_variants.VariantForward:
    """The variant oracle's forward (it carries the lse; a base case gives the base oracle's answer)."""
    return oracle_variants.forward(
        case, all_blocked=decl.all_blocked_policy(case), causal_alignment=decl.causal_alignment
    )


def expected_lse(case: Case, decl: Declaration) -> np.ndarray:
    """The oracle's lse of ``case`` in the declared base, with the declared value on empty rows."""
    fwd = _forward(case, decl)
    lse = np.array(fwd.lse, dtype=np.float64)
    if decl.lse_base == "2":
        lse = lse / LN2
    lse[fwd.all_blocked] = math.inf if decl.lse_empty == "+inf" else -math.inf  # large-negative: -inf stands in
    return lse


def _wrong_empty(got: np.ndarray, want: np.ndarray, empty: np.ndarray, decl: Declaration) -> np.ndarray:
    """Rows that see no key whose lse is not the declared value: exactly -inf or +inf, or, for
    ``large-negative``, anything at or below LSE_LARGE_NEGATIVE_MAX (-inf included)."""
    if decl.lse_empty == "large-negative":
        with np.errstate(invalid="ignore"):
            return empty & ~(got <= LSE_LARGE_NEGATIVE_MAX)
    return empty & (got != want)


def lse_allowance(case: Case, decl: Declaration) -> np.ndarray:
    """Per-row allowance [B, Hq, T] for the lse in the declared base (0 on empty rows: exact)."""
    low = oracle_variants.lower(case, decl.causal_alignment)
    fwd = _forward(case, decl)
    prec = tolerance.precision(case.dtype, decl.tolerance_dtype(case))
    # The row model of the lowered case, on its own forward: with sinks it has one more key (the sink).
    rm = tolerance.row_model(low, _forward(low, decl), prec)
    mag = np.where(fwd.all_blocked, 0.0, np.abs(fwd.lse))
    allowed = rm.eps + prec.gamma(2 * case.S + 8) + prec.u_a * mag + prec.rounding(mag)
    allowed = np.where(fwd.all_blocked, 0.0, allowed)
    return allowed / LN2 if decl.lse_base == "2" else allowed


def _gqa_orders(lse: np.ndarray, hkv: int) -> np.ndarray:
    """``lse`` [B, Hq, T] with the query heads of each kv head listed kv-major instead of group-major:
    what a kernel that writes head (g, kv) at g * Hkv + kv instead of kv * G + g returns."""
    B, Hq, T = lse.shape
    g = Hq // hkv
    return lse.reshape(B, hkv, g, T).transpose(0, 2, 1, 3).reshape(B, Hq, T)


def _diagnose(got: np.ndarray, case: Case, decl: Declaration, allowed: np.ndarray) -> str:
    """Name the convention the kernel's values follow instead of the declared one, if any."""
    fwd = _forward(case, decl)
    live = ~fwd.all_blocked
    nat = np.where(live, fwd.lse, 0.0)
    slack = allowed * (LN2 if decl.lse_base == "2" else 1.0) * 4 + 1e-6
    guesses = {
        "natural log (lse_base=e)": nat,
        "base 2, log2(sum 2^(s log2 e)) (lse_base=2)": nat / LN2,
        "natural log with the query heads in kv-major order (a GQA layout bug)": _gqa_orders(nat, case.Hkv),
        "base 2 with the query heads in kv-major order": _gqa_orders(nat, case.Hkv) / LN2,
    }
    g = np.where(live, got, 0.0)
    with np.errstate(invalid="ignore"):
        for name, values in guesses.items():
            if np.all(np.abs(g - values) <= slack):
                return f"\n  the values are the {name}; declared lse_base={decl.lse_base}"
    return ""


def assert_lse_matches(impl: GuardedAdapter, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Run ``forward_with_lse``; the output must match the oracle and the lse its declared convention."""
    __tracebackhide__ = True
    out, lse = impl.forward_with_lse(case)
    decl = impl.declaration
    allowed_out = compare.output_allowance(case, decl)
    allowed_out = np.where(np.isfinite(allowed_out), allowed_out, np.finfo(np.float64).max)
    msg = mismatch_report(
        "output", out, _forward(case, decl).out, allowed_out, tolerance.describe(decl.tolerance_dtype(case))
    )
    if msg:
        raise ClauseViolation(msg, case)
    got = np.asarray(lse, dtype=np.float64)
    want = expected_lse(case, decl)
    pad = np.broadcast_to(oracle_variants.padding(case)[:, None, :], want.shape)  # varlen rows past the end
    got, want = np.where(pad, 0.0, got), np.where(pad, 0.0, want)
    empty = ~np.isfinite(want)
    wrong_empty = _wrong_empty(got, want, empty, decl)
    if wrong_empty.any():
        b, h, t = (int(i) for i in np.argwhere(wrong_empty)[0])
        raise ClauseViolation(
            f"lse on rows that see no key: {int(wrong_empty.sum())} of {int(empty.sum())} differ from the declared "
            f"lse_empty={decl.lse_empty}; first at [b,h,t]=[{b},{h},{t}]: got {got[b, h, t]!r}",
            case,
        )
    allowed = lse_allowance(case, decl)
    rule = (
        f"|err| <= eps_row + gamma(2S+8) + u_a|lse| + max(u_w|lse|, eta) for the lse of this case in "
        f"{decl.tolerance_dtype(case)}, base {decl.lse_base} as declared (harness.judge.lse)"
    )
    msg = mismatch_report(  # empty rows were checked exactly above
        f"lse (base {decl.lse_base}, [B, Hq, T])", np.where(empty, 0.0, got), np.where(empty, 0.0, want), allowed, rule
    )
    if msg:
        raise ClauseViolation(msg + _diagnose(got, case, decl, allowed), case)
    return out, got
