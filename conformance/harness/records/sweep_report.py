"""The release sweep's report: one adapter's certificates on several releases of its library, side by side.

Built from certificates alone (``--certificate`` JSON), so the certifications can run anywhere (a CI
matrix across machines, tox's parallel mode) and be merged afterwards. Each certificate names its
adapter, the release of the adapter's library it ran on (its environment's ``libraries``, the library
being the first distribution of the adapter's ``measured_with``) and every clause's outcome. Releases
are ordered by version; between two consecutive releases the report tells

* **regressions**: a clause that passed and now fails (unexplained), or a known cause that newly fails;
* **fixes**: a clause that failed (or failed as a known cause) and now passes, and each known cause that
  explained failures before and explains none now;
* **convention changes**: a declaration field the spec leaves open or the adapter declares per release
  (the fill of rows blocked entirely, causal alignment, mask sense, a formulation) that differs, and a
  likely cause's ``--declare`` that appears or goes: a behaviour changed on purpose, not a regression.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Declaration fields that say a convention or a formulation (not a capability): a change is a convention change.
CONVENTIONS = (
    "causal_alignment", "all_blocked", "all_blocked_float_mask", "mean_v_keys", "mask_sense", "float64_computed_as",
    "float32_computed_as", "float16_computed_as", "bfloat16_computed_as", "scale_applied", "blocked_fill",
    "lse_base", "lse_empty",
)  # fmt: skip
FAILED_WORDS = ("fail",)
PASSED_WORDS = ("pass",)


@dataclass
class Column:
    """One certification: an adapter on one release of its library."""

    spec: str
    library: str
    version: str
    verdict: str
    summary: str
    clauses: dict[str, dict]
    declaration: dict
    causes: list[dict]
    expectations: list[dict]
    source: str
    drift: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.library} {self.version}"


def _version_key(version: str) -> tuple:
    parts = re.findall(r"\d+|[A-Za-z]+", version.split("+")[0])
    return tuple((0, int(p)) if p.isdigit() else (-1, p) for p in parts)


def columns(docs: list[tuple[str, dict]]) -> dict[str, list[Column]]:
    """spec -> its certifications ordered by release, from (file name, certificate) pairs."""
    out: dict[str, list[Column]] = {}
    for source, doc in docs:
        for spec, a in (doc.get("adapters") or {}).items():
            env = a.get("environment") or {}
            measured = env.get("measured_with") or {}
            library = next(iter(measured), None) or next(iter(env.get("kernel_libraries") or {}), "suite")
            version = (env.get("libraries") or {}).get(library) or (env.get("kernel_libraries") or {}).get(library)
            out.setdefault(spec, []).append(
                Column(
                    spec=spec,
                    library=str(library),
                    version=str(version or "?"),
                    verdict=str(a.get("verdict", "?")),
                    summary=str((a.get("coverage") or {}).get("summary", "")),
                    clauses=a.get("clauses") or {},
                    declaration=a.get("declaration") or {},
                    causes=(a.get("likely_causes") or {}).get("causes") or [],
                    expectations=(a.get("expectations") or {}).get("entries") or [],
                    source=source,
                    drift=str(env.get("version_drift") or ""),
                )
            )
    for cols in out.values():
        cols.sort(key=lambda c: _version_key(c.version))
    return out


def _word(entry: dict | None) -> str:
    return str((entry or {}).get("outcome", "not run"))


@dataclass
class Change:
    kind: str  # "regression", "fix", "convention change"
    text: str


def changes(before: Column, after: Column) -> list[Change]:
    """What changed from ``before`` to ``after`` (consecutive releases of one adapter)."""
    out: list[Change] = []
    for clause in sorted(set(before.clauses) | set(after.clauses)):
        a, b = _word(before.clauses.get(clause)), _word(after.clauses.get(clause))
        if a == b:
            continue
        if b == "fail" and a in ("pass", "expected failure"):
            was = "passed" if a == "pass" else "failed only as a known cause"
            out.append(Change("regression", f"{clause}: {was} in {before.label}, fails in {after.label}"))
        elif a in ("fail", "expected failure") and b == "pass":
            out.append(Change("fix", f"{clause}: failed in {before.label}, passes in {after.label}"))
    was = {e["behaviour"]: e for e in before.expectations if e.get("status") == "matched"}
    now = {e["behaviour"]: e for e in after.expectations if e.get("status") == "matched"}
    for behaviour in sorted(set(was) - set(now)):
        status = next((e.get("status") for e in after.expectations if e["behaviour"] == behaviour), "not listed")
        out.append(Change("fix", f"known cause no longer fails in {after.label} ({status}): {behaviour}"))
    for behaviour in sorted(set(now) - set(was)):
        out.append(Change("regression", f"known cause fails from {after.label} on: {behaviour}"))
    for name in CONVENTIONS:
        x, y = before.declaration.get(name), after.declaration.get(name)
        if x != y:
            out.append(Change("convention change", f"declares {name}={y} from {after.label} (was {x})"))
    declared_before = {c.get("declare") for c in before.causes if c.get("declare")}
    for c in after.causes:
        d = c.get("declare")
        if d and "=" in d and d not in declared_before:
            feats = " + ".join(c.get("features") or ())
            out.append(
                Change("convention change", f"the failing outputs of {feats} match --declare {d} in {after.label}")
            )
    return out


def _cell(entry: dict | None) -> str:
    word = _word(entry)
    return {"pass": "pass", "fail": "**FAIL**", "expected failure": "xfail", "not applicable": "n/a"}.get(word, word)


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _cause_text(cause: dict) -> str:
    from conformance.harness.causes.text import hint

    feats = " + ".join(cause.get("features") or ())
    said = hint(cause)
    return f"{feats} ({cause.get('clause_tests', 0)} tests){': ' + said if said else ''}"


def markdown(docs: list[tuple[str, dict]], *, command: str = "", every_clause: bool = False) -> str:
    """The report: per adapter, a row per release (verdict, first causes), the changes between consecutive
    releases, and the release x clause table (clauses whose outcome differs, or every clause)."""
    out = ["# Conformance across releases\n"]
    if command:
        out.append(f"Made by `{command}` from {len(docs)} certificate(s).\n")
    for spec, cols in columns(docs).items():
        out.append(f"## {spec}\n")
        out.append("| release | verdict | clauses | first likely causes |\n|---|---|---|---|")
        for c in cols:
            first = "<br>".join(f"{i}. {_esc(_cause_text(x))}" for i, x in enumerate(c.causes[:2], 1))
            out.append(f"| {c.label} | {c.verdict} | {_esc(c.summary)} | {first} |")
        out.append("")
        for before, after in zip(cols, cols[1:]):
            found = changes(before, after)
            out.append(f"### {before.label} -> {after.label}\n")
            if not found:
                out.append("No clause changed outcome; no known cause and no convention changed.\n")
                continue
            for kind in ("regression", "fix", "convention change"):
                for ch in (x for x in found if x.kind == kind):
                    out.append(f"- {kind}: {_esc(ch.text)}")
            out.append("")
        ids = sorted({k for c in cols for k in c.clauses})
        differ = [k for k in ids if len({_word(c.clauses.get(k)) for c in cols}) > 1]
        shown = ids if every_clause else differ
        what = "every clause" if every_clause else f"the {len(differ)} clauses whose outcome differs between releases"
        out.append(f"### Clauses by release ({what})\n")
        if shown:
            out.append("| clause | " + " | ".join(c.label for c in cols) + " |")
            out.append("|---|" + "---|" * len(cols))
            for k in shown:
                out.append(f"| {k} | " + " | ".join(_cell(c.clauses.get(k)) for c in cols) + " |")
        else:
            out.append("Every clause has the same outcome on every release.")
        out.append("")
    return "\n".join(out) + "\n"
