"""``likely causes`` (harness.causes.likely): the set cover on synthetic records, and on kernels with one
injected cause each (tests/cause_kernels.py) the root cause named first, with its ``--declare``
where the cause is a convention, in the summary and in the certificate alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.harness.cases import features as cf
from conformance.harness.causes import likely as causes
from conformance.harness.causes import text as causes_text
from conformance.harness.records.verdict import ClauseResult
from tests import cause_kernels  # noqa: F401 - loaded with torch before pytester snapshots sys.modules

# (the snapshot would otherwise unload torch after the first in-process run; torch cannot be imported twice)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile", "worst_case_search")

CLAUSES = Path(__file__).resolve().parents[1] / "conformance" / "clauses"


def _key(*feats: str) -> str:
    return cf.JOIN.join(feats)


def _passed(clause: str, dtype: str, *feats: str, n: int = 3) -> dict:
    return ClauseResult(clause, "k", dtype, "passed", case_features={_key(f"dtype={dtype}", *feats): n}).as_dict()


def _failed(clause: str, dtype: str, *feats: str, matches=(), rel=None) -> dict:
    measure = {"err": 1.0, "allowed": 1e-3, "rel_err": rel, "nan": 0} if rel is not None else None
    failure = {"features": _key(f"dtype={dtype}", *feats), "call": "forward", "dtype": dtype,
               "measure": measure, "matches": list(matches), "checked": True}  # fmt: skip
    return ClauseResult(clause, "k", dtype, "failed", failure=failure).as_dict()


def test_one_dtype_failing_everywhere_is_one_cause():
    rows = []
    for c in "ABCDE":
        rows += [_passed(c, d, "forward (forward)", "bool mask") for d in ("float32", "float16")]
        rows.append(_failed(c, "float64", "forward (forward)", "bool mask", matches=["float64_computed_as=float32"],
                            rel=2.0**-23))  # fmt: skip
    found = causes.likely_causes(rows)
    assert found["failures"] == 5 and not found["unexplained"]
    first = found["causes"][0]
    assert first["features"] == ["dtype=float64"] and first["clauses"] == 5
    assert first["declare"] == "float64_computed_as=float32" and first["declare_matched"] == 5
    assert "2 float32 u" in causes_text.summary_lines("k", found)[2]  # 2^-23 relative = 2 float32 unit roundoffs


def test_greedy_order_and_the_second_cause():
    rows = [_passed("P", "float32", "causal", "T == S", n=50)]
    rows += [_passed(c, "float32", "no mask") for c in "ABCDEF"]
    rows += [_failed(c, "float64", "no mask") for c in "ABCDEF"]
    rows += [_failed(c, "float32", "causal", "T < S", "causal, T != S") for c in "XY"]
    rows.append(_failed("Z", "float32", "causal", "T > S", "causal, T != S"))
    found = causes.likely_causes(rows)
    assert [c["features"] for c in found["causes"]] == [["dtype=float64"], ["causal, T != S"]]
    assert [c["clause_tests"] for c in found["causes"]] == [6, 3]


def test_a_clause_failing_everywhere_is_compared_with_the_sensitive_clauses():
    """Clauses no precision can fail pass float64 as often as any dtype; a clause that failed in
    every dtype is set against the clauses that failed somewhere, where float64 is rare."""
    dtypes = ("float64", "float32", "float16", "bfloat16")
    rows = [_passed(f"SHAPE-{i}", d, "no mask", n=10) for i in range(10) for d in dtypes]
    for i in range(8):
        rows += [_passed(f"PREC-{i}", d, "no mask", n=10) for d in dtypes[1:]]
        rows.append(_failed(f"PREC-{i}", "float64", "no mask"))
    rows += [_failed(f"CAUSAL-{i}", d, "causal", "causal, T != S") for i in range(2) for d in dtypes]
    found = causes.likely_causes(rows)
    assert [(c["features"], c["clause_tests"]) for c in found["causes"]] == [
        (["dtype=float64"], 10),  # with every passing case as reference: 8 (float64 is 16% of them)
        (["causal, T != S"], 6),
    ]


def test_ties_go_to_fewer_features_and_common_features_explain_nothing():
    rows = [_passed("P", "float32", "B > 1", n=100)]
    rows += [_failed(c, "float32", "B > 1", "bool mask", "row blocked entirely: bool") for c in "AB"]
    found = causes.likely_causes(rows)
    first = found["causes"][0]
    assert first["features"] == ["row blocked entirely: bool"]  # a tie goes to the feature naming a mechanism
    assert all("B > 1" not in c["features"] for c in found["causes"])  # in every passing case: explains nothing


def test_a_convention_is_suggested_only_for_the_features_it_is_about():
    rows = [_passed("P", "float32", "no mask", n=20)]
    rows += [_failed(c, "float32", "large |scores| (>= 64)", matches=["mask_sense=attend"]) for c in "AB"]
    (cause,) = causes.likely_causes(rows)["causes"]
    assert cause["features"] == ["large |scores| (>= 64)"] and cause["declare"] is None


def test_a_fill_of_blocked_rows_is_not_matched_by_nan_everywhere():
    """NaN in the row a mask blocks entirely matches all_blocked=nan; NaN in every row does not (NaN outside
    those rows is not the fill's: torch 2.13's SDPA with is_causal, a mask and scale 0 NaNs every row)."""
    import numpy as np

    from conformance.contract import Case, Declaration
    from conformance.harness.causes.conventions import matching_conventions
    from conformance.harness.judge.expected import expected

    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, n, 8)) for n in (3, 4, 4))
    mask = np.zeros((3, 4), dtype=bool)
    mask[1] = True
    case = Case(q, k, v, mask=mask, seed=5, label="row 1 blocked entirely")
    decl = Declaration()
    right = np.asarray(expected(case, decl).out, dtype=np.float64)
    nan_row = right.copy()
    nan_row[:, :, 1] = np.nan
    assert "all_blocked=nan" in matching_conventions(case, nan_row, decl)
    wrong_elsewhere = nan_row.copy()
    wrong_elsewhere[:, :, 0] += 1.0  # another error (a value) elsewhere does not hide the fill
    assert "all_blocked=nan" in matching_conventions(case, wrong_elsewhere, decl)
    assert "all_blocked=nan" not in matching_conventions(case, np.full_like(right, np.nan), decl)


def test_a_failure_without_a_case_is_listed_unexplained():
    rows = [_passed("A", "float32", "no mask"), ClauseResult("B", "k", "float32", "failed").as_dict()]
    found = causes.likely_causes(rows)
    assert found["causes"] == [] and found["unexplained"] == ["B[float32]"]


def test_records_survive_json():
    row = _failed("A", "float64", "no mask", matches=["float64_computed_as=float32"], rel=1e-7)
    back = ClauseResult.from_dict(json.loads(json.dumps(row)))
    assert back.failure == row["failure"]


# -- kernels with one injected cause each ----------------------------------------------------------
INJECTED = [
    ("float64_as_float32", ["test_masks.py"], "dtype=float64", "float64_computed_as=float32"),
    ("bottom_right_causal", ["test_causal.py", "test_masks.py"], "causal, T != S", "causal_alignment=bottom-right"),
    ("mean_v_rows", ["test_masks.py"], "row blocked entirely: bool", "all_blocked=mean-v"),
    ("finite_fill", ["test_masks.py"], "row blocked entirely: bool", "blocked_fill=add:-1e4"),
    (
        "no_upcast",
        ["test_precision.py", "test_masks.py"],
        "large |scores| (>= 64)",
        "float16_computed_as=float16-products --declare bfloat16_computed_as=bfloat16-products",
    ),  # fmt: skip
]


@pytest.mark.parametrize("kernel,modules,feature,declare", INJECTED, ids=[k for k, *_ in INJECTED])
def test_root_cause_first(pytester, tmp_path, kernel, modules, feature, declare):
    cert = tmp_path / "cert.json"
    spec = f"tests.cause_kernels:{kernel}"
    args = [str(CLAUSES / m) for m in modules]
    result = pytester.runpytest_inprocess(
        *args, f"--impl={spec}", "--declare=dropout=false", "--allow-partial", f"--certificate={cert}",
        "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 1, out
    found = json.loads(cert.read_text())["adapters"][spec]["likely_causes"]
    first = found["causes"][0]
    assert feature in first["features"] and first["declare"] == declare, json.dumps(found, indent=1)
    lines = out.splitlines()
    head = lines.index(next(ln for ln in lines if ln.startswith("likely causes")))
    wrong = "wrong values, not rounding: " if first.get("wrong_values") else ""
    assert lines[head + 2].strip().startswith(f"1. {wrong}{' + '.join(first['features'])}:"), out
    if declare and "=" in declare:
        assert f"--declare {declare}" in "\n".join(lines[head + 2 : head + 6]), out
    assert "## Likely causes" in cert.with_suffix(".md").read_text()


def test_reference_kernel_has_no_likely_causes(pytester, tmp_path):
    cert = tmp_path / "cert.json"
    spec = "tests.cause_kernels:reference"
    result = pytester.runpytest_inprocess(
        str(CLAUSES / "test_masks.py"), f"--impl={spec}", "--declare=dropout=false", "--allow-partial",
        f"--certificate={cert}", "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    assert "likely causes" not in result.stdout.str()
    assert json.loads(cert.read_text())["adapters"][spec]["likely_causes"]["failures"] == 0


# -- the vocabulary -----------------------------------------------------------------------------------
def test_features_of_causal_rows_and_magnitudes():
    import numpy as np

    from conformance.harness.cases.build import random_case

    c = random_case(1, T=4, S=2, is_causal=True)
    assert {"causal", "causal, T != S", "T > S"} <= set(cf.features(c))
    assert "row blocked entirely: causal" not in cf.features(c)  # top-left: every row sees key 0
    assert "row blocked entirely: causal" in cf.features(c, alignment="bottom-right")  # rows 0, 1 see nothing
    mask = np.zeros((2, 2, 3, 5), dtype=bool)
    mask[0, 1, 2] = True
    feats = cf.features(random_case(2, mask=mask))
    assert {"bool mask", "bool mask [B,H,T,S]", "row blocked entirely: bool"} <= set(feats)
    small = random_case(3, T=1, S=4, Dk=64, dtype="float16")
    big = small.replace(query=np.full_like(small.query, 40), key=np.full_like(small.key, 40))  # q.k = 102400
    assert "|QK^T| > 65504 (float16 max)" not in cf.features(small)
    assert {"|QK^T| > 65504 (float16 max)", "decode T = 1", "dtype float16 or bfloat16"} <= set(cf.features(big))
    assert "backward (vjp)" in cf.features(big, "vjp")


def test_the_guard_records_a_folded_causal_mask():
    """A function that rejects is_causal with a mask gets the causal part folded in by the suite
    (implementations/function.py); the recorded features say so."""
    import numpy as np

    from conformance.harness.calls.guarded import GuardedAdapter
    from conformance.harness.cases.build import random_case
    from implementations.function import FunctionAdapter
    from tests.cause_kernels import reference

    def rejects_both(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if is_causal and attn_mask is not None:
            raise ValueError("attn_mask and is_causal together")
        return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    impl = GuardedAdapter(FunctionAdapter(rejects_both, "rejects-both"), timeout=0)
    impl.forward(random_case(4, T=3, S=3, is_causal=True, mask=np.zeros((3, 3), dtype=bool)))
    impl.forward(random_case(5, T=3, S=3, is_causal=True))
    folded = [k for k in impl.case_features if "suite folded causal into the mask" in cf.split(k)]
    assert len(folded) == 1 and "causal + mask" in cf.split(folded[0])


def test_failures_within_the_allowance_are_told_as_the_rule_that_failed():
    """A bitwise rule broken by one-ulp differences (errors 0.04x the allowance, in float64 and float32) is not a
    precision: no formulation is offered, no single lower precision is named, and the text says what failed."""
    rows = []
    for c in ("PRESENT-MEMORY-01", "PRESENT-IDENTITY-02"):
        for dtype, rel in (("float64", 2.0**-52), ("float32", 2.0**-23)):
            rows.append(_passed(c, "float16", "forward (forward)", "bool mask"))
            row = _failed(c, dtype, "forward (forward)", "bool mask", rel=rel)
            row["failure"]["measure"].update(err=0.04, allowed=1.0)
            row["failure"]["within_allowance"] = True
            # a looser formulation's allowance also holds them; offered, it would read as a precision lost
            row["failure"]["matches"] = [f"{dtype}_computed_as=" + ("float32" if dtype == "float64" else "tf32")]
            rows.append(row)
    found = causes.likely_causes(rows)
    text = "\n".join(causes_text.summary_lines("k", found))
    assert "computed at" not in text and "--declare" not in text, text
    assert "within the allowance (up to 0.04x allowed)" in text and "PRESENT-MEMORY-01" in text, text
    assert "past the allowance" not in text, text
