"""The import layers hold (tests/layers.py): no import points up, no cycle, rooms documented.

The harness in rooms, one direction of imports. The check must also fail when the rule is
broken, so the second half copies the package, adds one back-import to it and sees it named.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from tests import layers

HARNESS = layers.ROOT / "conformance" / "harness"


def test_no_import_points_up_or_across():
    bad = layers.violations(layers.imports())
    assert not bad, "imports against the layers of tests/layers.py:\n" + "\n".join(bad)


def test_no_import_cycle():
    assert layers.cycles(layers.imports()) == []


def test_every_module_is_in_a_layer():
    unplaced = [m for m in layers.modules() if m.split(".")[0] != layers.ADAPTERS and layers.layer_of(m) is None]
    assert unplaced == []


def test_harness_is_rooms_each_with_a_docstring_naming_what_it_may_import():
    top = sorted(p.name for p in HARNESS.glob("*.py"))
    assert len(top) <= 12, top
    rooms = sorted(p for p in HARNESS.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert rooms, "the harness has no sub-packages"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"{room.name}/__init__.py must say what the room holds and may import"
        assert layers.layer_of(f"conformance.harness.{room.name}") is not None, f"{room.name} is in no layer"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for pkg in layers.PACKAGES:
        shutil.copytree(layers.ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.toml"))
    return root


def test_a_deliberate_back_import_is_named(tmp_path):
    root = _copy(tmp_path)
    assert layers.violations(layers.imports(root)) == []
    target = root / "conformance" / "harness" / "spec" / "report.py"
    target.write_text(target.read_text() + "\n\ndef _late():\n    from conformance.harness.run import runstate\n")
    bad = layers.violations(layers.imports(root))
    assert len(bad) == 1 and "conformance/harness/spec/report.py" in bad[0] and "points up" in bad[0], bad


def test_a_cycle_is_found(tmp_path):
    root = _copy(tmp_path)
    target = root / "conformance" / "harness" / "cases" / "space.py"
    target.write_text(target.read_text() + "\nfrom conformance.harness.cases import cells  # noqa\n")
    assert ["conformance.harness.cases.cells", "conformance.harness.cases.space"] in layers.cycles(layers.imports(root))


def test_an_adapter_importing_the_harness_is_named(tmp_path):
    root = _copy(tmp_path)
    target = root / "implementations" / "numpy_kernel.py"
    target.write_text(target.read_text() + "\nfrom conformance.harness.judge import tolerance  # noqa\n")
    bad = layers.violations(layers.imports(root))
    assert len(bad) == 1 and "an adapter imports the contract alone" in bad[0], bad


def test_the_committed_picture_is_what_the_code_draws_now():
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture", layers.ROOT / "scripts" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (layers.ROOT / "docs" / "architecture.svg").read_text()
    assert module.draw() == committed, "regenerate: python scripts/architecture.py > docs/architecture.svg"
