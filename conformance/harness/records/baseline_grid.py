"""The regression baselines' fixed grid of cases, and one pass of a kernel over it.

Three cases per dtype (self-attention plain; cross-attention plain and with mask+causal): small
enough for under a second per adapter, large enough that the reductions are not trivially exact.
The certificate reuses the pass for its per-dtype error statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from conformance.contract import DTYPES, Case
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare

METRICS = ("max", "mean", "p99")
# (label, B, H, T, S, D): small enough for < 1 s per adapter, large enough that the reductions
# (S = 24 keys, D = 32) are not trivially exact, one self- and one cross-attention shape.
SHAPES = (("self", 1, 2, 16, 16, 32), ("cross", 2, 2, 8, 24, 32))
VARIANTS = ("plain", "mask+causal")
# Three cases per dtype rather than the full product: a jitted kernel compiles once per signature.
GRID = (("self", "plain"), ("cross", "plain"), ("cross", "mask+causal"))


def grid(dtypes) -> list[tuple[str, Case]]:
    """The fixed cases, keyed ``<shape>/<variant>/<dtype>``; inputs are seeded, hence reproducible."""
    out = []
    for d in [x for x in DTYPES if x in dtypes]:
        for si, (label, B, H, T, S, D) in enumerate(SHAPES):
            for vi, variant in enumerate(VARIANTS):
                if (label, variant) not in GRID:
                    continue
                seed = 9000 + 10 * si + vi
                masked = variant != "plain"
                mask = random_mask(seed, (B, 1, T, S), p_blocked=0.3) if masked else None
                case = random_case(
                    seed,
                    B=B,
                    Hq=H,
                    T=T,
                    S=S,
                    Dk=D,
                    Dv=D,
                    dtype=d,
                    mask=mask,
                    is_causal=masked,
                    label=f"baseline {label}/{variant}",
                )
                out.append((f"{label}/{variant}/{d}", case))
    return out


def error_stats(err: np.ndarray) -> dict[str, float]:
    e = err[np.isfinite(err)]
    if not e.size:
        return {m: 0.0 for m in METRICS}
    return {"max": float(e.max()), "mean": float(e.mean()), "p99": float(np.percentile(e, 99))}


@dataclass
class Run:
    """One pass over the grid: outputs, per-case and per-dtype error against the oracle, skips."""

    outputs: dict[str, np.ndarray]
    inputs: dict[str, str]  # case key -> hash of its inputs (to notice a changed case builder)
    per_case: dict[str, dict[str, float]]
    per_dtype: dict[str, dict[str, float]]
    skipped: dict[str, str]


def run_grid(impl) -> Run:
    """Run the kernel (through the guarded ``GuardedAdapter``) on the grid; refusals are recorded, not raised."""
    decl = impl.declaration
    outputs, inputs, per_case, skipped = {}, {}, {}, {}
    errs: dict[str, list[np.ndarray]] = {}
    for key, case in grid(decl.dtypes):
        reasons = decl.not_supported_reasons(case)
        if reasons:
            skipped[key] = "; ".join(reasons)
            continue
        try:
            out = impl.forward(case)
        except pytest.skip.Exception as exc:
            skipped[key] = str(exc).removeprefix("Skipped: ")
            continue
        want = compare.expected(case, decl).out
        with np.errstate(invalid="ignore"):
            err = np.abs(np.asarray(out, dtype=np.float64) - want)
        outputs[key] = out
        inputs[key] = compare.case_key(case)
        per_case[key] = error_stats(err)
        errs.setdefault(case.dtype, []).append(err.ravel())
    per_dtype = {d: error_stats(np.concatenate(v)) for d, v in errs.items()}
    return Run(outputs, inputs, per_case, per_dtype, skipped)
