"""The self-tests' short summary lists the skips that say what a machine lacks and counts those by design."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_by_design_skips_are_counted_and_missing_ones_listed(pytester):
    pytester.makeconftest("from tests.skip_summary import pytest_terminal_summary  # noqa: F401\n")
    tests = pytester.mkdir("tests")
    (tests / "test_x.py").write_text(
        "import pytest\n"
        "def test_a():\n    pytest.skip('thorough tier: runs with `pytest tests -m thorough`')\n"
        "def test_b():\n    pytest.skip('CLAUSE-01 applies to none of the held-out zoo kernels\\' declarations')\n"
        "def test_c():\n    pytest.skip('mlx is not installed; its adapters cannot run')\n"
    )
    out = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-o", "addopts=-ra", "tests").stdout.str()
    assert "SKIPPED [1] tests/test_x.py:7: mlx is not installed" in out, out
    assert "thorough tier: runs" not in out and "held-out zoo" not in out, out
    assert "self-tests skipped by design, not listed above: 1 the thorough tier (pytest tests -m thorough); " in out
    assert "1 not applicable to the kernels' declarations" in out
    out = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs", "tests").stdout.str()
    assert "thorough tier: runs" in out, "an -r on the command line shows every skip"


@pytest.mark.parametrize("reason", ["torch is not installed", "no CUDA device", "could not import 'mlx'"])
def test_what_a_machine_lacks_is_never_by_design(reason):
    from tests.skip_summary import kind_of

    assert kind_of(reason) is None
