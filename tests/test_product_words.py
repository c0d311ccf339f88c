"""What users read speaks of the product, not of how it was made: no internal step or issue number and
no who-did-what in the README, the docs, the docstrings and comments, the set-up files.

The history of how a figure or a design was reached is in git log; a user reads facts (a figure, its
date, machine and command) and how to use the suite. References to another project's tracker are
written as their address (``https://github.com/pytorch/pytorch/issues/121558``), which names the
project they belong to.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each pattern with the kind of sentence it catches; a hash and digits only outside a word or a colour.
WORDS = re.compile(
    "|".join(
        (
            r"\b[Ss]tops? \d+",  # "stop" and its number: a step of the work that made the suite
            r"\b[Ii]ssues? \d+",  # "issue" and its number: this project's tracker
            r"(?<![\w&/#])#\d{1,4}\b",  # a hash and a number, short for the same
            r"\b[Ss]teps? \d+\b",  # "step" and its number
            r"\bthe lead\b|\blead's\b|\(lead\b",  # who decided
            r"session that (?:wrote|built)|\bno GPU was lent|by the author\b",  # who measured what
            r"\bhelpers?'? (?:session|branch|worktree)",
        )
    )
)


def _python_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring line and comment of a Python source (not its other strings)."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out += [(node.body[0].lineno + i, line) for i, line in enumerate(doc.splitlines())]
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return out + [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def read_by_users(root: Path) -> list[Path]:
    files = [root / n for n in ("README.md", "tox.ini", "pyproject.toml", "constraints.txt", ".ci/run")]
    files += sorted((root / "docs").rglob("*.md")) + sorted((root / "implementations" / "expectations").glob("*.toml"))
    for folder in ("conformance", "implementations", "tests", "scripts", "benchmarks"):
        files += sorted((root / folder).rglob("*.py")) + sorted((root / folder).rglob("*.sh"))
    return [f for f in files if f.is_file()]


def work_log_words(root: Path) -> list[str]:
    """'path:line: "words": the line' for every match under ``root``."""
    found = []
    for path in read_by_users(root):
        text = path.read_text(encoding="utf-8")
        if not WORDS.search(text):  # most files: nothing to look at more closely
            continue
        lines = _python_prose(text) if path.suffix == ".py" else list(enumerate(text.splitlines(), 1))
        for n, line in lines:
            found += [
                f"{path.relative_to(root)}:{n}: {m.group(0)!r}: {line.strip()[:120]}" for m in WORDS.finditer(line)
            ]
    return found


def test_no_work_log_in_what_users_read():
    found = work_log_words(ROOT)
    assert not found, "\n".join(found)


def test_the_check_names_a_planted_step_or_issue_number(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# A suite\n\nFast since stop 24, as issue 19 asked (#19).\n")
    (tmp_path / "docs" / "notes.md").write_text("Colours #1e8e3e and #999999 are fine; step 3 is not.\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "x.py").write_text(
        '"""A tool (written in the session that built the matrix)."""\n\n'
        'PLAIN = "issue 7 in a string that is not a docstring"\n'
        "# decided by the lead\n"
    )
    found = work_log_words(tmp_path)
    assert [f.split(": ", 2)[1] for f in found] == [
        "'stop 24'",
        "'issue 19'",
        "'#19'",
        "'step 3'",
        "'session that built'",
        "'the lead'",
    ], found
