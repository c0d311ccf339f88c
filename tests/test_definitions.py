"""Clauses that rest on a variant's own definition quote it verbatim and never pass it off as the seed.

The seed says nothing of sliding windows, softcap, ALiBi or a returned lse; the clauses about them
cite FlashAttention's documentation (conformance.harness.spec.definitions). The checks mirror
tests/test_citations.py: each quote occurs, whitespace-normalised, in the stored verbatim excerpt of
the document it names; no quote occurs in the seeds (so it cannot be read as the seed's); every
citation says "definition (not the seed)" and names the repository, commit and lines; and every
clause cites either a seed Source or a Definition, nothing else.
"""

from __future__ import annotations

import pytest

from conformance import catalog
from conformance.harness.spec.clause import SEEDS, Source
from conformance.harness.spec.definitions import DOCUMENTS, SEED_KEY, Definition
from tests.test_citations import SEEDS_DIR, normalise


def definition_problems(source: Definition) -> list[str]:
    """Why ``source`` is not a verbatim quote of its document; empty when it is."""
    doc = DOCUMENTS[source.document]
    text = normalise(doc.text)
    return [f"{normalise(q)!r} is not in {doc.where}" for q in source.sentences if normalise(q) not in text]


def _definition_clauses() -> dict[str, Definition]:
    return {cid: info.source for cid, info in catalog.load().items() if isinstance(info.source, Definition)}


def test_every_clause_cites_a_seed_or_a_definition():
    odd = {cid: type(info.source).__name__ for cid, info in catalog.load().items()}
    odd = {cid: t for cid, t in odd.items() if t not in ("Source", "Definition")}
    assert not odd, f"clauses citing neither a seed Source nor a Definition: {odd}"
    assert _definition_clauses(), "no clause cites a definition: this test would check nothing"


def test_definition_quotes_are_verbatim():
    bad = {cid: p for cid, src in sorted(_definition_clauses().items()) if (p := definition_problems(src))}
    assert not bad, "definition quotes not verbatim in their stored excerpt:\n" + "\n".join(
        f"  {cid}: {p}" for cid, ps in bad.items() for p in ps
    )


def test_a_definition_is_never_presented_as_the_seed():
    for cid, src in _definition_clauses().items():
        assert src.seed == SEED_KEY and src.seed not in SEEDS, cid
        assert src.is_seed is False, cid
        cite = src.cite()
        assert cite.startswith("definition (not the seed): "), cite
        doc = src.source_document
        assert doc.repo in cite and doc.commit[:10] in cite and doc.path in cite, cite


def test_definition_quotes_are_not_in_the_seeds():
    if not SEEDS_DIR.is_dir():
        pytest.skip(f"the seed articles are not at {SEEDS_DIR}")
    seeds = normalise(" ".join((SEEDS_DIR / f).read_text(encoding="utf-8") for f in SEEDS.values()))
    for cid, src in _definition_clauses().items():
        for q in src.sentences:
            assert normalise(q) not in seeds, f"{cid}: {q!r} is in the seed: cite it as a Source"


def test_the_check_fails_on_a_paraphrase():
    para = Definition("flash-attn", "flash_attn_func docstring", "Query i attends to keys in [i - left, i + right].")
    assert definition_problems(para)
    real = Definition(
        "flash-attn", "flash_attn_func docstring", "If the row of the mask is all zero, the output will be zero."
    )
    assert definition_problems(real) == []


def test_definitions_reject_unknown_documents_and_empty_quotes():
    with pytest.raises(ValueError, match="unknown definition document"):
        Definition("flash-attn-3", "x", "y")
    with pytest.raises(ValueError, match="non-empty"):
        Definition("flash-attn", "x", " ")
    assert Source("003", "输入与输出", "x").seed != SEED_KEY
