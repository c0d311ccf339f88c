"""The verdict rule (harness.verdict) and its negative controls: kernels that try to earn CONFORMS
without being checked never get it, and their runs exit non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.harness import verdict as V

ROOT = Path(__file__).resolve().parents[1]


def _r(clause: str, dtype: str | None, outcome: str, **kw) -> V.ClauseResult:
    return V.ClauseResult(clause=clause, impl="k", dtype=dtype, outcome=outcome, **kw)


PLAN = {"A-01": ("float32", "float16"), "B-02": (None,), "LONG-03": ("float32",)}


def test_every_planned_case_passed_or_declared_away_conforms():
    v = V.decide(
        [
            _r("A-01", "float32", V.PASSED, cases_run=3),
            _r("A-01", "float16", V.NOT_APPLICABLE, reason="r"),
            _r("B-02", None, V.NOT_APPLICABLE, reason="declares grad=False"),
            _r("LONG-03", "float32", V.NOT_IN_PROFILE, reason="not in profile"),
        ],
        PLAN,
    )
    assert v.word == V.CONFORMS and v.exit_code == 0
    assert v.clauses_planned == 2 and v.not_in_profile == ["LONG-03"] and v.cases_run == 3
    assert v.headline().startswith("CONFORMS: 1/2 clauses passed, 1 not applicable by declaration; 3 cases run")


def test_a_missing_dtype_or_clause_is_partial_never_conforms():
    rows = [_r("A-01", "float32", V.PASSED), _r("B-02", None, V.PASSED)]
    v = V.decide(rows, PLAN)
    assert v.word == V.PARTIAL and v.exit_code == 6
    assert "not run for float16" in v.clauses_missing["A-01"] and "LONG-03" in v.clauses_missing
    assert any("not a certification" in line for line in v.details())


def test_an_unexpected_skip_is_partial():
    rows = [
        _r("A-01", "float32", V.PASSED),
        _r("A-01", "float16", V.SKIPPED, reason="device busy"),
        _r("B-02", None, V.PASSED),
        _r("LONG-03", "float32", V.PASSED),
    ]
    v = V.decide(rows, PLAN)
    assert v.word == V.PARTIAL and "device busy" in v.clauses_missing["A-01"]


def test_nothing_applicable_is_not_run_and_a_failure_wins():
    v = V.decide([_r("A-01", d, V.NOT_APPLICABLE) for d in PLAN["A-01"]] + [_r("B-02", None, V.NOT_APPLICABLE)], PLAN)
    assert v.word == V.NOT_RUN_VERDICT and v.exit_code != 0
    v = V.decide([_r("A-01", "float32", V.FAILED), _r("B-02", None, V.PASSED)], PLAN)
    assert v.word == V.DOES_NOT_CONFORM and v.clauses_failed == ["A-01"]
    assert V.worst([V.CONFORMS, V.PARTIAL, V.DOES_NOT_CONFORM]) == V.DOES_NOT_CONFORM


def test_a_property_clause_that_ran_fewer_examples_says_so():
    v = V.decide(
        [_r("B-02", None, V.PASSED, examples_run=5, examples_planned=25, cases_declared_na=20)], {"B-02": (None,)}
    )
    assert v.thin_examples == {
        "B-02[None]": "5 of 25 planned examples ran (20 drawn cases not applicable by declaration)"
    }


def test_records_survive_a_round_trip_through_a_dict():
    r = _r("A-01", "float32", V.PASSED, cases_run=2, examples_run=1, examples_planned=4)
    assert V.ClauseResult.from_dict({**r.as_dict(), "unknown": 1}) == r


# -- negative controls: whole runs ---------------------------------------------------------------
def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _summary(proc: subprocess.CompletedProcess, spec: str) -> str:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{spec}: ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-2000:]
    return lines[0]


def test_kernels_that_refuse_cases_without_declaring_it_do_not_conform():
    pytest.importorskip("torch", reason="the cheating kernels are plain torch-signature functions")
    specs = ("tests.cheaters:refuse_everything", "tests.cheaters:refuse_most")
    # The three clauses the issue saw certify such kernels (after 5 of 25 examples, one shape, 1 of 19 fixtures).
    files = [f"conformance/clauses/{m}.py" for m in ("test_agreement", "test_cross_shapes", "test_golden")]
    proc = _pytest(*files, "--impl=" + ",".join(specs))
    assert proc.returncode == 1, proc.stdout[-3000:]
    failed = next(ln for ln in proc.stdout.splitlines() if ln.startswith("failed clauses: "))
    for spec in specs:
        line = _summary(proc, spec)
        assert line.startswith(f"{spec}: DOES NOT CONFORM: "), line
        assert "refused without a declaration" in line, line
        for cid in ("ORACLE-AGREE-01", "XATTN-SHAPES-01", "GOLDEN-01"):
            assert f"{cid} [{spec}]" in failed, failed
    assert "undeclared refusal" in proc.stdout and "--declare bool_mask=false" in proc.stdout


def test_a_clause_selection_is_partial_and_exits_non_zero(tmp_path):
    cert = tmp_path / "cert.json"
    proc = _pytest("--impl=numpy", "-k", "test_output_shape", f"--certificate={cert}")
    assert proc.returncode == 6, proc.stdout[-3000:]
    assert _summary(proc, "numpy").startswith("numpy: PARTIAL: ")
    doc = json.loads(cert.read_text())["adapters"]["numpy"]
    assert doc["verdict"] == "PARTIAL"
    assert "**Verdict: PARTIAL**" in cert.with_suffix(".md").read_text()
    allowed = _pytest("--impl=numpy", "-k", "test_output_shape", "--allow-partial")
    assert allowed.returncode == 0 and "PARTIAL" in _summary(allowed, "numpy")


def test_zeros_under_a_clause_selection_never_conforms():
    pytest.importorskip("torch", reason="the cheating kernels are plain torch-signature functions")
    proc = _pytest("--impl=tests.cheaters:zeros", "-k", "test_output_shape or test_dtype")
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "CONFORMS:" not in _summary(proc, "tests.cheaters:zeros").replace("NOT CONFORM", "")


def test_declaring_nothing_is_not_run_and_exits_non_zero():
    proc = _pytest("--impl=numpy", "--declare=dtypes=")
    assert proc.returncode == 5, proc.stdout[-3000:]
    assert _summary(proc, "numpy").startswith("numpy: NOT RUN: 0/")
