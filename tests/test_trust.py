"""Real bugs the suite once certified or misdiagnosed, each in a kernel of its own (tests/trust_kernels.py,
tests/discovery_kernels.py), certified in-process as a user would: the verdict and the first likely cause.

- a kernel with no scale argument and Dk == Dv required, whose dropout shares one keep-mask across heads
  and batch items: DROPOUT-INDEPENDENT-06 runs (its V = I probe passes no scale) and fails;
- 1e30 in one class of cases (float32 causal decode): the first cause names the magnitude, and behind
  rounding-size failures of the same clause the failure note and the cause name the worst case;
- a clipped softmax (blocked keys at e^-64): the first cause says blocked keys get a non-zero weight;
- causal as an additive -1e4 triangle: CAUSAL-EXACT-ZERO-06 fails, the cause names the finite fill;
- a fill of rows blocked entirely that depends on S (the mean of V at S = 8 and 16, NaN at S = 5): no
  ``--declare`` is proposed for it (discovery's findings for it are tests/test_discover.py's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # loaded before pytester snapshots sys.modules (it cannot load twice)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile", "worst_case_search")

CLAUSES = Path(__file__).resolve().parents[1] / "conformance" / "clauses"


def _certify(pytester, tmp_path, kernel: str, *args: str) -> tuple[object, dict, str]:
    """(result, the adapter's certificate entry, stdout) of one in-process certification."""
    cert = tmp_path / "cert.json"
    paths, rest = [a for a in args if a.endswith(".py")], [a for a in args if not a.endswith(".py")]
    result = pytester.runpytest_inprocess(
        *[str(CLAUSES / p) for p in paths], *rest, f"--impl={kernel}", "--declare=dropout=false", "--allow-partial",
        f"--certificate={cert}", "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    entry = json.loads(cert.read_text())["adapters"][kernel]
    return result, entry, result.stdout.str()


def _first_cause(entry: dict) -> dict:
    causes = entry["likely_causes"]["causes"]
    assert causes, json.dumps(entry["likely_causes"], indent=1)
    return causes[0]


def test_discovery_folds_nothing_on_a_crash():
    """An AssertionError on is_causal with a mask is no declared rejection class: the pair is not folded
    (causal_with_mask stays undecided, so the call passes both and fails), and a finding names the crash
    (tests/test_discover.py certifies the kernel under --discover: CAUSAL-WITH-MASK-ARGS-05 fails)."""
    from conformance.harness.discovery import discover as discovery

    found, _ = discovery.discover_spec("tests.discovery_kernels:asserts_causal_with_mask")
    m = next(m for m in found.measured if m.field == "causal_with_mask")
    assert found.declaration.causal_with_mask is None and m.evidence.startswith("kept"), m
    assert "causal_with_mask" not in found.changes(), found.declare_line()
    assert any("raised AssertionError" in f and "a crash, not a rejection" in f for f in found.findings), found.findings


@pytest.mark.thorough  # a whole certification in a child pytest (10 s)
def test_no_scale_argument_does_not_silence_the_dropout_clauses(pytester, tmp_path):
    cert = tmp_path / "cert.json"
    spec = "tests.trust_kernels:shared_dropout"
    result = pytester.runpytest_inprocess(
        str(CLAUSES / "test_dropout_structure.py"), "-k", "independent", f"--impl={spec}",
        "--declare=custom_scale=false", "--declare=requires_dk_eq_dv=true", "--allow-partial",
        f"--certificate={cert}", "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    clause = json.loads(cert.read_text())["adapters"][spec]["clauses"]["DROPOUT-INDEPENDENT-06"]
    assert clause["outcome"] == "fail" and clause["detail"].startswith("failed: float64, float32, float16, bfloat16"), (
        clause
    )
    assert "dropout masks are not independent across heads" in out


def test_one_class_of_1e30_is_the_first_cause(pytester, tmp_path):
    _, entry, out = _certify(
        pytester, tmp_path, "tests.trust_kernels:huge_on_causal_decode", "test_causal.py", "-k", "decode or triangle"
    )
    first = _first_cause(entry)
    assert first["wrong_values"] and first["clause_ids"] == ["CAUSAL-DECODE-03"], first
    assert "got 1e+30" in first["errors"]["float32"]["worst"], first["errors"]
    head = out.index("likely causes")
    assert "1. wrong values, not rounding:" in out[head:] and "got 1e+30" in out[head:], out[head:]


def test_the_worst_case_behind_rounding_slips(pytester, tmp_path):
    """float32 outputs 2^-10 off everywhere and 1e30 in causal decode: CAUSAL-DECODE-03 fails first on the
    slip, goes on past it, and reports the 1e30 (a note on the failure, and its record for the causes)."""
    result, entry, out = _certify(
        pytester, tmp_path, "tests.trust_kernels:slips_and_huge", "test_causal.py", "-k", "decode and float32"
    )
    assert result.ret == 1, out[-3000:]
    assert "the worst of" in out and "got 1e+30" in out, out[-3000:]
    (failure,) = [f for f in entry["failures"] if f["clause"] == "CAUSAL-DECODE-03"]
    assert failure["message"].startswith("output: 64 of 64"), failure  # the first failing case: the slip
    first = _first_cause(entry)
    assert first["wrong_values"] and "got 1e+30" in first["errors"]["float32"]["worst"], first


def test_a_clipped_softmax_is_a_blocked_weight_not_a_precision(pytester, tmp_path):
    _, entry, out = _certify(
        pytester, tmp_path, "tests.trust_kernels:clipped_softmax", "test_masks.py", "test_causal.py",
        "-k", "before_softmax or triangle",
    )  # fmt: skip
    first = _first_cause(entry)
    assert first["features"] == ["blocked keys get a non-zero weight"] and 1e-29 < first["blocked_weight"] < 1e-27, (
        first
    )
    head = out.index("likely causes")
    assert "blocked keys get weight up to 1.6e-28" in out[head:], out[head:]


def test_causal_as_a_finite_triangle_fails_and_says_so(pytester, tmp_path):
    result, entry, out = _certify(
        pytester, tmp_path, "tests.trust_kernels:causal_finite_triangle", "test_causal.py", "-k", "exactly_zero"
    )
    assert result.ret == 1 and "CAUSAL-EXACT-ZERO-06" in out, out[-3000:]
    first = _first_cause(entry)
    assert first["declare"] == "finite additive fill", first
    assert "finite additive fill (such as -1e4" in out[out.index("likely causes") :]


def test_a_fill_that_depends_on_s_gets_no_declare(pytester, tmp_path):
    _, entry, out = _certify(
        pytester, tmp_path, "tests.discovery_kernels:fill_by_length", "test_masks.py", "-k", "all_blocked_rows"
    )
    causes = entry["likely_causes"]["causes"]
    assert causes and not any(c["declare"] for c in causes), json.dumps(causes, indent=1)
    assert causes[0]["conflicts"] == {"all_blocked": ["mean-v", "nan"]}, causes[0]
    assert "--declare all_blocked" not in out
