"""The measuring process: ``python -m conformance.harness.perf.worker JOB.pkl OUT.json``.

Every performance figure is taken in a worker process started for it, never inside the pytest
process: a fresh process has no allocator state, caches or warm kernels left by the clauses that
ran before, so its first call of a shape is a real first call, and its memory readings are not
hidden by memory an earlier test freed into a heap. The parent (harness.perf.launch) sends the
adapter (pickled, or as its ``--impl`` spec plus the declaration to use) and the rows; the worker
answers with JSON.

Two tasks:

* ``profile``: for each row, first call, latency quantiles (forward; forward + backward where the
  declaration has ``grad``), the two-GEMM floor, which kernel ran, and a spot check of the output;
  then, after every row was timed, the memory phase (glibc pinned, see harness.perf.memory): the
  peak extra bytes of one forward and one backward call per row.
* ``scaling``: the memory phase alone over a T = S ladder (the MEM-SCALING-01 clause).

Rows that a row before them in the same ladder (same kind, D, causal, dtype) showed to be too slow
(one call over ``max_call_s``) or that would not fit in memory are skipped with the reason.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
import traceback
from typing import Any

import numpy as np

from conformance.harness.perf import memory as perf_memory
from conformance.harness.perf.driver import Driver, framework_of, kernel_report
from conformance.harness.perf.grid import Row, case_for, estimated_bytes
from conformance.harness.perf.timing import Budget, first_call, repeat


def _load_adapter(job: dict) -> Any:
    for p in reversed(job.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    if job.get("adapter") is not None:
        return pickle.loads(job["adapter"])
    from conformance.harness.calls import registry

    res = registry.resolve(job["spec"])
    if res.adapter is None:
        raise RuntimeError(f"cannot load {job['spec']!r} in the worker: {res.reason}")
    if job.get("declaration") is not None:
        res.adapter.declaration = job["declaration"]
    return res.adapter


def _mem_available() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _ladder(row: Row) -> tuple:
    return (row.kind, row.D, row.causal, row.dtype, row.Hq, row.Hkv)


def _grad_out(case: Any, row: Row) -> np.ndarray:
    from conformance.harness.cases.build import cast

    rng = np.random.default_rng(row.S + 1)
    return cast(rng.standard_normal(case.out_shape, dtype=np.float32), row.dtype)


def _precheck(row: Row, adapter: Any, linear: bool, skipped: dict, available: int | None) -> tuple[Any, str | None]:
    """(case, None) when the row can run, else (None, why not)."""
    if _ladder(row) in skipped:
        return None, skipped[_ladder(row)]
    case = case_for(row)
    reasons = adapter.declaration.not_supported_reasons(case)
    if reasons:
        return None, "not applicable: " + "; ".join(reasons)
    need = estimated_bytes(row, linear)
    device = adapter.declaration.device
    if available is not None and not device.startswith("cuda") and need > available // 2:
        return (
            None,
            f"skipped: needs about {need / 2**30:.1f} GiB, more than half of the {available / 2**30:.1f} GiB free",
        )
    return case, None


def _time_row(adapter: Any, row: Row, case: Any, job: dict, framework: str) -> dict:
    from conformance.harness.perf.check import spot_check
    from conformance.harness.perf.floor import BACKWARD_FACTOR, floor_call

    decl = adapter.declaration
    budget = Budget(**job["budget"])
    rec: dict[str, Any] = {}
    driver = Driver(adapter, case, _grad_out(case, row) if decl.grad else None)
    result, first = first_call(driver.forward)
    rec["mode"] = driver.mode
    ok, detail = spot_check(case, driver.output(result), decl)
    del result
    rec["pass"], rec["check"] = ok, detail
    rec["forward"] = repeat(driver.forward, budget, driver.device_times(), first_s=first).summary()
    if decl.grad and job.get("backward", True):
        _, bfirst = first_call(driver.backward)
        rec["backward_mode"] = driver.backward_mode()
        bbudget = Budget(budget.seconds, budget.min_reps, budget.max_reps)
        rec["backward"] = repeat(driver.backward, bbudget, driver.device_times(backward=True), first_s=bfirst).summary()
    driver.release()
    try:
        call, what = floor_call(row, framework, decl.device)
        fl = repeat(call, Budget(budget.seconds / 2, budget.min_reps, budget.max_reps))
        rec["floor"] = {"what": what, "p50_s": fl.quantile(50), "min_s": min(fl.samples), "n": fl.n}
        # The ratio of the least-disturbed times (best of each): on a shared machine one disturbed
        # floor sample, or a disturbed median, would otherwise make a kernel look faster than its GEMMs.
        rec["floor_ratio"] = rec["forward"]["min_s"] / rec["floor"]["min_s"]
        rec["floor_ratio_p50"] = rec["forward"]["p50_s"] / rec["floor"]["p50_s"]
        if "backward" in rec:
            rec["backward_floor_ratio"] = rec["backward"]["min_s"] / (BACKWARD_FACTOR * rec["floor"]["min_s"])
    except Exception as exc:  # noqa: BLE001 - a floor that cannot run leaves the ratio empty, with the reason
        rec["floor"] = {"error": f"{type(exc).__name__}: {exc}"}
        rec["floor_ratio"] = None
    backend, evidence = kernel_report(adapter, case)
    rec["backend"], rec["backend_evidence"] = backend, evidence
    return rec


def _memory_row(adapter: Any, row: Row, case: Any, framework: str, backward: bool) -> dict:
    decl = adapter.declaration
    driver = Driver(adapter, case, _grad_out(case, row) if (decl.grad and backward) else None)
    out: dict[str, Any] = {"mode": driver.mode}
    driver.forward()  # warm: compilation and lazy initialisation are not this call's memory
    out["forward"] = perf_memory.measure(driver.forward, framework, decl.device).as_dict()
    if decl.grad and backward:
        driver.backward()
        out["backward"] = perf_memory.measure(driver.backward, framework, decl.device).as_dict()
    driver.release()
    return out


def profile(adapter: Any, job: dict) -> dict:
    framework = framework_of(adapter)
    decl = adapter.declaration
    linear = getattr(decl, "memory_scaling", None) == "linear"
    available = _mem_available()
    skipped: dict[tuple, str] = {}
    records = []
    for raw in job["rows"]:
        row = Row(**raw)
        rec: dict[str, Any] = {"key": row.key, "row": row.as_dict(), "status": "measured"}
        records.append(rec)
        case, why = _precheck(row, adapter, linear, skipped, available)
        if case is None:
            rec["status"], rec["reason"] = ("not applicable" if why.startswith("not applicable") else "skipped"), why
            continue
        _progress(f"{row.key}: timing")
        try:
            rec.update(_time_row(adapter, row, case, job, framework))
        except Exception as exc:  # noqa: BLE001 - a failing row is a finding of the profile
            rec.update(status="error", **{"pass": False}, reason=f"{type(exc).__name__}: {exc}")
            rec["traceback"] = traceback.format_exc(limit=6)
            continue
        slow = rec["forward"]["first_call_s"]
        if slow is not None and slow > job["max_call_s"]:
            skipped[_ladder(row)] = (
                f"skipped: the {row.key} row took {slow:.1f} s for one call (> {job['max_call_s']:g} s per call)"
            )
    pinned = perf_memory.pin_malloc() if framework != "torch" or not decl.device.startswith("cuda") else False
    for rec in records:
        if rec["status"] != "measured":
            continue
        row = Row(**rec["row"])
        _progress(f"{row.key}: memory")
        try:
            rec["memory"] = _memory_row(adapter, row, case_for(row), framework, job.get("backward", True))
        except Exception as exc:  # noqa: BLE001
            rec["memory"] = {"error": f"{type(exc).__name__}: {exc}"}
    return {"framework": framework, "malloc_pinned": pinned, "rows": records, "environment": _environment(adapter)}


def scaling(adapter: Any, job: dict) -> dict:
    framework = framework_of(adapter)
    pinned = perf_memory.pin_malloc()
    records = []
    for raw in job["rows"]:
        row = Row(**raw)
        case = case_for(row)
        rec = {"key": row.key, "row": row.as_dict(), "matrix_bytes": row.matrix_bytes()}
        rec.update(_memory_row(adapter, row, case, framework, backward=False))
        records.append(rec)
    return {"framework": framework, "malloc_pinned": pinned, "rows": records}


def _environment(adapter: Any) -> dict:
    try:
        from conformance.harness.calls.environment import environment

        return environment(adapter)
    except Exception as exc:  # noqa: BLE001 - informative only
        return {"error": str(exc)}


_START = time.perf_counter()


def _progress(msg: str) -> None:
    print(f"[perf worker {time.perf_counter() - _START:7.1f} s] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    job_path, out_path = argv
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    try:
        adapter = _load_adapter(job)
        answer = scaling(adapter, job) if job["task"] == "scaling" else profile(adapter, job)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the item with it
        answer = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(out_path, "w") as f:
        json.dump(answer, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
