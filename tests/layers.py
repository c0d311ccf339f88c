"""The import layers of the project, declared once, and the check that the code keeps them.

A module may import its own layer and the layers below it, never one above: the direction of
imports is part of the architecture (docs/architecture.md), so it is written down here and checked
by tests/test_layers.py on every run, the way import-linter's layer contracts are. Every import
counts, those inside functions too: a lazy import still makes the lower module depend on the upper.

The layers, top first. A name stands for a module and everything below it in the package tree.
Rooms listed on one line are independent of each other: neither may import the other.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, ...], ...] = (
    # command-line entry points: python -m conformance.catalog / certificates / discover / matrix
    ("conformance.certificates", "conformance.discover", "conformance.matrix", "conformance.sweep"),
    ("conformance.catalog",),  # python -m conformance.catalog; the matrix reads the clauses' sections from it
    ("conformance.clauses",),
    ("conformance.harness.plugin",),  # the pytest entry point: registers run's sub-plugins
    ("conformance.harness.run",),
    ("conformance.harness.records",),
    ("conformance.harness.perf",),
    ("conformance.harness.discovery",),
    ("conformance.harness.causes",),
    ("conformance.harness.judge",),
    ("conformance.harness.calls",),
    ("conformance.harness.covering",),
    ("conformance.harness.cases",),
    ("conformance.harness.spec",),
    ("conformance.fixtures",),
    ("conformance.oracle_variants",),
    ("conformance.oracle_formulations",),
    ("conformance.oracle",),
    ("conformance.contract",),
    ("conformance.releases",),  # which release of a library is installed, and whether a range holds it
    ("conformance",),  # the package itself: __version__ and SPEC_REVISION, no imports
)

# The adapters stand beside the layers: they import the contract alone (and their own private
# modules), and only the rooms that load them or read their files import them.
ADAPTERS = "implementations"
ADAPTERS_MAY_IMPORT = ("conformance.contract", "conformance.releases", ADAPTERS)
MAY_IMPORT_ADAPTERS = ("conformance.harness.calls", "conformance.harness.records")

PACKAGES = ("conformance", ADAPTERS)


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str  # dotted module name (a package's name for ``from pkg import name`` of a non-module)
    path: str  # file, relative to the root
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imports(root: Path = ROOT) -> list[Import]:
    """Every import of one project module by another, module level and inside functions."""
    mods = modules(root)
    out = []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            for t in targets:
                if t.split(".")[0] in PACKAGES and t != name:
                    out.append(Import(name, t, str(path.relative_to(root)), node.lineno))
    return out


def layer_of(module: str) -> int | None:
    """The index of the most specific layer entry that contains ``module`` (None: an adapter)."""
    best, best_len = None, -1
    for i, entries in enumerate(LAYERS):
        for e in entries:
            if (module == e or module.startswith(e + ".")) and len(e) > best_len:
                best, best_len = i, len(e)
    return best


def entry_of(module: str) -> str | None:
    best = None
    for entries in LAYERS:
        for e in entries:
            if (module == e or module.startswith(e + ".")) and (best is None or len(e) > len(best)):
                best = e
    return best


def violations(found: list[Import]) -> list[str]:
    """Each import that points up a layer, across independent rooms of one layer, or into the adapters
    from where they may not be loaded, with the reason."""
    bad = []
    for imp in found:
        a_adapter = imp.importer.split(".")[0] == ADAPTERS
        b_adapter = imp.imported.split(".")[0] == ADAPTERS
        if a_adapter:
            if not any(imp.imported == m or imp.imported.startswith(m + ".") for m in ADAPTERS_MAY_IMPORT):
                bad.append(f"{imp}: an adapter imports the contract alone")
            continue
        if b_adapter:
            if not any(imp.importer.startswith(m) for m in MAY_IMPORT_ADAPTERS):
                bad.append(f"{imp}: only {', '.join(MAY_IMPORT_ADAPTERS)} load the adapters")
            continue
        la, lb = layer_of(imp.importer), layer_of(imp.imported)
        if la is None or lb is None:
            bad.append(f"{imp}: a module in no layer (declare it in tests/layers.py)")
        elif lb < la:
            bad.append(f"{imp}: points up, from {entry_of(imp.importer)} to {entry_of(imp.imported)}")
        elif lb == la and entry_of(imp.importer) != entry_of(imp.imported):
            bad.append(f"{imp}: {entry_of(imp.importer)} and {entry_of(imp.imported)} are independent rooms")
    return bad


def cycles(found: list[Import]) -> list[list[str]]:
    """Import cycles between modules (each strongly connected component of more than one module)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        graph.setdefault(imp.importer, set()).add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
