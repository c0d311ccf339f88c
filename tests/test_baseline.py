"""Self-tests of the regression baselines: committed ones pass, a 1e-3 drift fails with a table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.registry import resolve
from conformance.harness.records.baseline_compare import compare_run
from conformance.harness.records.baseline_grid import run_grid
from conformance.harness.records.baseline_store import load, record
from tests.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "fixtures" / "regression"


def _impl(adapter, spec="kernel"):
    return GuardedAdapter(adapter, spec=spec, timeout=0)


@pytest.mark.parametrize("spec", ["numpy", "torch-eager", "torch-sdpa", "torch-sdpa-math", "torch-sdpa-flash"])
def test_committed_baseline_passes(spec):
    res = resolve(spec)
    if res.adapter is None or res.reason:
        pytest.skip(f"{spec} unavailable: {res.reason}")
    loaded = load(COMMITTED, spec)
    assert loaded is not None, f"no committed baseline for {spec}"
    meta, recorded = loaded
    assert compare_run(meta, recorded, run_grid(_impl(res.adapter, spec))) == []


def test_rerun_passes_and_drift_fails_with_table(tmp_path):
    record(tmp_path, "kernel", _impl(MUTANTS["base"]()))
    meta, recorded = load(tmp_path, "kernel")
    assert compare_run(meta, recorded, run_grid(_impl(MUTANTS["base"]()))) == []
    problems = compare_run(meta, recorded, run_grid(_impl(MUTANTS["output_drift_1e-3"]())))
    text = "\n\n".join(problems)
    assert "outputs that drifted" in text and "self/plain/float32" in text and "float64" in text
    assert "error statistics" in text and "ratio" in text
    print(text)


def test_missing_baseline_is_a_clear_skip(tmp_path):
    assert load(tmp_path, "nothing") is None


def test_pytest_items_end_to_end(tmp_path):
    """The options add items; the drifted kernel's run fails and prints the table."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "conformance/clauses/test_worked_example.py",
        "-k",
        "baseline",
    ]
    rec = subprocess.run(
        base + ["--impl=tests.mutants:BaseKernel", f"--record-baseline={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert (tmp_path / "tests.mutants_BaseKernel" / "baseline.json").is_file()
    spec = "tests.mutants_golden:OutputDrift"
    (tmp_path / "tests.mutants_golden_OutputDrift").symlink_to(tmp_path / "tests.mutants_BaseKernel")
    cmp_ = subprocess.run(
        base + [f"--impl={spec}", f"--baseline={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert cmp_.returncode == 1, cmp_.stdout + cmp_.stderr
    assert "moved against its baseline" in cmp_.stdout and "outputs that drifted" in cmp_.stdout
    skip = subprocess.run(
        base + ["-rs", "--impl=numpy", f"--baseline={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert skip.returncode == 0 and "no baseline in" in skip.stdout, skip.stdout


def _other_machine(meta: dict) -> dict:
    """The recording's machine record, faked as another CPU with another OpenBLAS core type."""
    return {**meta["machine"], "cpu": "Another CPU", "blas": {**meta["machine"]["blas"], "corename": "SkylakeX"}}


def _moved_within_model(recorded: dict) -> dict:
    """The recorded float32/float64 outputs moved by 4x the baseline's relative drift threshold: a
    move the baseline notices, far inside the error model (the kernel's output is unchanged)."""
    from conformance.harness.records.baseline_compare import RTOL

    out = {}
    for k, v in recorded.items():
        d = k.rsplit("/", 1)[1]
        out[k] = (v.astype(np.float64) * (1 + 4 * RTOL[d])).astype(v.dtype) if d in ("float32", "float64") else v
    return out


def test_baseline_records_the_machine_and_another_machine_is_not_a_regression(tmp_path):
    """A figure that moved on another machine within the error model is reported, not failed; the same
    move on the recording's machine fails as before; a move beyond the error model fails on any machine."""
    import tests.mutants_golden  # noqa: F401 - registers output_drift_1e-3
    from conformance.harness.calls.machine import machine, machine_changes
    from conformance.harness.records.baseline_compare import compare_on

    impl = _impl(MUTANTS["base"]())
    record(tmp_path, "kernel", impl)
    meta, recorded = load(tmp_path, "kernel")
    assert meta["machine"]["cpu"] and "blas" in meta["machine"]
    now = machine()
    assert machine_changes(meta["machine"], now) == []
    run = run_grid(impl)
    moved = _moved_within_model(recorded)

    same = compare_on(meta, moved, run, impl.declaration, machine_changes(meta["machine"], now))
    assert same.machine == "" and same.moved == []
    assert same.problems == compare_run(meta, moved, run) and "outputs that drifted" in same.problems[0]

    changes = machine_changes(_other_machine(meta), now)
    assert changes and changes[0].startswith("cpu: Another CPU -> ")
    assert f"blas corename: SkylakeX -> {now['blas'].get('corename', 'unset')}" in changes
    other = compare_on(meta, moved, run, impl.declaration, changes)
    assert other.machine.startswith("another machine: cpu: Another CPU")
    assert other.problems == []  # moved, but within the error model: not a regression
    assert other.moved and other.moved[0].startswith("moved on another machine (within the error model)")
    assert "self/plain/float64" in other.moved[0]

    bad = _impl(MUTANTS["output_drift_1e-3"]())
    beyond = compare_on(meta, recorded, run_grid(bad), bad.declaration, changes)
    assert beyond.problems and "beyond the error model" in beyond.problems[0]
    assert "self/plain/float64" in beyond.problems[0]
    assert not any("self/plain/float64" in m for m in beyond.moved)  # a failure is not "within the model"

    unrecorded = compare_on({k: v for k, v in meta.items() if k != "machine"}, moved, run, impl.declaration, None)
    assert unrecorded.machine.startswith("machine not recorded") and unrecorded.problems == same.problems
