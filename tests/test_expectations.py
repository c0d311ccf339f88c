"""``--expectations``: known causes make their failures expected; a cause that no longer fails is stale.

The file format and its errors are checked directly (harness.records.expectations); the rest through small
in-process pytest runs of two clause files against self-test kernels: ``MaskSenseInverted`` (reads
the boolean mask the wrong way round: fails four clauses of those files, every failing case with a
boolean mask, the forward outputs matching ``mask_sense=attend``) and ``BaseKernel``, the same kernel
with the bug fixed. The runs' plan is cut to the clauses of those files, so that the verdict of a
two-file run is a whole verdict (DEVIATES AS EXPECTED, not PARTIAL) and each run takes about a second.
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


def _entry(behaviour: str = "reads True as may-attend", when: str = '["bool mask"]', **extra: str) -> str:
    fields = {
        "behaviour": behaviour,
        "when": when,
        "reason": "a mask of the other sense",
        "evidence": "w [0, 1]",
        **extra,
    }
    return "[[cause]]\n" + "".join(f"{k} = {v if v.startswith('[') else repr(v)}\n" for k, v in fields.items())


def _file(tmp_path: Path, *entries: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text("# Known causes of a self-test kernel\n" + "\n".join(entries), encoding="utf-8")
    return path


# -- the file format ---------------------------------------------------------------------------
def test_a_file_loads_into_causes_scoped_by_features(tmp_path):
    text = _entry(
        when='[["causal + mask"], ["causal", "decode T = 1"]]', matches="is_causal ignored", link="https://x.org/1"
    )
    (e,) = load(_file(tmp_path, text))
    assert (e.behaviour, e.matches, e.entry, e.link) == (
        "reads True as may-attend",
        "is_causal ignored",
        1,
        "https://x.org/1",
    )
    assert e.shows_on(frozenset({"causal + mask", "T == S"})) and e.shows_on(frozenset({"causal", "decode T = 1"}))
    assert not e.shows_on(frozenset({"causal", "T == S"}))
    assert e.when_text() == "causal + mask or (causal and decode T = 1)"


def test_a_cause_explains_a_failure_only_with_its_features_and_its_convention(tmp_path):
    (e,) = load(_file(tmp_path, _entry(matches="mask_sense=attend")))
    feats = "dtype=float32; forward (forward); bool mask; T < S"
    assert e.explains({"features": feats, "matches": ["mask_sense=attend"], "checked": True})
    assert e.explains({"features": feats, "matches": [], "checked": False})  # a backward: features alone
    assert not e.explains({"features": feats, "matches": ["causal_alignment=bottom-right"], "checked": True})
    assert not e.explains({"features": "dtype=float32; forward (forward); no mask", "checked": False})
    assert not e.explains({"features": None}) and not e.explains(None)  # nothing recorded: nothing explained
    worst = {"features": "dtype=float32; forward (forward); no mask", "checked": False}
    assert not e.explains({"features": feats, "checked": False, "worst": worst})  # every failing case must have them


def test_a_cause_that_raises_on_some_cases_explains_other_failures_only_off_them(tmp_path):
    """``raises_when``: ONNX Runtime refuses a negative scale in float32 and returns NaN in float64. On a
    float32 case only the refusal is the behaviour; on a float64 case a wrong output is."""
    (e,) = load(
        _file(
            tmp_path,
            _entry(when='["negative scale"]', raises="scale must be", raises_when='[["dtype=float32"]]'),
        )
    )
    f32, f64 = "dtype=float32; forward (forward); negative scale", "dtype=float64; forward (forward); negative scale"
    refused = {"error": "AdapterError", "message": "scale must be greater than 0"}
    assert e.explains({"features": f32, **refused})
    assert not e.explains({"features": f32, "error": "ClauseViolation", "message": "NaN"})  # float32 must raise
    assert e.explains({"features": f64, "error": "ClauseViolation", "message": "NaN"})
    assert not e.explains({"features": f64, "error": "AdapterError", "message": "something else"})
    worst = {"features": f32}
    assert not e.explains({"features": f64, "error": "ClauseViolation", "worst": worst})  # one float32 case in it
    (plain,) = load(_file(tmp_path, _entry(when='["negative scale"]', raises="scale must be"), name="p.toml"))
    assert not plain.explains({"features": f64, "error": "ClauseViolation", "message": "NaN"})  # raises everywhere


BAD = [
    (_entry(when='["bool mask", "made up"]'), "[[cause]] 1: unknown case feature(s) ['made up']"),
    (_entry(when="[]"), "'when' must be a non-empty list"),
    (_entry(when='"bool mask"'), "'when' must be a non-empty list"),
    (_entry(matches="mask_sense=sideways"), "'matches' = 'mask_sense=sideways' is not a convention"),
    ('[[cause]]\nbehaviour = "b"\nwhen = ["causal"]\nevidence = "x"\n', "[[cause]] 1: missing 'reason'"),
    ('[[cause]]\nbehaviour = " "\nwhen = ["causal"]\nreason = "r"\nevidence = "x"\n', "missing 'behaviour'"),
    ('[[cause]]\nbehaviour = "b"\nreason = "r"\nevidence = "x"\n', "missing 'when'"),
    (_entry(clause="GRAD-01"), "unknown key(s) ['clause']"),
    (_entry(raises_when='[["dtype=float32"]]'), "'raises_when' says where the behaviour raises: it needs 'raises'"),
    (_entry(raises="x", raises_when='["made up"]'), "unknown case feature(s) ['made up'] in 'raises_when'"),
    (_entry() + _entry(), "[[cause]] 2: behaviour 'reads True as may-attend' is already listed by [[cause]] 1"),
    ('[[deviation]]\nclause = "GRAD-01"\n', "[[deviation]] entries name clause ids"),
    ("[cause]\nbehaviour = 1\n", "'cause' must be an array of tables"),
    ("behaviour = 'x'\n", "unknown top-level key(s) ['behaviour']"),
    ("[[cause]\n", "not valid TOML"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m for _, m in BAD])
def test_a_bad_file_names_the_file_the_entry_and_the_problem(tmp_path, text, message):
    path = _file(tmp_path, text)
    with pytest.raises(ExpectationsError) as err:
        load(path)
    assert str(path) in str(err.value) and message in str(err.value)


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
    """A built-in adapter's own file (implementations/expectations/*.toml) loads: known features and
    conventions, at most four causes holding for the release the adapter was measured with (the others
    hold for older releases, each scoped by its ``versions``)."""
    from conformance import releases
    from conformance.harness.calls import registry

    shipped = sorted(expectations.expectations_dir().glob("*.toml"))
    for path in shipped:
        assert path.stem in registry.builtin_names(), f"{path.name}: no built-in adapter {path.stem!r}"
        entries = load(path)
        assert entries, f"{path}: an expectations file lists one cause or more"
        assert all(e.versions is None or e.library is None for e in entries), path
        measured = registry.resolve(path.stem).adapter
        measured = next(iter((getattr(measured, "measured_with", None) or {}).values()), None)
        held = [e for e in entries if e.versions is None or measured is None or releases.contains(e.versions, measured)]
        assert len(held) <= 4, f"{path}: a release's known causes are at most four entries ({len(held)})"


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


def test_a_known_cause_makes_its_failures_expected_and_the_run_passes(pytester, tmp_path, files_plan):
    path = _file(tmp_path, _entry(matches="mask_sense=attend"))
    result, out = _run(pytester, f"--impl={BROKEN}", f"--expectations={path}")
    assert result.ret == 0, out
    line = _headline(out, BROKEN)
    assert line.startswith(f"{BROKEN}: DEVIATES AS EXPECTED: ") and "4 expected failures (1 known cause)" in line, line
    assert "expected cause: reads True as may-attend (when bool mask): 16 clause tests, " + ", ".join(FAILING) in out
    assert "XFAIL" in out and "a mask of the other sense" in out and "[[cause]] 1" in out
    assert result.parseoutcomes().get("xfailed", 0) == 4 * len(FAILING)


@pytest.mark.parametrize(
    "entry,why",
    [
        (_entry(when='["bool mask", "GQA 4:1"]'), "the failing cases lack the cause's features"),
        (_entry(matches="causal_alignment=bottom-right"), "the failing outputs do not match the cause's convention"),
    ],
)
def test_a_cause_that_does_not_explain_the_failures_leaves_them_failures(pytester, tmp_path, files_plan, entry, why):
    result, out = _run(pytester, f"--impl={BROKEN}", f"--expectations={_file(tmp_path, entry)}")
    assert result.ret == 1, why + "\n" + out
    assert _headline(out, BROKEN).startswith(f"{BROKEN}: DOES NOT CONFORM: "), why
    failed = next(ln for ln in out.splitlines() if ln.startswith("failed clauses: "))
    explained_by_features_alone = {"ALL-BLOCKED-GRAD-03", "MASK-BEFORE-SOFTMAX-01"}  # outputs not checked there
    still = set(FAILING) if "GQA" in entry else set(FAILING) - explained_by_features_alone
    assert all(c in failed for c in still), (why, failed)


def test_a_fixed_behaviour_is_a_stale_cause_that_fails(pytester, tmp_path, files_plan):
    path = _file(tmp_path, _entry())
    result, out = _run(pytester, f"--impl={FIXED}", f"--expectations={FIXED}={path}")
    assert result.ret == 1, out
    line = _headline(out, FIXED)
    assert line.startswith(f"{FIXED}: DOES NOT CONFORM: ") and "1 stale expectation" in line, line
    assert "stale expectation: 'reads True as may-attend': no failing case with bool mask in this run" in out
    assert result.parseoutcomes().get("failed", 0) == 0  # every clause test passed: the cause is what is stale


def test_a_cause_the_run_never_reached_is_not_stale(pytester, tmp_path, files_plan):
    path = _file(tmp_path, _entry(when='["GQA 8:1 (MQA)", "dropout"]'))
    result, out = _run(pytester, f"--impl={FIXED}", f"--expectations={FIXED}={path}")
    assert result.ret == 0 and _headline(out, FIXED).startswith(f"{FIXED}: CONFORMS: "), out


def test_a_builtins_own_file_applies_by_default_and_none_shows_the_raw_verdict(
    pytester, tmp_path, files_plan, monkeypatch
):
    _file(tmp_path, _entry(), name="numpy.toml")
    monkeypatch.setattr(expectations, "expectations_dir", lambda: tmp_path)
    result, out = _run(pytester, "--impl=numpy")
    assert result.ret == 1 and "stale expectation: 'reads True as may-attend'" in out, out
    result, out = _run(pytester, "--impl=numpy", "--expectations=none")
    assert result.ret == 0 and _headline(out, "numpy").startswith("numpy: CONFORMS: "), out


def test_a_bad_file_on_the_command_line_is_a_usage_error(pytester, tmp_path):
    path = _file(tmp_path, _entry(when='["no such feature"]'))
    result, _ = _run(pytester, "--impl=numpy", f"--expectations={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in result.errlines if ln.startswith("ERROR:")]
    assert len(errors) == 1 and "[[cause]] 1: unknown case feature(s) ['no such feature']" in errors[0], errors


def test_an_expected_failure_is_not_shrunk(pytester, tmp_path):
    """ORACLE-AGREE-01 (property-based) fails on the counting kernel either way; with a known cause for
    it, it stops at the first failing example instead of shrinking it, and is still an expected failure."""
    from tests import counting_kernels

    spec = "tests.counting_kernels:CountingMaskAfterSoftmax"
    args = (str(CLAUSES_DIR / "test_agreement.py"), f"--impl={spec}", "-k", "float32", "--allow-partial")
    calls = {}
    for listed in (False, True):
        counting_kernels.CALLS["forward"] = 0
        path = _file(tmp_path, _entry(when='["dtype=float32"]'))
        extra = [f"--expectations={path}"] if listed else []
        result = pytester.runpytest_inprocess(*args, *extra, "-p", "no:cacheprovider", "-rx")
        calls[listed] = counting_kernels.CALLS["forward"]
        outcomes = result.parseoutcomes()
        assert outcomes.get("xfailed" if listed else "failed") == 1, result.stdout.str()[-3000:]
    assert 0 < calls[True] < calls[False], calls
