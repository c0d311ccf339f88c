"""On keras's NumPy backend, wrapped as a plain SDPA-signature function (tests/cause_kernels_keras.py),
the first ``likely causes`` line of rounding-size errors names float64, with the ``--declare`` that
describes it (wrong values, not rounding, are listed before it: the mean of V on blocked rows, float16
NaN). Skipped where keras (or its NumPy backend) is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile", "worst_case_search")

kernels = pytest.importorskip("tests.cause_kernels_keras")  # loaded before pytester snapshots sys.modules
if kernels.UNAVAILABLE:
    pytest.skip(kernels.UNAVAILABLE, allow_module_level=True)

CLAUSES = Path(__file__).resolve().parents[1] / "conformance" / "clauses"


@pytest.mark.thorough  # keras-numpy's first cause end to end in a child pytest (10 s)
def test_keras_numpy_first_cause_is_float64(pytester, tmp_path):
    cert = tmp_path / "cert.json"
    spec = "tests.cause_kernels_keras:keras_sdpa"
    modules = [str(CLAUSES / m) for m in ("test_masks.py", "test_causal.py", "test_precision.py")]
    result = pytester.runpytest_inprocess(
        *modules, f"--impl={spec}", "--declare=grad=false", "--declare=dropout=false", "--declare=gqa=false",
        "--allow-partial", f"--certificate={cert}", "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 1, out
    causes = json.loads(cert.read_text())["adapters"][spec]["likely_causes"]["causes"]
    # Wrong values (the mean of V on blocked rows, float16 NaN) come first; the first rounding-size cause
    # is float64's, with its --declare.
    n, first = next((i, c) for i, c in enumerate(causes, 1) if not c["wrong_values"])
    assert all(c["wrong_values"] for c in causes[: n - 1]), causes
    assert first["features"] == ["dtype=float64"] and first["declare"] == "float64_computed_as=float32", first
    lines = out.splitlines()
    at = lines.index(next(ln for ln in lines if ln.strip().startswith(f"{n}. dtype=float64:")))
    assert "--declare float64_computed_as=float32" in "\n".join(lines[at : at + 3]), out
