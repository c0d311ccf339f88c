"""Discovery's formulation probes: what each dtype is computed at, where the scale goes, the fill, merges.

A formulation (conformance/oracle_formulations.py) is told from another by the oracle re-run under
each candidate and the error model of that candidate, on witnesses built so that the candidates'
answers lie many allowances apart: the kernel's output on a witness *matches* a candidate when every
element is within that candidate's allowance (``harness.judge.expected``), NaN matching NaN. The
first candidate in order that matches every witness is recorded, the spec's own first, so a kernel
that follows the spec is never given a formulation; when none matches, the field keeps its value
and a finding says what was measured. Each probe calls the kernel once per witness.

* ``float32_computed_as``: keys that differ from each other in the 12th mantissa bit with a query
  that turns that bit into score differences of 2 (TF32 and float16 keep the 11th bit, bfloat16 the
  8th), and a query of 2^17, past float16's range (a float16 operand is inf).
* ``float16_computed_as`` / ``bfloat16_computed_as`` with ``scale_applied``: the large-logits witness
  (raw Q K^T = 65536 + 8j: a float16 product overflows, a bfloat16 one loses j), queries with
  scores of a few hundred at Dk = 8 (scale 1/sqrt 8: Q scaled in the input dtype, a product
  rounded before or after the scale, each lands elsewhere), a row of 1024 keys of equal weight
  (sums accumulated in the input dtype drift by many units), and scores of exactly 256 plus an additive
  M of fractions (``-masked``: s + M rounded to the input dtype loses them).
* ``blocked_fill``: keys blocked with scores of +1e10 (a fill of -1e4 or -1e9 leaves them visible),
  a row blocked by the mask and -inf together (a set fill makes it uniform over the masked keys), a
  row blocked entirely (its gradient passes to dQ under an added fill), and in float16 a row blocked
  entirely with spread scores (added in float32 it is their softmax; in float16 it is not) and a
  blocked key scoring +25000 beside visible ones near -25000 (-0.7 x 65504 added leaves it on top).
* ``normwise_merges``: a row with one dominant key (the last) and weights near 1e-14 read through
  V = I; the fewest merges whose absolute allowance admits the kernel's tiny weights.

Longer than 250 lines because it is one job, four probes sharing one matching rule (``worst``,
``_choose``), each probe's witnesses written beside it so that what sets the candidates apart can be
read with the candidates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from conformance.contract import (
    FINITE_FILLS,
    FLOAT32_FORMATS,
    LOW_PRECISION,
    LOWP_COMPUTED_AS,
    SCALE_APPLIED,
    Case,
    Declaration,
    np_dtype,
)
from conformance.harness.calls.probes import probe_case
from conformance.harness.discovery.probing import Probing
from conformance.harness.judge import expected as judged
from conformance.harness.spec.report import abs_error

_BIG = np.finfo(np.float64).max


@dataclass
class Witness:
    """One witness case and what the kernel returned for it (forward, V = I weights, or a VJP)."""

    case: Case
    kind: str  # "forward" | "weights" | "vjp"
    got: object
    grad_out: np.ndarray | None = None


def _ratio(got: np.ndarray, want: np.ndarray, allowed: np.ndarray) -> float:
    err = abs_error(np.asarray(got, dtype=np.float64), want)
    allowed = np.where(np.isinf(allowed), _BIG, allowed)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        r = np.where(err == 0, 0.0, err / np.maximum(allowed, 1e-300))
    return float(np.max(r)) if r.size else 0.0


def worst(w: Witness, decl: Declaration) -> float:
    """The witness's worst |err| / allowance under ``decl`` (<= 1: it matches)."""
    case = w.case
    try:
        if w.kind == "forward":
            return _ratio(w.got, judged.expected(case, decl).out, judged.output_allowance(case, decl))
        if w.kind == "weights":
            return _ratio(w.got, judged.expected(case, decl).weights, judged.weights_allowance(case, decl))
        grads = judged.expected_vjp(case, w.grad_out, decl)
        allow = judged.grad_allowance(case, w.grad_out, decl)
        return max(_ratio(g, e, a) for g, e, a in zip(w.got, grads, allow))
    except Exception:  # noqa: BLE001 - a candidate the oracle cannot take matches nothing
        return np.inf


def _collect(p: Probing, cases: Iterable[tuple[Case, str]]) -> tuple[list[Witness], list[str]]:
    out, notes = [], []
    for case, kind in cases:
        why = p.decl.not_supported_reasons(case)
        if why:
            notes.append(f"{case.label}: not run ({'; '.join(why)})")
            continue
        if kind == "weights":
            o = p.forward(probe_case(case, p.decl))
            got = None if not o.ok else np.asarray(o.value)[..., : case.S]
        elif kind == "vjp":
            g = np.random.default_rng(7).standard_normal(case.out_shape).astype(case.query.dtype)
            o = p.vjp(case, g)
            if o.ok:
                out.append(Witness(case, kind, o.value, g))
            else:
                notes.append(f"{case.label} (vjp): {o.error}")
            continue
        else:
            o = p.forward(case)
            got = o.value if o.ok else None
        if got is None:
            notes.append(f"{case.label}: {o.error}")
        else:
            out.append(Witness(case, kind, got))
    return out, notes


def _choose(p: Probing, witnesses: list[Witness], candidates: list[dict]) -> tuple[dict | None, str]:
    """The first candidate (field values) every witness matches, and the evidence line."""
    seen = []
    for cand in candidates:
        decl = p.decl.replace(**cand)
        r = max((worst(w, decl) for w in witnesses), default=np.inf)
        seen.append(f"{_words(cand)} {r:.3g}")
        if r <= 1.0:
            return cand, f"matched {_words(cand)} (worst {r:.2g} of its allowance); tried " + ", ".join(seen)
    return None, "no candidate matched (worst share of each candidate's allowance: " + ", ".join(seen) + ")"


def _words(cand: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cand.items())


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np_dtype(dtype))


# -- float32 ----------------------------------------------------------------------------------------
def _f32_witnesses() -> list[tuple[Case, str]]:
    rng = np.random.default_rng(23)
    S, Dk = 8, 16
    m = np.arange(S) % 4
    k = np.zeros((1, 1, S, Dk))
    k[..., 0] = 1.0 + m * 2.0**-12  # the 12th mantissa bit: float32 keeps it, TF32 and float16 round it
    k[..., 1] = 1.0 + (np.arange(S) % 2) * 2.0**-9  # the 9th: TF32 and float16 keep it, bfloat16 does not
    q = np.zeros((1, 1, 2, Dk))
    q[0, 0, 0, 0] = 2.0**15  # score differences 0.25 * 2^15 * 2^-12 = 2 per step of m
    q[0, 0, 1, 1] = 2.0**13  # differences 0.25 * 2^13 * 2^-9 = 4
    v = rng.standard_normal((1, 1, S, Dk))  # Dv = Dk: some kernels require it
    fine = Case(_cast(q, "float32"), _cast(k, "float32"), _cast(v, "float32"), label="float32 mantissa bits 9, 12")
    big = np.zeros((1, 1, 1, Dk))
    big[0, 0, 0, 1] = 2.0**17  # past float16's 65504: a float16 operand is inf
    wide = Case(_cast(big, "float32"), _cast(k, "float32"), _cast(v, "float32"), label="float32 query of 2^17")
    return [(fine, "forward"), (wide, "forward")]


def float32_computed_as(p: Probing) -> None:
    if p.pinned_here("float32_computed_as"):
        return
    if "float32" not in p.decl.dtypes:
        p.keep("float32_computed_as", "not measured: no float32")
        return
    witnesses, notes = _collect(p, _f32_witnesses())
    if not witnesses:
        p.keep("float32_computed_as", "kept: " + "; ".join(notes))
        return
    found, evidence = _choose(p, witnesses, [{"float32_computed_as": f} for f in FLOAT32_FORMATS])
    if found:
        p.record("float32_computed_as", found["float32_computed_as"], evidence)
        if found["float32_computed_as"] != "float32":
            # explained: the plain float32 witness's error is the format's; the convention probes,
            # whose thresholds are float32's, move to float64 where it runs at its own precision, and
            # read their thresholds at the format's where no dtype does
            p.findings[:] = [f for f in p.findings if not f.startswith("float32: the plain witness")]
            every_dtype_at(p)
            if p.dtype == "float32" and "float64" in p.decl.dtypes and "float64" not in p.swallowed:
                p.dtype = "float64"
            elif p.dtype == "float32":
                p.match_as = _MATCH_AS.get(found["float32_computed_as"], "bfloat16")
    else:
        p.keep("float32_computed_as", f"kept: {evidence}")
        p.finding(f"float32 outputs match no float32 formulation: {evidence}")


# -- float16 / bfloat16 ---------------------------------------------------------------------------------
def _lowp_witnesses(dtype: str) -> list[tuple[Case, str]]:
    from conformance.harness.discovery.precision import large_logits

    rng = np.random.default_rng(29)
    q = rng.standard_normal((1, 2, 4, 8)) * 6.0  # Q K^T of a few hundred at Dk = 8
    k = rng.standard_normal((1, 2, 16, 8)) * 6.0
    v = rng.standard_normal((1, 2, 16, 8))
    mid = Case(_cast(q, dtype), _cast(k, dtype), _cast(v, dtype), label=f"{dtype} scores of a few hundred, Dk = 8")
    S = 1024
    flat = Case(
        _cast(np.full((1, 1, 1, 8), 0.25), dtype),
        _cast(np.full((1, 1, S, 8), 0.25), dtype),
        _cast(1.0 + rng.random((1, 1, S, 8)), dtype),
        label=f"{dtype} 1024 keys of equal weight",
    )
    # Every score exactly 256 (Q K^T exact in the dtype, scale 1) plus an additive M of fractions (exact
    # in the dtype): added in float32 the weights are softmax(M); added in the input dtype (``-masked``)
    # 256 + M is rounded to the dtype's spacing there (2 in bfloat16, 0.25 in float16).
    m = _cast(rng.uniform(-1.0, 1.0, (1, 1, 4, 16)), dtype).astype(np.float64)
    with_m = Case(_cast(np.full((1, 2, 4, 8), 2.0), dtype), _cast(np.full((1, 2, 16, 8), 16.0), dtype),
                  _cast(rng.standard_normal((1, 2, 16, 8)), dtype), bias=m, scale=1.0,
                  label=f"{dtype} scores of 256 plus an additive M of fractions")  # fmt: skip
    return [(large_logits(dtype), "forward"), (mid, "forward"), (flat, "forward"), (with_m, "forward")]


def _lowp_candidates(dtype: str) -> list[dict]:
    """The spec's upcast first, then the formulations from the tightest error model to the loosest
    (``-sums`` admits what ``-products`` and ``-scores`` do on the witnesses but the flat one)."""
    field = f"{dtype}_computed_as"
    order = sorted(LOWP_COMPUTED_AS[dtype], key=lambda how: ("float32", "products", "masked", "scores", "sums").index(
        how.rpartition("-")[2] if "-" in how else how))  # fmt: skip
    out = []
    for how in order:
        for where in SCALE_APPLIED:
            if how == "float32" and where == "product":
                continue  # the same as "scores" when nothing is rounded to the input dtype
            out.append({field: how, "scale_applied": where})
    return out


def lowp_computed_as(p: Probing) -> None:
    """``float16_computed_as``, ``bfloat16_computed_as`` and ``scale_applied`` (one placement for both)."""
    low = [d for d in sorted(LOW_PRECISION) if d in p.decl.dtypes]
    scale_pinned = "scale_applied" in p.pinned
    found_scale = []
    for dtype in low:
        field = f"{dtype}_computed_as"
        if p.pinned_here(field):
            continue
        if dtype in p.swallowed:
            p.keep(field, f"kept: computed at {p.swallowed[dtype]} with every dtype (see the findings)")
            continue
        witnesses, notes = _collect(p, _lowp_witnesses(dtype))
        if not witnesses:
            p.keep(field, "kept: " + "; ".join(notes))
            continue
        cands = _lowp_candidates(dtype)
        if scale_pinned:
            cands = [c for c in cands if c["scale_applied"] == p.decl.scale_applied]
        found, evidence = _choose(p, witnesses, cands)
        if found is None:
            p.keep(field, f"kept: {evidence}")
            p.finding(f"{dtype} outputs match no {dtype} formulation: {evidence}")
            continue
        p.record(field, found[field], evidence)
        found_scale.append(found["scale_applied"])
    if scale_pinned:
        p.pinned_here("scale_applied")
    elif found_scale and len(set(found_scale)) == 1:
        p.record("scale_applied", found_scale[0], f"the placement every low-precision dtype matched ({found_scale[0]})")
    elif found_scale:
        p.keep("scale_applied", f"kept: the low-precision dtypes matched different placements {found_scale}")
        p.finding(f"the scale is applied differently per dtype ({found_scale}): one placement is declarable")
    else:
        p.keep("scale_applied", "not measured: no low-precision dtype ran")
    if not low:
        p.keep("float16_computed_as", "not measured: no float16")
        p.keep("bfloat16_computed_as", "not measured: no bfloat16")


# -- the fill of blocked keys -------------------------------------------------------------------------------
def _fill_witnesses(p: Probing) -> list[tuple[Case, str]]:
    dtype = p.dtype
    rng = np.random.default_rng(31)
    S, Dk = 6, 8
    q = rng.standard_normal((1, 2, 3, Dk))
    k = rng.standard_normal((1, 2, S, Dk))
    q[..., 0], k[..., 0] = 0.0, 0.0
    q[0, :, 1, 0], k[0, :, 4, 0] = 1.0e5, 1.0e5 * 2.8  # query 1 scores key 4 at ~1e10 (scaled)
    v = rng.standard_normal((1, 2, S, Dk))
    mask = np.zeros((1, 1, 3, S), dtype=bool)
    mask[0, 0, 1, 4] = True  # the key a fill of -1e9 would leave visible
    mask[0, 0, 2, :] = True  # a row blocked entirely
    huge = Case(_cast(q, dtype), _cast(k, dtype), _cast(v, dtype), mask=mask, label="blocked key scoring 1e10")
    out = [(huge, "forward")]
    if p.decl.float_mask:  # a row whose keys the mask and a -inf bias block together: a set fill is
        bias = np.zeros((1, 1, 3, S))  # uniform over the filled keys alone, -inf leaves the row empty
        bias[0, 0, 0, :3] = -np.inf
        both = np.zeros((1, 1, 3, S), dtype=bool)
        both[0, 0, 0, 3:] = True
        out.append((Case(_cast(q * 1e-5, dtype), _cast(k, dtype), _cast(v, dtype), mask=both, bias=bias,
                         label="a row blocked by the mask and -inf together"), "forward"))  # fmt: skip
    small = Case(_cast(q * 1e-5, dtype), _cast(k, dtype), _cast(v, dtype), mask=mask, label="a row blocked entirely")
    if p.decl.grad:
        out.append((small, "vjp"))
    if "float16" in p.decl.dtypes:
        spread, k16 = rng.standard_normal((1, 2, 3, Dk)) * 3.0, rng.standard_normal((1, 2, S, Dk))
        out.append((Case(_cast(spread, "float16"), _cast(k16, "float16"), _cast(v, "float16"), mask=mask,
                         label="float16, a row blocked entirely with spread scores"), "forward"))  # fmt: skip
        # a blocked key scoring +25000 beside visible ones near -25000: -0.7 x 65504 added leaves it
        # on top (-20856), float16's lowest (-65504) does not, a set fill or -inf never do
        qf, kf = np.zeros((1, 1, 1, Dk)), np.zeros((1, 1, S, Dk))
        qf[..., 0], kf[..., 0], kf[..., 1] = 266.0, -266.0, rng.standard_normal(S)  # scaled by 1/sqrt(8)
        kf[0, 0, 0, 0] = 266.0
        far = np.zeros((1, 1, 1, S), dtype=bool)
        far[..., 0] = True
        out.append((Case(_cast(qf, "float16"), _cast(kf, "float16"), _cast(v[:, :1], "float16"), mask=far,
                         label="float16, a blocked key scoring +25000"), "forward"))  # fmt: skip
    return out


# The spec's -inf first, then the finite fills in the order contract.FINITE_FILLS gives.
FILL_ORDER = ("-inf", *FINITE_FILLS)


def blocked_fill(p: Probing) -> None:
    if p.pinned_here("blocked_fill"):
        return
    if not p.decl.bool_mask:
        p.keep("blocked_fill", "not measured: no boolean mask")
        return
    witnesses, notes = _collect(p, _fill_witnesses(p))
    if not witnesses:
        p.keep("blocked_fill", "kept: " + "; ".join(notes))
        return
    found, evidence = _choose(p, witnesses, [{"blocked_fill": f} for f in FILL_ORDER])
    if found:
        p.record("blocked_fill", found["blocked_fill"], evidence)
    else:
        p.keep("blocked_fill", f"kept: {evidence}")


# -- normwise merges ----------------------------------------------------------------------------------------
MAX_MERGES = 16


def normwise_merges(p: Probing) -> None:
    if p.pinned_here("normwise_merges"):
        return
    dtype = "float32" if "float32" in p.decl.dtypes else p.dtype
    rng = np.random.default_rng(37)
    S, Dk = 12, 8
    q = np.zeros((1, 1, 2, Dk))
    q[..., 0] = 45.0  # times key S-1's 2.0 and 1/sqrt(8): a score of 32 above the others
    k = rng.standard_normal((1, 1, S, Dk)) * 0.1
    k[0, 0, -1, 0] = 2.0  # the last key dominates: the others' weights are ~exp(-32) ~ 1e-14, and a
    # merge that meets it last subtracts them from themselves (the sigmoid merge's cancellation)
    case = Case(_cast(q, dtype), _cast(k, dtype), _cast(rng.standard_normal((1, 1, S, Dk)), dtype),
                label=f"{dtype} weights of 1e-14 beside one dominant key")  # fmt: skip
    witnesses, notes = _collect(p, [(case, "weights")])
    if not witnesses:
        p.keep("normwise_merges", "kept: " + "; ".join(notes))
        return
    found, evidence = _choose(p, witnesses, [{"normwise_merges": n} for n in range(MAX_MERGES + 1)])
    if found:
        p.record("normwise_merges", found["normwise_merges"], evidence)
    else:
        p.keep("normwise_merges", f"kept: {evidence}")


# -- one precision for every dtype ------------------------------------------------------------------------
# Finer dtypes a float32 format can also swallow: a runtime told to compute at bfloat16 (an inference
# precision hint) rounds float16's and float64's operands too, where no field of theirs says it.
_SWALLOWS = {"bfloat16": ("float16", "float64"), "float16": ("float64",), "tf32": ("float64",)}
_MATCH_AS = {"bfloat16": "bfloat16", "float16": "float16", "tf32": "float16"}  # witness.MATCH's nearest


def _at_precision(p: Probing, dtype: str, fmt: str) -> tuple[bool, str]:
    """Whether ``dtype``'s outputs on the float32 witnesses (cast to it) are float32's computed as ``fmt``
    and not ``dtype``'s own formulation; and the evidence."""
    under = p.decl.replace(float32_computed_as=fmt)
    spec = p.decl.replace(float16_computed_as="float32", float64_computed_as="float64")  # the dtype's own, 000 §8
    worst_own, worst_fmt, ran = 0.0, 0.0, 0
    for case, _ in _f32_witnesses():
        if dtype == "float16" and float(np.max(np.abs(case.query))) > 65504.0:
            continue  # the 2^17 query is inf in float16: no witness of a format there
        own = case.replace(query=_cast(case.query, dtype), key=_cast(case.key, dtype), value=_cast(case.value, dtype))
        o = p.forward(own)
        if not o.ok:
            return False, f"{dtype}: {o.error}"
        as32 = own.replace(query=_cast(own.query, "float32"), key=_cast(own.key, "float32"),
                           value=_cast(own.value, "float32"))  # fmt: skip
        want = judged.expected(as32, under).out
        allowed = judged.output_allowance(as32, under) + np.abs(want) * 2.0 ** -(11 if dtype == "float16" else 53)
        worst_fmt = max(worst_fmt, _ratio(o.value, want, allowed))
        worst_own = max(worst_own, worst(Witness(own, "forward", o.value), spec))
        ran += 1
    evidence = f"{dtype}: worst {worst_fmt:.2g} of the allowance at {fmt}, {worst_own:.2g} of its own"
    return bool(ran) and worst_fmt <= 1.0 < worst_own, evidence


def every_dtype_at(p: Probing) -> None:
    """Once float32 is found computed at a lower format: whether the finer dtypes are too (one precision
    for every dtype), a finding that names them; their own probes then skip them (``p.swallowed``)."""
    fmt = p.decl.float32_computed_as
    if fmt == "float32":
        return
    hits, evidence = [], []
    for dtype in _SWALLOWS.get(fmt, ()):
        if dtype not in p.decl.dtypes:
            continue
        at, why = _at_precision(p, dtype, fmt)
        evidence.append(why)
        if at:
            hits.append(dtype)
    if not hits:
        return
    p.swallowed.update(dict.fromkeys(hits, fmt))
    p.findings[:] = [f for f in p.findings if not any(f.startswith(f"{d}: the plain witness") for d in hits)]
    nearest = " (float64_computed_as=float32 is the nearest declaration, and too tight)" if "float64" in hits else ""
    p.finding(
        f"every dtype computed at {fmt} (an inference precision hint?): float32 as declared "
        f"(float32_computed_as={fmt}) and {', '.join(hits)} at {fmt} too, which no field of theirs says"
        f"{nearest}; " + "; ".join(evidence)
    )


# Run after the conventions and the fills of rows blocked entirely (float32_computed_as runs first of
# all, right after the dtypes: harness.discovery.discover).
PROBES = (lowp_computed_as, blocked_fill, normwise_merges)
