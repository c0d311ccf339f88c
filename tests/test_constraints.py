"""One set of library releases: constraints.txt, the adapters' ``measured_with``, and the verdict line
that names a release other than the measured one.

The built-in adapters' declarations, expectations files and regression baselines were measured with
particular releases of torch, jax, onnxruntime, onnx, keras, transformers and mlx. The set-up
commands (README, .ci/run, tox.ini) install those releases through constraints.txt; each library
adapter names them in ``measured_with``; and a run on other releases says so on its verdict line, so
a stale or missing expectation reads as the library's news, not the suite's fault.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from conformance.harness.calls import environment

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]

# Every library whose behaviour a committed file records (declarations, expectations, baselines).
LIBRARIES = ("torch", "jax", "jaxlib", "onnxruntime", "onnx", "keras", "transformers", "mlx", "mlx-cpu")


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not an exact pin"
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def measured_with_literals() -> dict[str, list[dict[str, str]]]:
    """Every dict literal the adapters assign to ``measured_with``, per module (read, not imported)."""
    found: dict[str, list[dict[str, str]]] = {}
    for path in sorted((ROOT / "implementations").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", getattr(t, "attr", None)) == "measured_with" for t in node.targets
            ):
                dicts = [n for n in ast.walk(node.value) if isinstance(n, ast.Dict)]
                found.setdefault(path.name, []).extend(ast.literal_eval(d) for d in dicts)
    return found


def test_constraints_pin_every_library_a_committed_file_records():
    assert set(LIBRARIES) <= set(pins()), sorted(set(LIBRARIES) - set(pins()))


def test_each_library_adapter_names_the_pinned_releases():
    found = measured_with_literals()
    for module in ("torch_sdpa.py", "torch_eager.py", "jax_attention.py", "onnxruntime_attention.py", "_hf.py"):
        assert found.get(module), f"implementations/{module} names no measured releases"
    for module in ("keras_numpy.py", "keras_jax.py", "keras_torch.py", "mlx_attention.py"):
        assert found.get(module), f"implementations/{module} names no measured releases"
    named = {lib for dicts in found.values() for d in dicts for lib in d}
    assert named >= set(LIBRARIES) - {"mlx-cpu"}, sorted(set(LIBRARIES) - named)
    for module, dicts in found.items():
        for d in dicts:
            for lib, version in d.items():
                assert pins().get(lib) == version, (
                    f"implementations/{module}: {lib} {version}, constraints.txt pins {pins().get(lib)}"
                )


def test_the_setup_commands_install_through_the_constraints():
    ci = (ROOT / ".ci" / "run").read_text()
    installs = [ln for ln in ci.splitlines() if re.search(r"pip install", ln) and "--upgrade pip" not in ln]
    assert installs and all("-c constraints.txt" in ln for ln in installs), installs
    assert not re.search(r"==\d", ci), "a release pinned in .ci/run instead of constraints.txt"
    tox = (ROOT / "tox.ini").read_text()
    assert "PIP_CONSTRAINT = {toxinidir}/constraints.txt" in tox
    assert not re.search(r"^\s+[\w\[\].-]+==", tox, re.M), "a release pinned in tox.ini instead of constraints.txt"
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(python3 -m venv[^\n]*)\n```", readme)
    assert first and first.group(1).count("-c constraints.txt") == 2, "README's first command installs without pins"


def test_version_drift_names_the_measured_and_the_running_release(monkeypatch):
    class Adapter:
        measured_with = {"keras": "3.15.1", "torch": "2.13.0"}

    installed = {"keras": "3.15.1", "torch": "2.13.0+cpu"}
    monkeypatch.setattr(environment.importlib.metadata, "version", lambda dist: installed[dist])
    assert environment.version_drift(Adapter()) == {}  # a local build label is the same release
    installed["keras"] = "3.16.0"
    assert environment.drift_text(environment.version_drift(Adapter())) == (
        "expectations measured with keras 3.15.1; running 3.16.0"
    )
    installed["torch"] = "2.14.0+cu128"
    assert environment.drift_text(environment.version_drift(Adapter())) == (
        "expectations measured with keras 3.15.1, torch 2.13.0; running keras 3.16.0, torch 2.14.0+cu128"
    )
    assert environment.version_drift(object()) == {}  # a user's adapter names nothing: nothing to say


def test_the_verdict_line_names_both_releases(monkeypatch, pytester, restore_hypothesis_profile):
    """keras-numpy certified (one clause) with keras reporting 3.16.0: the summary's verdict line and
    the certificate's say "expectations measured with keras 3.15.1; running 3.16.0"."""
    if importlib.util.find_spec("keras") is None:  # not imported here: keras picks its backend on import
        pytest.skip("keras is not installed")
    real = environment.importlib.metadata.version
    monkeypatch.setattr(
        environment.importlib.metadata, "version", lambda dist: "3.16.0" if dist == "keras" else real(dist)
    )
    cert = pytester.path / "cert.json"
    result = pytester.runpytest_inprocess(
        str(ROOT / "conformance" / "clauses" / "test_shapes.py"),
        "--impl=keras-numpy",
        "-k",
        "test_output_shape",
        "--allow-partial",
        f"--certificate={cert}",
        "-p",
        "no:cacheprovider",
    )
    line = next(ln for ln in result.stdout.lines if ln.startswith("keras-numpy: "))
    assert line.endswith("(ci profile); expectations measured with keras 3.15.1; running 3.16.0"), line
    assert "expectations measured with keras 3.15.1; running 3.16.0." in cert.with_suffix(".md").read_text()
