"""A conformance certificate in Markdown: one certificate for people, or several side by side.

Both forms write a clause's outcome with the same cell (:data:`OUTCOME_CELL`), so "n/a" or
"**FAIL**" means one thing whichever table it is read in.
"""

from __future__ import annotations

from typing import Any

from conformance.contract import DTYPES
from conformance.harness.calls import programs
from conformance.harness.calls.machine import machine_changes
from conformance.harness.calls.machine import summary as machine_summary
from conformance.harness.discovery.discover import declare_text
from conformance.harness.records import coverage_tables, invalid_inputs, transforms

# -- one certificate ----------------------------------------------------------------------------------
OUTCOME_CELL: dict[str, str] = {
    "pass": "pass",
    "fail": "**FAIL**",
    "not applicable": "n/a",
    "skipped": "skipped",
    "not run": "not run",
    "not in profile": "not in profile",
    "expected failure": "expected failure",
}
"""A clause's outcome in a certificate (``certificate._clause_outcome``) as a Markdown table cell."""


def outcome_cell(outcome: str) -> str:
    return OUTCOME_CELL.get(outcome, outcome)


def _esc(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _discovery_lines(record: dict | None) -> list[str]:
    """The certificate's section for a run under ``--discover``."""
    if not record:
        return []
    out = [
        "\n## Discovered declaration\n",
        f"This run certified under a discovered declaration: {declare_text(record)}.\n",
    ]
    out.append("| field | measured | evidence |\n|---|---|---|")
    out += [f"| {m['field']} | {_esc(m['value'])} | {_esc(m['evidence'])} |" for m in record["measured"]]
    out.append("\nFindings (behaviours no declaration field allows; never declared away):\n")
    out += [f"- {_esc(f)}" for f in record["findings"]] or ["- none"]
    return out


def render_markdown(doc: dict) -> str:
    """The certificate ``doc`` (``certificate.build``) for people: one section per adapter."""
    from conformance.harness.causes import text as causes_text

    out = []
    for spec, a in doc["adapters"].items():
        out.append(f"# SDPA conformance certificate: `{spec}`\n")
        if a["verdict"] == "NOT RUN" and "clauses" not in a:
            out.append(f"**Verdict: NOT RUN** ({a.get('reason', '')})\n")
            continue
        cov = a.get("coverage") or {}
        drift = (a.get("environment") or {}).get("version_drift")  # the kernel's library is not the measured release
        out.append(f"**Verdict: {a['verdict']}**: {cov.get('summary', '')}{f'; {drift}' if drift else ''}.\n")
        out += [f"- {line}" for line in cov.get("details", [])]
        if cov.get("details"):
            out.append("")
        out += deviation_lines(a.get("deviations") or [])
        out += expectation_lines(a.get("expectations") or {})
        out.append(
            "The verdict holds for the declaration below: a clause the declaration rules out is *not "
            "applicable* (reason given) and says nothing about the kernel. Outputs are compared with a "
            "float64 oracle under the tolerance rule of `conformance/harness/judge/tolerance.py`.\n"
        )
        g = doc["golden_set"]
        out.append("| | |\n|---|---|")
        hashes = "hashes verified" if g["hashes_ok"] else "HASH PROBLEMS: " + _esc("; ".join(g["problems"]))
        out += [
            f"| suite | sdpa-conformance {doc['suite']['version']} |",
            f"| spec revision | {_esc(doc['suite']['spec_revision'])} |",
            f"| golden fixture set (sha256 of manifest) | `{g['sha256']}` ({hashes}) |",
            f"| command | `{_esc(doc['command'])}` |",
            f"| hypothesis profile | {doc.get('profile')} |",
            f"| date | {doc['date']} |",
        ]
        env = a["environment"]
        out.append("\n## Environment\n\n| | |\n|---|---|")
        out += [f"| {k} | {_esc(env[k])} |" for k in ("platform", "machine", "processor", "python", "device")]
        out.append(f"| machine (as the libraries see it) | {_esc(machine_summary(doc.get('machine')))} |")
        out += [f"| {lib} | {v} |" for lib, v in env["libraries"].items()]
        out.append("\n## Declaration\n\n| field | value |\n|---|---|")
        out += [f"| {k} | {_esc(v)} |" for k, v in a["declaration"].items() if k != "notes"]
        if a["declaration"].get("notes"):
            out.append(f"\nNotes: {a['declaration']['notes']}")
        out += _discovery_lines(a.get("discovery"))
        out.append("\n## Clauses\n\n| clause | result | detail | what it checks |\n|---|---|---|---|")
        for cid, cl in a["clauses"].items():
            out.append(f"| {cid} | {outcome_cell(cl['outcome'])} | {_esc(cl['detail'])} | {_esc(cl['title'])} |")
        out += causes_text.markdown(a.get("likely_causes"))  # failures grouped by cause
        if a.get("space_coverage"):
            out += coverage_tables.cells_markdown(a["space_coverage"])
        if a.get("pair_coverage"):
            out += coverage_tables.pairs_markdown(a["pair_coverage"])
        if a.get("invalid_inputs"):
            out += invalid_inputs.markdown(a["invalid_inputs"])
        if a.get("transforms"):
            out += transforms.markdown(a["transforms"])
        if (a.get("programs") or {}).get("calls"):  # the distinct structures, and the time of first calls
            out += ["\n## Programs\n", programs.sentence(a["programs"], a["declaration"].get("compiles_per_shape"))]
        out.append("\n## Error against the float64 oracle, per dtype\n")
        out.append(f"Source: {a['error_stats_source']}.\n")
        if a["error_stats"]:
            out.append("| dtype | max abs error | mean abs error | 99th percentile |\n|---|---|---|---|")
            for d, s in a["error_stats"].items():
                out.append(f"| {d} | {s['max']:.3g} | {s['mean']:.3g} | {s['p99']:.3g} |")
        b = a.get("baseline")
        if b:
            out.append("\n## Regression baseline\n")
            if "recorded" in b:
                out.append(f"Recorded to `{b['recorded']}` in this run.")
            else:
                if b.get("machine"):  # "another machine: ..." or "machine not recorded ..."
                    out.append(f"{b['machine'][0].upper()}{b['machine'][1:]}.\n")
                out.append(f"Compared against `{b['directory']}`: **{'no drift' if b['passed'] else 'MOVED'}**.")
                if b.get("environment_changes"):
                    out.append("Environment changes since the recording: " + "; ".join(b["environment_changes"]))
                for p in b.get("problems", []) + b.get("moved_on_another_machine", []):
                    out.append("\n```\n" + p + "\n```")
        out += perf_lines(a.get("perf"))
        out.append("\n## Failures\n")
        if not a["failures"]:
            out.append("None.")
        for f in a["failures"]:
            out.append(f"### {f['clause']} [{f['dtype']}]\n\nReproduce: `{f['reproduce']}`\n\n```\n{f['message']}\n```")
        out.append("")
    return "\n".join(out) + "\n"


# -- several certificates side by side ---------------------------------------------------------
def render_compare(cols: list[tuple[str, dict, dict]]) -> str:
    """Several certificates side by side as one Markdown table, clause x adapter; ``cols`` as
    ``conformance.certificates.load`` gives them (label, adapter entry, whole certificate)."""
    if not cols:
        return "no adapters in the given certificates\n"
    top, moved = machine_notes(cols)
    clauses = sorted({cid for _, e, _ in cols for cid in e.get("clauses", {})})
    head = "| clause | " + " | ".join(c for c, _, _ in cols) + " |"
    lines = [*(f"{t}\n" for t in top), head, "|---|" + "---|" * len(cols)]
    lines.append("| **verdict** | " + " | ".join(f"**{e.get('verdict', '?')}**" for _, e, _ in cols) + " |")
    lines.append("| declared deviations | " + " | ".join(_deviation_cell(e) for _, e, _ in cols) + " |")
    lines.append("| expected failures | " + " | ".join(_expected_cell(e) for _, e, _ in cols) + " |")
    for cid in clauses:
        cells = []
        for _, e, _ in cols:
            cl = e.get("clauses", {}).get(cid)
            if cl is None:
                cells.append("-")
                continue
            cell = outcome_cell(cl["outcome"])
            if cl["outcome"] in ("fail", "expected failure"):
                cell += " (" + cl["detail"].split(": ", 1)[-1].split(" (")[0] + ")"
            cells.append(cell)
        lines.append(f"| {cid} | " + " | ".join(cells) + " |")
    dtypes = [d for d in DTYPES if any(d in e.get("error_stats", {}) for _, e, _ in cols)]
    for d in dtypes:
        cells = [max_error_cell(cols, i, d, moved) for i in range(len(cols))]
        lines.append(f"| max error vs oracle, {d} | " + " | ".join(cells) + " |")
    lines.append("| device | " + " | ".join(e.get("environment", {}).get("device", "-") for _, e, _ in cols) + " |")
    lines.append("| machine | " + " | ".join(_esc(machine_summary(d.get("machine"))) for _, _, d in cols) + " |")
    lines.append(
        "| golden set | " + " | ".join(f"`{(d['golden_set']['sha256'] or '-')[:12]}`" for _, _, d in cols) + " |"
    )
    lines.append("| date | " + " | ".join(d.get("date", "-") for _, _, d in cols) + " |")
    legend = (
        "\npass: passed in every dtype it applies to; **FAIL** (dtypes): failed there; n/a: the declaration "
        "rules the clause out (reasons in each certificate); expected failure: failed as the adapter's "
        "expectations file lists it; **STALE**: listed there but passed; -: not in that certificate. Declared "
        "deviations: declaration values that depart from a rule of the spec (each certificate quotes the rule).\n"
    )
    return "\n".join(lines) + "\n" + legend


def machine_notes(cols: list[tuple[str, dict, dict]]) -> tuple[list[str], dict[int, int]]:
    """The lines a comparison starts with when its certificates come from different machines, and,
    for each column measured on another machine than the first column of the same adapter, that
    column's index (column -> reference column): its figures that differ moved on another machine.

    Each certificate's machine record (harness.calls.machine) is compared with the first
    certificate's: "another machine: <label>: <what differs>", or "machine not recorded" for a
    certificate written before the record existed (compared as today)."""
    top, moved, seen = [], {}, set()
    first_doc, first_label = cols[0][2], cols[0][0]
    for label, _, doc in cols[1:]:
        if doc is first_doc or id(doc) in seen:
            continue
        seen.add(id(doc))
        changes = machine_changes(first_doc.get("machine"), doc.get("machine"))
        if changes is None:
            top.append(f"machine not recorded in {first_label if not first_doc.get('machine') else label}: "
                       "compared as on the same machine")  # fmt: skip
        elif changes:
            top.append(f"another machine: {label} against {first_label}: " + "; ".join(changes))
    reference: dict[str, int] = {}
    for i, (label, entry, doc) in enumerate(cols):
        j = reference.setdefault(str(entry.get("spec", label)), i)
        if j != i and machine_changes(cols[j][2].get("machine"), doc.get("machine")):
            moved[i] = j
    return top, moved


def max_error_cell(cols: list[tuple[str, dict, dict]], i: int, d: str, moved: dict[int, int]) -> str:
    """Column ``i``'s max error for dtype ``d``; "(moved on another machine)" where it differs from
    the same adapter's figure on the reference machine (not a regression: the verdicts judge)."""
    stats = cols[i][1].get("error_stats", {})
    if d not in stats:
        return "-"
    cell = f"{stats[d]['max']:.3g}"
    ref = cols[moved[i]][1].get("error_stats", {}).get(d) if i in moved else None
    if ref is not None and ref["max"] != stats[d]["max"]:
        cell += " (moved on another machine)"
    return cell


def perf_lines(section: dict | None) -> list[str]:
    """The Markdown certificate's lines for this run's performance data (empty when there is none)."""
    if not section:
        return []
    from conformance.harness.perf import report as perf_report

    lines = perf_report.summary_lines(section)
    if not lines:
        return []
    out = ["\n## Performance and engineering claims\n"]
    out += [f"- {line}" for line in lines]
    ratios = section.get("error_ratios") or {}
    if ratios:
        worst = sorted(((max(v.values()), cid) for cid, v in ratios.items() if v), reverse=True)[:5]
        out.append(
            "- closest to the allowance (worst |error| / allowed): " + ", ".join(f"{c} {r:.2g}" for r, c in worst)
        )
    return out


def deviation_lines(deviations: list[dict]) -> list[str]:
    """The declared deviations from the spec, each with the sentence it departs from (empty: none)."""
    if not deviations:
        return []
    out = [
        "## Declared deviations from the spec\n",
        "The kernel declares these conventions and the clauses test them as declared; each departs from "
        "a rule the spec states, so a run that passes conforms *as declared*, not to the spec.\n",
        "| field | value | what the kernel does | departs from |\n|---|---|---|---|",
    ]
    for d in deviations:
        out.append(
            f"| {d['field']} | {_esc(d['value'])} | {_esc(d['what'])} | "
            f"{_esc(d['file'])} {_esc(d['section'])}: \u201c{_esc(d['sentence'])}\u201d |"
        )
    return [*out, ""]


def expectation_run(entry: dict) -> str:
    """What one known cause did in the run, in words (the certificate's "this run" column)."""
    status = entry.get("status")
    if status == "matched":
        return f"explained {entry['tests']} failing clause test(s): {', '.join(entry['clauses'])}"
    if status == "stale":
        return f"STALE: no failing case, although {entry['reached']} cases with its features ran"
    if status == "other releases":
        return f"not applied: {entry.get('why') or 'holds for other releases'}"
    return "not reached: no case of this run had its features"


def expectation_lines(section: dict) -> list[str]:
    """The expectations file applied, its known causes, and what each did in the run (empty: none)."""
    if not section.get("file"):
        return []
    out = [f"## Known causes (expected failures)\n\nExpectations file: `{section['file']}`.\n"]
    if section.get("error"):
        out.append(f"Could not be read: {_esc(section['error'])}\n")
    out.append("| behaviour | when | reason | evidence | link | this run |\n|---|---|---|---|---|---|")
    for e in section.get("entries", []):
        run = expectation_run(e)
        run = f"**{run}**" if e.get("status") == "stale" else run
        out.append(
            f"| {_esc(e['behaviour'])} | {_esc(e['when_text'])} | {_esc(e['reason'])} | {_esc(e['evidence'])} "
            f"| {_esc(e.get('link') or '')} | {_esc(run)} |"
        )
    return [*out, ""]


def _deviation_cell(entry: dict) -> str:
    devs = entry.get("deviations") or []
    return ", ".join(f"{d['field']}={d['value']}" for d in devs) or "none"


def _expected_cell(entry: dict) -> str:
    cov = entry.get("coverage") or {}
    n, stale = cov.get("expected_failures", 0), cov.get("stale_expectations", 0)
    return f"{n}" + (f", **{stale} stale**" if stale else "")
