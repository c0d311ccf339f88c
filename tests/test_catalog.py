"""docs/clauses.md is generated from the clause decorators and must match what runs."""

from pathlib import Path

from conformance import catalog

DOC = Path(__file__).resolve().parents[1] / "docs" / "clauses.md"


def test_docs_catalog_is_current():
    assert DOC.exists(), "docs/clauses.md is missing: python -m conformance.catalog > docs/clauses.md"
    assert DOC.read_text(encoding="utf-8") == catalog.render(), (
        "docs/clauses.md is out of date: python -m conformance.catalog > docs/clauses.md"
    )
