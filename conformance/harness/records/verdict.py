"""The verdict: one function decides what a run says about a kernel, for the summary, the
certificate and the exit code alike.

Why a single function: the word CONFORMS is the product, and three places that each count
outcomes their own way (as the summary and the certificate once did) drift apart. Here the rule
is written once:

* **DOES NOT CONFORM** — some clause failed (an undeclared refusal is a failure, see
  ``harness.calls.guarded``).
* **PARTIAL** — no failure, but some clause of the profile did not run on every dtype it plans
  (deselected with ``-k``/``--deselect``, a file subset, stopped by ``-x``, or skipped for a reason
  that is not the kernel's declaration). A partial run is never a certification.
* **NOT RUN** — nothing failed and nothing passed: the declaration ruled every clause out, or the
  adapter is unavailable here.
* **DEVIATES AS EXPECTED** — no unexpected failure, but some clause tests failed as a known cause of an
  expectations file explains them (harness.records.expectations: a library's known behaviours, each
  scoped by the case features it shows on, with its reason). Not a claim of conformance; exit code 0,
  so a library's CI gates on "no new deviation". A cause that no longer fails anywhere the run reached
  its features is *stale* and fails the run (DOES NOT CONFORM), as pytest's strict xfail does.
* **CONFORMS AS DECLARED** — every clause passed or was not applicable, under a declaration that
  departs from rules the spec states (harness.records.deviations: e.g. ``all_blocked=mean-v`` against 000 §8's
  zero rows); the verdict lists each deviation with the sentence it departs from.
* **CONFORMS** — every clause of the profile ran on every planned dtype and each passed or was not
  applicable *by the kernel's declaration*, and the declaration deviates from no rule of the spec.

Clauses that belong to another profile (the long-sequence clauses of ``thorough``) are listed as
"not in this profile" and do not count either way. Records cross process boundaries (pytest-xdist
workers) as plain dicts, hence :meth:`ClauseResult.as_dict` / :meth:`ClauseResult.from_dict`.
(Over 250 lines: the rule, its words and the lines that explain a verdict are kept in one module.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from conformance.harness.records.deviations import grouped
from conformance.harness.records.reasons import merged
from conformance.harness.spec.report import MEASURED_CAPABILITY

PASSED = "passed"
FAILED = "failed"
NOT_APPLICABLE = "not applicable"  # by the kernel's declaration
NOT_IN_PROFILE = "not in profile"
SKIPPED = "skipped"  # anything else: adapter unavailable, an unexpected skip
NOT_RUN = "not run"  # planned, but no result came back (deselected, interrupted)
EXPECTED_FAILURE = "expected failure"  # failed, as a known cause explains (harness.records.expectations)

CONFORMS = "CONFORMS"
CONFORMS_AS_DECLARED = "CONFORMS AS DECLARED"
DEVIATES_AS_EXPECTED = "DEVIATES AS EXPECTED"
DOES_NOT_CONFORM = "DOES NOT CONFORM"
PARTIAL = "PARTIAL"
NOT_RUN_VERDICT = "NOT RUN"

# Exit codes: pytest's own for a failure (1) and for nothing to run (5); 6 for a partial run, so a
# CI gate on the exit code never passes a run that covered a subset (``--allow-partial`` opts out).
EXIT_CODES = {
    CONFORMS: 0,
    CONFORMS_AS_DECLARED: 0,
    DEVIATES_AS_EXPECTED: 0,
    DOES_NOT_CONFORM: 1,
    NOT_RUN_VERDICT: 5,
    PARTIAL: 6,
}
_SEVERITY = (CONFORMS, CONFORMS_AS_DECLARED, DEVIATES_AS_EXPECTED, PARTIAL, NOT_RUN_VERDICT, DOES_NOT_CONFORM)


@dataclass(frozen=True)
class ClauseResult:
    """How one clause test (clause x adapter x dtype) ended, with the cases it covered.

    ``cases_run`` counts kernel calls that returned; ``cases_declared_na`` the generated cases the
    declaration ruled out; ``cases_refused`` the cases the kernel refused although its declaration
    covers them. For property-based clauses ``examples_planned`` is hypothesis' ``max_examples``
    and ``examples_run`` the examples that actually reached the kernel. ``case_features`` and
    ``failure`` are what ``harness.causes.likely`` groups failures by (JSON-sized; None when not recorded).
    """

    clause: str
    impl: str
    dtype: str | None
    outcome: str
    reason: str = ""
    nodeid: str = ""
    duration: float = 0.0
    cases_run: int = 0
    cases_declared_na: int = 0
    cases_refused: int = 0
    examples_run: int | None = None
    examples_planned: int | None = None
    case_features: dict[str, int] | None = None  # passed: feature key -> cases run (harness.cases.features)
    failure: dict | None = None  # failed: the failing case's features, call, error, matches (harness.causes.likely)
    expectation: str | None = None  # expected failure: the key of the known cause that explains it

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ClauseResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Verdict:
    """The verdict on one adapter and the counts behind it."""

    word: str
    clauses_planned: int
    clauses_passed: list[str] = field(default_factory=list)
    clauses_failed: list[str] = field(default_factory=list)
    clauses_expected: dict[str, str] = field(default_factory=dict)  # clause -> "dtypes: cause" (expected failures)
    causes_expected: dict[str, dict] = field(default_factory=dict)  # behaviour -> review (records.expectations)
    causes_stale: dict[str, str] = field(default_factory=dict)  # behaviour -> why its entry is stale
    causes_unseen: list[str] = field(default_factory=list)  # known causes no failure of a partial run showed
    deviations: list[dict] = field(default_factory=list)  # harness.records.deviations.Deviation.as_dict(), declared
    clauses_na: dict[str, str] = field(default_factory=dict)  # clause -> reason (by declaration)
    # clause -> reason: the kernel refused what the clause asks (a transform it has no rule for), measured
    clauses_refused: dict[str, str] = field(default_factory=dict)
    clauses_missing: dict[str, str] = field(default_factory=dict)  # clause -> why it is incomplete
    not_in_profile: list[str] = field(default_factory=list)
    cases_run: int = 0
    cases_refused: int = 0
    cases_declared_na: int = 0
    thin_examples: dict[str, str] = field(default_factory=dict)  # "ID[dtype]" -> "5 of 25 ..."

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.word]

    def headline(self) -> str:
        """One line: the word, clause coverage and case coverage."""
        return f"{self.word}: {self.coverage()}"

    def coverage(self) -> str:
        """Clause coverage and case coverage, in one line."""
        run = sum(map(len, (self.clauses_passed, self.clauses_failed, self.clauses_na, self.clauses_refused)))
        run += len(self.clauses_expected)
        parts = [f"{len(self.clauses_passed)}/{self.clauses_planned} clauses passed"]
        if self.clauses_failed:
            parts.append(f"{len(self.clauses_failed)} failed")
        if self.causes_stale:
            parts.append(_plural(len(self.causes_stale), "stale expectation"))
        if self.clauses_expected:
            n = len(self.causes_expected)
            parts.append(_plural(len(self.clauses_expected), "expected failure") + f" ({_plural(n, 'known cause')})")
        if self.clauses_refused:
            parts.append(f"{len(self.clauses_refused)} refused by the kernel (measured capabilities)")
        if self.clauses_na:
            parts.append(f"{len(self.clauses_na)} not applicable by declaration")
        if self.clauses_missing:
            parts.append(f"{len(self.clauses_missing)} not run or incomplete ({run} of {self.clauses_planned} run)")
        text = ", ".join(parts)
        text += f"; {self.cases_run} cases run"
        if self.cases_refused:
            text += f", {self.cases_refused} refused without a declaration"
        if self.cases_declared_na:
            text += f", {self.cases_declared_na} generated cases not applicable by declaration"
        return text

    def details(self, limit: int = 8) -> list[str]:
        """Indented lines that say what the headline's counts are made of."""
        lines = []
        if self.clauses_failed:
            lines.append("failed: " + ", ".join(self.clauses_failed))
        for behaviour, why in sorted(self.causes_stale.items()):
            lines.append(f"stale expectation: {behaviour!r}: {why}")
        if self.causes_unseen:
            lines.append(
                "known causes not seen failing in this partial run (stale or not, a whole run decides): "
                + "; ".join(self.causes_unseen)
            )
        for behaviour, seen in sorted(self.causes_expected.items()):
            lines.append(
                f"expected cause: {behaviour} (when {seen['when_text']}): {_plural(seen['tests'], 'clause test')}, "
                + ", ".join(seen["clauses"])
            )
        for d in grouped(self.deviations):
            lines.append(f"declared deviation: {d['declare']} ({d['what']}) departs from {d['citation']}")
        if self.clauses_missing:
            items = sorted(self.clauses_missing.items())
            shown = "; ".join(f"{c} ({why})" for c, why in items[:limit])
            more = f"; ... and {len(items) - limit} more" if len(items) > limit else ""
            lines.append(f"not run or incomplete: {shown}{more}")
        if self.clauses_refused:
            items = sorted(self.clauses_refused.items())
            lines.append("refused by the kernel (a measured capability): " + "; ".join(f"{c} ({w})" for c, w in items))
        if self.clauses_na:
            items = sorted(self.clauses_na.items())
            shown = "; ".join(f"{c} ({why})" for c, why in items[:limit])
            more = f"; ... and {len(items) - limit} more" if len(items) > limit else ""
            lines.append(f"not applicable by declaration: {shown}{more}")
        if self.thin_examples:
            lines.append(
                "property clauses with fewer examples run than planned: "
                + "; ".join(f"{k}: {v}" for k, v in sorted(self.thin_examples.items()))
            )
        if self.not_in_profile:
            lines.append("not in this profile: " + ", ".join(self.not_in_profile))
        if self.word == PARTIAL:
            lines.append("a partial run is not a certification: run every clause (no -k, --deselect or file subset)")
        return lines


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _expected_detail(rows: list[ClauseResult], order: tuple[str | None, ...]) -> str:
    """'float16, bfloat16: <reason>' for a clause's expected failures, dtypes in the plan's order."""
    rank = {d: i for i, d in enumerate(order)}
    hit = sorted((r for r in rows if r.outcome == EXPECTED_FAILURE), key=lambda r: rank.get(r.dtype, len(rank)))
    dts = ", ".join(str(r.dtype) for r in hit if r.dtype) or "no dtype axis"
    return f"{dts}: {_clause_reason(hit)}"


def _clause_reason(rows: list[ClauseResult]) -> str:
    return merged(r.reason.removeprefix(f"not applicable to {r.impl}: ") for r in rows if r.reason)[:300]


def decide(
    results: Iterable[ClauseResult],
    planned: dict[str, tuple[str | None, ...]],
    deviations: Iterable[dict] = (),
    expectations: Iterable[Any] = (),
) -> Verdict:
    """The verdict on one adapter from its clause results and the run's plan.

    ``planned`` maps every clause id of the suite to the dtypes it runs with (``(None,)`` for a
    clause without a dtype axis). A planned (clause, dtype) with no result is *not run*.
    ``deviations`` are the declaration's departures from the spec (``harness.records.deviations``, as dicts):
    a run that would conform conforms *as declared* when there are any. ``expectations``: the known
    causes that applied (``harness.records.expectations.Expectation``); each is reviewed against the
    records, and a stale one is a failure of the run.
    """
    results = list(results)
    by_clause: dict[str, dict[str | None, ClauseResult]] = {}
    for r in results:
        by_clause.setdefault(r.clause, {})[r.dtype] = r
    v = Verdict(word=CONFORMS, clauses_planned=0, deviations=[dict(d) for d in deviations])
    for cid in sorted(set(planned) | set(by_clause)):
        got = by_clause.get(cid, {})
        rows = list(got.values())
        for r in rows:
            v.cases_run += r.cases_run
            v.cases_refused += r.cases_refused
            v.cases_declared_na += r.cases_declared_na
            if r.examples_planned and r.outcome == PASSED and (r.examples_run or 0) < r.examples_planned:
                v.thin_examples[f"{cid}[{r.dtype}]"] = (
                    f"{r.examples_run or 0} of {r.examples_planned} planned examples ran"
                    + (
                        f" ({r.cases_declared_na} drawn cases not applicable by declaration)"
                        if r.cases_declared_na
                        else ""
                    )
                )
        if rows and all(r.outcome == NOT_IN_PROFILE for r in rows):
            v.not_in_profile.append(cid)
            continue
        v.clauses_planned += 1
        outcomes = {r.outcome for r in rows}
        missing = [d for d in planned.get(cid, ()) if d not in got]
        if FAILED in outcomes:
            v.clauses_failed.append(cid)
        elif missing or SKIPPED in outcomes or NOT_IN_PROFILE in outcomes:
            if not rows:
                why = "not selected or not run"
            elif missing:
                why = "not run for " + ", ".join(str(d) for d in missing)
            else:
                why = "skipped: " + _clause_reason([r for r in rows if r.outcome == SKIPPED])
            v.clauses_missing[cid] = why
        elif EXPECTED_FAILURE in outcomes:
            v.clauses_expected[cid] = _expected_detail(rows, planned.get(cid, ()))
        elif PASSED in outcomes:
            v.clauses_passed.append(cid)
        else:
            why = _clause_reason(rows)
            (v.clauses_refused if MEASURED_CAPABILITY in why else v.clauses_na)[cid] = why
    _review(v, list(expectations), results)
    ran = (PASSED, FAILED, EXPECTED_FAILURE)
    if v.clauses_failed or v.causes_stale:
        v.word = DOES_NOT_CONFORM
    elif not v.clauses_passed and not any(r.outcome in ran for rows in by_clause.values() for r in rows.values()):
        v.word = NOT_RUN_VERDICT
    elif v.clauses_missing:
        v.word = PARTIAL
    elif v.clauses_expected:
        v.word = DEVIATES_AS_EXPECTED
    elif v.deviations:
        v.word = CONFORMS_AS_DECLARED
    return v


def _review(v: Verdict, entries: list[Any], results: list[ClauseResult]) -> None:
    """The known causes' part of the verdict: what each explained, and which are stale. A partial run
    (clauses missing) cannot tell a stale cause from one whose failing clauses were not selected: such
    causes are listed as unseen, not failed."""
    if not entries:
        return
    from conformance.harness.records.expectations import review

    seen = review(entries, (r.as_dict() for r in results))
    for e in entries:
        got = seen[e.key]
        if got["status"] == "matched":
            v.causes_expected[e.behaviour] = {**got, "when_text": e.when_text(), "where": e.where}
        elif got["status"] == "stale" and v.clauses_missing:
            v.causes_unseen.append(e.behaviour)
        elif got["status"] == "stale":
            v.causes_stale[e.behaviour] = (
                f"no failing case with {e.when_text()} in this run, although {got['reached']} cases with those "
                f"features ran: the kernel no longer does this; remove {e.where}"
            )


def clause_outcome(rows: list[dict]) -> tuple[str, str]:
    """(outcome, detail) of one clause over the dtypes it ran with: the certificate's clause column.

    Here beside :func:`decide` so that the word a certificate shows for a clause follows the same
    outcomes as the verdict it sums up."""
    outs = [r["outcome"] for r in rows]

    def dts(kind):
        return ", ".join(str(r["dtype"]) for r in rows if r["outcome"] == kind and r["dtype"])

    if "failed" in outs:
        return "fail", f"failed: {dts('failed') or 'all'}"
    if "expected failure" in outs:
        passed = dts("passed")
        return "expected failure", f"expected failure: {dts('expected failure') or 'all'}" + (
            f"; passed: {passed}" if passed else ""
        )
    if "passed" in outs:
        na = [r for r in rows if r["outcome"] != "passed"]
        detail = f"passed: {dts('passed') or 'yes'}"
        if na:
            detail += "; not applicable: " + "; ".join(f"{r['dtype'] or ''} ({r['reason']})".strip() for r in na)
        return "pass", detail
    kinds = {r["outcome"] for r in rows}
    kind = next((k for k in ("skipped", "not in profile", "not applicable") if k in kinds), "skipped")
    return kind, merged(r["reason"] for r in rows if r["reason"])


def worst(words: Iterable[str]) -> str | None:
    """The most severe of several verdicts (the run's exit code follows it); None for none."""
    words = list(words)
    return max(words, key=_SEVERITY.index) if words else None
