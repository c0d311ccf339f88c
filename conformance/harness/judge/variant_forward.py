"""A variant case's forward against the variant oracle: which keys each query sees, and the output.

The variants (sliding windows, softcap, ALiBi, varlen batches, KV-cache forms) and the causal mask
decide which keys a query row may see. :func:`check_blocked_pattern` reads the observed weights
(``harness.calls.probes.observe_weights``): exactly 0 outside the visible set, nonzero inside, the
oracle's within the error model; :func:`assert_variant_output` compares the output. A failure names
the variant, in the kernel's declared causal alignment, and the query and key where the kernel went
wrong (for a varlen batch, the sequences that differ). The gradients are ``variant_vjp``.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle_variants
from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.judge import compare, tolerance
from conformance.harness.spec.report import ClauseViolation, mismatch_report


def _variant_words(case: Case, align: str) -> str:
    parts = []
    if case.is_varlen:
        tq, sk = oracle_variants.lengths(case)
        if case.seqlens_q is None:
            parts.append(f"per-sequence key lengths {sk.tolist()} (T={case.T} each)")
        else:
            parts.append(f"varlen seqlens_q={tq.tolist()} seqlens_k={sk.tolist()}")
    if case.kv_form is not None:
        parts.append(case.kv_form.describe())
    if case.window is not None:
        parts.append(f"window {tuple(case.window)}")
    if case.is_causal:
        parts.append("causal")
    if case.softcap:
        parts.append(f"softcap {case.softcap:g}")
    if case.alibi_slopes is not None:
        parts.append(f"ALiBi slopes {list(np.shape(case.alibi_slopes))}")
    return ", ".join(parts) + f" ({align}, as declared)"


def _visible_keys(blocked_row: np.ndarray) -> str:
    vis = np.flatnonzero(~blocked_row)
    if vis.size == 0:
        return "none"
    if vis.size == vis[-1] - vis[0] + 1:
        return f"keys {vis[0]}..{vis[-1]}"
    return f"keys {vis.tolist()}"


def check_blocked_pattern(impl: GuardedAdapter, case: Case, *, empty_rows: bool = True) -> np.ndarray:
    """Observed weights: exactly 0 outside the visible set (the causal mask, window, lengths and mask
    of ``case``, in the declared alignment), nonzero inside (where the oracle's weight is not
    negligible), and equal to the oracle's within the error model on every row that sees a key.

    With ``empty_rows`` a row that sees no key must also have weights 0 under the declared fill
    ``zeros``; the causal clauses leave such rows to their output check (``empty_rows=False``)."""
    decl = impl.declaration
    want = compare.expected(case, decl)
    w = observe_weights(impl, case)
    live = ~want.all_blocked
    words = _variant_words(case, decl.causal_alignment)
    allowed = compare.weights_allowance(case, decl)
    # what the failure's picture shows (harness.causes.picture): a blocked weight is allowed nothing
    pictured = np.where(want.blocked, 0.0, np.where(live[..., None], allowed, np.inf))
    compared = {"what": f"weights under {words}", "actual": w, "expected": want.weights, "allowed": pictured}
    leaked = want.blocked & live[..., None] & (w != 0)
    if leaked.any():
        b, h, t, s = (int(i) for i in np.argwhere(leaked)[0])
        raise ClauseViolation(
            f"{words}: {int(leaked.sum())} positions outside the visible set have nonzero weight; first: query {t} "
            f"reads key {s} (b={b}, h={h}, weight {w[b, h, t, s]:.6g}) but may see only "
            f"{_visible_keys(want.blocked[b, h, t])}",
            case,
            compared,
        )
    starved = ~want.blocked & live[..., None] & (w == 0) & (want.weights > 1e-3)
    if starved.any():
        b, h, t, s = (int(i) for i in np.argwhere(starved)[0])
        raise ClauseViolation(
            f"{words}: {int(starved.sum())} visible positions have weight 0; first: query {t} cannot read key {s} "
            f"(b={b}, h={h}), which it may see ({_visible_keys(want.blocked[b, h, t])})",
            case,
            compared,
        )
    empty_read = want.all_blocked[..., None] & (w != 0) & ~np.isnan(w)
    if empty_rows and decl.all_blocked_policy(case) == "zeros" and empty_read.any():
        b, h, t, _ = (int(i) for i in np.argwhere(empty_read)[0])
        raise ClauseViolation(
            f"{words}: query {t} (b={b}, h={h}) sees no key, yet its weights are not 0", case, compared
        )
    msg = mismatch_report(
        f"weights under {words}",
        w,
        want.weights,
        np.where(live[..., None], allowed, np.inf),
        tolerance.describe(decl.tolerance_dtype(case), "observed weights"),
    )
    if msg:
        raise ClauseViolation(msg, case)
    return w


def _sequences_off(case: Case, decl, out: np.ndarray) -> str:
    """Which sequences of the batch the kernel got wrong, with their lengths."""
    with np.errstate(invalid="ignore"):
        err = np.abs(np.asarray(out, dtype=np.float64) - compare.expected(case, decl).out)
        bad = ~(err <= compare.output_allowance(case, decl))
    bad &= ~np.isnan(compare.expected(case, decl).out)
    tq, sk = oracle_variants.lengths(case)
    seqs = [f"b={b} (T_b={tq[b]}, S_b={sk[b]})" for b in np.flatnonzero(bad.reshape(case.B, -1).any(axis=1))]
    return f"\n  sequences that differ: {', '.join(seqs)}" if seqs else ""


def assert_variant_output(impl: GuardedAdapter, case: Case) -> np.ndarray:
    """The output of a variant case against the variant oracle, the failure naming the variant (and,
    for a varlen batch, the sequences that differ)."""
    decl = impl.declaration
    out = impl.forward(case)
    try:
        compare.assert_close(out, compare.expected(case, decl).out, case=case, decl=decl)
    except ClauseViolation as exc:
        words = _variant_words(case, decl.causal_alignment)
        seqs = _sequences_off(case, decl, out) if case.is_varlen else ""
        raise ClauseViolation(f"under {words}:\n{exc}{seqs}", compared=exc.compared) from exc
    return out
