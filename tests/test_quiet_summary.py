"""A certification ends with its verdict: no per-test skip or expected-failure line repeats what the
verdict summary accounts for (harness.run.quiet_summary), while the lines of other tests, failures
and an explicit ``-r`` stay."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHAPES = str(ROOT / "conformance" / "clauses" / "test_shapes.py")
pytest_plugins = ["pytester"]


@pytest.fixture
def run(pytester, restore_hypothesis_profile):
    """One clause on numpy declared float32-only (its other dtypes skip as not applicable), beside a
    self-test of its own that skips, under ``addopts = -ra`` as in this project's pyproject.toml."""
    pytester.makeini("[pytest]\naddopts = -ra\n")
    mine = pytester.makepyfile(test_mine="import pytest\n\ndef test_mine():\n    pytest.skip('my own reason')\n")

    def go(*extra: str):
        return pytester.runpytest_inprocess(
            SHAPES, str(mine), "--impl=numpy", "--declare=dtypes=float32", "-k", "output_shape or mine",
            "--allow-partial", "-p", "no:cacheprovider", *extra,
        )  # fmt: skip

    return go


def test_the_verdict_accounts_for_the_skips_and_their_lines_are_left_out(run):
    result = run()
    assert any(ln.startswith("numpy: PARTIAL: 1/") for ln in result.stdout.lines)  # the verdict's account
    skip_lines = [ln for ln in result.stdout.lines if ln.startswith("SKIPPED")]
    assert skip_lines == [next(ln for ln in skip_lines if "my own reason" in ln)], skip_lines
    result.assert_outcomes(passed=1, skipped=4)  # the closing counts still count every skip
    verdict = next(i for i, ln in enumerate(result.stdout.lines) if ln.startswith("numpy: "))
    tail = [ln for ln in result.stdout.lines[verdict:] if ln.strip()]
    assert len(tail) < 12, tail  # the verdict stays on the last screen


def test_an_explicit_r_on_the_command_line_is_honoured(run):
    result = run("-rs")
    assert sum("not applicable to numpy" in ln for ln in result.stdout.lines if ln.startswith("SKIPPED")) >= 1
