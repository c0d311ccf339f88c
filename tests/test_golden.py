"""Self-tests of the golden set: it regenerates bitwise, and any damage is reported by file name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conformance import fixtures
from conformance.fixtures import golden
from tests.clause_runner import load_catalog, run_clause
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
    assert fixtures.verify() == []


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
    verdict = run_clause(load_catalog()["GOLDEN-01"], MUTANTS["base"](), "float32")
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
    _flip_byte(copy / "bias.npz")
    assert main(["verify", "--dir", str(copy)]) == 1
    assert "bias.npz" in capsys.readouterr().err


def test_drift_mutant_fails_golden_but_base_passes():
    info = load_catalog()["GOLDEN-01"]
    assert run_clause(info, MUTANTS["base"](), "float32") == "passed"
    verdict = run_clause(info, MUTANTS["output_drift_1e-3"](), "float32")
    assert verdict.startswith("failed") and "golden fixtures in float32 disagree" in verdict
