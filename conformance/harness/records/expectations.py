"""``--expectations``: a library's known deviations, each with its reason, as expected failures.

A real library deviates from the spec somewhere real (float64 softmax in float32, no upcast before
QK^T, ...). Its CI wants a gate that says "no new deviation, and none fixed silently". An
expectations file lists the known ones; a clause test it lists runs as usual and, when it fails, is
reported as an *expected failure* (a pytest xfail carrying the reason; verdict outcome
``EXPECTED_FAILURE``); when it passes, the entry is *stale* and the test fails, as pytest's strict
xfail does (outcome ``STALE_EXPECTATION``; the message says to remove the entry). The verdict
counts them (harness.records.verdict: ``DEVIATES AS EXPECTED``, never a claim of conformance).

The file is TOML (``implementations/expectations/<adapter>.toml`` for a built-in adapter)::

    # Known deviations of <adapter> (library version measured ...)
    [[deviation]]
    clause = "UPCAST-01"
    dtypes = ["float16", "bfloat16"]   # optional; omitted = every dtype (and clauses without a dtype axis)
    reason = "one sentence: what the library does"
    evidence = "the measured behaviour (numbers)"
    link = "https://..."               # optional: the library's docs or issue

Which file applies (``--expectations``, repeatable):

* not given: a built-in adapter's own file, ``implementations/expectations/<name>.toml``, when it
  exists; no expectations for any other ``--impl``;
* ``none``: no expectations at all (the raw verdict);
* ``FILE``: FILE for every ``--impl`` of the run (needs ``--impl``);
* ``SPEC=FILE`` or ``SPEC=none``: for that ``--impl`` only (SPEC exactly as given to ``--impl``);
  these override the two forms above for their SPEC.

This module reads and checks the files; harness.run.expectations_plugin applies them to a run.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.harness.spec.clause import planned_dtypes

_KEYS = {"clause", "dtypes", "reason", "evidence", "link"}
_REQUIRED = ("clause", "reason", "evidence")


class ExpectationsError(ValueError):
    """An expectations file or an ``--expectations`` value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Expectation:
    """One ``[[deviation]]`` entry: a clause (on some dtypes) expected to fail, and why."""

    clause: str
    dtypes: tuple[str, ...] | None  # None: every dtype, and clauses without a dtype axis
    reason: str
    evidence: str
    link: str | None
    file: str
    entry: int  # 1-based position of the [[deviation]] in the file

    def covers(self, clause: str, dtype: str | None) -> bool:
        return clause == self.clause and (self.dtypes is None or dtype in self.dtypes)

    @property
    def where(self) -> str:
        return f"{self.file}, [[deviation]] {self.entry}"

    def as_dict(self) -> dict:
        return {
            "clause": self.clause,
            "dtypes": list(self.dtypes) if self.dtypes else None,
            "reason": self.reason,
            "evidence": self.evidence,
            "link": self.link,
            "file": self.file,
            "entry": self.entry,
        }


def load(path: Path, plan: dict[str, tuple[str | None, ...]] | None = None) -> list[Expectation]:
    """The entries of the expectations file at ``path``, checked against ``plan`` (clause id -> the
    dtypes it runs with; default: every clause of the suite, ``spec.clause.planned_dtypes``)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExpectationsError(f"expectations file {path}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"expectations file {path}: not valid TOML: {exc}") from None
    extra = sorted(set(doc) - {"deviation"})
    if extra:
        raise ExpectationsError(
            f"expectations file {path}: unknown top-level key(s) {extra}; expected [[deviation]] tables"
        )
    entries = doc.get("deviation", [])
    if not isinstance(entries, list):
        raise ExpectationsError(f"expectations file {path}: 'deviation' must be an array of tables ([[deviation]])")
    plan = planned_dtypes() if plan is None else plan
    out: list[Expectation] = []
    for n, raw in enumerate(entries, start=1):
        exp = _entry(raw, path, n, plan)
        clash = next((e for e in out if e.clause == exp.clause and _overlap(e.dtypes, exp.dtypes)), None)
        if clash is not None:
            raise ExpectationsError(
                f"{exp.where}: clause {exp.clause} is already listed by [[deviation]] {clash.entry}"
            )
        out.append(exp)
    return out


def _overlap(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> bool:
    return a is None or b is None or bool(set(a) & set(b))


def _entry(raw: Any, path: Path, n: int, plan: dict[str, tuple[str | None, ...]]) -> Expectation:
    where = f"{path}, [[deviation]] {n}"
    if not isinstance(raw, dict):
        raise ExpectationsError(f"{where}: must be a table")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ExpectationsError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(sorted(_KEYS))}")
    for key in _REQUIRED:
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ExpectationsError(f"{where}: missing {key!r} (a non-empty string)")
    clause = raw["clause"].strip()
    if clause not in plan:
        near = sorted(c for c in plan if c.split("-")[0] == clause.split("-")[0])[:6]
        hint = f"; clauses of that family: {', '.join(near)}" if near else ""
        raise ExpectationsError(f"{where}: unknown clause id {clause!r} (docs/clauses.md lists them){hint}")
    dtypes = raw.get("dtypes")
    if dtypes is not None:
        axis = [d for d in plan[clause] if d is not None]
        if not isinstance(dtypes, list) or not dtypes or not all(isinstance(d, str) for d in dtypes):
            raise ExpectationsError(f"{where}: 'dtypes' must be a non-empty list of dtype names, or omitted")
        if not axis:
            raise ExpectationsError(f"{where}: clause {clause} has no dtype axis; omit 'dtypes'")
        bad = [d for d in dtypes if d not in axis]
        if bad:
            raise ExpectationsError(f"{where}: bad dtype(s) {bad} for clause {clause}, which runs in {', '.join(axis)}")
    link = raw.get("link")
    if link is not None and (not isinstance(link, str) or not link.strip()):
        raise ExpectationsError(f"{where}: 'link' must be a non-empty string, or omitted")
    return Expectation(
        clause, tuple(dtypes) if dtypes else None, raw["reason"].strip(), raw["evidence"].strip(), link, str(path), n
    )


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
