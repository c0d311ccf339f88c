"""Coverage as records and text: the cells (feature x shape class) and the value-class t-tuples a run
reached, tabulated against what the declaration admits, for the summary and the certificate.

The counting happens in the run (``run.coverage`` and ``run.pair_coverage``, whose records travel in
the test reports); this module only turns their totals into the certificate's tables and lines.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from conformance.contract import Declaration
from conformance.harness.cases import covering
from conformance.harness.cases.cells import FEATURES, SEP, SHAPE_CLASSES, admitted


def cells_table(reached: Counter, decl: Declaration) -> dict[str, Any]:
    """The certificate's record: per feature and shape class the count, None where not admitted."""
    admit = set(admitted(decl))
    rows = {
        f: {c: (reached.get(f"{f}{SEP}{c}", 0) if f"{f}{SEP}{c}" in admit else None) for c in SHAPE_CLASSES}
        for f in FEATURES
    }
    missing = [cell for cell in admitted(decl) if not reached.get(cell)]
    return {
        "shape_classes": list(SHAPE_CLASSES),
        "rows": rows,
        "admitted": len(admit),
        "reached": len(admit) - len(missing),
        "not_reached": missing,
    }


def cells_markdown(record: dict[str, Any]) -> list[str]:
    """The certificate's section: the table, then the admitted cells never reached."""
    classes = record["shape_classes"]
    out = [
        "\n## Coverage of the case space\n",
        f"Cases that reached the kernel, per feature and shape class: **{record['reached']} of "
        f"{record['admitted']} cells the declaration admits were reached**. `-` = not admitted by the "
        "declaration (or no case can fall there); **0** = admitted but never reached.\n",
        "| feature | " + " | ".join(classes) + " |",
        "|---|" + "---:|" * len(classes),
    ]
    for feature, row in record["rows"].items():
        marks = ["-" if n is None else ("**0**" if n == 0 else str(n)) for n in (row[c] for c in classes)]
        out.append(f"| {feature} | " + " | ".join(marks) + " |")
    if record["not_reached"]:
        out.append("\nAdmitted by the declaration but never reached in this run: " + "; ".join(record["not_reached"]))
    else:
        out.append("\nEvery cell the declaration admits was reached.")
    return out


def _n(k: int) -> str:
    return f"{k:,}".replace(",", " ")


def plan_summary(decl: Declaration, t: int) -> dict[str, Any]:
    """What the coverage record needs of the strength-``t`` plan for ``decl``, as JSON: the row count,
    the admitted tuples' names, the excluded tuples and values with their reasons. A pytest-xdist
    worker that ran the covering clauses has the plan at hand and sends this to the controlling
    process (run.pair_coverage), which would otherwise build every adapter's plan again at the end
    of the run (0.7 s each for t = 2, serially, after the last test)."""
    plan = covering.plan(decl, t)
    return {
        "rows": len(plan.rows),
        "admitted": [covering.name(tup) for tup in plan.admitted],
        "excluded": {covering.name(tup): why for tup, why in plan.excluded.items()},
        "excluded_values": {f"{p}: {v}": why for (p, v), why in plan.excluded_values.items()},
    }


def pairs_table(
    recs: list[dict[str, str]],
    decl: Declaration,
    ts: tuple[int, ...],
    plans: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The certificate's record: per t, admitted / reached, the admitted tuples not reached, the
    excluded tuples and values with their reasons. ``plans``: :func:`plan_summary` per str(t) where
    already known (sent by a worker); any other is built here."""
    out: dict[str, Any] = {}
    for t in ts:
        plan = (plans or {}).get(str(t)) or plan_summary(decl, t)
        reached = {name for r in recs for name in covering.reached(r, t)}
        missing = [a for a in plan["admitted"] if a not in reached]
        out[str(t)] = {
            "rows": plan["rows"],
            "admitted": len(plan["admitted"]),
            "reached": len(plan["admitted"]) - len(missing),
            "cases": len(recs),
            "not_reached": missing,
            "excluded": plan["excluded"],
            "excluded_values": plan["excluded_values"],
        }
    return out


def pairs_line(t: str, rec: dict[str, Any], shown: int = 4) -> str:
    """``2-way: 1 754 / 1 754 admitted pairs reached (72 rows; 17 pairs and 1 value excluded, with reasons)``."""
    what = {"2": "pairs", "3": "triples"}.get(t, f"{t}-tuples")
    text = f"{t}-way: {_n(rec['reached'])} / {_n(rec['admitted'])} admitted {what} reached ({rec['rows']} rows"
    nv = len(rec["excluded_values"])
    text += f"; {_n(len(rec['excluded']))} {what} and {nv} value{'s' * (nv != 1)} excluded, with reasons)"
    if rec["not_reached"]:
        text += "; not reached: " + "; ".join(rec["not_reached"][:shown])
        if len(rec["not_reached"]) > shown:
            text += f"; ... and {len(rec['not_reached']) - shown} more (--certificate lists all)"
    return text


def pairs_excluded_line(rec: dict[str, Any]) -> str:
    """The excluded values, and the excluded tuples counted by their first reason (the certificate lists each)."""
    reasons = Counter(why.split("; ")[0] for why in rec["excluded"].values())
    parts = [f"{k} ({why.split('; ')[0][:70]})" for k, why in rec["excluded_values"].items()]
    parts += [f"{n} x {why}" for why, n in reasons.most_common()]
    return "excluded: " + "; ".join(parts) if parts else "excluded: none"


def pairs_markdown(record_: dict[str, Any]) -> list[str]:
    out = ["\n## Pair coverage (covering arrays, COVER-PAIRS-01 / COVER-PAIRS-GRAD-02)\n"]
    for t, rec in record_.items():
        out.append(f"**{pairs_line(t, rec, shown=0)}**, from {rec['cases']} cases that reached the kernel.\n")
        if rec["not_reached"]:
            out.append("Admitted but never reached: " + "; ".join(f"`{a}`" for a in rec["not_reached"]) + "\n")
        if rec["excluded_values"]:
            out.append("| value excluded | reason |\n|---|---|")
            out += [f"| {k} | {why} |" for k, why in rec["excluded_values"].items()]
        if rec["excluded"]:
            out.append(f"\n| {t}-tuple excluded | reason |\n|---|---|")
            out += [f"| {k} | {why} |" for k, why in rec["excluded"].items()]
    return out
