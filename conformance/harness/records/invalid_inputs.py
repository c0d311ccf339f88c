"""What a kernel did with each invalid input of 000 §8's preconditions, in words: the summary's line per
adapter, the certificate's section and the matrix's note read it from one table.

The table is precondition name -> the outcomes of its bad inputs (``what``, ``outcome``: refused,
accepted, crashed or declined, and ``detail``: what was raised or returned), as the precondition
clauses recorded them (``harness.run.preconditions``).
"""

from __future__ import annotations

from conformance.contract import PRECONDITIONS, Declaration
from conformance.harness.cases.preconditions import WORDS

_VERBS = {"accepted": "accepts", "crashed": "crashes on", "declined": "declines"}


def table_of(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rec in sorted(records, key=lambda r: PRECONDITIONS.index(r["name"])):
        out.setdefault(rec["name"], []).append({k: rec[k] for k in ("what", "outcome", "detail")})
    return out


def headline(by_name: dict[str, list[dict]], decl: Declaration | None = None) -> str:
    """The line: "refuses 11 of 14 invalid inputs; accepts batch, kv-length" (what it declares, where given)."""
    flat = [(n, r) for n, rs in by_name.items() for r in rs]
    refused = sum(r["outcome"] == "refused" for _, r in flat)
    text = "refuses all" if refused == len(flat) else f"refuses {refused} of"
    text += f" {len(flat)} invalid inputs"
    if decl is not None:
        held = "validates its inputs" if decl.validates_inputs else "declares validates_inputs=False"
        if decl.accepts_invalid:
            held += f", declares accepts_invalid={','.join(n for n in PRECONDITIONS if n in decl.accepts_invalid)}"
        text += f" ({held})"
    for kind, verb in _VERBS.items():
        names = [n for n, rs in by_name.items() if any(r["outcome"] == kind for r in rs)]
        if names:
            text += f"; {verb} {', '.join(names)}"
    return text


def line(spec: str, decl: Declaration, by_name: dict[str, list[dict]]) -> list[str]:
    """The summary's lines for one adapter: how many invalid inputs it refuses, then each one it accepts
    (and what it returned), declines or crashes on, and each precondition it refuses in part."""
    flat = [(n, r) for n, rs in by_name.items() for r in rs]
    if not flat:
        return []
    out = [f"{spec}: " + headline(by_name, decl).split("; ")[0]]
    for kind, verb in _VERBS.items():
        these = [(n, r) for n, r in flat if r["outcome"] == kind]
        if these:
            out.append(f"    {verb}: " + "; ".join(f"{n} ({r['what']}: {r['detail']})" for n, r in these))
    partial = sorted(
        n
        for n, rs in by_name.items()
        if len({r["outcome"] for r in rs}) > 1 and any(r["outcome"] == "refused" for r in rs)
    )
    for n in partial:
        kinds = {r["what"]: r["outcome"] for r in by_name[n]}
        out.append(f"    partly: {WORDS[n]}: " + ", ".join(f"{o} {w}" for w, o in kinds.items()))
    return out


def markdown(by_name: dict[str, list[dict]]) -> list[str]:
    """The certificate's section: the headline, then each bad input with what the kernel did."""
    out = [
        "\n## Invalid inputs (000 §8's preconditions)\n",
        headline(by_name) + ".\n",
        "| precondition | bad input | outcome | detail |\n|---|---|---|---|",
    ]
    for name, rows in by_name.items():
        for r in rows:
            detail = str(r["detail"]).replace("|", "\\|")
            out.append(f"| {name} | {r['what']} | {r['outcome']} | {detail} |")
    return out
