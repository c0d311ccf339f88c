"""Self-tests of the golden set: any damage is reported by file name, and a regeneration is held to
the stated float64 bound (conformance/fixtures/agreement.py), not to bitwise equality, so the set
verifies on any CPU while a change of the oracle's meaning is still caught."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance import fixtures, oracle
from conformance.contract import Case
from conformance.fixtures import agreement, golden
from tests.clause_runner import load_clauses, run_clause
from tests.mutants import MUTANTS


@pytest.fixture
def copy(tmp_path):
    d = tmp_path / "golden"
    shutil.copytree(fixtures.default_dir(), d)
    return d


def test_generate_then_verify_round_trips(tmp_path):
    manifest = fixtures.write(tmp_path)
    assert fixtures.verify(tmp_path) == []
    assert sum((tmp_path / n).stat().st_size for n in manifest["files"]) < 1_000_000
    again = tmp_path / "again"
    fixtures.write(again)
    assert (again / "manifest.json").read_bytes() == (tmp_path / "manifest.json").read_bytes()


def test_committed_set_verifies():
    report = fixtures.verification()
    assert report.problems == []
    assert "regenerated: within the float64 bound" in report.summary()
    assert report.inputs_total and len(report.expected) == 5 * len(
        json.loads((fixtures.default_dir() / "manifest.json").read_text())["files"]
    )


def _rewrite(directory: Path, name: str, arrays: dict[str, np.ndarray]) -> None:
    """Replace a fixture's arrays and its manifest hash, so that only the regeneration check can object."""
    data = golden.npz_bytes(arrays)
    (directory / name).write_bytes(data)
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"][name]["sha256"] = golden.sha256(data)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def _stored(directory: Path, name: str) -> dict[str, np.ndarray]:
    with np.load(directory / name, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _reordered(fx: fixtures.GoldenFixture) -> dict[str, np.ndarray]:
    """The fixture's answers from the oracle with every reduction run backwards (queries, keys and
    both feature axes reversed; causal and -inf entries as an explicit mask): the same float64
    mathematics in another summation order, as another CPU's SIMD kernels would do it."""
    case = fx.case
    alignment, policy = fx.conventions["causal_alignment"][0], fx.conventions["all_blocked"][0]
    blocked, bias = oracle.blocked_and_bias(case, alignment)
    flipped = Case(
        np.flip(case.query, (2, 3)),
        np.flip(case.key, (2, 3)),
        np.flip(case.value, (2, 3)),
        mask=np.flip(blocked, (2, 3)),
        bias=None if case.bias is None else np.flip(bias, (2, 3)),
        scale=case.scale,
    )
    answers = golden._answers(flipped, np.flip(fx.grad_out, (2, 3)), policy, "top-left")
    return {k: np.ascontiguousarray(np.flip(a, (2, 3))) for k, a in answers.items()}


def test_a_reduction_order_regeneration_is_within_the_bound_and_not_bitwise(copy):
    for fx in fixtures.load_set(copy):
        _rewrite(copy, fx.name, {**_stored(copy, fx.name), **_reordered(fx)})
    report = fixtures.verification(copy)
    assert report.problems == [], report.problems[:5]
    assert any(not a.bitwise for a in report.expected.values())  # the orders really differ
    assert "within the float64 bound" in report.summary() and "bitwise equal: no" in report.summary()


@pytest.mark.parametrize("key", ["out", "weights", "dq", "dk", "dv"])
def test_the_bound_check_fails_just_beyond_the_bound_and_passes_inside(copy, key):
    name = "large-logits-float32.npz" if key in ("dq", "dk") else "cross-float32.npz"
    fx = next(f for f in fixtures.load_set(copy) if f.name == name)
    allow = agreement.allowances(fx.case, fx.grad_out, oracle.forward(fx.case))[key]
    stored = _stored(copy, name)
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(allow.magnitude)), stored[key].shape))
    for fraction, inside in ((0.5, True), (1.5, False)):
        arr = stored[key].copy()
        arr[idx] += fraction * np.broadcast_to(allow.allowed, arr.shape)[idx]
        _rewrite(copy, name, {**stored, key: arr})
        problems = fixtures.verify(copy)
        if inside:
            assert problems == []
        else:
            assert len(problems) == 1 and problems[0].startswith(f"{name}: array {key!r}"), problems
            assert "outside the float64 regeneration bound" in problems[0] and str(list(idx)) in problems[0]


def test_a_relative_change_of_1e_11_is_outside_the_bound(copy):
    """Independent of the bound's own numbers: a change far below any tolerance of the clauses is seen."""
    name = "cross-float64.npz"
    stored = _stored(copy, name)
    _rewrite(copy, name, {**stored, "out": stored["out"] * (1 + 1e-11)})
    assert any(p.startswith(f"{name}: array 'out'") and "outside" in p for p in fixtures.verify(copy))


def test_an_input_the_case_builder_does_not_regenerate_is_reported(copy):
    name = "cross-float32.npz"
    stored = _stored(copy, name)
    q = stored["query"].copy()
    q.flat[3] = np.nextafter(np.nextafter(q.flat[3], np.float32(np.inf)), np.float32(np.inf))  # two steps
    _rewrite(copy, name, {**stored, "query": q})
    assert any(
        p == f"{name}: input 'query' is not what the case builder regenerates (more than one step of its dtype apart)"
        for p in fixtures.verify(copy)
    )


def test_the_committed_set_verifies_with_another_cpus_simd_kernels():
    """NumPy's SIMD dispatch chooses the summation order and exp of the oracle by CPU. Turning off the
    dispatched targets this CPU has reproduces, on this machine, a CPU without them (on an AVX-512
    machine: hundreds of element-ulps of difference in dk, 213 arrays not bitwise equal)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    targets = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    if not targets:
        pytest.skip("this CPU runs no dispatched SIMD target of NumPy: nothing to turn off")
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=" ".join(targets))
    run = subprocess.run(
        [sys.executable, "-m", "conformance.fixtures", "verify"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "OK; hashes match; regenerated: within the float64 bound" in run.stdout


def test_every_file_loads_without_pickle_and_is_described():
    manifest = json.loads((fixtures.default_dir() / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        with np.load(fixtures.default_dir() / name, allow_pickle=False) as z:
            assert set(entry["arrays"]) == set(z.files), name
        assert entry["spec_revision"] and entry["generator_version"] == fixtures.GENERATOR_VERSION
        assert set(entry["conventions"]) == {"all_blocked", "causal_alignment"}
    loaded = {fx.name: fx for fx in fixtures.load_set()}
    assert loaded["worked-bfloat16.npz"].case.dtype == "bfloat16"
    np.testing.assert_array_equal(loaded["worked-float32.npz"].expected["out"].ravel(), [1.0, 2.0])
    np.testing.assert_array_equal(loaded["worked-k2-blocked-float64.npz"].expected["out"].ravel(), [2.0, 0.0])


def test_coverage_of_conventions_and_dtypes():
    fx = fixtures.load_set()
    assert {f.case.dtype for f in fx} == {"float64", "float32", "float16", "bfloat16"}
    for policy in ("zeros", "nan", "mean-v"):
        assert any(f.conventions["all_blocked"] == [policy] for f in fx), policy
    for alignment in ("top-left", "bottom-right"):
        assert any(f.conventions["causal_alignment"] == [alignment] for f in fx), alignment
    assert any(f.case.is_gqa for f in fx) and any(f.case.scale is not None for f in fx)
    assert any(f.case.bias is not None for f in fx)


def _flip_byte(path, offset=-40):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_tampered_file_is_named_with_both_hashes(copy):
    target = copy / "cross-float32.npz"
    want = json.loads((copy / "manifest.json").read_text())["files"][target.name]["sha256"]
    _flip_byte(target)
    problems = fixtures.verify(copy)
    hit = [p for p in problems if p.startswith("cross-float32.npz")]
    assert hit and want in hit[0] and golden.sha256(target.read_bytes()) in hit[0]
    with pytest.raises(fixtures.FixtureError, match="cross-float32.npz"):
        fixtures.load_set(copy)


def test_tampered_fixture_fails_the_golden_clause(copy, monkeypatch):
    _flip_byte(copy / "self-float64.npz")
    monkeypatch.setenv("SDPA_GOLDEN_DIR", str(copy))
    verdict = run_clause(load_clauses()["GOLDEN-01"], MUTANTS["base"](), "float32")
    assert verdict.startswith("failed") and "self-float64.npz" in verdict and "sha256 mismatch" in verdict


def test_missing_file_is_reported(copy):
    (copy / "gqa.npz").unlink()
    problems = fixtures.verify(copy)
    assert any(p.startswith("gqa.npz: missing") and "expected sha256" in p for p in problems)


def test_unknown_file_is_reported(copy):
    shutil.copy(copy / "gqa.npz", copy / "stray.npz")
    assert any(p.startswith("stray.npz: not in the manifest") for p in fixtures.verify(copy))


def test_unknown_generator_version_is_reported(copy):
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["generator_version"] = "999"
    path.write_text(json.dumps(manifest))
    problems = fixtures.verify(copy)
    assert any("generator version '999' is unknown" in p for p in problems)
    with pytest.raises(fixtures.FixtureError, match="999"):
        fixtures.load_set(copy)


def test_cli_verify_exit_codes(copy, capsys):
    from conformance.fixtures.__main__ import main

    assert main(["verify", "--dir", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "hashes match; regenerated: within the float64 bound" in out and "bitwise equal: " in out
    stored = _stored(copy, "gqa.npz")
    _rewrite(copy, "gqa.npz", {**stored, "dv": stored["dv"] * (1 + 1e-9)})  # hash fine, value out of bound
    assert main(["verify", "--dir", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "gqa.npz: array 'dv'" in err and "regenerated: OUTSIDE the float64 bound" in err
    _flip_byte(copy / "bias.npz")
    assert main(["verify", "--dir", str(copy)]) == 1
    assert "bias.npz" in capsys.readouterr().err


def test_drift_mutant_fails_golden_but_base_passes():
    info = load_clauses()["GOLDEN-01"]
    assert run_clause(info, MUTANTS["base"](), "float32") == "passed"
    verdict = run_clause(info, MUTANTS["output_drift_1e-3"](), "float32")
    assert verdict.startswith("failed") and "golden fixtures checked in float32 disagree" in verdict


def test_refused_fixtures_fail_the_golden_clause_unless_declared_away():
    """A kernel cannot pass GOLDEN-01 by refusing the fixtures it gets wrong: a refusal of a fixture
    its declaration covers fails the clause; declaring the feature away makes those fixtures not apply."""
    from conformance.contract import NotApplicable
    from implementations.numpy_kernel import NumpyAdapter

    class RefusesCausal(NumpyAdapter):
        def forward(self, case):
            if case.is_causal:
                raise NotApplicable("no causal here")
            return super().forward(case)

    info = load_clauses()["GOLDEN-01"]
    kernel = RefusesCausal()
    verdict = run_clause(info, kernel, "float32")
    assert verdict.startswith("failed") and "were refused although the declaration covers them" in verdict, verdict
    assert "causal-float32.npz" in verdict and "--declare causal=false" in verdict
    kernel.declaration = kernel.declaration.replace(causal=False)
    assert run_clause(info, kernel, "float32") == "passed"
