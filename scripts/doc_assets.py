"""Regenerate every committed doc asset from real runs, in one command:

    python scripts/doc_assets.py            # everything (the matrix certifies every CPU built-in: minutes)
    python scripts/doc_assets.py --no-matrix  # the rest only

What it writes, from the repository root:

* ``docs/clauses.md`` (``python -m conformance.catalog``) and ``docs/architecture.svg``
  (``scripts/architecture.py``);
* ``docs/certificate-numpy.{json,md,html}``: ``pytest --impl=numpy --conformance-perf ... --certificate=...``,
  and ``docs/certificate-numpy-html.png``, a headless-browser screenshot of the page;
* ``docs/certificate-bottom-right-causal.html`` and its screenshot: the certificate of a self-test
  kernel that aligns causal bottom-right while it declares top-left (``tests/cause_kernels.py``),
  whose failing cases are drawn;
* ``docs/matrix.md``, ``docs/failing-cases/*.svg`` and ``docs/matrix-html.png``: ``python -m
  conformance.matrix --jobs 2`` over every built-in available here but the torch.compile ones (they
  join with ``--with-compiled``, or as certificates written beforehand with ``--compiled-certificates``);
* ``docs/certificates-compare-html.png``: ``python -m conformance.certificates html`` of three of the
  matrix's certificates side by side;
* ``docs/assets.json``: for each screenshot, the page it shows, its SHA-256, the clause count and
  the verdict lines of that page, which ``tests/test_doc_assets.py`` compares with the committed
  pages and the current clause list (a screenshot cannot be read; its record can).

Screenshots use Debian's chromium and a font with the spec's Chinese characters (``apt-get install -y
chromium fonts-wqy-zenhei``) through
``scripts/matrix_screenshot.sh``: headless, off the network, a throwaway profile. Work files go to
``out/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OUT = ROOT / "out"
MANIFEST = DOCS / "assets.json"
BOTTOM_RIGHT = "tests.cause_kernels:bottom_right_causal"


def verdict_lines(page: str) -> list[str]:
    """The verdict lines of a certificate or matrix page (HTML or Markdown): the verdict word and the
    clause coverage after it, one line per adapter, in the page's order, whitespace normalised."""
    if page.lstrip().startswith("<"):
        found = re.findall(r"<span class='badge [a-z]+'>([^<]+)</span>\s*(?:</th>)?([^<]*)", page)
        text = [f"{unescape(w)}: {unescape(s).strip()}" if s.strip() else unescape(w) for w, s in found]
        # the matrix repeats each verdict in its table head; the verdicts table has the coverage beside it
        return [t for t in text if "clauses passed" in t]
    lines = re.findall(r"\*\*Verdict: ([^*]+)\*\*: ([^\n]+?)\.?\n", page)  # a certificate
    lines += re.findall(
        r"^\| [^|]+ \| [^|]* \| [^|]* \| \*\*([A-Z ]+)\*\*[^|]* \| ([^|]*clauses passed[^|]*) \|", page, re.M
    )
    return [f"{w}: {s.strip().replace(chr(92), '')}" for w, s in lines]


def clause_count(page: str) -> int:
    """How many clauses a page's clause table lists (a row per clause id; the matrix's ids are bold)."""
    if page.lstrip().startswith("<"):
        ids = re.findall(r"<tr[^>]*><td>([A-Z][A-Z0-9-]*-\d{2})</td>", page)
        ids += re.findall(r"<b>([A-Z][A-Z0-9-]*-\d{2})</b>", page)
    else:
        ids = re.findall(r"^\| (?:\*\*)?([A-Z][A-Z0-9-]*-\d{2})(?:\*\*)?[ |]", page, re.M)
    return len(set(ids))


def run(cmd: list[str], ok: tuple[int, ...] = (0,)) -> None:
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    if code not in ok:
        raise SystemExit(f"{cmd[:4]}... exited {code}")


def screenshot(page: Path, png: Path, size: str) -> dict:
    run(["bash", "scripts/matrix_screenshot.sh", str(page), str(png), size])
    text = page.read_text(encoding="utf-8")
    return {
        "page": str(page.relative_to(ROOT)),
        "sha256": hashlib.sha256(png.read_bytes()).hexdigest(),
        "clauses": clause_count(text),
        "verdict_lines": verdict_lines(text),
        "window": size,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-matrix", action="store_true", help="keep the committed matrix and its screenshots")
    ap.add_argument("--jobs", default="2", help="the matrix's parallel certifications (default 2)")
    ap.add_argument(
        "--with-compiled",
        action="store_true",
        help="put the torch.compile built-ins (torch-compile, torch-flex) in the matrix too: each takes tens of "
        "minutes cold on a 2-core CPU",
    )
    ap.add_argument(
        "--compiled-certificates",
        nargs="+",
        metavar="JSON",
        default=[],
        help="certificates of the torch.compile built-ins written beforehand (python -m pytest conformance/clauses "
        "--impl=torch-flex --certificate=out/compiled/torch-flex.json -n auto), put in the matrix as they are "
        "instead of certifying those built-ins again",
    )
    ap.add_argument(
        "--screenshots-only", action="store_true", help="retake the screenshots of the pages written by the last run"
    )
    args = ap.parse_args(argv)
    py = sys.executable
    OUT.mkdir(exist_ok=True)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    if args.screenshots_only:
        for png, rec in manifest.items():
            page = ROOT / rec["page"].split(" (")[0]
            page = OUT / "matrix" / "matrix.html" if png == "docs/matrix-html.png" else page
            manifest[png] = {**screenshot(page, ROOT / png, rec["window"]), "page": rec["page"]}
        MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1, ensure_ascii=False) + "\n")
        return 0
    (DOCS / "clauses.md").write_text(subprocess.check_output([py, "-m", "conformance.catalog"], cwd=ROOT, text=True))
    (DOCS / "architecture.svg").write_text(
        subprocess.check_output([py, "scripts/architecture.py"], cwd=ROOT, text=True)
    )
    quiet = ["-q", "-p", "no:cacheprovider"]
    run([py, "-m", "pytest", "--impl=numpy", "--conformance-perf", "--perf-report=out/perf-numpy",
         "--certificate=docs/certificate-numpy.html", *quiet])  # fmt: skip
    manifest["docs/certificate-numpy-html.png"] = screenshot(
        DOCS / "certificate-numpy.html", DOCS / "certificate-numpy-html.png", "1400,2200"
    )
    run([py, "-m", "pytest", f"--impl={BOTTOM_RIGHT}", "--declare=dropout=false",
         "--certificate=out/certificate-bottom-right-causal.html", *quiet], ok=(1,))  # fmt: skip
    shutil.copyfile(OUT / "certificate-bottom-right-causal.html", DOCS / "certificate-bottom-right-causal.html")
    manifest["docs/certificate-bottom-right-causal-html.png"] = screenshot(
        DOCS / "certificate-bottom-right-causal.html", DOCS / "certificate-bottom-right-causal-html.png", "1400,1500"
    )
    if not args.no_matrix:
        shutil.rmtree(OUT / "matrix", ignore_errors=True)
        from conformance.matrix import probe_builtins
        from implementations import INDUCTOR

        usable, _ = probe_builtins()
        given = [os.path.relpath(Path(c).resolve(), ROOT) for c in args.compiled_certificates]
        columns = [f"--impl={s}" for s in usable if (args.with_compiled and not given) or s not in INDUCTOR]
        columns += ["--certificates", *given] if given else []
        run([py, "-m", "conformance.matrix", "--out", "out/matrix", "--jobs", args.jobs, *columns])
        shutil.copyfile(OUT / "matrix" / "matrix.md", DOCS / "matrix.md")
        shutil.rmtree(DOCS / "failing-cases", ignore_errors=True)
        if (OUT / "matrix" / "failing-cases").is_dir():
            shutil.copytree(OUT / "matrix" / "failing-cases", DOCS / "failing-cases")
        manifest["docs/matrix-html.png"] = {
            **screenshot(OUT / "matrix" / "matrix.html", DOCS / "matrix-html.png", "1400,1800"),
            "page": "docs/matrix.md (its HTML twin, out/matrix/matrix.html)",
        }
        certs = [OUT / "matrix" / "certs" / f"{s}.json" for s in ("numpy", "torch-sdpa", "jax")]
        run([py, "-m", "conformance.certificates", "html", *map(str, certs), "-o", "out/compare.html"])
        manifest["docs/certificates-compare-html.png"] = {
            **screenshot(OUT / "compare.html", DOCS / "certificates-compare-html.png", "1400,1400"),
            "page": "out/compare.html (numpy, torch-sdpa and jax of the matrix run)",
        }
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1, ensure_ascii=False) + "\n")
    print(f"written: {MANIFEST.relative_to(ROOT)} and the assets it lists", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
