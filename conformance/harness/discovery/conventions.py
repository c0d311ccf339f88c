"""Discovery's convention probes: masks and their sense, causal and its alignment, causal together with a mask.

Each witness is built so that the candidate conventions give answers that differ by O(1), and each
probe prints the error against every candidate, so the evidence shows the separation. Conventions a
plain function's *call* depends on (``mask_sense``, ``causal_with_mask``: implementations/function.py
reads them to build the call) are probed by trying each candidate declaration and keeping the one
whose output matches the oracle; an adapter that translates masks itself gives the same answer under
every candidate, and its declared value is kept. Conventions the kernel itself decides (alignment
here; the fills of harness.discovery.blocked, the precision of harness.discovery.precision) are
measured under the declaration as it stands and compared with each candidate's oracle. A behaviour
that is no candidate's is a finding and the field keeps its declared value.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.harness.discovery import witness as w
from conformance.harness.discovery.probes import base, capability
from conformance.harness.discovery.probing import Probing


def _pattern(shape: tuple[int, int, int, int], period: int, hit: int = 0) -> np.ndarray:
    """True where (key + 2 * query + head) % period == hit: every row has some keys blocked and some not."""
    _, h, t, s = np.indices(shape)
    return (s + 2 * t + h) % period == hit


# -- masks --------------------------------------------------------------------------------------------
def masks(p: Probing) -> None:
    if p.pinned_here("bool_mask") and not p.decl.bool_mask:
        p.keep("mask_sense", "not measured: no boolean mask (bool_mask pinned false)")
    else:
        _bool_mask(p, measure_support="bool_mask" not in p.pinned)
    mask = _pattern((1, 2, 3, 5), 4, 1)
    finite = np.random.default_rng(11).standard_normal((1, 2, 3, 5))
    case = base(p, 11, bias=np.where(mask, -np.inf, finite))
    capability(p, "float_mask", case, case.replace(bias=None), "float mask [1,2,3,5] (N(0,1) and some -inf)")


def _bool_mask(p: Probing, measure_support: bool) -> None:
    case = base(p, 10, mask=_pattern((1, 2, 3, 5), 3))
    what = "boolean mask [1,2,3,5], 1-2 keys of every row blocked"
    ref = w.reference(case)
    pinned_sense = "mask_sense" in p.pinned
    senses = [p.decl.mask_sense] + (
        [] if pinned_sense else [s for s in ("attend", "blocked") if s != p.decl.mask_sense]
    )
    tried = {s: p.forward(case, p.decl.replace(mask_sense=s)) for s in senses}
    errs = {s: w.err(o.value, ref) for s, o in tried.items() if o.ok}
    good = [s for s, e in errs.items() if p.matches(e)]
    desc = "; ".join(
        f"as mask_sense={s}: " + (f"err {w.fmt(errs[s])}" if s in errs else tried[s].error) for s in senses
    )

    def support(value: bool, evidence: str) -> None:
        if measure_support:
            p.record("bool_mask", value, evidence)

    def sense(evidence: str, value: str | None = None) -> None:
        if pinned_sense:
            p.pinned_here("mask_sense")
        elif value is None:
            p.keep("mask_sense", evidence)
        else:
            p.record("mask_sense", value, evidence)

    if good:
        support(True, f"{what}: matched the oracle ({desc})")
        if len(good) > 1:
            sense(f"the adapter translates masks itself: every candidate declaration matched ({desc}); kept")
        else:
            sense(f"{desc}", good[0])
        return
    if not errs:
        crash = next((o for o in tried.values() if p.crashed(o, what)), None)
        if crash is not None:
            support(True, f"kept: {what}: {desc} (a crash, not a rejection)")
        else:
            support(False, f"{what}: {desc}")
        sense("not measured: the boolean mask did not run")
        return
    if any(p.matches(w.err(o.value, w.reference(case.replace(mask=None)))) for o in tried.values() if o.ok):
        support(False, f"{what} ran and was ignored: matched the oracle without the mask ({desc})")
        sense("not measured: the boolean mask is ignored")
        return
    support(True, f"{what}: matched no sense ({desc})")
    sense("kept: no candidate matched (see findings)")
    p.finding(f"a boolean mask gives an output that matches neither mask sense ({desc})")


# -- causal ---------------------------------------------------------------------------------------------
ALIGNMENT_WITNESSES = (("T<S (T=3, S=5)", 3, 5), ("T>S (T=5, S=3)", 5, 3), ("decode (T=1, S=5)", 1, 5))


def causal(p: Probing) -> None:
    square = base(p, 12, T=4, S=4, is_causal=True)
    capability(p, "causal", square, square.replace(is_causal=False), "is_causal, T=S=4")
    if p.pinned_here("causal_alignment"):
        return
    if not p.decl.causal:
        p.keep("causal_alignment", "not measured: no is_causal")
        return
    parts, answers = [], {}
    for label, T, S in ALIGNMENT_WITNESSES:
        case = base(p, 13, T=T, S=S, is_causal=True)
        o = p.forward(case)
        if not o.ok:
            parts.append(f"{label}: {o.error}")
            continue
        tl, br = (oracle.causal_blocked(T, S, a) for a in ("top-left", "bottom-right"))
        rows = np.broadcast_to(~(tl.all(-1) | br.all(-1)), (case.B, case.Hq, T))  # rows with keys in both
        e_tl = w.err(o.value, w.reference(case, alignment="top-left"), rows)
        e_br = w.err(o.value, w.reference(case, alignment="bottom-right"), rows)
        found = "top-left" if p.matches(e_tl) else "bottom-right" if p.matches(e_br) else None
        answers[label] = found
        parts.append(f"{label}: {found or 'neither'} (top-left err {w.fmt(e_tl)}, bottom-right err {w.fmt(e_br)})")
    evidence = "; ".join(parts)
    distinct = {a for a in answers.values() if a}
    if None in answers.values():
        p.finding(f"is_causal matches neither alignment on {', '.join(k for k, a in answers.items() if a is None)}")
    if len(distinct) > 1:
        p.finding(
            "the causal alignment differs between shapes (" + ", ".join(f"{k} {a}" for k, a in answers.items()) + ")"
        )
    if len(distinct) == 1 and None not in answers.values():
        p.record("causal_alignment", distinct.pop(), evidence)
    else:
        p.keep("causal_alignment", f"kept: {evidence}")


def causal_with_mask(p: Probing) -> None:
    if p.pinned_here("causal_with_mask"):
        return
    if not p.decl.causal or not (p.decl.bool_mask or p.decl.float_mask):
        p.keep("causal_with_mask", "not measured: needs is_causal and a mask")
        return
    mask = np.zeros((4, 4), dtype=bool)
    mask[1, 0] = mask[2, 1] = mask[3, 2] = mask[0, 3] = True
    kind = "boolean mask" if p.decl.bool_mask else "float mask"
    arrays = {"mask": mask} if p.decl.bool_mask else {"bias": np.where(mask, -np.inf, 0.0)}
    case = base(p, 14, T=4, S=4, is_causal=True, **arrays)
    union = w.reference(case)
    only_mask = w.reference(case.replace(is_causal=False))
    only_causal = w.reference(case.replace(mask=None, bias=None))
    what = f"is_causal with a {kind}, T=S=4"
    both = p.forward(case, p.decl.replace(causal_with_mask=True))
    if both.ok:
        e, em, ec = (w.err(both.value, r) for r in (union, only_mask, only_causal))
        desc = f"union err {w.fmt(e)}, mask only {w.fmt(em)}, causal only {w.fmt(ec)}"
        if p.matches(e):
            declared = p.decl.causal_with_mask
            p.record("causal_with_mask", None if declared is False else declared, f"{what}: applied both ({desc})")
            return
        p.keep("causal_with_mask", f"kept: {what} passed together: {desc}")
        if p.matches(em):
            p.finding(f"ignores is_causal when a mask is given ({what}: {desc}); no field declares that")
        elif p.matches(ec):
            p.finding(f"ignores the mask when is_causal is given ({what}: {desc}); no field declares that")
        else:
            p.finding(f"{what} gives neither the union, the mask alone nor causal alone ({desc})")
        return
    if p.crashed(both, f"{what}, passed together"):
        p.keep("causal_with_mask", f"kept: {what}: together {both.error} (a crash, not a rejection: never folded)")
        return
    folded = p.forward(case, p.decl.replace(causal_with_mask=False))
    e = w.err(folded.value, union) if folded.ok else np.inf
    if p.matches(e):
        p.record(
            "causal_with_mask",
            False,
            f"{what}: rejected together ({both.error}); folded into the mask it matched (err {w.fmt(e)})",
        )
        return
    tries = f"together {both.error}; folded {folded.error or 'err ' + w.fmt(e)}"
    p.keep("causal_with_mask", f"kept: {what}: {tries}")
    p.finding(f"{what}: no way of passing the pair gave the union ({tries})")


CONVENTIONS = (masks, causal, causal_with_mask)
