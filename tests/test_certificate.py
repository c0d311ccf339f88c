"""Self-tests of ``--certificate`` and ``python -m conformance.certificates compare``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import fixtures
from conformance.certificates import render_compare
from tests.narrow_plan import narrow_plan

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
CLAUSES = ["conformance/clauses/test_worked_example.py", "conformance/clauses/test_golden.py"]


def _run(tmp_path: Path, impl: str, name: str, *clauses: str) -> tuple[subprocess.CompletedProcess, Path]:
    """A certification run: every clause unless ``clauses`` names a subset."""
    path = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *clauses,
            f"--impl={impl}",
            f"--certificate={path}",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    return proc, path


def _check_conforming(good: Path) -> None:
    """What the certificate of the NumPy kernel says when it conforms, in JSON and in Markdown."""
    doc = json.loads(good.read_text())
    a = doc["adapters"]["numpy"]
    assert a["verdict"] == "CONFORMS"
    assert a["clauses"]["GOLDEN-01"]["outcome"] == "pass"
    assert a["clauses"]["WORKED-EXAMPLE-01"]["outcome"] == "pass"
    assert set(a["error_stats"]) == {"float64", "float32", "float16", "bfloat16"}
    assert doc["golden_set"]["sha256"] == fixtures.set_hash() and doc["golden_set"]["hashes_ok"]
    assert a["environment"]["libraries"]["numpy"] and a["declaration"]["all_blocked"] == "zeros"
    assert doc["machine"]["cpu"] and doc["machine"]["builds"]["numpy"] and "blas" in doc["machine"]
    md = good.with_suffix(".md").read_text()
    assert "**Verdict: CONFORMS**" in md and "| GOLDEN-01 | pass |" in md and fixtures.set_hash() in md
    assert f"| machine (as the libraries see it) | {doc['machine']['cpu']} (" in md


def _check_drifting_and_compare(tmp_path: Path, good: Path) -> None:
    """A kernel whose outputs drift fails the golden set: its certificate says so with the command that
    reproduces it, and the comparison table sets it against the conforming one."""
    bad, drift = _run(tmp_path, "tests.mutants_golden:OutputDrift", "drift", *CLAUSES)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    b = json.loads(drift.read_text())["adapters"]["tests.mutants_golden:OutputDrift"]
    assert b["verdict"] == "DOES NOT CONFORM"
    golden_fail = [f for f in b["failures"] if f["clause"] == "GOLDEN-01"]
    assert golden_fail and "--impl=tests.mutants_golden:OutputDrift" in golden_fail[0]["reproduce"]
    assert "disagree with their stored answers" in golden_fail[0]["message"]
    md = drift.with_suffix(".md").read_text()
    assert "DOES NOT CONFORM" in md and "Reproduce: `pytest" in md

    table = render_compare([good, drift])
    assert "| clause | numpy (numpy) | tests.mutants_golden:OutputDrift (drift) |" in table
    assert "| GOLDEN-01 | pass | **FAIL** (" in table


def test_certificate_of_a_conforming_and_a_drifting_kernel(tmp_path, pytester, monkeypatch, restore_hypothesis_profile):
    """The conforming kernel's certificate from a run of the two clause files the certificate's
    assertions name (worked example and golden set), with the run's plan cut to their clauses so that
    the verdict is a whole one (tests/narrow_plan.py); the drifting kernel's from the same files in a
    child process, as a user runs it. The certificate of a whole run is the thorough twin below."""
    good = tmp_path / "numpy.json"
    files = narrow_plan(monkeypatch, *CLAUSES)
    result = pytester.runpytest_inprocess(*files, "--impl=numpy", f"--certificate={good}", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-3000:]
    _check_conforming(good)
    _check_drifting_and_compare(tmp_path, good)


@pytest.mark.thorough
def test_certificate_of_a_whole_conforming_run_and_a_drifting_kernel(tmp_path):
    """The same certificate from a whole certification (every clause, in a child process): CONFORMS
    covers the whole suite, so the coverage it records is the whole suite's."""
    ok, good = _run(tmp_path, "numpy", "numpy")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    a = json.loads(good.read_text())["adapters"]["numpy"]
    assert a["coverage"]["cases_run"] > 500 and a["coverage"]["clauses_planned"] >= 55
    _check_conforming(good)
    _check_drifting_and_compare(tmp_path, good)


def test_compare_cli(tmp_path):
    doc = {
        "date": "d",
        "golden_set": {"sha256": "ab" * 32},
        "adapters": {
            "k": {
                "verdict": "CONFORMS",
                "clauses": {"X-01": {"outcome": "not applicable", "detail": "r"}},
                "error_stats": {},
                "environment": {"device": "cpu"},
            }
        },
    }
    p = tmp_path / "a.json"
    p.write_text(json.dumps(doc))
    out = subprocess.run(
        [sys.executable, "-m", "conformance.certificates", "compare", str(p)], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0 and "| X-01 | n/a |" in out.stdout


def _cert(max_f32: float, machine: dict | None) -> dict:
    doc = {
        "date": "d",
        "golden_set": {"sha256": "ab" * 32},
        "adapters": {
            "k": {
                "spec": "k",
                "verdict": "CONFORMS",
                "clauses": {"X-01": {"outcome": "pass", "detail": "r"}},
                "error_stats": {"float32": {"max": max_f32, "mean": 0.0, "p99": 0.0}},
                "environment": {"device": "cpu"},
            }
        },
    }
    if machine is not None:
        doc["machine"] = machine
    return doc


def test_compare_names_another_machine_and_what_moved_there(tmp_path):
    """Two certificates of one kernel: on another machine the comparison says so first, and a figure
    that differs is "moved on another machine"; on the same machine (or one not recorded) it reads as
    before. Checked in the Markdown table and the HTML page."""
    from conformance.certificates import load
    from conformance.harness.calls.machine import machine
    from conformance.harness.records.certificate_html import render_compare as render_html

    here = machine()
    there = {**here, "cpu": "Another CPU", "torch_cpu_capability": "AVX512"}
    paths = {}
    for name, doc in {
        "a": _cert(1e-7, here),
        "b": _cert(2e-7, there),
        "c": _cert(2e-7, here),
        "d": _cert(2e-7, None),
    }.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    other = render_compare([paths["a"], paths["b"]])
    assert other.startswith("another machine: k (b) against k (a): cpu: ")
    assert "Another CPU" in other.splitlines()[0]
    assert "| max error vs oracle, float32 | 1e-07 | 2e-07 (moved on another machine) |" in other
    assert "| machine | " in other
    same = render_compare([paths["a"], paths["c"]])
    assert same.startswith("| clause |") and "moved on another machine" not in same
    unrecorded = render_compare([paths["a"], paths["d"]])
    assert unrecorded.startswith("machine not recorded in k (d)") and "moved on another" not in unrecorded
    page = render_html(load([paths["a"], paths["b"]]))
    assert "another machine: k (b) against k (a)" in page and "moved on another machine" in page
