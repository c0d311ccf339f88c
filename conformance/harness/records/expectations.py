"""``--expectations``: a library's known deviations, each a *cause* scoped by the cases it shows on.

A real library deviates from the spec somewhere real (``is_causal`` dropped when a mask is given,
masks broadcast along T refused, ...). Its CI wants a gate that says "no new deviation, and none
fixed silently". An expectations file names each known cause once, with the case features it shows
on, not the clause tests it happens to fail: one cause fails many clauses, and which of them a
property clause reaches depends on the examples drawn. A failing clause test is an *expected
failure* (a pytest xfail carrying the cause; verdict outcome ``EXPECTED_FAILURE``) only when its
failing case has every feature of one of the entry's ``when`` sets (and, where the entry names the
convention the output follows, the output matches it); any other failure stays a failure. An entry
whose features no longer fail anywhere in a run that reached them is *stale* and fails the run (the
message says to remove it). The verdict lists the causes (harness.records.verdict:
``DEVIATES AS EXPECTED``, never a claim of conformance).

The file is TOML (``implementations/expectations/<adapter>.toml`` for a built-in adapter)::

    # Known deviations of <adapter> (library version measured ...)
    [[cause]]
    behaviour = "is_causal dropped when a mask is given"   # what the library does: the cause's name
    when = ["causal + mask"]           # case features (harness.cases.features), all of them; or a list
                                       # of such lists: any one of them
    matches = "is_causal ignored"      # optional: the convention a failing output must match
                                       # (harness.causes.conventions), checked where the output can be
    raises = "scale must be > 0"       # optional: the behaviour is an error; a failure it explains is the
                                       # kernel raising (or refusing) with a message this regex finds
    raises_when = [["dtype=float32"]]  # optional, with raises: the cases it raises on (features, as in
                                       # when); on the entry's other cases it shows as a wrong output
    reason = "one sentence: why the library does it"
    evidence = "the measured behaviour (numbers), reproduced by calling the library directly"
    link = "https://..."               # optional: the library's docs or issue
    versions = ">=3.6,<3.15"           # optional: the releases of the adapter's library it holds for (a
                                       # PEP 440 specifier set); outside them the cause is not applied
    library = "torch"                  # optional, with versions: count releases of this distribution
                                       # instead of the adapter's library (the first of its measured_with)

What a kernel *computes* differently (float16 products without the upcast, a finite fill of blocked
keys, float32 at a lower precision) is not an expectation: it is a declared formulation of the
adapter (conformance.contract.Declaration), judged exactly (docs/expectations.md).

Which file applies (``--expectations``, repeatable):

* not given: a built-in adapter's own file, ``implementations/expectations/<name>.toml``, when it
  exists; no expectations for any other ``--impl``;
* ``none``: no expectations at all (the raw verdict);
* ``FILE``: FILE for every ``--impl`` of the run (needs ``--impl``);
* ``SPEC=FILE`` or ``SPEC=none``: for that ``--impl`` only (SPEC exactly as given to ``--impl``);
  these override the two forms above for their SPEC.

One file serves every release of a library: a cause whose ``versions`` leave out the installed release
is *not applied* (listed as "other releases", never stale), and one applied that no longer fails is
stale for this release alone (conformance.releases reads the release and matches the range).

This module reads and checks the files and reviews a run's records against them;
harness.run.expectations_plugin applies them to the clause tests of a run.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance import releases
from conformance.harness.cases import features as cf
from conformance.harness.causes.conventions import known_convention

_KEYS = {"behaviour", "when", "matches", "raises", "raises_when", "reason", "evidence", "link", "versions", "library"}
RAISED = ("AdapterError", "UndeclaredRefusal")  # a kernel that raised on, or refused, a case it should take
_REQUIRED = ("behaviour", "reason", "evidence")


class ExpectationsError(ValueError):
    """An expectations file or an ``--expectations`` value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Expectation:
    """One ``[[cause]]`` entry: a behaviour of the kernel, the case features it shows on, and why."""

    behaviour: str
    when: tuple[frozenset[str], ...]  # any one of these feature sets, each feature of it present
    matches: str | None  # a convention the failing output must match, where the output can be checked
    raises: str | None  # the behaviour is an error: a failure it explains raised, its message matching this
    raises_when: tuple[frozenset[str], ...] | None  # where it raises (None: on every case of ``when``)
    reason: str
    evidence: str
    link: str | None
    file: str
    entry: int  # 1-based position of the [[cause]] in the file
    versions: str | None = None  # the releases it holds for (PEP 440 specifier set); None: every release
    library: str | None = None  # the distribution ``versions`` counts (None: the adapter's library)

    def holds_for(self, version: str | None) -> bool:
        """Whether the behaviour is expected of this release of the library (an unknown release: yes)."""
        return self.versions is None or version is None or releases.contains(self.versions, version)

    @property
    def key(self) -> str:
        """What a clause result names its entry by (survives the trip from an xdist worker as JSON)."""
        return f"{Path(self.file).name}#{self.entry}"

    @property
    def where(self) -> str:
        return f"{self.file}, [[cause]] {self.entry}"

    def when_text(self) -> str:
        """The feature sets in words: ``causal + mask`` or ``causal and decode T = 1``."""
        return " or ".join("(" + " and ".join(sorted(s)) + ")" if len(self.when) > 1 and len(s) > 1
                           else " and ".join(sorted(s)) for s in self.when)  # fmt: skip

    def shows_on(self, features: frozenset[str]) -> bool:
        """Whether a case with these features is one the behaviour shows on."""
        return any(s <= features for s in self.when)

    def explains(self, failure: dict | None) -> bool:
        """Whether this behaviour explains a failing clause test's record (``harness.causes.record``):
        every failing case it recorded has the features, and where the entry names a convention and
        the output could be checked against conventions, the output matches it; a cause that raises
        explains only failures where the kernel raised (or refused) with a message it matches."""
        cases = failing_cases(failure)
        if not cases:
            return False
        if self.raises and not _raised(failure or {}, self.raises):
            # where the entry says it raises, a failure of any other kind is not this behaviour; where
            # it does not (raises_when), a wrong output is, and another error is not
            if self.raises_when is None or (failure or {}).get("error") in RAISED:
                return False
            if any(any(s <= cf.split(c.get("features") or "") for s in self.raises_when) for c in cases):
                return False
        for case in cases:
            if not self.shows_on(cf.split(case.get("features") or "")):
                return False
            if self.matches and case.get("checked") and self.matches not in (case.get("matches") or ()):
                return False
        return True

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "behaviour": self.behaviour,
            "when": [sorted(s) for s in self.when],
            "when_text": self.when_text(),
            "matches": self.matches,
            "raises": self.raises,
            "raises_when": None if self.raises_when is None else [sorted(s) for s in self.raises_when],
            "reason": self.reason,
            "evidence": self.evidence,
            "link": self.link,
            "file": self.file,
            "entry": self.entry,
            "versions": self.versions,
            "library": self.library,
        }


def _raised(failure: dict, pattern: str) -> bool:
    return failure.get("error") in RAISED and re.search(pattern, str(failure.get("message") or "")) is not None


def failing_cases(failure: dict | None) -> list[dict]:
    """The failing cases a clause test's failure record carries: the reported one and, where the
    clause recorded it apart, the worst one (each with ``features``, and ``matches``/``checked``)."""
    if not failure or not failure.get("features"):
        return []
    return [failure] + [w for w in (failure.get("worst"),) if isinstance(w, dict) and w.get("features")]


def load(path: Path) -> list[Expectation]:
    """The entries of the expectations file at ``path``, checked (unknown keys, features or conventions
    are errors that name the file and the entry)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExpectationsError(f"expectations file {path}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"expectations file {path}: not valid TOML: {exc}") from None
    if "deviation" in doc:
        raise ExpectationsError(
            f"expectations file {path}: [[deviation]] entries name clause ids, which this version no longer "
            "reads: write each known cause once as [[cause]] with the case features it shows on "
            "(behaviour, when, reason, evidence; docs/expectations.md)"
        )
    extra = sorted(set(doc) - {"cause"})
    if extra:
        raise ExpectationsError(
            f"expectations file {path}: unknown top-level key(s) {extra}; expected [[cause]] tables"
        )
    entries = doc.get("cause", [])
    if not isinstance(entries, list):
        raise ExpectationsError(f"expectations file {path}: 'cause' must be an array of tables ([[cause]])")
    out: list[Expectation] = []
    for n, raw in enumerate(entries, start=1):
        exp = _entry(raw, path, n)
        clash = next((e for e in out if e.behaviour == exp.behaviour and e.versions == exp.versions), None)
        if clash is not None:
            raise ExpectationsError(
                f"{exp.where}: behaviour {exp.behaviour!r} is already listed by [[cause]] {clash.entry}"
            )
        out.append(exp)
    return out


def _when(raw: Any, where: str, key: str = "when") -> tuple[frozenset[str], ...]:
    """``when`` (or ``raises_when``): a list of features (one set) or a list of such lists (any of them)."""
    if isinstance(raw, list) and raw and all(isinstance(f, str) for f in raw):
        sets = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(s, list) and s for s in raw):
        sets = raw
    else:
        raise ExpectationsError(
            f"{where}: {key!r} must be a non-empty list of case features, or a list of such lists (any of them)"
        )
    for s in sets:
        bad = [f for f in s if not isinstance(f, str) or not cf.is_known(f)]
        if bad:
            raise ExpectationsError(
                f"{where}: unknown case feature(s) {bad} in {key!r}; features are written as the likely causes "
                f"print them, e.g. {', '.join(repr(f) for f in cf.EXAMPLES)}"
            )
    return tuple(frozenset(s) for s in sets)


def _entry(raw: Any, path: Path, n: int) -> Expectation:
    where = f"{path}, [[cause]] {n}"
    if not isinstance(raw, dict):
        raise ExpectationsError(f"{where}: must be a table")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ExpectationsError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(sorted(_KEYS))}")
    for key in _REQUIRED:
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ExpectationsError(f"{where}: missing {key!r} (a non-empty string)")
    if "when" not in raw:
        raise ExpectationsError(f"{where}: missing 'when' (the case features the behaviour shows on)")
    when = _when(raw["when"], where)
    matches = raw.get("matches")
    if matches is not None and (not isinstance(matches, str) or not known_convention(matches)):
        raise ExpectationsError(
            f"{where}: 'matches' = {matches!r} is not a convention the likely causes test "
            "(e.g. 'is_causal ignored', 'causal_alignment=bottom-right', 'all_blocked=mean-v')"
        )
    raises = raw.get("raises")
    if raises is not None:
        try:
            re.compile(raises if isinstance(raises, str) and raises.strip() else "(")
        except re.error:
            raise ExpectationsError(
                f"{where}: 'raises' must be a regular expression the kernel's error message matches, or omitted"
            ) from None
    raises_when = None
    if "raises_when" in raw:
        if raises is None:
            raise ExpectationsError(f"{where}: 'raises_when' says where the behaviour raises: it needs 'raises'")
        raises_when = _when(raw["raises_when"], where, key="raises_when")
    link = raw.get("link")
    if link is not None and (not isinstance(link, str) or not link.strip()):
        raise ExpectationsError(f"{where}: 'link' must be a non-empty string, or omitted")
    versions, library = raw.get("versions"), raw.get("library")
    if versions is not None:
        try:
            releases.check(versions)
        except releases.ReleaseRangeError as exc:
            raise ExpectationsError(f"{where}: 'versions' = {exc}") from None
    if library is not None and (versions is None or not isinstance(library, str) or not library.strip()):
        raise ExpectationsError(
            f"{where}: 'library' names the distribution whose releases 'versions' counts: a non-empty string, "
            "given with 'versions'"
        )
    return Expectation(
        behaviour=raw["behaviour"].strip(),
        when=when,
        matches=matches,
        raises=raises,
        raises_when=raises_when,
        reason=raw["reason"].strip(),
        evidence=raw["evidence"].strip(),
        link=link,
        file=str(path),
        entry=n,
        versions=versions,
        library=library,
    )


def release_of(entry: Expectation, adapter: object) -> tuple[str | None, str | None]:
    """(distribution, installed release) that ``entry``'s ``versions`` is read against."""
    dist = entry.library or releases.library_of(adapter)
    return dist, (releases.installed(dist) if dist else None)


def in_release(
    entries: Iterable[Expectation], adapter: object
) -> tuple[list[Expectation], list[tuple[Expectation, str]]]:
    """(the entries that hold for the installed release of the adapter's library, (entry, why not) for
    the others: "keras 3.15.1 is outside >=3.6,<3.15"). An entry without ``versions``, or whose library
    is not installed, holds."""
    held, others = [], []
    for e in entries:
        dist, version = release_of(e, adapter)
        if e.holds_for(version):
            held.append(e)
        else:
            others.append((e, f"{dist} {version} is outside {e.versions}"))
    return held, others


def review(entries: Iterable[Expectation], rows: Iterable[dict]) -> dict[str, dict]:
    """What each entry did in a run, from one adapter's clause results (dicts): entry key ->
    {"status": "matched" | "stale" | "not reached", "tests": clause tests it explained,
    "clauses": their clause ids, "reached": cases with its features that passed}.

    *Stale*: the run reached cases with the entry's features and none of them failed as it says,
    so the library no longer does this (or the entry's features are too wide to mean anything).
    *Not reached*: no case of the run had its features (a run of a few clauses); not a failure."""
    rows = list(rows)
    out = {}
    for e in entries:
        hits = [r for r in rows if r.get("expectation") == e.key]
        reached = sum(
            n
            for r in rows
            for k, n in (r.get("case_features") or {}).items()
            if e.shows_on(cf.split(k))
        )  # fmt: skip
        status = "matched" if hits else ("stale" if reached else "not reached")
        out[e.key] = {
            "status": status,
            "tests": len(hits),
            "clauses": sorted({r["clause"] for r in hits}),
            "reached": reached,
        }
    return out


def expectations_dir() -> Path:
    """Where the built-in adapters' files live: ``implementations/expectations`` (package data of the wheel)."""
    import implementations

    return Path(implementations.__file__).resolve().parent / "expectations"


def default_file(spec: str) -> Path | None:
    """A built-in adapter's own expectations file, when it has one."""
    from conformance.harness.calls import registry

    path = expectations_dir() / f"{spec}.toml"
    return path if spec in registry.builtin_names() and path.is_file() else None


def choose_files(values: list[str], specs: list[str], explicit: bool, base: Path) -> dict[str, Path | None]:
    """spec -> the expectations file that applies to it (None: none), from ``--expectations`` values."""
    every: list[str] = [v for v in values if "=" not in v]
    if len(every) > 1:
        raise ExpectationsError(f"--expectations given {every}: name one FILE (or none), or use SPEC=FILE per --impl")
    files = {spec: default_file(spec) for spec in specs}
    for value in every:
        if value != "none" and not explicit:
            raise ExpectationsError("--expectations=FILE needs --impl: an expectations file describes one kernel")
        files = dict.fromkeys(specs, None if value == "none" else _existing(value, base))
    for value in (v for v in values if "=" in v):
        spec, _, target = value.partition("=")  # an --impl spec has no "="; a path might
        if spec not in files:
            raise ExpectationsError(
                f"--expectations={value}: {spec!r} is not an --impl of this run ({', '.join(specs)})"
            )
        files[spec] = None if target == "none" else _existing(target, base)
    return files


def _existing(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise ExpectationsError(f"--expectations: no such file: {path}")
    return path
