"""The verdict rule (harness.records.verdict) and its negative controls: kernels that try to earn CONFORMS
without being checked never get it, and their runs exit non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.harness.records import verdict as V

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]


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


def test_a_refused_transform_is_a_measured_capability_apart_from_declarations():
    refusal = "the kernel refuses forward-mode AD (NotImplementedError: no rule): a measured capability, listed ..."
    v = V.decide(
        [
            _r("A-01", "float32", V.PASSED, cases_run=3),
            _r("A-01", "float16", V.PASSED, cases_run=1),
            _r("B-02", None, V.NOT_APPLICABLE, reason=refusal),
            _r("LONG-03", "float32", V.NOT_APPLICABLE, reason="declares grad=False"),
        ],
        PLAN,
    )
    assert v.word == V.CONFORMS and list(v.clauses_refused) == ["B-02"] and list(v.clauses_na) == ["LONG-03"]
    assert "1 refused by the kernel (measured capabilities), 1 not applicable by declaration" in v.headline()
    assert any(line.startswith("refused by the kernel (a measured capability): B-02") for line in v.details())


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
    # The three clauses that once certified such kernels (after 5 of 25 examples, one shape, 1 of 19
    # fixtures), on one dtype: a refusal fails a clause on any dtype, and the verdict is decided the same.
    files = [f"conformance/clauses/{m}.py" for m in ("test_agreement", "test_cross_shapes", "test_golden")]
    sel = "(test_agrees_with_oracle or test_cross_attention_shapes or test_golden) and float32"
    proc = _pytest(*files, "-k", sel, "--impl=" + ",".join(specs))
    assert proc.returncode == 1, proc.stdout[-3000:]
    failed = next(ln for ln in proc.stdout.splitlines() if ln.startswith("failed clauses: "))
    for spec in specs:
        line = _summary(proc, spec)
        assert line.startswith(f"{spec}: DOES NOT CONFORM: "), line
        assert "refused without a declaration" in line, line
        for cid in ("ORACLE-AGREE-01", "XATTN-SHAPES-01", "GOLDEN-01"):
            assert f"{cid} [{spec}]" in failed, failed
    assert "undeclared refusal" in proc.stdout and "--declare bool_mask=false" in proc.stdout


# The clause directory, not the project's test paths: collecting the self-tests too only to deselect them
# costs seconds per run, and the selection is the -k alone either way.
CLAUSE_DIR = "conformance/clauses"


def test_a_clause_selection_is_partial_and_exits_non_zero(tmp_path):
    cert = tmp_path / "cert.json"
    proc = _pytest(CLAUSE_DIR, "--impl=numpy", "-k", "test_output_shape", f"--certificate={cert}")
    assert proc.returncode == 6, proc.stdout[-3000:]
    assert _summary(proc, "numpy").startswith("numpy: PARTIAL: ")
    doc = json.loads(cert.read_text())["adapters"]["numpy"]
    assert doc["verdict"] == "PARTIAL"
    assert "**Verdict: PARTIAL**" in cert.with_suffix(".md").read_text()
    allowed = _pytest(CLAUSE_DIR, "--impl=numpy", "-k", "test_output_shape", "--allow-partial")
    assert allowed.returncode == 0 and "PARTIAL" in _summary(allowed, "numpy")


def test_zeros_under_a_clause_selection_never_conforms():
    pytest.importorskip("torch", reason="the cheating kernels are plain torch-signature functions")
    proc = _pytest(CLAUSE_DIR, "--impl=tests.cheaters:zeros", "-k", "test_output_shape or test_dtype")
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "CONFORMS:" not in _summary(proc, "tests.cheaters:zeros").replace("NOT CONFORM", "")


def test_declaring_nothing_is_not_run_and_exits_non_zero():
    proc = _pytest(CLAUSE_DIR, "--impl=numpy", "--declare=dtypes=")
    assert proc.returncode == 5, proc.stdout[-3000:]
    assert _summary(proc, "numpy").startswith("numpy: NOT RUN: 0/")


# -- deviations and expectations ---------------------------------------------------------------------
ALL_PASS = [_r("A-01", d, V.PASSED, cases_run=1) for d in PLAN["A-01"]] + [
    _r("B-02", None, V.PASSED),
    _r("LONG-03", "float32", V.NOT_IN_PROFILE, reason="not in profile"),
]


def test_declared_deviations_conform_as_declared_and_list_their_sentence():
    from conformance.contract import Declaration
    from conformance.harness.records.deviations import deviations

    assert deviations(Declaration()) == []  # the spec's own conventions
    open_ones = Declaration(mask_sense="attend", causal_alignment="bottom-right", lse_base="2", lse_empty="+inf")
    limits = Declaration(dropout=False, gqa=False, custom_scale=False, float_mask=False, requires_dk_eq_dv=True)
    assert deviations(open_ones) == [] and deviations(limits) == []  # left open by the spec, or capabilities
    devs = deviations(Declaration(all_blocked="nan", float64_computed_as="float32"))
    assert [(d.field, d.value) for d in devs] == [("all_blocked", "nan"), ("float64_computed_as", "float32")]
    assert deviations(Declaration(mean_v_keys="buffer")) == []  # which mean: only a deviation under mean-v
    v = V.decide(ALL_PASS, PLAN, [d.as_dict() for d in devs])
    assert v.word == V.CONFORMS_AS_DECLARED and v.exit_code == 0
    lines = [ln for ln in v.details() if ln.startswith("declared deviation: ")]
    assert (
        len(lines) == 2
        and "all_blocked=nan" in lines[0]
        and "本实现明确约定该行的权重和输出为 0，避免 NaN。" in lines[0]
    )
    assert "float64 输入则保留 float64。" in lines[1] and "000_f3dcd408372d9e02.txt §8" in lines[1]
    assert V.decide(ALL_PASS, PLAN).word == V.CONFORMS


def test_one_rule_broken_in_two_dtypes_is_one_verdict_line_with_both_values():
    """float16 and bfloat16 products formed without the upcast depart from one sentence: one line names
    both declared values; the certificate's per-field records stay two."""
    from conformance.contract import Declaration
    from conformance.harness.records.deviations import deviations

    decl = Declaration(
        float64_computed_as="float32", float16_computed_as="float16-products", bfloat16_computed_as="bfloat16-products"
    )
    devs = [d.as_dict() for d in deviations(decl)]
    assert [d["field"] for d in devs] == ["float64_computed_as", "float16_computed_as", "bfloat16_computed_as"]
    lines = [ln for ln in V.decide(ALL_PASS, PLAN, devs).details() if ln.startswith("declared deviation: ")]
    assert len(lines) == 2, lines
    assert lines[1].startswith(
        "declared deviation: float16_computed_as=float16-products, bfloat16_computed_as=bfloat16-products ("
    )
    assert lines[1].count("这里将低精度输入转为 float32 后才计算点积和 softmax") == 1


def test_expected_failures_deviate_as_expected_and_a_stale_one_does_not_conform():
    rows = [r for r in ALL_PASS if r.dtype != "float16"]
    expected = _r("A-01", "float16", V.EXPECTED_FAILURE, reason="softmax in float32")
    v = V.decide([*rows, expected], PLAN, [{"field": "f", "value": 1, "what": "w", "citation": "c"}])
    assert v.word == V.DEVIATES_AS_EXPECTED and v.exit_code == 0  # expected failures outrank deviations
    assert "1 expected failure" in v.headline() and v.clauses_expected == {"A-01": "float16: softmax in float32"}
    assert "A-01" not in v.clauses_passed and not v.clauses_failed
    assert "(1 known cause)" not in v.headline()  # no entries were given: the rows alone name no cause
    assert V.decide([*rows, expected, _r("B-02", None, V.FAILED)], PLAN).word == V.DOES_NOT_CONFORM
    partial = V.decide([expected, _r("B-02", None, V.PASSED)], PLAN)
    assert partial.word == V.PARTIAL  # float32 of A-01 and LONG-03 missing: still not a whole run
    only = V.decide([_r("B-02", None, V.EXPECTED_FAILURE)], {"B-02": (None,)})
    assert only.word == V.DEVIATES_AS_EXPECTED  # an expected failure ran: not NOT RUN
    assert V.worst([V.CONFORMS, V.CONFORMS_AS_DECLARED, V.DEVIATES_AS_EXPECTED]) == V.DEVIATES_AS_EXPECTED


def test_a_known_cause_that_no_longer_fails_where_reached_is_stale_and_does_not_conform(tmp_path):
    """Staleness is a property of a cause, not of a clause test: the entry explained nothing although
    cases with its features ran (and passed), so the library no longer does what it says."""
    from conformance.harness.records.expectations import load

    path = tmp_path / "k.toml"
    path.write_text(
        '[[cause]]\nbehaviour = "float16 not upcast"\nwhen = ["dtype=float16"]\nreason = "r"\nevidence = "e"\n'
        '[[cause]]\nbehaviour = "decode broken"\nwhen = ["decode T = 1"]\nreason = "r"\nevidence = "e"\n',
        encoding="utf-8",
    )
    fp16, decode = load(path)
    reached = {"dtype=float16; forward (forward); no mask": 3}
    rows = [_r(c, d, V.PASSED, case_features=reached) for c, d in (("A-01", "float32"), ("A-01", "float16"))]
    rows += [_r("B-02", None, V.PASSED)]
    v = V.decide(rows, {"A-01": ("float32", "float16"), "B-02": (None,)}, (), [fp16, decode])
    assert v.word == V.DOES_NOT_CONFORM and "1 stale expectation" in v.headline()
    assert list(v.causes_stale) == ["float16 not upcast"]  # reached and never failed; "decode broken" not reached
    assert "6 cases with those features ran" in v.causes_stale["float16 not upcast"]
    explained = _r("A-01", "float16", V.EXPECTED_FAILURE, reason="float16 not upcast", expectation=fp16.key)
    v = V.decide([rows[0], explained, rows[2]], {"A-01": ("float32", "float16"), "B-02": (None,)}, (), [fp16])
    assert v.word == V.DEVIATES_AS_EXPECTED and "1 expected failure (1 known cause)" in v.headline()
    assert any(ln.startswith("expected cause: float16 not upcast (when dtype=float16): 1 clause test, A-01")
               for ln in v.details())  # fmt: skip


def test_the_builtins_verdict_words_in_a_real_run(tmp_path, monkeypatch, pytester_runner):
    """numpy: CONFORMS; jax: CONFORMS AS DECLARED with its four deviations, in the summary and the certificate.

    One clause file, with the run's plan cut to its clauses so that the verdict is a whole one."""
    pytest.importorskip("jax")
    from conformance import catalog
    from conformance.harness.run import runstate

    plan = {
        c: d for c, d in runstate.planned_dtypes().items() if catalog.load()[c].module.endswith(".test_worked_example")
    }
    monkeypatch.setattr(runstate, "planned_dtypes", lambda: plan)
    cert = tmp_path / "cert.json"
    result = pytester_runner(
        str(ROOT / "conformance" / "clauses" / "test_worked_example.py"), "--impl=numpy,jax", f"--certificate={cert}"
    )
    out = result.stdout.str()
    assert result.ret == 0, out
    assert _summary_of(out, "numpy").startswith("numpy: CONFORMS: ")
    assert _summary_of(out, "jax").startswith("jax: CONFORMS AS DECLARED: ")
    listed = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("declared deviation: ")]
    fields = [
        [kv.split("=")[0] for kv in ln.split(" (")[0].removeprefix("declared deviation: ").split(", ")] for ln in listed
    ]
    assert fields == [
        ["mean_v_keys", "all_blocked_float_mask"],  # one line per sentence departed from (000 §8's zero rows)
        ["float64_computed_as"],
        ["blocked_fill"],  # which gives the mean of V: listed with the fill, not again as all_blocked
    ]
    doc = json.loads(cert.read_text())["adapters"]
    assert doc["numpy"]["verdict"] == "CONFORMS" and doc["numpy"]["deviations"] == []
    assert doc["jax"]["verdict"] == "CONFORMS AS DECLARED"
    assert {d["field"]: d["sentence"] for d in doc["jax"]["deviations"]}[
        "float64_computed_as"
    ] == "float64 输入则保留 float64。"
    md = cert.with_suffix(".md").read_text()
    assert "## Declared deviations from the spec" in md and "**Verdict: CONFORMS AS DECLARED**" in md


def test_a_declare_override_that_departs_from_the_spec_is_a_declared_deviation(monkeypatch, pytester_runner):
    """The rule reads the final declaration: --declare all_blocked=nan on a kernel that NaNs such rows."""
    from conformance import catalog
    from conformance.harness.run import runstate

    mine = {c for c, info in catalog.load().items() if info.module.endswith(".test_masks")}
    plan = {c: d for c, d in runstate.planned_dtypes().items() if c in mine}
    monkeypatch.setattr(runstate, "planned_dtypes", lambda: plan)
    spec = "tests.mutants:NanOnAllBlocked"
    result = pytester_runner(str(ROOT / "conformance" / "clauses" / "test_masks.py"), f"--impl={spec}")
    assert result.ret == 1 and _summary_of(result.stdout.str(), spec).startswith(f"{spec}: DOES NOT CONFORM")
    result = pytester_runner(
        str(ROOT / "conformance" / "clauses" / "test_masks.py"), f"--impl={spec}", "--declare=all_blocked=nan"
    )
    out = result.stdout.str()
    assert result.ret == 0 and _summary_of(out, spec).startswith(f"{spec}: CONFORMS AS DECLARED: "), out
    assert "declared deviation: all_blocked=nan (a row whose keys a boolean mask blocks entirely gets NaN)" in out


def _summary_of(out: str, spec: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(f"{spec}: "))


@pytest.fixture
def pytester_runner(pytester, restore_hypothesis_profile):
    return lambda *args: pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider")
