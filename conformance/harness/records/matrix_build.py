"""The conformance matrix as data: a row per clause grouped by spec section, a column per adapter.

Built from certificates only (``harness.run.certificate.build``'s JSON), so a matrix can be drawn from
certificates written on other machines; ``harness.records.matrix_markdown`` and ``harness.records.matrix_html``
render it, ``python -m conformance.matrix`` writes both. Every cell carries the one command that
reruns its clause on its adapter with the options its certificate was made with (``--declare``,
``--signature``, the profile, ...), so a reader can check any cell without reading the suite.

Fields that other parts of the suite add to a certificate as they grow (``likely_causes``, an
expectation's outcomes, the kernel's own libraries in the environment) are read by
harness.records.matrix_fields, shown when present and simply absent otherwise: an older certificate still draws.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from conformance.harness.records.matrix_fields import (
    column_notes,
    libraries,
    likely_cause_lines,
    run_options,
    split_citation,
)
from conformance.harness.spec.clause import CLAUSES

# A certificate's clause outcome -> (the word a cell shows, its kind: ok / bad / xfail / na / nr).
CELL_WORDS: dict[str, tuple[str, str]] = {
    "pass": ("pass", "ok"),
    "fail": ("fail", "bad"),
    "expected failure": ("expected failure", "xfail"),
    "not applicable": ("n/a", "na"),
    "not run": ("not run", "nr"),
    "skipped": ("skipped", "nr"),
    "not in profile": ("not in profile", "nr"),
}
MISSING = ("-", "nr")  # the clause is not in that certificate (another suite version)
# the dtypes a failing clause's detail names (harness.run.certificate._clause_outcome's words)
_FAILED_DTYPES = re.compile(r"(?:failed|expected failure|passed although expected to fail): ([^(;\u2014]+)")


@dataclass(frozen=True)
class TestRef:
    """The test function that runs a clause: ``conformance.clauses.test_x`` and ``test_y``."""

    module: str
    function: str

    def target(self, pyargs: bool) -> list[str]:
        """The pytest arguments naming it: a path from a checkout, ``--pyargs`` for an installed suite."""
        if pyargs:
            return ["--pyargs", f"{self.module}::{self.function}"]
        return [self.module.replace(".", "/") + ".py::" + self.function]


@dataclass(frozen=True)
class Cell:
    outcome: str  # the certificate's word ("pass", "fail", "not applicable", ...) or "-"
    word: str  # as shown: pass / fail / expected failure / n/a / not run / -
    kind: str  # ok / bad / xfail / na / nr
    reason: str  # the certificate's detail, or the expectation's reason
    message: str = ""  # the first failure's message, for a failing cell
    command: str = ""  # reruns this clause on this adapter
    picture: dict | None = field(default=None, compare=False, hash=False)  # the first failing case (causes.picture)

    @property
    def brief(self) -> str:
        """The reason in a few words, for a table: a failure's dtypes (its detail begins "failed: float16,
        bfloat16 (...)"), nothing for a pass, else the whole reason."""
        if self.kind in ("bad", "xfail"):
            found = _FAILED_DTYPES.match(self.reason)
            return found.group(1).strip() if found else ""
        return "" if self.kind == "ok" else self.reason


@dataclass(frozen=True)
class Row:
    clause: str
    title: str
    sentence: str  # the quoted spec sentence(s)
    citation: str  # the whole citation, as the certificate has it
    test: str  # the clause's test as pytest names it (a path, or a --pyargs module); "" when unknown
    cells: tuple[Cell, ...]


@dataclass
class Section:
    heading: str  # seed file and section ("000_f3dcd408372d9e02.txt §7.3 ..."), or a definition's source
    rows: list[Row] = field(default_factory=list)


@dataclass(frozen=True)
class Column:
    spec: str  # as --impl names it
    label: str  # the column's heading: the spec, and its certificate's name when a spec appears twice
    verdict: str
    summary: str  # the coverage line of the verdict
    libraries: dict[str, str]  # the kernel's own libraries and versions, or every recorded one
    device: str
    likely_causes: tuple[str, ...]
    notes: tuple[tuple[str, str], ...]  # (short, whole): expectation counts, declared deviations
    source: str  # which certificate file it came from
    date: str
    options: tuple[str, ...]  # the reproducing options of its run


@dataclass
class Matrix:
    columns: list[Column]
    sections: list[Section]
    unavailable: list[tuple[str, str]]  # (spec, why) for adapters with no clause results
    pyargs: bool  # the commands use --pyargs (an installed suite) instead of paths (a checkout)

    @property
    def rows(self) -> list[Row]:
        return [r for s in self.sections for r in s.rows]


def _natural(text: str) -> tuple:
    """Sort key that orders ``§2`` before ``§10``, seeds (``000``, ``003``) before definitions."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text) if t)


def test_ref(clause: str, entry: dict) -> TestRef | None:
    """Where clause ``clause`` lives: this suite's registry, else a failure's nodeid in ``entry``."""
    info = CLAUSES.get(clause)
    if info is not None:
        return TestRef(info.func.__module__, info.func.__name__)
    for f in entry.get("failures") or []:
        if f.get("clause") != clause:
            continue
        path, sep, name = str(f.get("nodeid", "")).partition("::")
        if sep and "conformance/clauses/" in path:
            module = "conformance/clauses/" + path.split("conformance/clauses/", 1)[1]
            return TestRef(module.removesuffix(".py").replace("/", "."), name.split("[", 1)[0])
    return None


def command(ref: TestRef | None, spec: str, options: tuple[str, ...], pyargs: bool) -> str:
    """The command that reruns one clause on one adapter (every dtype it plans)."""
    if ref is None:
        return ""
    return " ".join(shlex.quote(a) for a in ["pytest", *ref.target(pyargs), f"--impl={spec}", *options])


def _cell(cid: str, cl: dict | None, entry: dict, spec: str, cmd: str) -> Cell:
    if cl is None:
        return Cell("-", *MISSING, reason="not in this certificate (another suite version)", command=cmd)
    outcome = str(cl.get("outcome", "-"))
    word, kind = CELL_WORDS.get(outcome, (outcome, "nr"))
    reason = str(cl.get("detail") or "").replace(f"not applicable to {spec}: ", "")
    if kind not in ("bad", "xfail"):
        return Cell(outcome, word, kind, reason, "", cmd)
    expectations = entry.get("expectations") or {}
    listed = [e for e in expectations.get("expected_failures") or [] if isinstance(e, dict) and e.get("clause") == cid]
    why = sorted({str(e["reason"]) for e in listed if e.get("reason")})
    if why:
        reason += " — expected because: " + " / ".join(why)
    messages = [str(r.get("message") or "") for r in listed] + [
        str(f.get("message") or "") for f in entry.get("failures") or [] if f.get("clause") == cid
    ]
    message = next((m.strip() for m in messages if m.strip()), "")
    return Cell(outcome, word, kind, reason, message, cmd, cl.get("picture") or None)


def build_matrix(certificates: list[tuple[str, dict]], pyargs: bool = False) -> Matrix:
    """The matrix of ``certificates``: (source label, certificate document) pairs, in column order.

    An adapter appearing in several certificates gets one column per appearance, labelled by
    source. An adapter without clause results (unavailable here) is listed apart with its reason."""
    entries: list[tuple[str, dict, dict, str]] = []  # (spec, entry, doc, source)
    unavailable: list[tuple[str, str]] = []
    for source, doc in certificates:
        for spec, entry in (doc.get("adapters") or {}).items():
            if "clauses" not in entry:
                unavailable.append((spec, str(entry.get("reason") or entry.get("verdict", "no result"))))
                continue
            entries.append((spec, entry, doc, source))
    specs = [spec for spec, *_ in entries]
    columns = []
    for spec, entry, doc, source in entries:
        env = entry.get("environment") or {}
        label = spec if specs.count(spec) == 1 else f"{spec} ({Path(source).stem})"
        columns.append(
            Column(
                spec=spec,
                label=label,
                verdict=str(entry.get("verdict", "?")),
                summary=str((entry.get("coverage") or {}).get("summary", "")),
                libraries=libraries(env),
                device=str(env.get("device", "")),
                likely_causes=likely_cause_lines(entry.get("likely_causes")),
                notes=column_notes(entry),
                source=source,
                date=str(doc.get("date", "")),
                options=run_options(doc),
            )
        )
    clause_ids = sorted({cid for _, e, _, _ in entries for cid in e["clauses"]})
    sections: dict[str, Section] = {}
    for cid in clause_ids:
        meta = next(e["clauses"][cid] for _, e, _, _ in entries if cid in e["clauses"])
        where, sentence = split_citation(str(meta.get("source", "")))
        ref = next((r for _, e, _, _ in entries if (r := test_ref(cid, e)) is not None), None)
        cells = []
        for (spec, entry, _, _), col in zip(entries, columns, strict=True):
            cells.append(_cell(cid, entry["clauses"].get(cid), entry, spec, command(ref, spec, col.options, pyargs)))
        test = " ".join(ref.target(pyargs)) if ref else ""
        row = Row(cid, str(meta.get("title", "")), sentence, str(meta.get("source", "")), test, tuple(cells))
        sections.setdefault(where, Section(where)).rows.append(row)
    ordered = [sections[k] for k in sorted(sections, key=_natural)]
    return Matrix(columns, ordered, unavailable, pyargs)
