"""Failures you can see: each failing clause's first failing case travels from the clause's failure
(``ClauseViolation.compared``, harness.causes.picture) through the verdict records, xdist workers
included, to the certificate and the matrix, and is drawn as a small self-contained SVG
(harness.records.heatmap_svg)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from conformance.harness.causes import picture
from conformance.harness.records import heatmap_svg
from conformance.harness.spec.report import ClauseViolation, mismatch_report

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]


def _violation(actual: np.ndarray, expected: np.ndarray) -> ClauseViolation:
    msg = mismatch_report("weights", actual, expected, np.full(expected.shape, 1e-6), "a rule")
    assert msg is not None
    return ClauseViolation(msg)


def test_the_record_is_a_window_around_the_worst_element():
    expected = np.zeros((2, 3, 100, 90))
    actual = expected.copy()
    actual[1, 2, 70, 80] = 0.5  # the worst element, far from the origin
    actual[0, 0, 0, 0] = 1e-5
    rec = picture.record(_violation(actual, expected), decl=None)
    assert rec["slice"] == [1, 2] and rec["shape"] == [2, 3, 100, 90]
    assert rec["rows"][1] - rec["rows"][0] == picture.MAX_ROWS and rec["cols"][1] - rec["cols"][0] == picture.MAX_COLS
    t, s = 70 - rec["rows"][0], 80 - rec["cols"][0]
    assert rec["received"][t][s] == 0.5 and rec["expected"][t][s] == 0.0 and rec["ratio"][t][s] == 5e5
    assert len(json.dumps(rec)) < 20_000  # small enough to travel with every failing clause test
    execnet = pytest.importorskip("execnet")
    assert execnet.loads(execnet.dumps(rec)) == rec  # what pytest-xdist ships from a worker, unchanged


def test_nan_and_inf_survive_as_json_and_are_drawn():
    expected = np.full((1, 1, 2, 3), 0.25)
    actual = expected.copy()
    actual[0, 0, 0, 1], actual[0, 0, 1, 2] = np.nan, np.inf
    rec = json.loads(json.dumps(picture.record(_violation(actual, expected), decl=None)))
    assert rec["received"][0][1] == "nan" and rec["received"][1][2] == "inf" and rec["ratio"][0][1] == "inf"
    svg = heatmap_svg.render({**rec, "dtype": "float32"})
    assert heatmap_svg.NAN in svg and heatmap_svg.INF in svg


def test_every_string_is_escaped_and_nothing_is_fetched():
    expected = np.eye(3)[None, None]
    rec = picture.record(_violation(expected[..., ::-1].copy(), expected), decl=None)
    rec.update(what="weights <script>alert(1)</script> & more", dtype="<b>x</b>", blocked=[[0, 1, 1]] * 3)
    svg = heatmap_svg.render(rec, title="kernel '<img src=x onerror=alert(1)>'")
    root = ET.fromstring(svg)  # well-formed: every string was escaped
    assert "<script" not in svg and "<img" not in svg and "<b>" not in svg
    assert {el.tag.split("}")[-1] for el in root.iter()} <= {"svg", "rect", "path", "text"}
    assert not [k for el in root.iter() for k in el.attrib if "href" in k or k == "src"]
    assert not re.search(r"url\(|https?://(?!www\.w3\.org/2000/svg)", svg)


@pytest.mark.thorough  # a certification and a matrix end to end (8 s)
def test_a_causal_misalignment_is_drawn_in_the_certificate_and_the_matrix(
    pytester, tmp_path, restore_hypothesis_profile
):
    """The bottom-right causal kernel certified as top-left (its signature's default): CAUSAL-ALIGN-02's
    picture shows weight on keys the case blocks, in the HTML certificate and the matrix drawn from it."""
    cert = tmp_path / "cert.html"
    spec = "tests.cause_kernels:bottom_right_causal"
    result = pytester.runpytest_inprocess(
        str(ROOT / "conformance" / "clauses" / "test_causal.py"), f"--impl={spec}", "--declare=dropout=false",
        "-k", "causal_alignment", "--allow-partial", f"--certificate={cert}", "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == 1, result.stdout.str()
    pic = json.loads(cert.with_suffix(".json").read_text())["adapters"][spec]["clauses"]["CAUSAL-ALIGN-02"]["picture"]
    assert pic["what"].startswith("weights") and pic["dtype"] in ("float64", "float32", "float16", "bfloat16")
    leaked = [
        (t, s) for t, row in enumerate(pic["blocked"]) for s, b in enumerate(row) if b and pic["received"][t][s] != 0
    ]
    assert leaked and all(pic["expected"][t][s] == 0 for t, s in leaked)  # weight where the case blocks the key
    html = cert.read_text()
    assert "Failing cases, drawn" in html and html.count("<svg") >= 1 and "CAUSAL-ALIGN-02 [" in html
    from conformance import matrix

    out = tmp_path / "matrix"
    assert matrix.main(["--out", str(out), "--certificates", str(cert.with_suffix(".json"))]) == 0
    drawn = list((out / "failing-cases").glob("*CAUSAL-ALIGN-02.svg"))
    assert len(drawn) == 1 and f"(failing-cases/{drawn[0].name})" in (out / "matrix.md").read_text()
    assert "first failing case" in (out / "matrix.html").read_text()
