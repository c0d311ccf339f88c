"""docs/clauses.md is generated from the clause decorators and must match what runs."""

from pathlib import Path

from conformance import catalog

DOC = Path(__file__).resolve().parents[1] / "docs" / "clauses.md"


def test_docs_catalog_is_current():
    assert DOC.exists(), "docs/clauses.md is missing: python -m conformance.catalog > docs/clauses.md"
    assert DOC.read_text(encoding="utf-8") == catalog.render(), (
        "docs/clauses.md is out of date: python -m conformance.catalog > docs/clauses.md"
    )


def test_a_clause_requiring_an_unknown_declaration_field_is_refused_at_definition():
    import pytest

    from conformance.harness.spec.clause import Source, clause

    with pytest.raises(ValueError, match="not Declaration fields"):
        clause("X-99", "t", Source("000", "§1", "s"), kills=["base"], requires=["gradd"])


def test_one_applicability_test_for_requirements_and_dtypes():
    from conformance.contract import Declaration
    from conformance.harness.spec.clause import ClauseInfo, Source

    info = ClauseInfo(
        "X-98",
        "t",
        Source("000", "§1", "s"),
        ("grad", "float64_computed_as=float64"),
        None,
        ("m",),
        None,
        None,
        func=lambda impl: None,
    )
    assert info.not_applicable_reasons(Declaration(grad=True), "float32") == []
    reasons = info.not_applicable_reasons(
        Declaration(grad=False, float64_computed_as="float32", dtypes=frozenset({"float64"})), "float16"
    )
    assert reasons == [
        "declares grad=False",
        "declares float64_computed_as=float32, this clause checks float64_computed_as=float64",
        "declares dtypes ['float64'], not float16",
    ]
