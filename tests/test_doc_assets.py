"""The committed doc assets are of the current code: each committed certificate, the matrix and each
screenshot count the clauses the suite has now, and agree with each other on their verdict lines.

Cheap by design: no certification runs here. The counts come from the committed files and the clause
registry; a screenshot cannot be read, so ``scripts/doc_assets.py`` (the one command that regenerates
every asset) records, beside each PNG in ``docs/assets.json``, its SHA-256 and the clause count and
verdict lines of the page it shows; a PNG that is not the recorded one, or whose record no longer
matches the code or the committed page, fails here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("doc_assets", ROOT / "scripts" / "doc_assets.py")
doc_assets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doc_assets)

PAGES = ("certificate-numpy.md", "certificate-numpy.html", "certificate-bottom-right-causal.html", "matrix.md")


def current_clause_count() -> int:
    from conformance import catalog

    return len(catalog.load())


def stale(root: Path, clauses: int) -> list[str]:
    """What in ``root/docs`` does not match a suite of ``clauses`` clauses, one line each."""
    docs = root / "docs"
    out = []
    for name in PAGES:
        page = (docs / name).read_text(encoding="utf-8")
        if doc_assets.clause_count(page) != clauses:
            out.append(f"docs/{name}: {doc_assets.clause_count(page)} clauses, the suite has {clauses}")
        if not doc_assets.verdict_lines(page):
            out.append(f"docs/{name}: no verdict line found")
    md, html = (doc_assets.verdict_lines((docs / n).read_text()) for n in PAGES[:2])
    if md != html:
        out.append(f"docs/certificate-numpy.md and .html say {md} and {html}: not one run")
    cert = json.loads((docs / "certificate-numpy.json").read_text())["adapters"]["numpy"]
    if md and md[0] != f"{cert['verdict']}: {cert['coverage']['summary']}":
        out.append("docs/certificate-numpy.json is not the run of its Markdown and HTML")
    manifest = json.loads((docs / "assets.json").read_text()) if (docs / "assets.json").is_file() else {}
    for png in sorted(docs.glob("*.png")):
        rel = f"docs/{png.name}"
        rec = manifest.get(rel)
        if rec is None:
            out.append(f"{rel}: not recorded in docs/assets.json (regenerate: python scripts/doc_assets.py)")
            continue
        if hashlib.sha256(png.read_bytes()).hexdigest() != rec["sha256"]:
            out.append(f"{rel}: not the screenshot docs/assets.json records")
        if rec["clauses"] != clauses:
            out.append(f"{rel}: a page of {rec['clauses']} clauses, the suite has {clauses}")
        twin = {"docs/matrix-html.png": docs / "matrix.md"}.get(rel) or root / rec["page"]
        if twin.is_file() and doc_assets.verdict_lines(twin.read_text(encoding="utf-8")) != rec["verdict_lines"]:
            out.append(f"{rel}: its verdict lines are not those of {twin.relative_to(root)}")
    return out


def test_the_committed_assets_are_of_the_current_code():
    found = stale(ROOT, current_clause_count())
    assert not found, "\n".join(found) + "\nregenerate with: python scripts/doc_assets.py"


@pytest.fixture
def copy(tmp_path):
    for name in (*PAGES, "certificate-numpy.json", "assets.json", *(p.name for p in (ROOT / "docs").glob("*.png"))):
        (tmp_path / "docs").mkdir(exist_ok=True)
        shutil.copyfile(ROOT / "docs" / name, tmp_path / "docs" / name)
    return tmp_path


def test_the_check_fails_on_a_stale_screenshot_and_a_stale_page(copy):
    n = current_clause_count()
    assert stale(copy, n) == []
    (copy / "docs" / "certificate-numpy-html.png").write_bytes(b"\x89PNG an older picture")
    page = copy / "docs" / "matrix.md"
    page.write_text(page.read_text().replace("| **ALIBI-01**", "| **ALIBI-01-GONE**", 1))
    found = stale(copy, n)
    assert any(f.startswith("docs/certificate-numpy-html.png: not the screenshot") for f in found), found
    assert any(f.startswith("docs/matrix.md: ") and "clauses" in f for f in found), found
    assert any("a page of" in f for f in stale(copy, n + 1))  # a clause added since: every record is stale
