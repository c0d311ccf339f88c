"""A misbehaving kernel fails the clause that was running, with a message naming what it did, and the
run goes on: the other clauses still run and pass, and the session ends.

Each case runs the real plugin in-process (pytester) on two clause modules against one adapter from
tests/misbehaving.py that misbehaves only on the worked example.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


# In-process pytester runs load hypothesis profiles globally (tests/conftest.py restores ours).
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")

CLAUSES = Path(__file__).resolve().parents[1] / "conformance" / "clauses"

CASES = [
    ("Raises", "raised RuntimeError: kernel exploded on purpose"),
    ("WrongShape", "output.shape=(1, 1, 1, 1), but should be (1, 1, 1, 2)"),
    ("WrongDtype", "output.dtype=float64, but should be float32 (the input dtype)"),
    ("WrongType", "output is list, but should be numpy.ndarray"),
    ("NonFinite", "NaN where a number was expected"),
    ("ModifiesInput", "modified its input 'query' in place"),
    ("ReturnsView", "output shares memory with an input"),
    ("Hangs", "did not return within 1 s (--call-timeout)"),
    ("Spins", "did not return within 1 s (--call-timeout)"),
    ("SilencesNumpy", "left process state its caller relies on changed"),
    ("DrawsGlobalRandom", "NumPy's global random generator (numpy.random.get_state): drawn from"),
    ("RewritesEarlierResult", "changed a result it returned earlier"),
]


def _run(pytester: pytest.Pytester, adapter: str, *modules: str):
    paths = [str(CLAUSES / m) for m in modules]
    start = time.monotonic()
    result = pytester.runpytest_inprocess(
        *paths, f"--impl=tests.misbehaving:{adapter}", "--call-timeout=1", "-p", "no:cacheprovider", "-rf"
    )
    return result, time.monotonic() - start


def _failed_clauses(result) -> list[str]:
    for line in result.outlines:
        if line.startswith("failed clauses: "):
            return sorted(set(re.findall(r"([A-Z][A-Z0-9-]+) \[", line)))
    return []


@pytest.mark.parametrize("adapter,message", CASES, ids=[c[0] for c in CASES])
def test_misbehaviour_fails_only_the_running_clause(pytester, adapter, message):
    result, elapsed = _run(pytester, adapter, "test_worked_example.py", "test_softmax.py")
    text = result.stdout.str()
    assert message in text, text[-3000:]
    assert _failed_clauses(result) == ["WORKED-EXAMPLE-01"], text[-3000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1
    # the softmax clause ran on every dtype after (or around) the failure, and passed
    passed = [ln for ln in result.outlines if "test_softmax.py" in ln and "PASSED" in ln]
    assert outcomes.get("passed", 0) >= 4, text[-3000:]
    assert not any("test_softmax.py" in ln and "FAILED" in ln for ln in result.outlines), passed
    assert elapsed < 20, f"the run took {elapsed:.1f} s: a hang was not cut off"
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_state_leaking_between_calls_is_caught(pytester):
    result, _ = _run(pytester, "LeaksState", "test_self_consistency.py", "test_softmax.py")
    text = result.stdout.str()
    assert "returned exactly the first call's result" in text, text[-3000:]
    assert _failed_clauses(result) == ["SELF-CONSISTENT-01"], text[-3000:]
    assert not any("test_softmax.py" in ln and "FAILED" in ln for ln in result.outlines)


def test_well_behaved_base_passes_the_same_modules(pytester):
    """Control: the same modules against the correct base kernel pass, so the failures above are the misbehaviour's."""
    result = pytester.runpytest_inprocess(
        str(CLAUSES / "test_worked_example.py"),
        str(CLAUSES / "test_softmax.py"),
        str(CLAUSES / "test_self_consistency.py"),
        "--impl=tests.mutants:BaseKernel",
        "-p",
        "no:cacheprovider",
        "--allow-partial",
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]


def test_xdist_summary_aggregates_worker_results(pytester, monkeypatch):
    """Under ``-n 2`` the per-clause results live in the workers; the controller's summary must still count them."""
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", str(CLAUSES.parents[1]))
    result = pytester.runpytest_subprocess(
        str(CLAUSES / "test_worked_example.py"),
        str(CLAUSES / "test_softmax.py"),
        "--impl=tests.misbehaving:Raises",
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
    )
    text = result.stdout.str()
    # both workers' results: SOFTMAX-AXIS-01 passed on one, WORKED-EXAMPLE-01 failed on the other
    assert "tests.misbehaving:Raises: DOES NOT CONFORM: 1/" in text and "clauses passed, 1 failed" in text, text[-3000:]
    assert "failed clauses: WORKED-EXAMPLE-01 [tests.misbehaving:Raises]" in text
