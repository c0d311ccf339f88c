"""Formulation hypotheses for likely causes: the oracle re-asked under each candidate formulation, and
one precision across dtypes.

Two questions, asked of failures the feature sets of ``harness.causes.likely`` would otherwise split:

* **Which declared formulation would make this output right?** :func:`alternatives` yields, for a
  failing case, each formulation the kernel did not declare and the case can tell apart
  (conformance/oracle_formulations.py: float32 operands in TF32 / bfloat16 / float16; float16 and
  bfloat16 products, sums or scores in the input dtype with each placement of the scale; Q scaled
  in the input dtype; a finite fill, named or a round number); ``harness.causes.conventions`` asks the
  oracle and the error model of each, exactly as for the conventions, and a match becomes the
  cause's ``--declare``.
* **Is every dtype computed at one lower precision?** A kernel that rounds everything to bfloat16
  fails in float64, float32 and float16 alike, and the feature sets would name one cause per dtype.
  :func:`precision_cause` reads each failure's measured error (relative, at its worst element) in
  units of each candidate precision; the precision at which the failures of at least two dtypes sit
  (between 1/8 and 4 of its unit roundoff) is one cause, placed first, with the ``--declare`` that
  expresses it where a field can (float32_computed_as; float64 at float32 is the nearest float64
  has) and the dtypes where none can.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator

import numpy as np

from conformance.contract import FINITE_FILLS, FLOAT32_FORMATS, LOW_PRECISION, Case, Declaration
from conformance.harness.judge.tolerance import UNIT_ROUNDOFF

FILLS = FINITE_FILLS  # tried on a failing case that has blocked keys (contract.FINITE_FILLS)
# Precisions a kernel may compute at, coarsest first, with their unit roundoffs.
PRECISIONS = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
LOW, HIGH = 1.0 / 8.0, 4.0  # a failure "sits at" precision P when LOW u_P <= rel_err <= HIGH u_P


def alternatives(case: Case, decl: Declaration) -> Iterator[tuple[str, Case, Declaration, bool]]:
    """(``--declare`` text, case, declaration, rows) for each formulation the kernel did not declare and
    the case can tell apart (``harness.causes.conventions._alternatives``' form; rows False: every row)."""
    dtype = case.dtype
    if case.has_variant or case.dropout_p > 0:
        return
    if dtype == "float32" and decl.float32_computed_as == "float32":
        for fmt in FLOAT32_FORMATS[1:]:
            yield f"float32_computed_as={fmt}", case, decl.replace(float32_computed_as=fmt), False
    if dtype in LOW_PRECISION and decl.computed_as(dtype) == "float32":
        field = f"{dtype}_computed_as"
        for how in ("products", "scores", "sums"):
            for where in ("scores", "product", "query"):
                extra = "" if where == decl.scale_applied else f" --declare scale_applied={where}"
                text = f"{field}={dtype}-{how}{extra}"
                yield text, case, decl.replace(**{field: f"{dtype}-{how}", "scale_applied": where}), False
        if decl.scale_applied != "query":
            yield "scale_applied=query", case, decl.replace(scale_applied="query"), False
    if decl.blocked_fill == "-inf" and (case.mask is not None or case.is_causal):
        for fill in FILLS:
            yield f"blocked_fill={fill}", case, decl.replace(blocked_fill=fill, all_blocked="mean-v"), False


# -- one precision across dtypes -------------------------------------------------------------------------
def _rel(row: dict) -> float | None:
    m = (row.get("failure") or {}).get("measure") or {}
    rel = m.get("rel_err")
    return float(rel) if isinstance(rel, (int, float)) and np.isfinite(rel) and rel > 0 else None


def _dtype(row: dict) -> str:
    return str((row.get("failure") or {}).get("dtype") or row.get("dtype"))


def precision_cause(rows: list[dict]) -> tuple[dict, set[int]] | None:
    """(cause, indices of ``rows`` it explains) when the failures of two or more dtypes sit at one
    lower precision (see the module docstring); None otherwise."""
    best = None
    for name, u in PRECISIONS.items():
        hit = set()
        for i, r in enumerate(rows):
            if (r.get("failure") or {}).get("within_allowance"):
                continue  # right by the error model: a rule other than accuracy failed, no precision explains it
            rel, dt = _rel(r), _dtype(r)
            if rel is None or dt not in UNIT_ROUNDOFF or UNIT_ROUNDOFF[dt] >= u:
                continue  # only a dtype finer than the precision can be computed at it
            if LOW * u <= rel <= HIGH * u:
                hit.add(i)
        dtypes = {_dtype(rows[i]) for i in hit}
        if len(dtypes) >= 2 and (best is None or len(hit) > len(best[2])):
            best = (name, u, hit)
    if best is None:
        return None
    name, u, hit = best
    chosen = [rows[i] for i in sorted(hit)]
    return _describe(name, u, chosen), hit


def declares_for(precision: str, dtypes: set[str]) -> tuple[list[str], list[str]]:
    """(the ``--declare`` settings expressing "computed at ``precision``" for ``dtypes``, the dtypes no
    field can say it of)."""
    out, none = [], []
    for dt in sorted(dtypes, key=lambda d: -UNIT_ROUNDOFF[d]):
        if dt == "float32" and precision in FLOAT32_FORMATS:
            out.append(f"float32_computed_as={precision}")
        elif dt == "float64":
            out.append("float64_computed_as=float32")  # the nearest: float64 has no lower formulation
            if precision != "float32":
                none.append("float64")
        else:
            none.append(dt)
    return out, none


def _describe(name: str, u: float, chosen: list[dict]) -> dict:
    dtypes = {_dtype(r) for r in chosen}
    declares, undeclarable = declares_for(name, dtypes)
    rels = [_rel(r) for r in chosen]
    med = statistics.median(rels)
    ratios = []
    for r in chosen:
        m = r["failure"].get("measure") or {}
        if isinstance(m.get("err"), (int, float)) and isinstance(m.get("allowed"), (int, float)) and m["allowed"]:
            ratios.append(m["err"] / m["allowed"])
    summary = {"cases": len(chosen), "nan_cases": 0, "median_rel_err": med, "in_units": f"{med / u:.2g} {name} u"}
    if ratios:
        summary["times_allowed"] = statistics.median(ratios)
    matched = sum(1 for r in chosen if any(d in (r["failure"].get("matches") or ()) for d in declares))
    return {
        "features": [f"computed at {name} precision"],
        "precision": name,
        "clause_tests": len(chosen),
        "clauses": len({r["clause"] for r in chosen}),
        "clause_ids": sorted({r["clause"] for r in chosen}),
        "dtypes": sorted(dtypes, key=lambda d: -UNIT_ROUNDOFF[d]),
        "calls": dict(Counter(r["failure"]["call"] for r in chosen)),
        "passing_cases_with_it": 0,
        "passing_cases": 0,
        "errors": {"/".join(sorted(dtypes, key=lambda d: -UNIT_ROUNDOFF[d])): summary},
        "declare": " --declare ".join(declares) if declares else None,
        "declare_matched": matched,
        "declare_checked": sum(1 for r in chosen if r["failure"].get("checked")),
        "not_declarable": undeclarable,
    }
