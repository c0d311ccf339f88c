"""Discovery's probe of rows whose keys are all blocked: the fill for a boolean mask and for a row of -inf in M.

The spec fills such a row with zeros (000 §8); kernels also give NaN (softmax of nothing) or the mean
of V (a finite fill such as jax's). The witness blocks three rows entirely (two heads, first, middle
and last positions) and leaves the others partly blocked; every dead row is classified on its own, so
a kernel that fills some rows one way and others another (NaN only where a tile's guard is missing) is
a finding: the contract allows one policy per mask kind (``contract.ALL_BLOCKED_POLICIES``). The
witness runs at S = 5, 8 and 16 (tile paths start at multiples of 8 and 16) and in every declared
dtype, so a fill that depends on the dtype or on S is a finding too, never a declaration.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.contract import ALL_BLOCKED_POLICIES, DTYPES, Case
from conformance.harness.discovery import witness as w
from conformance.harness.discovery.probes import base
from conformance.harness.discovery.probing import Probing

DEAD_ROWS = ((0, 0, 1), (0, 1, 0), (0, 1, 2))  # (b, h, t) blocked entirely in the witness
# A row blocked entirely that is the softmax over all its keys (its own scores': a finite fill added to
# blocked scores, float16's -0.7 x max added in float32). With the mean of V (the same fill where the
# scores are uniform) it is one behaviour, the blocked_fill formulation's, measured there: all_blocked
# records mean-v.
FINITE = "finite fill"
FILL_LENGTHS = (5, 8, 16)  # S of the witnesses: a multiple of neither 8 nor 16, of 8 only, of both (tile sizes)


def _dead_witness(p: Probing, additive: bool, dtype: str, S: int) -> Case:
    blocked = np.zeros((1, 2, 3, S), dtype=bool)
    blocked[0, 0, 0, 2] = blocked[0, 1, 1, S - 1] = True  # partly blocked rows too
    for b, h, t in DEAD_ROWS:
        blocked[b, h, t] = True
    if not additive:
        return base(p, 15, dtype, S=S, mask=blocked)
    finite = 0.5 * np.random.default_rng(16).standard_normal(blocked.shape)
    return base(p, 15, dtype, S=S, bias=np.where(blocked, -np.inf, finite))


def _fills(p: Probing, case: Case, what: str) -> tuple[set[str], str]:
    """The fill of each all-blocked row ("zeros", "nan", "mean-v" or "other"), and the evidence."""
    o = p.forward(case)
    if not o.ok:
        return set(), f"{what}: {o.error}"
    out = np.asarray(o.value, dtype=np.float64)
    dead = oracle.forward(case).all_blocked
    mean_v = w.reference(case, all_blocked="mean-v")
    unmasked = w.reference(case.replace(mask=None, bias=None))
    by: dict[str, list[str]] = {}
    for b, h, t in zip(*np.nonzero(dead)):
        row = out[b, h, t]
        fill = "zeros" if np.all(row == 0) else "nan" if np.all(np.isnan(row)) else None
        if fill is None:
            fill = "mean-v" if w.matches(w.err(row, mean_v[b, h, t]), case.dtype) else "other"
        if fill == "other" and w.matches(w.err(row, unmasked[b, h, t]), case.dtype):
            fill = FINITE  # the softmax over every key: a finite fill added to the scores
        by.setdefault(fill, []).append(
            f"(h={h},t={t})" + (f" {np.round(row[:3], 3).tolist()}" if fill == "other" else "")
        )
    e_live = w.err(out, w.reference(case), ~dead)
    if not w.matches(e_live, "bfloat16"):  # rounding at a lower precision is the formulations' to measure
        p.finding(f"{what}: the rows that see keys differ from the oracle (err {w.fmt(e_live)})")
    rows = "; ".join(f"{fill} on {' '.join(ix)}" for fill, ix in by.items())
    return set(by), f"{what}: {rows} (other rows err {w.fmt(e_live)})"


def _survey(p: Probing, additive: bool, kind: str) -> tuple[set[str], str, bool]:
    """The fills of the dead rows at every S of FILL_LENGTHS in the working dtype, and in every declared
    dtype at the first S: (every fill seen, the evidence, whether they differ between witnesses, each
    one filling its rows one way). A fill that depends on S (a tile path) or on the dtype (NaN in
    float32, the mean of V in float64) is no policy."""
    seen: dict[tuple[str, int], set[str]] = {}
    notes = []
    witnesses = [(p.dtype, S) for S in FILL_LENGTHS]
    witnesses += [(d, FILL_LENGTHS[0]) for d in DTYPES if d in p.decl.dtypes and d != p.dtype]
    for dt, S in witnesses:
        fills, ev = _fills(p, _dead_witness(p, additive, dt, S), f"{dt} S={S}")
        seen[(dt, S)] = fills
        if len(fills) != 1:
            notes.append(ev)
    by_fill: dict[str, list[tuple[str, int]]] = {}
    for at, fills in seen.items():
        for f in sorted(fills):
            by_fill.setdefault(f, []).append(at)
    summary = "; ".join(f"{f} in {_where(at)}" for f, at in by_fill.items()) or "nothing ran"
    evidence = f"{kind}, {len(DEAD_ROWS)} rows blocked entirely: {summary}"
    evidence += f" ({'; '.join(notes)})" if notes else ""
    if FINITE in by_fill and set(by_fill) <= {FINITE, "mean-v"}:  # one finite fill (see FINITE)
        by_fill.setdefault("mean-v", []).extend(by_fill.pop(FINITE))
        seen = {at: {"mean-v" if f == FINITE else f for f in fills} for at, fills in seen.items()}
    varies = len(by_fill) > 1 and all(len(f) == 1 for f in seen.values() if f)
    return set(by_fill), evidence, varies


def _where(at: list[tuple[str, int]]) -> str:
    """ "float32 at S = 5, 8, 16; float64 at S = 5" from (dtype, S) pairs."""
    by_dtype: dict[str, list[int]] = {}
    for dt, S in at:
        by_dtype.setdefault(dt, []).append(S)
    return "; ".join(f"{dt} at S = {', '.join(map(str, ss))}" for dt, ss in by_dtype.items())


def _judge(p: Probing, fills: set[str], kind: str, evidence: str, varies: bool = False) -> str | None:
    if len(fills) == 1 and next(iter(fills)) in ALL_BLOCKED_POLICIES:
        return next(iter(fills))
    if varies:
        p.finding(
            f"{kind} all-blocked rows are filled differently by S or by dtype, {evidence}: one policy per mask kind"
        )
    elif len(fills) > 1:
        p.finding(f"{kind} all-blocked rows are filled in more than one way, {evidence}: one policy per mask kind")
    elif fills:
        p.finding(f"{kind} all-blocked rows give neither zeros, NaN nor the mean of V, {evidence}")
    return None


def all_blocked(p: Probing) -> None:
    """``all_blocked`` from boolean rows, ``all_blocked_float_mask`` from -inf rows (None when the two agree)."""
    only_float = not p.decl.bool_mask and "all_blocked" not in p.pinned  # -inf rows then say all_blocked
    if "all_blocked" in p.pinned:
        p.pinned_here("all_blocked")
    elif p.decl.bool_mask:
        fills, ev, varies = _survey(p, False, "boolean mask")
        policy = _judge(p, fills, "boolean", ev, varies)
        p.record("all_blocked", policy, ev) if policy else p.keep("all_blocked", f"kept: {ev}")
    elif not p.decl.float_mask:
        p.keep("all_blocked", "not measured: no mask")
    if p.pinned_here("all_blocked_float_mask"):
        return
    if not p.decl.float_mask:
        p.keep("all_blocked_float_mask", "not measured: no float mask")
        return
    fills, ev, varies = _survey(p, True, "float mask, rows all -inf")
    policy = _judge(p, fills, "-inf float", ev, varies)
    if policy is None:
        if only_float:
            p.keep("all_blocked", "kept: no boolean mask, and the -inf rows gave no single policy")
        p.keep("all_blocked_float_mask", f"kept: {ev}")
    elif only_float:
        p.record("all_blocked", policy, f"{ev} (no boolean mask: all_blocked says it)")
        p.record("all_blocked_float_mask", None, "the same as all_blocked")
    elif policy == p.decl.all_blocked:
        p.record("all_blocked_float_mask", None, f"{ev}: the same as all_blocked")
    else:
        p.record("all_blocked_float_mask", policy, ev)
