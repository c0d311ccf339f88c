"""Bad invocations end in one clear line and exit code 4 (pytest's usage-error code), before any test runs.

A certification run is often scripted; a typo in ``--impl`` must not turn into "0 tests ran, exit 5"
or a traceback, and conflicting options must not silently pick one meaning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


# In-process pytester runs load hypothesis profiles globally (tests/conftest.py restores ours).
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")

CLAUSE = str(Path(__file__).resolve().parents[1] / "conformance" / "clauses" / "test_worked_example.py")

BAD = [
    (["--impl=no-such-kernel"], "unknown --impl 'no-such-kernel'"),
    (["--impl=no_such_module_xyz:Adapter"], "cannot import module 'no_such_module_xyz'"),
    (["--impl=tests.misbehaving:NoSuchAttr"], "has no attribute 'NoSuchAttr'"),
    (["--impl=tests.misbehaving:__doc__"], "neither an adapter"),
    (["--declare=grad=false"], "--declare needs --impl"),
    (["--impl=numpy", "--declare=no_such_field=1"], "expected KEY=VALUE"),
    (["--impl=numpy", "--declare=grad=maybe"], "expected true or false"),
    (["--impl=numpy", "--call-timeout=-1"], "--call-timeout=-1"),
    (["--impl=numpy", "--conformance-random-seeds", "--conformance-profile=thorough"], "--conformance-random-seeds"),
]


@pytest.mark.parametrize("args,line", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_invocation_is_one_line_and_exit_4(pytester, args, line):
    result = pytester.runpytest_inprocess(CLAUSE, *args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    errors = [ln for ln in result.errlines if ln.startswith("ERROR:")]
    assert len(errors) == 1 and line in errors[0], result.errlines
    assert "Traceback" not in result.stderr.str()
    assert "passed" not in result.stdout.str()


def test_baseline_and_record_baseline_conflict(pytester, tmp_path):
    probe = pytester.runpytest_inprocess("--help")
    if "--record-baseline" not in probe.stdout.str():
        pytest.skip("the baseline sub-plugin is not installed here")
    result = pytester.runpytest_inprocess(
        CLAUSE,
        "--impl=numpy",
        f"--baseline={tmp_path / 'a'}",
        f"--record-baseline={tmp_path / 'b'}",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in result.errlines if ln.startswith("ERROR:")]
    assert len(errors) == 1 and "--baseline and --record-baseline conflict" in errors[0], result.errlines


def test_good_invocation_still_runs(pytester):
    result = pytester.runpytest_inprocess(CLAUSE, "--impl=numpy", "-p", "no:cacheprovider", "--allow-partial")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()


def test_one_clause_file_is_a_partial_run(pytester):
    """A file subset passes its tests but certifies nothing: PARTIAL, and a non-zero exit for CI gates."""
    result = pytester.runpytest_inprocess(CLAUSE, "--impl=numpy", "-p", "no:cacheprovider")
    assert result.ret == 6, result.stdout.str()
    assert any(ln.startswith("numpy: PARTIAL: 1/") for ln in result.outlines), result.stdout.str()
