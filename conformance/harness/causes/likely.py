"""Likely causes: the failures of one adapter grouped by the smallest feature sets that explain them.

Fifty failing clauses often have one cause (a softmax run in float32 for float64 inputs); a reader
should not have to find it in fifty tracebacks. Every clause test records what it needs
(``harness.causes.record``: the ``case_features`` of the cases that reached the kernel when it
passed; its ``failure`` when it failed: the failing case's features, the guarded call, the measured
error and the conventions under which the kernel's output would have been right,
``harness.causes.conventions``), and at the
end of the run :func:`likely_causes` sets the failing cases' features against the passing ones'.

A feature set F *explains* a failure when the failing case has every feature of F and F is absent
or rare (at most :data:`RARE` of the cases) among the cases that passed *the same clause* in other
dtypes; a clause that failed in every dtype is compared with the cases that passed the clauses that
failed in some dtype (those sensitive to what failed; half the passing cases are float64 in clauses
no precision can fail), or, when they are fewer than :data:`MIN_SENSITIVE`, with every passing case.
Greedy set cover then picks, again and again, the F of size 1 to 3 that explains the most failures
not yet explained, a failure whose output matches a convention about F's features (measured, so
more than a co-occurrence) counting twice (ties: fewer features, then more such matches, then a
feature that names a known mechanism such as float16 overflow, then the rarer among all passing
cases), so the root cause comes first. Each cause
carries its clause and case counts, the measured error in units of the relevant precision and the
``--declare`` the failing outputs match, if most of them match one. Cheap: bit matrices in NumPy,
pairs and triples only over the features most frequent among the failures.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from typing import Any

import numpy as np

from conformance.harness.cases import features as cf
from conformance.harness.causes import gross
from conformance.harness.causes.record import FAILING, record_fields

__all__ = ["FAILING", "by_adapter", "likely_causes", "record_fields", "write_summary"]

# Unions a cause is often stated in, derived from the features a call records: a kernel that cannot take
# grouped heads at all fails at every ratio, one cause, not one per ratio.
UNIONS = (
    (re.compile(r"GQA [0-9]+:1( \(MQA\))?"), "GQA (Hq > Hkv)"),
    # a kernel that gives NaN to a row with no key to see does so whether a boolean mask, a float mask of -inf,
    # causal or a sequence of length 0 took its keys: one cause, not four too small to stand out
    (re.compile(r"row blocked entirely: .+"), "row blocked entirely"),
)


def features_of(k: str) -> frozenset[str]:
    """The features of a recorded key, with the unions of :data:`UNIONS` its features belong to."""
    feats = cf.split(k)
    return feats | {name for pattern, name in UNIONS if any(pattern.fullmatch(f) for f in feats)}


NOT_SEPARATING = 0.25  # the weight of a failure explained by a set common among every passing case
RARE = 0.1  # a feature set shared by more than this share of the reference passing cases explains nothing
MAX_SIZE = 3
_PAIR_POOL = 16  # features (most frequent among failures) combined into pairs
_TRIPLE_POOL = 10  # ... and into triples
MIN_SENSITIVE = 50  # passing cases of the clauses that failed elsewhere: fewer say too little to compare with


# -- analysis: one adapter ----------------------------------------------------------------------------
class _Population:
    """Passing cases as a bit matrix (distinct feature keys x features) with their counts."""

    def __init__(self, counter: Counter, index: dict[str, int]):
        keys = list(counter)
        self.matrix = np.zeros((len(keys), len(index)), dtype=bool)
        for row, k in enumerate(keys):
            for f in features_of(k):
                if f in index:
                    self.matrix[row, index[f]] = True
        self.counts = np.array([counter[k] for k in keys], dtype=np.int64)
        self.total = int(self.counts.sum())
        self._memo: dict[tuple[int, ...], int] = {}

    def with_all(self, fset: tuple[int, ...]) -> int:
        """How many passing cases have every feature of ``fset``."""
        if fset not in self._memo:
            hit = self.matrix[:, list(fset)].all(axis=1) if self.total else np.zeros(0, bool)
            self._memo[fset] = int(self.counts[hit].sum())
        return self._memo[fset]

    def rare(self, fset: tuple[int, ...]) -> bool:
        return self.total == 0 or self.with_all(fset) <= RARE * self.total


def _references(rows: list[dict]) -> tuple[dict[str, Counter], Counter, Counter]:
    """Passing cases per clause, of the clauses that failed in some other dtype, and of every clause."""
    per_clause: dict[str, Counter] = {}
    sensitive: Counter = Counter()
    every: Counter = Counter()
    failed = {r["clause"] for r in rows if r["outcome"] in FAILING}
    for r in rows:
        feats = r.get("case_features") or {}
        if r["outcome"] != "passed" or not feats:
            continue
        per_clause.setdefault(r["clause"], Counter()).update(feats)
        every.update(feats)
        if r["clause"] in failed:
            sensitive.update(feats)
    return per_clause, sensitive, every


def _candidates(fails: list[frozenset[int]]) -> list[tuple[int, ...]]:
    freq = Counter(f for fs in fails for f in fs)
    ranked = [f for f, _ in freq.most_common()]
    cands = [(f,) for f in ranked]
    for size, pool in ((2, _PAIR_POOL), (3, _TRIPLE_POOL)):
        if size <= MAX_SIZE:
            cands += [tuple(sorted(c)) for c in itertools.combinations(ranked[:pool], size)]
    return cands


def likely_causes(rows: list[dict]) -> dict:
    """The causes of one adapter's failures, root cause first (see the module docstring).

    ``rows`` are the adapter's ClauseResult dicts. Returns {"failures": n, "causes": [...],
    "unexplained": [...]}; each cause: features, clause_tests (one failing case each), clauses,
    errors, declare (see :func:`_describe`)."""
    failing = [r for r in rows if r["outcome"] in FAILING]
    if not failing:
        return {"failures": 0, "causes": [], "unexplained": []}
    with_case = [r for r in failing if (r.get("failure") or {}).get("features")]
    names = sorted({f for r in with_case for f in features_of(r["failure"]["features"])})
    index = {f: i for i, f in enumerate(names)}
    per_clause, sensitive, every = _references(rows)
    fallback = ("sensitive", sensitive) if sum(sensitive.values()) >= MIN_SENSITIVE else ("every", every)
    pops: dict[str, _Population] = {}

    def population(name: str, counter: Counter) -> _Population:
        if name not in pops:
            pops[name] = _Population(counter, index)
        return pops[name]

    refs, sets = [], []
    for r in with_case:
        sets.append(frozenset(index[f] for f in features_of(r["failure"]["features"])))
        own = per_clause.get(r["clause"])
        refs.append(population("clause " + r["clause"], own) if own else population(*fallback))
    overall = population("every", every)
    explains: dict[tuple[int, ...], set[int]] = {}
    for cand in _candidates(sets):
        hit = {i for i, (s, ref) in enumerate(zip(sets, refs)) if set(cand) <= s and ref.rare(cand)}
        if hit:
            explains[cand] = hit
    causes = []
    from conformance.harness.causes.formulations import precision_cause
    from conformance.harness.causes.text import about, names_a_mechanism

    # Blocked keys with a weight first (harness.causes.blocked_weight: a rule broken, however small the
    # error), then wrong values (harness.causes.gross), then the rest: each group's causes are found
    # among its own failures, and listed in that order. Among the rest, every dtype computed at one lower
    # precision is one cause, and first (harness.causes.formulations).
    left = set(range(len(with_case)))
    leak = {i for i in left if with_case[i]["failure"].get("blocked_weight")}
    wrong = {i for i in left - leak if gross.is_gross(with_case[i]["failure"])}
    rest = left - leak - wrong
    one_precision = precision_cause([r for i, r in enumerate(with_case) if i in rest]) if rest else None
    if one_precision is not None:
        order = sorted(rest)
        took = {order[j] for j in one_precision[1]}
        rest -= took
        left -= took
    # Failures an expectations cause already names are analysed apart from the rest and listed after them:
    # a release's new bug is told among the causes no expectation knows, not mixed into a known limitation
    # that shares one of its features (float64 rows of NaN beside float64's unchecked shapes).
    known = {i for i in left if with_case[i]["outcome"] == "expected failure"}
    groups = ((leak, False), (wrong, True), (rest, False))  # (failures, wrong values)
    phases = [(g - known, w, False) for g, w in groups] + [(g & known, w, True) for g, w in groups]
    picked: dict[tuple[tuple[str, ...], bool], tuple[list[dict], bool]] = {}  # (features, known) -> (rows, wrong)
    for n, (phase, phase_wrong, phase_known) in enumerate(phases):
        if n == 2 and one_precision is not None:  # the rest no expectation names: one precision first
            causes.append(dict(one_precision[0], wrong_values=False, weight=weight([with_case[i] for i in took])))
        todo = {c: hit & phase for c, hit in explains.items() if hit & phase}
        uncovered = set(phase)

        def confirmed(c: tuple[int, ...], todo: dict = todo, uncovered: set = uncovered) -> int:
            """Failures in ``c``'s reach whose output matches a convention about ``c``'s features."""
            feats = [names[i] for i in c]
            hits = todo[c] & uncovered
            return sum(1 for i in hits if any(about(m, feats) for m in with_case[i]["failure"].get("matches") or ()))

        def separating(c: tuple[int, ...], todo: dict = todo, uncovered: set = uncovered) -> float:
            """1, or NOT_SEPARATING for a set common among every passing case when a larger set that is rare
            there explains half its failures or more (float64 and rows blocked entirely, not float64 alone,
            when float64 passes elsewhere: the smallest conjunction that separates failing from passing)."""
            if overall.rare(c):
                return 1.0
            n = len(todo[c] & uncovered)
            wider = (d for d in todo if len(d) > len(c) and set(c) < set(d) and overall.rare(d))
            return NOT_SEPARATING if any(2 * len(todo[d] & uncovered) >= n for d in wider) else 1.0

        while uncovered and todo:
            best = min(
                todo,
                key=lambda c: (
                    -(len(todo[c] & uncovered) + confirmed(c)) * separating(c),
                    len(c),
                    -confirmed(c),
                    -names_a_mechanism([names[i] for i in c]),
                    overall.with_all(c),
                    c,
                ),
            )
            newly = todo.pop(best) & uncovered
            if not newly:
                break
            uncovered -= newly
            left -= newly
            rows_of = [with_case[i] for i in sorted(newly)]
            shown = tuple(_without_markers([names[i] for i in best], rows_of, per_clause))
            # one feature set is one cause, whichever group its failures fell in (is_causal ignored gives NaN
            # in one case and a 0.48 relative error in another: one bug)
            before, was_wrong = picked.get((shown, phase_known), ([], False))
            picked[(shown, phase_known)] = (before + rows_of, was_wrong or phase_wrong)
    for (shown, _), (rows_of, was_wrong) in picked.items():
        parts = [(f, p) for kind in _by_outcome(rows_of) for f, p in _by_convention(list(shown), kind)]
        for feats, part in parts:
            found = _describe(feats, part, overall, tuple(index[f] for f in feats if f in index))
            every_known = all(r["outcome"] == "expected failure" for r in part)
            wrong_values = was_wrong and any(gross.is_gross(r["failure"]) for r in part)
            causes.append(dict(found, wrong_values=wrong_values, _known=every_known))
    # unknown causes first, then the largest error times the most tests; stable: equal weights keep the groups' order
    causes.sort(key=lambda c: (c.get("_known", False), -c.get("weight", 0.0)))
    for c in causes:
        c.pop("_known", None)
    uncovered = left
    unexplained = [r for i, r in enumerate(with_case) if i in uncovered] + [r for r in failing if r not in with_case]
    return {
        "failures": len(failing),
        "causes": causes,
        "unexplained": sorted(f"{r['clause']}[{r['dtype']}]" for r in unexplained),
    }


def _by_outcome(rows: list[dict]) -> list[list[dict]]:
    """A cause's failures split by what the kernel did: each error it raised (its class and its message, the
    numbers in it aside) one part, the wrong answers another. One feature set shared by a load failure and
    NaN in rows blocked entirely is two bugs (a release of onnxruntime refused float64 with a float mask
    and gave NaN where it loaded): told as one, the first error hides the second."""
    kinds: dict[tuple[str, str] | None, list[dict]] = {}
    for r in rows:
        f = r["failure"]
        key = None
        if f.get("error") not in (None, "ClauseViolation") and not f.get("measure"):
            first = str(f.get("message") or "").strip().splitlines()[:1]
            key = (str(f["error"]), re.sub(r"[0-9]+", "#", first[0])[:200] if first else "")
        kinds.setdefault(key, []).append(r)
    return list(kinds.values())


def _by_convention(features: list[str], rows: list[dict]) -> list[tuple[list[str], list[dict]]]:
    """A cause whose failing outputs match different values of one field (the mean of V on rows blocked
    entirely in float32, NaN in float64) split by dtype, when the dtypes keep the values apart: each part
    then is one convention (or one dtype's bug), with the dtype among its features where it holds for one
    dtype alone. Otherwise the cause as it is (its hint then says the values conflict)."""
    from conformance.harness.causes.text import conflicting, suggestion

    if not conflicting(rows, features):
        return [(features, rows)]
    by_dtype: dict[str, list[dict]] = {}
    for r in rows:
        by_dtype.setdefault(str(r["failure"].get("dtype") or r["dtype"]), []).append(r)
    groups: dict[str | None, list[str]] = {}
    for dtype, part in by_dtype.items():
        if conflicting(part, features):
            return [(features, rows)]  # one dtype alone matches both: the dtype does not tell them apart
        groups.setdefault(suggestion(part, features)[0], []).append(dtype)
    if len(groups) < 2:
        return [(features, rows)]
    out = []
    for dtypes in groups.values():
        part = [r for d in dtypes for r in by_dtype[d]]
        extra = [f"dtype={dtypes[0]}"] if len(dtypes) == 1 and f"dtype={dtypes[0]}" not in features else []
        out.append((features + extra, part))
    return out


MARKER_SHARE = 0.5  # a feature in this share of the passing cases of a cause's own clauses marks the clauses


def _without_markers(features: list[str], rows: list[dict], per_clause: dict[str, Counter]) -> list[str]:
    """``features`` less those that only mark which clauses failed ("T < S", "head dim <= 8": present in
    most cases those clauses pass in other dtypes, so they say which clauses check numbers there, not
    what went wrong); the set is kept whole when nothing would be left or the clauses pass nowhere."""
    passing: Counter = Counter()
    for clause in {r["clause"] for r in rows}:
        passing.update(per_clause.get(clause) or {})
    total = sum(passing.values())
    if len(features) < 2 or not total:
        return features
    share = {f: sum(n for k, n in passing.items() if f in features_of(k)) / total for f in features}
    from conformance.harness.causes.text import about

    # a feature the failing outputs' matched conventions are about is evidence, not a marker (rows blocked
    # entirely, where float64's rows give NaN and every clause of the cause blocks rows in every dtype)
    measured = {f for f in features for r in rows for m in (r["failure"].get("matches") or ()) if about(m, [f])}
    kept = [f for f in features if share[f] < MARKER_SHARE or f in measured]
    return kept or features


def _describe(features: list[str], rows: list[dict], overall: _Population, fset: tuple[int, ...]) -> dict:
    from conformance.harness.causes.text import conflicting, errors_summary, suggestion, within_allowance

    declare, matched, checked = suggestion(rows, features)
    cause = {
        "features": features,
        "clause_tests": len(rows),
        "clauses": len({r["clause"] for r in rows}),
        "clause_ids": sorted({r["clause"] for r in rows}),
        "dtypes": sorted({str(r["failure"].get("dtype") or r["dtype"]) for r in rows}),
        "calls": dict(Counter(r["failure"]["call"] for r in rows)),
        "passing_cases_with_it": overall.with_all(fset),
        "passing_cases": overall.total,
        "errors": errors_summary(rows),
        "blocked_weight": max((r["failure"].get("blocked_weight") or 0.0 for r in rows), default=0.0) or None,
        "declare": declare,
        "declare_matched": matched,
        "declare_checked": checked,
        "conflicts": conflicting(rows, features),
        "raised": raised(rows),
        "weight": weight(rows),
    }
    if within_allowance(cause) is not None:  # right by the error model: no declaration of arithmetic explains it
        cause["declare"], cause["declare_matched"] = None, 0
    return cause


RAISED_RATIO = 2.0**20  # a call that raised where it should have answered: as bad as 1e6 allowances
UNMEASURED_RATIO = 2.0**10  # a check failed without a measured error (a property, a structure): 1e3 allowances
NON_FINITE_BITS = 64.0  # a NaN or infinity where a number was expected: past any finite error


def severity_bits(row: dict) -> float:
    """How far one failing clause test is past its allowance, in bits (log2 of error / allowance):
    a NaN or infinity counts :data:`NON_FINITE_BITS`, a call that raised ``log2(RAISED_RATIO)``, a check
    that failed with no measured error ``log2(UNMEASURED_RATIO)``."""
    failure = row.get("failure") or {}
    ratio = gross.ratio(failure.get("measure"))
    if not failure.get("measure"):
        raised_here = failure.get("error") not in (None, "ClauseViolation")
        ratio = RAISED_RATIO if raised_here else UNMEASURED_RATIO
    return NON_FINITE_BITS if math.isinf(ratio) else min(NON_FINITE_BITS, math.log2(1.0 + ratio))


def weight(rows: list[dict]) -> float:
    """A cause's rank: its largest error (in bits of allowance) times its failing clause tests, so that
    eight tests at 1e31 stand above one at 5e-4, and many tests above one of the same size."""
    return max((severity_bits(r) for r in rows), default=0.0) * len(rows)


def raised(rows: list[dict]) -> dict | None:
    """What the kernel raised, where a cause's failures are errors: {"error", "message" (the first
    line), "tests"} for the most common one, or None when no failure of the cause raised."""
    seen = Counter()
    for r in rows:
        f = r.get("failure") or {}
        if f.get("error") in (None, "ClauseViolation") or f.get("measure"):
            continue
        first = str(f.get("message") or "").strip().splitlines()[:1]
        seen[(str(f["error"]), first[0][:200] if first else "")] += 1
    if not seen:
        return None
    (error, message), n = seen.most_common(1)[0]
    return {"error": error, "message": message, "tests": n, "of": len(rows)}


# -- the run: every adapter ---------------------------------------------------------------------------
_CACHE: dict[str, Any] = {}


def by_adapter(results: list[dict]) -> dict[str, dict]:
    """spec -> :func:`likely_causes` for every adapter of the run with failures (computed once per
    state of ``results``: the summary and the certificate both ask)."""
    key = (id(results), len(results))
    if _CACHE.get("key") != key:
        rows: dict[str, list[dict]] = {}
        for r in results:
            rows.setdefault(str(r["impl"]), []).append(r)
        found = {spec: likely_causes(rs) for spec, rs in rows.items()}
        _CACHE.update(key=key, found={s: f for s, f in found.items() if f["failures"]})
    return _CACHE["found"]


def write_summary(tr: Any, results: list[dict]) -> None:
    """The summary's ``likely causes`` section (nothing when no adapter failed)."""
    from conformance.harness.causes.text import summary_lines

    found = by_adapter(results)
    if not found:
        return
    tr.write_line("likely causes (failing cases' features absent or rare in the passing ones; root cause first):")
    for spec, f in found.items():
        for line in summary_lines(spec, f):
            tr.write_line(f"  {line}")
