"""Discovery's precision probes: float64 computed as what, and float16 / bfloat16 upcast before QK^T.

float64 is measured by its error against the oracle in units of the float32 and float64 ulps (a
float32 computation leaves ~1 float32 ulp). The upcast is noted (yes / no) on its witness
(:func:`large_logits`), which makes the raw product overflow float16 and lose its fine structure in
bfloat16 while the scaled scores stay O(1) apart; a kernel that forms the product in the input dtype
is given the ``float16_computed_as`` / ``bfloat16_computed_as`` formulation it matches
(harness.discovery.formulations), and a finding only when none matches (UPCAST-01 then fails).
"""

from __future__ import annotations

import numpy as np

from conformance.contract import LOW_PRECISION, Case, np_dtype
from conformance.harness.discovery import witness as w
from conformance.harness.discovery.probes import base
from conformance.harness.discovery.probing import UPCAST, Probing

# 000 §8, the sentence UPCAST-01 enforces.
UPCAST_RULE = "000 §8: “这里将低精度输入转为 float32 后才计算点积和 softmax”; UPCAST-01 will fail"
F32_ULP = 2.0**-23
F64_ULP = 2.0**-52


def float64_computed_as(p: Probing) -> None:
    if p.pinned_here("float64_computed_as"):
        return
    if "float64" not in p.decl.dtypes:
        p.keep("float64_computed_as", "not measured: no float64")
        return
    if "float64" in p.swallowed:
        p.keep("float64_computed_as", f"kept: computed at {p.swallowed['float64']} with every dtype (see the findings)")
        return
    case = base(p, 17, "float64", B=2, Hq=2, T=16, S=32, Dk=32)
    o = p.forward(case)
    if not o.ok:
        p.keep("float64_computed_as", f"kept: float64 {o.error}")
        return
    e = w.err(o.value, w.reference(case))
    what = f"float64 B=2 H=2 T=16 S=32 D=32: err {w.fmt(e)}"
    if e <= 1e-12:
        p.record("float64_computed_as", "float64", f"{what} = {e / F64_ULP:.1f} float64 ulps")
    elif e <= 1e-3:
        p.record(
            "float64_computed_as", "float32", f"{what} = {e / F32_ULP:.1f} float32 ulps (2^-23): computed in float32"
        )
    else:
        p.keep("float64_computed_as", f"kept: {what}")
        p.finding(f"float64 outputs differ from the oracle by {w.fmt(e)}, more than float32 rounding explains")


def large_logits(dtype: str, c: float = 32.0, Dk: int = 64, S: int = 8, H: int = 2) -> Case:
    """q = k = c (32: the raw product 64c^2 + 8j = 65536 + 8j overflows float16's 65504), key j's first
    element c + j/4 (exact in float16 and bfloat16), so the scaled scores are 8192 + j: upcast, the
    weights are softmax(j); a float16 product is inf (NaN out), a bfloat16 one rounds the j away."""
    j = np.arange(S) % 4
    k = np.full((1, H, S, Dk), c)
    k[..., 0] = c + (c / 128.0) * j
    v = j[None, None, :, None] + 0.5 * np.random.default_rng(18).standard_normal((1, H, S, Dk))
    dt = np_dtype(dtype)
    return Case(np.full((1, H, 1, Dk), c).astype(dt), k.astype(dt), v.astype(dt), label="large logits")


def upcast(p: Probing) -> None:
    low = [d for d in sorted(LOW_PRECISION) if d in p.decl.dtypes]
    if not low:
        p.note(UPCAST, "not measured", "no float16 or bfloat16 declared or run")
        return
    parts, failed = {}, []
    for dt in low:
        case = large_logits(dt)
        o = p.forward(case)
        if not o.ok:
            parts[dt] = f"{dt} {o.error}"
            continue
        out = np.asarray(o.value, dtype=np.float64)
        e = w.err(out, w.reference(case))
        finite = bool(np.all(np.isfinite(out)))
        if not (finite and w.matches(e, dt)):
            failed.append(dt)
        bad = "" if finite else f", {int((~np.isfinite(out)).sum())} of {out.size} outputs not finite"
        parts[dt] = f"{dt} err {w.fmt(e)}{bad}"
    witness = "q = k = 32, Dk = 64: raw q.k = 65536 + 8j (float16 max 65504), scaled 8192 + j"
    value = f"no ({', '.join(failed)})" if failed else "yes"
    p.note(UPCAST, value, f"{witness}; {'; '.join(parts.values())} (no declaration field)")
    for dt in failed:  # a declarable formulation that explains it was recorded instead (harness.discovery.formulations)
        if p.decl.computed_as(dt) == "float32" and dt not in p.swallowed:  # nor one precision for every dtype
            p.finding(f"{dt} inputs are not upcast before QK^T ({witness}: {parts[dt]}); {UPCAST_RULE}")
