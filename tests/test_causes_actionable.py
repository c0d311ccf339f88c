"""Causes a maintainer can act on (harness.causes.likely, .text), on synthetic clause records shaped like the
real releases' failures: the smallest conjunction that separates failing from passing cases, a hypothesis
that fits the outputs (NaN is no precision; a raised error is told as raised), a convention that holds in
some dtypes split from another dtype's bug, and the ranking by error times failing tests."""

from __future__ import annotations

from conformance.harness.causes import likely as causes
from conformance.harness.causes import text as causes_text
from tests.test_causes import _failed, _key, _passed


def _nan(clause: str, dtype: str, *feats: str, matches=()) -> dict:
    row = _failed(clause, dtype, *feats, matches=matches)
    row["failure"]["measure"] = {"err": "inf", "allowed": 1e-12, "rel_err": "inf", "nan": 24, "got": "nan"}
    return row


def test_float64_and_rows_blocked_entirely_not_float64_alone():
    """jax 0.10.0 with x64: float64 rows that see no key give NaN; float64 passes everywhere else."""
    rows = [_passed(f"P{i}", "float64", "no mask", n=40) for i in range(5)]  # float64 passes widely
    for c in ("ALL-BLOCKED", "GOLDEN", "COVER"):
        rows += [_passed(c, d, "bool mask", "row blocked entirely: bool") for d in ("float32", "float16")]
        rows.append(_nan(c, "float64", "bool mask", "row blocked entirely: bool", matches=["all_blocked=nan"]))
    (first,) = causes.likely_causes(rows)["causes"]
    assert set(first["features"]) == {"dtype=float64", "row blocked entirely: bool"}, first["features"]
    text = causes_text.hint(first)
    assert "NaN" in text and "float64 only" in text and "lower precision" not in text, text
    assert first["declare"] == "all_blocked=nan" and "--declare" not in "\n".join(causes_text.cause_lines(1, first))


def test_a_raised_error_is_told_as_raised_and_grouped_heads_are_one_cause():
    """keras 3.14.1's torch backend raises for every ratio Hq:Hkv with Hkv > 1: one cause, what it raised."""
    rows = [_passed("P", "float32", "no mask", n=50)]
    for i, ratio in enumerate(("GQA 2:1", "GQA 3:1", "GQA 4:1")):
        row = _failed(f"G{i}", "float32", "no mask", ratio)
        row["failure"].update(error="AdapterError", message="k.forward raised RuntimeError: The size of tensor a (6)")
        rows.append(row)
    (first,) = causes.likely_causes(rows)["causes"]
    assert first["features"] == ["GQA (Hq > Hkv)"] and first["clause_tests"] == 3
    assert "raised AdapterError: k.forward raised RuntimeError: The size of tensor a (6) (3 of 3" in causes_text.hint(
        first
    )


def test_the_largest_error_times_the_most_tests_comes_first():
    rows = [_passed("P", "float32", "no mask", n=50)]
    rows.append(_failed("SMALL", "float32", "custom scale", rel=5e-4))  # one test, 1e3 allowances (10 bits)
    rows += [_nan(f"BIG{i}", "float32", "causal") for i in range(8)]  # eight tests of NaN
    found = causes.likely_causes(rows)["causes"]
    assert [c["features"] for c in found] == [["causal"], ["custom scale"]]


def test_a_convention_of_some_dtypes_is_split_from_another_dtypes_bug():
    """onnxruntime 1.27: rows blocked entirely give the mean of V in float32 and float16, NaN in float64."""
    rows = [_passed("P", "float32", "no mask", n=50)]
    for c in ("A", "B"):
        for d in ("float32", "float16"):
            rows.append(_failed(c, d, "row blocked entirely: bool", matches=["all_blocked=mean-v"], rel=0.9))
        rows.append(_nan(c, "float64", "row blocked entirely: bool", matches=["all_blocked=nan"]))
    found = causes.likely_causes(rows)["causes"]
    by = {tuple(c["features"]): c for c in found}
    assert by[("row blocked entirely: bool",)]["declare"] == "all_blocked=mean-v"
    f64 = by[("row blocked entirely: bool", "dtype=float64")]
    assert f64["declare"] == "all_blocked=nan" and "float64 only" in causes_text.hint(f64)


def test_no_cause_line_without_a_hypothesis_or_a_measurement():
    rows = [_passed("P", "float32", "no mask", n=50)]
    rows += [_failed(c, "float32", "T == S", "forward (forward)", "head dim <= 8") for c in "AB"]
    for cause in causes.likely_causes(rows)["causes"]:
        assert causes_text.hint(cause), cause
    assert _key("a", "b") == "a; b"
