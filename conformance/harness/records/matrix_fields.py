"""What the conformance matrix reads from a certificate besides its clauses: the options of the run
that wrote it (for the cells' commands), a citation's parts, the likely causes, the notes beside a
verdict (expected failures, declared deviations, a discovered declaration) and the kernel's libraries.

Apart from harness.records.matrix_build so that each field's reading, and its fallback for a certificate
written before the field existed, sits in one place.
"""

from __future__ import annotations

import shlex
from typing import Any

from conformance.harness.records import invalid_inputs
from conformance.harness.records.deviations import grouped

# Options of a certification run that change what a clause feeds the kernel or how it is judged:
# a cell's command keeps them (as harness.run.failures.reproduce_command does); the rest (-q, -k,
# --certificate, ...) only shape the report. name -> whether it takes a value.
REPRODUCING_OPTIONS: dict[str, bool] = {
    "--declare": True,
    "--signature": True,
    "--conformance-profile": True,
    "--call-timeout": True,
    "--hypothesis-seed": True,
    "--expectations": True,
    "--conformance-random-seeds": False,
    "--discover": False,
}


def split_citation(citation: str) -> tuple[str, str]:
    """(where, sentence) of a citation ``"<file> <section>: \u201c<sentence>\u201d"`` (Source.cite)."""
    where, sep, sentence = citation.partition(": \u201c")
    if not sep:
        return citation or "(no citation)", ""
    return where.strip(), sentence.removesuffix("\u201d")


def run_options(doc: dict) -> tuple[str, ...]:
    """The reproducing options of the run that wrote certificate ``doc`` (its ``argv``, or its command)."""
    argv = doc.get("argv")
    if argv is None:
        text = str(doc.get("command", "")).removeprefix("pytest ")
        try:
            argv = shlex.split(text)
        except ValueError:
            argv = text.split()
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        name, eq, _ = arg.partition("=")
        if name not in REPRODUCING_OPTIONS:
            continue
        if REPRODUCING_OPTIONS[name] and not eq:
            arg = f"{name}={next(it, '')}"
        out.append(arg)
    return tuple(out)


def _record_text(item: Any) -> str:
    if isinstance(item, dict) and isinstance(item.get("features"), list):  # a cause, in its own words' absence
        text = " + ".join(map(str, item["features"]))
        if item.get("clause_tests"):
            text += f": {item['clause_tests']} failing clause tests of {item.get('clauses', '?')} clauses"
        return text + (f"; --declare {item['declare']}" if item.get("declare") else "")
    if isinstance(item, dict):
        text = next((item[k] for k in ("line", "text", "summary", "describe") if item.get(k)), None)
        return str(text) if text is not None else "; ".join(f"{k}: {v}" for k, v in item.items())
    return str(item)


def likely_cause_lines(value: Any) -> tuple[str, ...]:
    """A certificate's ``likely_causes`` (harness.causes.likely: {"causes": [...], "unexplained": [...]}) as one
    line per cause, in the words of the run's summary (harness.causes.text), root cause first."""
    if not value:
        return ()
    if isinstance(value, str):
        return tuple(line for line in value.splitlines() if line.strip())
    if not isinstance(value, dict):
        return tuple(_record_text(v) for v in value)
    try:
        from conformance.harness.causes.text import cause_lines as describe
    except ImportError:  # a suite without the likely-causes analysis still draws the causes it is given
        describe = None
    lines = []
    for n, cause in enumerate(value.get("causes") or [], 1):
        try:
            lines.append("; ".join(ln.strip() for ln in describe(n, cause)) if describe else _record_text(cause))
        except (KeyError, TypeError, AttributeError):
            lines.append(_record_text(cause))
    if value.get("unexplained"):
        lines.append("not explained by a feature set: " + ", ".join(map(str, value["unexplained"][:10])))
    return tuple(lines)


def column_notes(entry: dict) -> tuple[tuple[str, str], ...]:
    """What the certificate says beside the verdict, each (short, whole): the known causes of its expected
    failures (stale ones said so), declared deviations from the spec (the whole form quotes the sentence
    departed from)."""
    notes = []
    for e in (entry.get("expectations") or {}).get("entries") or []:
        if not isinstance(e, dict) or e.get("status") not in ("matched", "stale"):
            continue
        word = "known cause" if e["status"] == "matched" else "STALE known cause"
        short = f"{word}: {e.get('behaviour')}"
        whole = f"{short} (when {e.get('when_text')}): " + (
            f"{e.get('tests')} clause test(s) of {', '.join(e.get('clauses') or [])}"
            if e["status"] == "matched"
            else "no failing case in this run: remove the entry"
        )
        notes.append((short, whole))
    devs = entry.get("deviations") or []
    for d in grouped([d for d in devs if isinstance(d, dict) and "field" in d]):
        where = f"{str(d.get('file') or '')[:3]} {str(d.get('section') or '').split(' ')[0]}".strip()
        short = f"declared deviation: {d['declare']}" + (f" (vs {where})" if where else "")
        whole = f"declared deviation: {d['declare']} ({d['what']}), departing from " + str(d.get("citation") or where)
        notes.append((short, whole))
    for d in devs:
        if not (isinstance(d, dict) and "field" in d):
            notes.append(("declared deviation: " + _record_text(d),) * 2)
    bad = entry.get("invalid_inputs")  # what the kernel did with each invalid input of 000 §8's preconditions
    if isinstance(bad, dict) and bad:
        text = invalid_inputs.headline(bad)
        notes.append((text, text))
    drift = (entry.get("environment") or {}).get("version_drift")  # a library release other than the measured one
    if drift:
        notes.append((str(drift), str(drift)))
    found = entry.get("discovery")  # pytest --discover: the declaration was measured, not written
    if isinstance(found, dict):
        declared = " ".join(f"--declare {a}" for a in found.get("declare") or []) or "nothing differed"
        notes.append(("declaration discovered (--discover)", f"certified under a discovered declaration: {declared}"))
        notes += [(f"discovery finding: {f}",) * 2 for f in found.get("findings") or []]
    return tuple(notes)


def libraries(env: dict) -> dict[str, str]:
    libs = env.get("kernel_libraries") or env.get("libraries") or {}
    return {str(k): str(v) for k, v in libs.items() if v}
