"""The engineering claims a kernel makes besides its numbers: memory that does not grow like T x S,
and the kernel that actually runs behind the API.

Both run in the performance profile only (``--conformance-perf``); in an ordinary certification
run they are reported as *not in this profile*. The gate is a fixture, so calling the clause
functions directly (tests/test_clauses_bite.py) always runs them.

* MEM-SCALING-01 measures the peak extra memory of one forward call at T = S = S0, 2 S0, 4 S0 in a
  fresh worker process (harness.perf.worker, harness.perf.memory says what is read on each device)
  and classifies the growth (harness.perf.scaling). A kernel that declares
  ``memory_scaling="linear"`` fails when it grows faster; every kernel's measured scaling is
  recorded for the report and the certificate.
* BACKEND-01 asks the adapter which kernel ran (``kernel_ran``: torch's dispatched SDPA op seen by
  the profiler, jax's custom calls in the lowered HLO) for each dtype, and fails a kernel whose
  declared ``backend`` is not what ran, or that declares one and cannot show it.
"""

from __future__ import annotations

import pytest

from conformance.contract import DTYPES
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.perf import launch as perf_run
from conformance.harness.perf import notes as perf_notes
from conformance.harness.perf.driver import kernel_report
from conformance.harness.perf.grid import PREFILL, Row, case_for
from conformance.harness.perf.scaling import LINEAR, classify
from conformance.harness.run import runstate
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation

NO_FULL_MATRIX = Source("003", "逐步推导", "FlashAttention 通过重计算和在线归一化避免保存完整矩阵。")
SAME_API = Source("003", "工程实现", "不能仅凭调用了同一个 API 就断言实际使用了 FlashAttention。")
OPT_PERF = "conformance_perf"
HOST_SIZES = (512, 1024, 2048)
DEVICE_SIZES = (2048, 4096, 8192)
WORKER_TIMEOUT = 300.0


@pytest.fixture(autouse=True)
def _perf_profile_only(request: pytest.FixtureRequest) -> None:
    if not runstate.getoption(request.config, OPT_PERF):
        pytest.skip("not in profile: the performance clauses run with --conformance-perf")


def _dtype_for(decl) -> str:
    """float32 when declared (where memory is easiest to read), else the widest declared dtype."""
    return "float32" if "float32" in decl.dtypes else next(d for d in DTYPES if d in decl.dtypes)


@clause(
    "MEM-SCALING-01",
    "a kernel that declares linear memory never stores the T x S matrix: the peak extra memory of a forward call grows at most linearly from T = S = S0 to 4 S0 (every kernel's measured scaling is recorded)",
    NO_FULL_MATRIX,
    kills=["materialises_declares_linear"],
    tolerance="linear: exponent from S0 to 4 S0 <= 1.3, or a peak under half of one T x S matrix (harness.perf.scaling)",
)
def test_memory_scaling(impl):
    decl = impl.declaration
    dtype = _dtype_for(decl)
    sizes = DEVICE_SIZES if decl.device.startswith("cuda") else HOST_SIZES
    rows = [Row(PREFILL, 1, 1, 1, n, n, 64, dtype, False) for n in sizes]
    for row in rows:
        impl.require(case_for(row))
    compare.assert_output_matches(impl, case_for(rows[0]))  # the measured kernel answers correctly
    answer = perf_run.run_worker(impl.adapter, impl.spec, "scaling", rows, timeout=WORKER_TIMEOUT)
    readings = [r["forward"] for r in answer["rows"]]
    scaling = classify(list(sizes), [r["peak_extra_bytes"] for r in readings], rows[-1].matrix_bytes())
    claim = getattr(decl, "memory_scaling", None)
    perf_notes.note(impl, "MEM-SCALING-01", dtype, claimed=claim, scaling=scaling.as_dict(), readings=readings)
    if claim == LINEAR and scaling.verdict != LINEAR:
        detail = "; ".join(
            f"S={n}: tracemalloc {r['tracemalloc_bytes']}, RSS {r['rss_bytes']}, device {r['device_bytes']} bytes"
            for n, r in zip(sizes, readings)
        )
        raise ClauseViolation(
            f"declares memory_scaling=linear, but the {scaling.sentence()}\n"
            f"  readings ({readings[0]['method']}): {detail}\n"
            f"  measured in a fresh worker process, {dtype}, B=1, H=1, D=64, mode: {answer['rows'][0]['mode']}",
            case_for(rows[-1]),
        )


@clause(
    "BACKEND-01",
    "the kernel that actually ran is the declared backend (torch: the dispatched SDPA op; jax: the custom call in the lowered HLO), per dtype; a declared backend that the adapter cannot show fails",
    SAME_API,
    kills=["reports_other_backend", "declares_backend_without_report", "torch_math_declares_flash"],
)
def test_backend_that_ran(impl, dtype):
    case = random_case(70, B=1, Hq=2, T=128, S=128, Dk=64, dtype=dtype, label="backend probe")
    impl.require(case)
    compare.assert_output_matches(impl, case)
    backend, evidence = kernel_report(impl.adapter, case)
    declared = getattr(impl.declaration, "backend", None)
    if declared is None and backend is None:
        impl.not_applicable(f"declares no backend and reports none ({evidence})")
    perf_notes.note(impl, "BACKEND-01", dtype, declared=declared, ran=backend, evidence=evidence)
    if declared is None:
        return
    if backend is None:
        raise ClauseViolation(f"declares backend={declared}, but cannot show which kernel ran: {evidence}", case)
    if backend.lower() != declared.lower():
        raise ClauseViolation(f"declares backend={declared}, but {backend} ran ({evidence})", case)
