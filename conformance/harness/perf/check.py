"""Is a profiled row's output right? A spot check of sampled query rows against the float64 oracle.

The seed asks for the tolerance to be checked at the very shapes whose latency is reported
("分别检查输出容差、反向梯度、峰值显存和延迟"). Checking every query of a T = S = 16 384 row against the
oracle and its error-model ensemble would cost more than the profile, and each output row depends
only on its own query, so a few query rows (the first, the last and evenly spaced ones between)
are checked: the oracle runs on a case holding just those queries, with the causal structure
spelled out as a boolean mask in the kernel's declared alignment, under the suite's error model
(harness.judge.compare / harness.judge.tolerance).
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, Declaration
from conformance.harness.judge import compare, tolerance
from conformance.harness.spec.report import mismatch_report
from conformance.oracle import causal_blocked

ROWS_CHECKED = 8


def sampled_rows(T: int, n: int = ROWS_CHECKED) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, T - 1, min(T, n))})


def sub_case(case: Case, rows: list[int], decl: Declaration) -> Case:
    """``case`` restricted to query ``rows``, meaning the same for each of them."""
    mask = None
    if case.is_causal:
        mask = causal_blocked(case.T, case.S, decl.causal_alignment)[rows][None, None]
    return Case(
        query=np.ascontiguousarray(case.query[:, :, rows]),
        key=case.key,
        value=case.value,
        mask=mask,
        scale=case.scale,
        seed=case.seed,
        label=f"{case.label} query rows {rows}",
    )


def spot_check(case: Case, out: np.ndarray, decl: Declaration) -> tuple[bool, str]:
    """(passed, what was checked or the mismatch report)."""
    if out.shape != case.out_shape:
        return False, f"output shape {out.shape}, but should be {case.out_shape}"
    rows = sampled_rows(case.T)
    sub = sub_case(case, rows, decl)
    want = compare.expected(sub, decl).out
    allowed = compare.output_allowance(sub, decl)
    allowed = np.where(np.isfinite(allowed), allowed, np.finfo(np.float64).max)
    rule = tolerance.describe(decl.tolerance_dtype(sub), "output")
    msg = mismatch_report("output", np.ascontiguousarray(out[:, :, rows]), want, allowed, rule)
    if msg is not None:
        return False, f"{msg}\n  case: {sub.describe()}"
    return True, f"{len(rows)} of {case.T} query rows agree with the float64 oracle under the error model"
