"""Self-tests of the performance profile: its measuring parts, and one end-to-end run.

The end-to-end run uses the ``tiny`` grid (a few seconds): ``--conformance-perf`` on the NumPy
kernel and on a mutant whose outputs are wrong must write perf.json with the promised fields, the
two charts, and one self-contained HTML certificate, and must fail the mutant's rows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from conformance.harness.perf import errors as perf_errors
from conformance.harness.perf import memory as perf_memory
from conformance.harness.perf import scaling as perf_scaling
from conformance.harness.perf import svg as perf_svg
from conformance.harness.perf import timing as perf_timing
from conformance.harness.perf.grid import DECODE, PREFILL, Row, case_for, rows

ROOT = Path(__file__).resolve().parents[1]
ROW_FIELDS = {"key", "kind", "B", "Hq", "Hkv", "T", "S", "D", "dtype", "causal", "pass", "p50_s", "p90_s", "p99_s"}
ROW_FIELDS |= {"first_call_s", "n", "peak_bytes", "floor_ratio", "backend", "matrix_bytes", "status"}


# -- pieces ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "peaks, matrix, verdict",
    [
        ([1_000_000, 2_000_000, 4_000_000], 16 << 20, "linear"),
        ([3_000_000, 3_100_000, 3_200_000], 16 << 20, "linear"),  # a fixed workspace
        ([0, 0, 0], 16 << 20, "linear"),  # nothing allocated: one page each
        ([390_000, 1_400_000, 1_700_000], 16 << 20, "linear"),  # buffers that grow in a step (torch CPU flash)
        ([1_000_000, 4_000_000, 16_000_000], 16 << 20, "quadratic"),
        ([1_500_000, 5_000_000, 17_000_000], 16 << 20, "quadratic"),  # S^2 plus a linear part
        ([5_190_000, 25_900_000, 67_800_000], 16 << 20, "quadratic"),  # a noisy middle reading (jax)
        ([1_000_000, 3_000_000, 7_000_000], 1 << 20, "superlinear"),
        ([1_000_000, 3_000_000, 7_000_000], 16 << 20, "linear"),  # too small to hold the T x S matrix
        ([106_496, 225_280, 1_277_952], 4 << 20, "linear"),  # steep, but a quarter of the matrix at most
        ([None, None, 1], 16 << 20, "unmeasured"),
    ],
)
def test_scaling_classification(peaks, matrix, verdict):
    got = perf_scaling.classify([512, 1024, 2048], peaks, matrix)
    assert got.verdict == verdict, got
    if verdict != "unmeasured":
        assert "S=2048" in got.sentence() and got.fit_exponent is not None and got.last_exponent is not None


def test_quantiles_say_which_are_backed():
    t = perf_timing.Timing(0.5, [float(i) for i in range(1, 51)])
    s = t.summary()
    assert s["first_call_s"] == 0.5 and s["n"] == 50
    assert s["p50_s"] == pytest.approx(np.percentile(np.arange(1, 51), 50))
    assert s["quantiles_backed"] == ["p50", "p90"]  # p99 needs 100 samples
    assert not s["stable"]  # the samples climb: the two halves disagree


def test_repeat_keeps_the_first_call_apart_and_respects_the_budget():
    calls = []
    timing = perf_timing.repeat(lambda: calls.append(1), perf_timing.Budget(seconds=0.0, min_reps=4, max_reps=10))
    assert timing.first_s is not None and timing.n == 4 and len(calls) == 5


def test_host_memory_sees_numpy_buffers_and_not_nothing():
    perf_memory.pin_malloc()  # what the worker does: a test process can afford it
    eight_mib = perf_memory.measure_host(lambda: np.ones(1 << 20))  # 8 MiB of float64, touched
    assert eight_mib.peak_extra_bytes >= 8 << 20, eight_mib
    assert eight_mib.tracemalloc_bytes >= 8 << 20
    assert eight_mib.rss_bytes is None or eight_mib.rss_bytes >= 7 << 20
    nothing = perf_memory.measure_host(lambda: 1 + 1)
    assert nothing.peak_extra_bytes < 1 << 20, nothing


def test_error_ratio():
    want = np.array([1.0, 2.0, np.nan])
    assert perf_errors.ratio(want + [0.5, 0.0, 0.0], want, np.array([1.0, 1.0, 1.0])) == 0.5
    assert perf_errors.ratio(want + [0.0, 3.0, 0.0], want, np.array([1.0, 1.0, 1.0])) == 3.0
    assert perf_errors.ratio(want, want, np.zeros(3)) == 0.0
    assert perf_errors.ratio(np.array([np.nan]), np.array([np.nan]), np.ones(1)) is None


def test_grid_rows_are_fixed_shapes_and_decode_is_the_seeds_gqa_example():
    quick = rows("quick", ["float32"])
    decode = [r for r in quick if r.kind == DECODE]
    assert decode and all((r.Hq, r.Hkv, r.T, r.D) == (32, 8, 1, 128) and not r.causal for r in decode)
    prefill = [r for r in quick if r.kind == PREFILL]
    assert {r.causal for r in prefill} == {False, True} and all(r.T == r.S for r in prefill)
    assert all(r.Hkv == r.Hq for r in rows("quick", ["float32"], gqa=False) if r.kind == DECODE)
    case = case_for(Row(DECODE, 1, 4, 2, 1, 64, 16, "bfloat16", False))
    assert case.query.shape == (1, 4, 1, 16) and case.key.shape == (1, 2, 64, 16) and case.dtype == "bfloat16"


def test_svg_charts_are_well_formed():
    panel = perf_svg.Panel("p", [perf_svg.Series("a", [(256, 1e-3), (512, 4e-3)]), perf_svg.Series("b", [])])
    for svg in (
        perf_svg.line_chart("t", [panel], xlabel="S", yunit="s"),
        perf_svg.line_chart("t", [panel], xlabel="S", yunit="B"),
        perf_svg.dot_chart(
            "t", [("X-01", [("float32", 0.5), ("float16", 0.0)])], colors={"float32": "#000"}, xlabel="r"
        ),
        # a failing kernel's ratios: against a zero allowance they are 1e300, inf or NaN
        perf_svg.dot_chart(
            "t",
            [("X-01", [("float32", 1e300), ("float16", float("inf")), ("bfloat16", float("nan"))])],
            colors={"float32": "#000"},
            xlabel="r",
        ),
    ):
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg") and "http" not in svg.replace("http://www.w3.org/2000/svg", "")


# -- one run of the whole feature ----------------------------------------------------------------
class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.refs += [f"{tag} {k}={v}" for k, v in attrs if k in ("src", "href", "xlink:href", "data")]


@pytest.mark.thorough  # 25 s: the opt-in performance profile end to end (its parts are tested above)
def test_perf_profile_report_charts_and_html_certificate(tmp_path):
    report, cert = tmp_path / "perf", tmp_path / "cert.html"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "conformance/clauses/test_perf.py",
            "--impl=numpy,tests.mutants:NoScaling",
            "--conformance-perf",
            "--perf-grid=tiny",
            f"--perf-report={report}",
            f"--certificate={cert}",
            "--allow-partial",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    # The mutant computes without the 1/sqrt(d) scale: every row of its profile fails the output check.
    assert proc.returncode == 1, out
    assert re.search(r"FAILED perf::tests.mutants:NoScaling", out), out
    assert "perf::numpy PASSED" in out or "perf::numpy" not in re.findall(r"FAILED (\S+)", out), out
    doc = json.loads((report / "perf.json").read_text())
    np_rows = doc["adapters"]["numpy"]["rows"]
    assert {r["kind"] for r in np_rows} == {PREFILL, DECODE}
    for r in np_rows:
        assert ROW_FIELDS <= set(r), sorted(ROW_FIELDS - set(r))
        assert r["status"] == "measured" and r["pass"] is True, r
        assert r["p50_s"] > 0 and r["p50_s"] <= r["p90_s"] <= r["p99_s"] and r["peak_bytes"] > 0
        assert r["backend"] == "numpy-tiled" and r["floor_ratio"] > 0
    assert all(r["pass"] is False for r in doc["adapters"]["tests.mutants:NoScaling"]["rows"])
    assert doc["adapters"]["numpy"]["clauses"]["MEM-SCALING-01"]["scaling"]["verdict"] == "linear"
    assert doc["adapters"]["numpy"]["memory_scaling"], "each run states the memory scaling it measured"
    assert "memory (prefill" in out and "MEM-SCALING-01: claimed linear, measured linear" in out
    for name in ("latency.svg", "memory.svg"):
        ET.fromstring((report / name).read_text())
    # The certificate: JSON and Markdown next to one self-contained HTML page with tables and charts.
    assert cert.with_suffix(".json").exists() and cert.with_suffix(".md").exists()
    html = cert.read_text(encoding="utf-8")
    page = _Page()
    page.feed(html)
    assert not page.refs, page.refs  # nothing fetched from anywhere
    assert not re.search(r"url\(|@import|https?://", html, re.I)
    assert page.tags.get("script", 0) == 0 and page.tags.get("link", 0) == 0
    assert page.tags.get("svg", 0) >= 3 and page.tags.get("table", 0) >= 4
    assert "MEM-SCALING-01" in html and "BACKEND-01" in html and "Performance profile" in html


def test_perf_clauses_are_not_in_the_default_profile(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "conformance/clauses/test_perf.py"]
        + ["--impl=numpy", "--allow-partial"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 5, out  # NOT RUN: the only clauses selected are not in this profile
    assert "not in this profile: BACKEND-01, MEM-SCALING-01" in out
    assert "not in profile: the performance clauses run with --conformance-perf" in out
    assert "perf::" not in out
