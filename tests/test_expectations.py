"""``--expectations``: known deviations run as expected failures, a fixed one is a stale expectation.

The file format and its errors are checked directly (harness.records.expectations); the rest through small
in-process pytest runs of two clause files against self-test kernels: ``MaskSenseInverted`` (reads
the boolean mask the wrong way round: fails four clauses of those files) and ``BaseKernel``, the
same kernel with the bug fixed. The runs' plan is cut to the clauses of those files, so that the
verdict of a two-file run is a whole verdict (DEVIATES AS EXPECTED, not PARTIAL) and each run takes
about a second.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import catalog
from conformance.harness.records import expectations
from conformance.harness.records.expectations import ExpectationsError, choose_files, load
from conformance.harness.run import runstate

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")

CLAUSES_DIR = Path(__file__).resolve().parents[1] / "conformance" / "clauses"
FILES = [str(CLAUSES_DIR / f"{m}.py") for m in ("test_worked_example", "test_masks")]
BROKEN, FIXED = "tests.mutants:MaskSenseInverted", "tests.mutants:BaseKernel"
FAILING = ("ALL-BLOCKED-02", "ALL-BLOCKED-GRAD-03", "MASK-BEFORE-SOFTMAX-01", "WORKED-EXAMPLE-01")
PLAN = {"WORKED-EXAMPLE-01": ("float64", "float32"), "GRAD-01": (None,)}


def _entry(clause: str, **extra: str) -> str:
    fields = {"clause": clause, "reason": "reads True as may-attend", "evidence": "weights [0, 1] for [1, 0]", **extra}
    return "[[deviation]]\n" + "".join(f"{k} = {v if v.startswith('[') else repr(v)}\n" for k, v in fields.items())


def _file(tmp_path: Path, *entries: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text("# Known deviations of a self-test kernel\n" + "\n".join(entries), encoding="utf-8")
    return path


# -- the file format ---------------------------------------------------------------------------
def test_a_file_loads_into_entries(tmp_path):
    path = _file(tmp_path, _entry("WORKED-EXAMPLE-01", dtypes='["float32"]', link="https://example.org/i/1"))
    (e,) = load(path, PLAN)
    assert (e.clause, e.dtypes, e.entry, e.link) == ("WORKED-EXAMPLE-01", ("float32",), 1, "https://example.org/i/1")
    assert e.covers("WORKED-EXAMPLE-01", "float32") and not e.covers("WORKED-EXAMPLE-01", "float64")
    (every,) = load(_file(tmp_path, _entry("GRAD-01"), name="g.toml"), PLAN)
    assert every.dtypes is None and every.covers("GRAD-01", None)


BAD = [
    (_entry("WORKED-EXAMPLE-99"), "[[deviation]] 1: unknown clause id 'WORKED-EXAMPLE-99'"),
    (_entry("WORKED-EXAMPLE-01", dtypes='["float16"]'), "bad dtype(s) ['float16'] for clause WORKED-EXAMPLE-01"),
    (_entry("WORKED-EXAMPLE-01", dtypes='["float33"]'), "bad dtype(s) ['float33']"),
    (_entry("GRAD-01", dtypes='["float32"]'), "clause GRAD-01 has no dtype axis"),
    ('[[deviation]]\nclause = "GRAD-01"\nevidence = "x"\n', "[[deviation]] 1: missing 'reason'"),
    ('[[deviation]]\nclause = "GRAD-01"\nreason = " "\nevidence = "x"\n', "missing 'reason'"),
    ('[[deviation]]\nclause = "GRAD-01"\nreason = "r"\n', "missing 'evidence'"),
    (_entry("GRAD-01", dtype="float32"), "unknown key(s) ['dtype']"),
    (_entry("GRAD-01") + _entry("GRAD-01"), "[[deviation]] 2: clause GRAD-01 is already listed by [[deviation]] 1"),
    ("[deviation]\nclause = 1\n", "'deviation' must be an array of tables"),
    ("clause = 'GRAD-01'\n", "unknown top-level key(s) ['clause']"),
    ("[[deviation]\n", "not valid TOML"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m for _, m in BAD])
def test_a_bad_file_names_the_file_the_entry_and_the_problem(tmp_path, text, message):
    path = _file(tmp_path, text)
    with pytest.raises(ExpectationsError) as err:
        load(path, PLAN)
    assert str(path) in str(err.value) and message in str(err.value)


def test_disjoint_dtypes_of_one_clause_are_two_entries(tmp_path):
    a, b = _entry("WORKED-EXAMPLE-01", dtypes='["float64"]'), _entry("WORKED-EXAMPLE-01", dtypes='["float32"]')
    assert [e.dtypes for e in load(_file(tmp_path, a, b), PLAN)] == [("float64",), ("float32",)]


def test_which_file_applies(tmp_path, monkeypatch):
    own = _file(tmp_path, _entry("GRAD-01"), name="numpy.toml")
    other = _file(tmp_path, _entry("GRAD-01"), name="other.toml")
    monkeypatch.setattr(expectations, "expectations_dir", lambda: tmp_path)
    specs = ["numpy", "mypkg:fn"]
    assert choose_files([], specs, True, tmp_path) == {"numpy": own, "mypkg:fn": None}
    assert choose_files(["none"], specs, True, tmp_path) == {"numpy": None, "mypkg:fn": None}
    assert choose_files(["other.toml"], specs, True, tmp_path) == {"numpy": other, "mypkg:fn": other}
    assert choose_files(["mypkg:fn=other.toml", "numpy=none"], specs, True, tmp_path) == {
        "numpy": None,
        "mypkg:fn": other,
    }
    for values, message in [
        (["nothere.toml"], "no such file"),
        (["torch=other.toml"], "'torch' is not an --impl of this run"),
        (["a.toml", "b.toml"], "name one FILE"),
    ]:
        with pytest.raises(ExpectationsError, match=message):
            choose_files(values, specs, True, tmp_path)
    with pytest.raises(ExpectationsError, match="needs --impl"):
        choose_files(["other.toml"], specs, False, tmp_path)


def test_every_shipped_file_loads():
    """A built-in adapter's own file (implementations/expectations/*.toml) names real clauses and dtypes."""
    shipped = sorted(expectations.expectations_dir().glob("*.toml"))
    from conformance.harness.calls import registry

    for path in shipped:
        assert path.stem in registry.builtin_names(), f"{path.name}: no built-in adapter {path.stem!r}"
        assert load(path), f"{path}: no [[deviation]] entry"


# -- runs ----------------------------------------------------------------------------------------
@pytest.fixture
def files_plan(monkeypatch):
    """The plan of a run cut to the clauses of FILES, so that a run of FILES is a whole verdict."""
    modules = {Path(f).stem for f in FILES}
    full = runstate.planned_dtypes()
    plan = {c: d for c, d in full.items() if catalog.load()[c].module.rsplit(".", 1)[-1] in modules}
    assert set(FAILING) <= set(plan)
    monkeypatch.setattr(runstate, "planned_dtypes", lambda: plan)
    return plan


def _run(pytester, *args: str):
    result = pytester.runpytest_inprocess(*FILES, "-p", "no:cacheprovider", "-rx", *args)
    return result, result.stdout.str()


def _headline(out: str, spec: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(f"{spec}: "))


def test_listed_deviations_are_expected_failures_and_the_run_passes(pytester, tmp_path, files_plan):
    path = _file(tmp_path, *(_entry(c) for c in FAILING))
    result, out = _run(pytester, f"--impl={BROKEN}", f"--expectations={path}")
    assert result.ret == 0, out
    line = _headline(out, BROKEN)
    assert line.startswith(f"{BROKEN}: DEVIATES AS EXPECTED: ") and "4 expected failures" in line, line
    assert "XFAIL" in out and "reads True as may-attend" in out and "[[deviation]] 4" in out
    assert result.parseoutcomes().get("xfailed", 0) >= len(FAILING)


def test_removing_one_expectation_fails_the_run_naming_that_clause(pytester, tmp_path, files_plan):
    path = _file(tmp_path, *(_entry(c) for c in FAILING if c != "MASK-BEFORE-SOFTMAX-01"))
    result, out = _run(pytester, f"--impl={BROKEN}", f"--expectations={path}")
    assert result.ret == 1, out
    assert _headline(out, BROKEN).startswith(f"{BROKEN}: DOES NOT CONFORM: ")
    failed = next(ln for ln in out.splitlines() if ln.startswith("failed clauses: "))
    assert failed == f"failed clauses: MASK-BEFORE-SOFTMAX-01 [{BROKEN}]", failed


def test_a_fixed_deviation_is_a_stale_expectation_that_fails(pytester, tmp_path, files_plan):
    path = _file(tmp_path, _entry("WORKED-EXAMPLE-01"))
    result, out = _run(pytester, f"--impl={FIXED}", f"--expectations={FIXED}={path}")
    assert result.ret == 1, out
    line = _headline(out, FIXED)
    assert line.startswith(f"{FIXED}: DOES NOT CONFORM: ") and "1 stale expectation" in line, line
    assert "stale expectation: WORKED-EXAMPLE-01 passed" in out and "remove the entry" in out
    assert result.parseoutcomes().get("failed") == 4  # one per dtype of WORKED-EXAMPLE-01


def test_a_builtins_own_file_applies_by_default_and_none_shows_the_raw_verdict(
    pytester, tmp_path, files_plan, monkeypatch
):
    _file(tmp_path, _entry("WORKED-EXAMPLE-01"), name="numpy.toml")
    monkeypatch.setattr(expectations, "expectations_dir", lambda: tmp_path)
    result, out = _run(pytester, "--impl=numpy")
    assert result.ret == 1 and "stale expectation: WORKED-EXAMPLE-01 passed" in out, out
    result, out = _run(pytester, "--impl=numpy", "--expectations=none")
    assert result.ret == 0 and _headline(out, "numpy").startswith("numpy: CONFORMS: "), out


def test_a_bad_file_on_the_command_line_is_a_usage_error(pytester, tmp_path):
    path = _file(tmp_path, _entry("NO-SUCH-CLAUSE-01"))
    result, _ = _run(pytester, "--impl=numpy", f"--expectations={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in result.errlines if ln.startswith("ERROR:")]
    assert len(errors) == 1 and "[[deviation]] 1: unknown clause id 'NO-SUCH-CLAUSE-01'" in errors[0], errors


def test_an_expected_failure_is_not_shrunk(pytester, tmp_path):
    """ORACLE-AGREE-01 (property-based) fails on the counting kernel either way; listed, it stops at
    the first failing example instead of shrinking it, and is still an expected failure."""
    from tests import counting_kernels

    spec = "tests.counting_kernels:CountingMaskAfterSoftmax"
    args = (str(CLAUSES_DIR / "test_agreement.py"), f"--impl={spec}", "-k", "float32", "--allow-partial")
    calls = {}
    for listed in (False, True):
        counting_kernels.CALLS["forward"] = 0
        extra = [f"--expectations={_file(tmp_path, _entry('ORACLE-AGREE-01'))}"] if listed else []
        result = pytester.runpytest_inprocess(*args, *extra, "-p", "no:cacheprovider", "-rx")
        calls[listed] = counting_kernels.CALLS["forward"]
        outcomes = result.parseoutcomes()
        assert outcomes.get("xfailed" if listed else "failed") == 1, result.stdout.str()[-3000:]
    assert 0 < calls[True] < calls[False], calls
