"""Coverage as records and text: the cells (feature x shape class) and the value-class t-tuples a run
reached, tabulated against what the declaration admits, for the summary and the certificate.

The counting happens in the run (``run.coverage`` and ``run.pair_coverage``, whose records travel in
the test reports); this module only turns their totals into the certificate's tables and lines.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from conformance.contract import Declaration
from conformance.harness.cases.cells import FEATURES, SEP, SHAPE_CLASSES, admitted
from conformance.harness.covering import array as covering
from conformance.harness.covering import hiding, tuples


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
        "admitted": [tuples.name(tup) for tup in plan.admitted],
        "excluded": {tuples.name(tup): why for tup, why in plan.excluded.items()},
        "excluded_values": {f"{p}: {v}": why for (p, v), why in plan.excluded_values.items()},
    }


def hidden_of(rec: dict[str, Any]) -> dict:
    """What a value-class record (``run.pair_coverage.record``) says was hidden in its case, as
    ``hiding`` takes it."""
    return {(p, v): [frozenset(map(tuple, h)) for h in hs] for p, v, hs in rec.get("hidden", [])}


def pairs_table(
    recs: list[dict[str, Any]],
    decl: Declaration,
    ts: tuple[int, ...],
    plans: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The certificate's record: per t, admitted / observable / reached, the admitted tuples never
    observable (reached but hidden, with what hid them, or not reached at all), the excluded tuples and
    values with their reasons, and the values each class took. ``plans``: :func:`plan_summary` per
    str(t) where already known (sent by a worker); any other is built here."""
    out: dict[str, Any] = {}
    hidden_by: dict[str, set[str]] = {}
    taken: dict[str, set[str]] = {}
    blocked = {r["blocked"]: r["by"] for r in recs if "blocked" in r}
    recs = [r for r in recs if "values" in r]
    for r in recs:
        for p, values in r.get("took", {}).items():
            if p in r["values"]:
                taken.setdefault(f"{p}: {r['values'][p]}", set()).update(values)
    for t in ts:
        plan = (plans or {}).get(str(t)) or plan_summary(decl, t)
        reached: set[str] = set()
        shown: set[str] = set()
        for r in recs:
            values, hidden = r["values"], hidden_of(r)
            tups = tuples.tuples_of(values, t)
            names = [tuples.name(tup) for tup in tups]
            reached.update(names)
            visible = {n for n, tup in zip(names, tups) if hiding.observable(tup, hidden)}
            shown |= visible
            unseen = set(names) - visible
            if t == min(ts) and unseen:
                what_hid = hiding.describe(hidden)  # one record's hidden values, the same for each of its tuples
                for name in unseen:
                    hidden_by.setdefault(name, set()).update(what_hid)
        admitted = plan["admitted"]
        # a pair whose value the kernel fails alone (the covering clause ran it so) cannot show anything
        # else there; named apart, and out of the share observable coverage is stated as
        stopped = {a: blocked[a] for a in admitted if t == 2 and a in blocked and a not in shown}
        out[str(t)] = {
            "rows": plan["rows"],
            "admitted": len(admitted),
            "observable": sum(a in shown for a in admitted),
            "reached": sum(a in reached for a in admitted),
            "cases": len(recs),
            "not_observable": {
                a: sorted(hidden_by.get(a, ()))[:4]
                for a in admitted
                if a in reached and a not in shown and a not in stopped
            },
            "not_reached": [a for a in admitted if a not in reached and a not in stopped],
            "blocked": stopped,
            "excluded": plan["excluded"],
            "excluded_values": plan["excluded_values"],
            "values_taken": {k: _sorted_values(v) for k, v in sorted(taken.items())},
        }
    return out


def _sorted_values(values: set[str]) -> list[str]:
    def key(x: str):
        try:
            return (0, float(x.split(":")[0]), x)
        except ValueError:
            return (1, 0.0, x)

    return sorted(values, key=key)


def pairs_line(t: str, rec: dict[str, Any], shown: int = 4) -> str:
    """``2-way: 1 754 / 1 754 admitted pairs observable (80 rows, 160 cases; 17 pairs and 1 value
    excluded, with reasons)``: a pair counts where it reached the kernel and no third value hid it."""
    what = {"2": "pairs", "3": "triples"}.get(t, f"{t}-tuples")
    obs = rec.get("observable", rec["reached"])
    blocked = rec.get("blocked") or {}
    text = f"{t}-way: {_n(obs)} / {_n(rec['admitted'] - len(blocked))} admitted {what} observable"
    if blocked:
        by = sorted(set(blocked.values()))
        text += (
            f" ({_n(len(blocked))} more blocked: the kernel fails every case of "
            + ", ".join(f"`{b}`" for b in by[:3])
            + (f" and {len(by) - 3} more values" if len(by) > 3 else "")
            + " alone)"
        )
    text += f" ({rec['rows']} rows"
    text += f", {_n(rec['cases'])} cases" if "cases" in rec else ""
    nv = len(rec["excluded_values"])
    text += f"; {_n(len(rec['excluded']))} {what} and {nv} value{'s' * (nv != 1)} excluded, with reasons)"
    missing = list(rec.get("not_observable", {})) + rec["not_reached"]
    if missing:
        text += "; not observable: " + "; ".join(missing[:shown])
        if len(missing) > shown:
            text += f"; ... and {len(missing) - shown} more (--certificate lists all)"
    return text


def pairs_excluded_line(rec: dict[str, Any]) -> str:
    """The excluded values, and the excluded tuples counted by their first reason (the certificate lists each)."""
    reasons = Counter(why.split("; ")[0] for why in rec["excluded"].values())
    parts = [f"{k} ({why.split('; ')[0][:70]})" for k, why in rec["excluded_values"].items()]
    parts += [f"{n} x {why}" for why, n in reasons.most_common()]
    return "excluded: " + "; ".join(parts) if parts else "excluded: none"


def pairs_markdown(record_: dict[str, Any]) -> list[str]:
    out = ["\n## Pair coverage (covering arrays, COVER-PAIRS-01 / COVER-PAIRS-GRAD-02)\n"]
    out.append(
        "A pair counts where it reached the kernel in a case in which no third value hides it (S = 1 "
        "hides Dk and the scale, scale 0 hides Dk, ...: docs/case-space.md).\n"
    )
    for t, rec in record_.items():
        out.append(f"**{pairs_line(t, rec, shown=0)}**, from {rec['cases']} cases that reached the kernel.\n")
        if rec.get("not_observable"):
            out.append("Reached, but only where another value hid them:\n")
            out += [f"- `{a}`: hidden as {'; '.join(by) or '?'}" for a, by in rec["not_observable"].items()]
            out.append("")
        if rec.get("blocked"):
            out.append(
                "Blocked: admitted, but a value of the pair fails alone on this kernel (it raised or refused "
                "a case holding only that value), so nothing else can show there:\n"
            )
            out += [f"- `{a}`: blocked by `{by}`" for a, by in rec["blocked"].items()]
            out.append("")
        if rec["not_reached"]:
            out.append("Admitted but never reached: " + "; ".join(f"`{a}`" for a in rec["not_reached"]) + "\n")
        if rec.get("values_taken") and t == min(record_):
            out.append("| value class | values it took |\n|---|---|")
            for k, vals in rec["values_taken"].items():
                more = f" ... ({len(vals)} values)" if len(vals) > 16 else ""
                out.append(f"| {k} | {', '.join(vals[:16])}{more} |")
            out.append("")
        if rec["excluded_values"]:
            out.append("| value excluded | reason |\n|---|---|")
            out += [f"| {k} | {why} |" for k, why in rec["excluded_values"].items()]
        if rec["excluded"]:
            out.append(f"\n| {t}-tuple excluded | reason |\n|---|---|")
            out += [f"| {k} | {why} |" for k, why in rec["excluded"].items()]
    return out
