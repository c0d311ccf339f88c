"""Expectations and declarations scoped by release: one file, one adapter, every release of a library.

The range matching is checked directly (with packaging, and the fallback parser on the same table); the
file format's ``versions`` and ``library`` keys and their errors through ``load``; what a run does with a
cause of another release through the same small in-process runs as tests/test_expectations.py (the
release of the kernel's library made to answer 1.5).
"""

from __future__ import annotations

import pytest

from conformance import releases
from conformance.harness.records import expectations
from conformance.harness.records.expectations import ExpectationsError, in_release, load
from tests import test_expectations
from tests.test_expectations import BROKEN, FAILING, FIXED, _entry, _file, _headline, _run

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")

RANGES = [
    (">=3.6,<3.15", "3.6.0", True),
    (">=3.6,<3.15", "3.14.1", True),
    (">=3.6,<3.15", "3.15.0", False),
    (">=3.6,<3.15", "3.5", False),
    ("<0.10.1", "0.10.0", True),
    ("<0.10.1", "0.10.1", False),
    ("==2.13.0", "2.13.0+cpu", True),  # a local build label is not a release
    ("<2.14", "2.13.0+cpu", True),
    ("~=1.27.0", "1.27.3", True),
    ("~=1.27.0", "1.28.0", False),
    ("==1.27.*", "1.27.9", True),
    ("!=0.9.0", "0.9.0", False),
    ("<=0.8.1", "0.8.1", True),
    (">0.8.1", "0.8.2", True),
]


@pytest.mark.parametrize("spec,version,inside", RANGES)
def test_a_release_range_holds_the_releases_pep440_says(spec, version, inside):
    assert releases.contains(spec, version) is inside
    assert releases._fallback(spec, version.split("+")[0]) is inside  # the parser used without packaging


@pytest.mark.parametrize("bad", ["", "3.6", ">= three", ">=3.6;<3.15", 3.6])
def test_a_release_range_that_is_not_one_is_an_error(bad):
    with pytest.raises(releases.ReleaseRangeError, match="is not a release range"):
        releases.check(bad)


def test_a_declaration_table_gives_the_fields_of_the_release():
    table = {"<1.28": {"all_blocked": "mean-v"}, ">=1.30": {"float64_computed_as": "float32"}}
    assert releases.for_release(table, "1.27.0") == {"all_blocked": "mean-v"}
    assert releases.for_release(table, "1.28.0") == {}
    assert releases.for_release(table, "1.32.0") == {"float64_computed_as": "float32"}
    assert releases.for_release(table, None) == {}


class _Adapter:
    measured_with = {"lib": "2.0", "other": "1.0"}


def test_a_cause_holds_for_the_releases_of_its_library(tmp_path, monkeypatch):
    path = _file(
        tmp_path,
        _entry("old bug", versions=">=1.0,<2.0"),
        _entry("new bug", versions=">=2.0"),
        _entry("always"),
        _entry("of the other library", versions="<1.0", library="other"),
    )
    entries = load(path)
    assert [e.versions for e in entries] == [">=1.0,<2.0", ">=2.0", None, "<1.0"]
    monkeypatch.setattr(releases, "installed", {"lib": "1.5", "other": "1.0"}.get)
    held, others = in_release(entries, _Adapter())
    assert [e.behaviour for e in held] == ["old bug", "always"]
    assert [(e.behaviour, why) for e, why in others] == [
        ("new bug", "lib 1.5 is outside >=2.0"),
        ("of the other library", "other 1.0 is outside <1.0"),
    ]
    monkeypatch.setattr(releases, "installed", lambda dist: None)  # not installed: nothing to rule out
    assert len(in_release(entries, _Adapter())[0]) == 4


def test_one_behaviour_may_be_listed_once_per_release_range(tmp_path):
    both = _file(tmp_path, _entry("b", versions="<2"), _entry("b", when='["causal"]', versions=">=2"))
    assert len(load(both)) == 2
    with pytest.raises(ExpectationsError, match="already listed"):
        load(_file(tmp_path, _entry("b", versions="<2"), _entry("b", versions="<2"), name="twice.toml"))


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"versions": ">= three"}, "'versions' = '>= three' is not a release range"),
        ({"library": "torch"}, "'library' names the distribution whose releases 'versions' counts"),
    ],
)
def test_a_bad_release_key_names_the_entry(tmp_path, extra, message):
    with pytest.raises(ExpectationsError, match=r"\[\[cause\]\] 1: " + message):
        load(_file(tmp_path, _entry(**extra)))


# -- runs: the release of the kernel's library made to answer 1.5 -------------------------------------
files_plan = test_expectations.files_plan  # the plan cut to the clauses of the two files run


@pytest.fixture
def release_1_5(monkeypatch):
    monkeypatch.setattr(expectations, "release_of", lambda entry, adapter: ("lib", "1.5"))


def test_a_cause_of_the_release_explains_its_failures(pytester, tmp_path, files_plan, release_1_5):
    path = _file(tmp_path, _entry(matches="mask_sense=attend", versions=">=1.0,<2.0"))
    result, out = _run(pytester, f"--impl={BROKEN}", f"--expectations={path}")
    assert result.ret == 0 and _headline(out, BROKEN).startswith(f"{BROKEN}: DEVIATES AS EXPECTED: "), out


def test_a_cause_of_other_releases_explains_nothing(pytester, tmp_path, files_plan, release_1_5):
    path = _file(tmp_path, _entry(matches="mask_sense=attend", versions=">=2.0"))
    result, out = _run(pytester, f"--impl={BROKEN}", f"--expectations={path}")
    assert result.ret == 1 and _headline(out, BROKEN).startswith(f"{BROKEN}: DOES NOT CONFORM: "), out
    failed = next(ln for ln in out.splitlines() if ln.startswith("failed clauses: "))
    assert all(c in failed for c in FAILING), failed


def test_a_fixed_cause_of_other_releases_is_not_stale_here(pytester, tmp_path, files_plan, release_1_5):
    path = _file(tmp_path, _entry(versions="<1.0"))
    result, out = _run(pytester, f"--impl={FIXED}", f"--expectations={FIXED}={path}")
    assert result.ret == 0 and _headline(out, FIXED).startswith(f"{FIXED}: CONFORMS: "), out
    path = _file(tmp_path, _entry(versions="<2.0"), name="in-range.toml")  # in its range, fixed: stale
    result, out = _run(pytester, f"--impl={FIXED}", f"--expectations={FIXED}={path}")
    assert result.ret == 1 and "1 stale expectation" in _headline(out, FIXED), out


def test_the_certificate_lists_a_cause_of_other_releases_as_not_applied(pytester, tmp_path, files_plan, release_1_5):
    import json

    path = _file(tmp_path, _entry(versions="<1.0"))
    cert = tmp_path / "cert.json"
    result, out = _run(pytester, f"--impl={FIXED}", f"--expectations={FIXED}={path}", f"--certificate={cert}")
    assert result.ret == 0, out
    (entry,) = json.loads(cert.read_text())["adapters"][FIXED]["expectations"]["entries"]
    assert (entry["status"], entry["why"], entry["versions"]) == ("other releases", "lib 1.5 is outside <1.0", "<1.0")
