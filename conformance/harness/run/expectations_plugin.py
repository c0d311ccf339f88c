"""The pytest side of ``--expectations`` (the file format, the choice of file and the review of a run:
harness.records.expectations).

A file named on the command line is loaded and checked before any test runs (a bad entry is a usage
error, exit 4, naming the file and the entry); a built-in's own file once clauses are collected,
since every pytest run in the environment loads this plugin and most collect no clause. The plugin's
report hook calls :func:`apply` on each failing clause test's record before it keeps it; whether each
entry was stale is decided at the end, from every record (``runstate.verdicts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.records.expectations import (
    Expectation,
    ExpectationsError,
    choose_files,
    in_release,
    load,
    review,
)
from conformance.harness.run import runstate

OPT_EXPECTATIONS = "expectations"


@dataclass
class Applied:
    """This run's expectations: which file applies to each spec, and its entries once loaded; of those,
    the ones that hold for the installed release of the spec's library (``adapter_of`` gives the adapter
    whose ``measured_with`` names it; without it every entry holds)."""

    files: dict[str, Path | None]
    loaded: dict[str, list[Expectation]] = field(default_factory=dict)
    adapter_of: Callable[[str], Any] | None = None
    _split: dict[str, tuple[list[Expectation], list[tuple[Expectation, str]]]] = field(default_factory=dict)

    def all_entries(self, spec: str) -> list[Expectation]:
        """Every entry of ``spec``'s file, loaded and checked, whatever release it holds for."""
        if spec not in self.loaded:
            path = self.files.get(spec)
            self.loaded[spec] = load(path) if path is not None else []
        return self.loaded[spec]

    def _release_split(self, spec: str) -> tuple[list[Expectation], list[tuple[Expectation, str]]]:
        if spec not in self._split:
            entries = self.all_entries(spec)
            adapter = self.adapter_of(spec) if self.adapter_of is not None and entries else None
            self._split[spec] = in_release(entries, adapter) if adapter is not None else (entries, [])
        return self._split[spec]

    def entries(self, spec: str) -> list[Expectation]:
        """The entries that apply in this run: those whose ``versions`` hold the installed release."""
        return self._release_split(spec)[0]

    def other_releases(self, spec: str) -> list[tuple[Expectation, str]]:
        """(entry, why it is not applied) for the entries of other releases of the library."""
        return self._release_split(spec)[1]

    def explaining(self, spec: str, failure: dict | None) -> Expectation | None:
        """The first entry of ``spec``'s file whose behaviour explains this failure record."""
        return next((e for e in self.entries(spec) if e.explains(failure)), None)


_KEY = pytest.StashKey[Applied]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("sdpa-conformance").addoption(
        "--expectations",
        action="append",
        default=[],
        metavar="FILE|none|SPEC=FILE",
        help="known causes of deviation to report as expected failures (TOML, [[cause]] entries scoped by case "
        "features). Default: a built-in adapter's own implementations/expectations/<name>.toml; 'none' shows the raw "
        "verdict; FILE applies to every --impl; SPEC=FILE (or SPEC=none) to one. A cause that no longer fails where "
        "the run reached its features fails the run.",
    )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    state = runstate.get_state(config)
    if state is None or runstate.getoption(config, runstate.OPT_IMPL_LIST):
        return
    values = runstate.getoption(config, OPT_EXPECTATIONS) or []
    try:
        applied = Applied(choose_files(values, state.specs, state.explicit, config.invocation_params.dir))
        for spec in state.specs if values else ():
            applied.all_entries(spec)  # named on the command line: a bad file stops the run before any test
    except ExpectationsError as exc:
        raise pytest.UsageError(str(exc)) from None
    applied.adapter_of = lambda spec: _adapter(state, spec)
    config.stash[_KEY] = applied
    state.expectations = applied


def _adapter(state: Any, spec: str) -> Any:
    """The adapter ``spec`` resolves to (its library's release scopes the causes), or None."""
    resolved = state.resolved.get(spec)
    return getattr(resolved, "adapter", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Load the built-ins' own files once clauses are collected, so a bad entry stops the run here."""
    applied = config.stash.get(_KEY, None)
    if applied is None or not any(_is_clause(item) for item in items):
        return
    try:
        for spec in applied.files:
            applied.all_entries(spec)
    except ExpectationsError as exc:
        raise pytest.UsageError(str(exc)) from None


def _is_clause(item: pytest.Item) -> bool:
    from conformance.harness.spec.clause import info_of

    return info_of(getattr(item, "function", None)) is not None


def listed(item: pytest.Item, clause: str) -> bool:
    """Whether this clause test's adapter has known causes that could explain its failure (an
    expectations file with entries): its failures are then judged against them as they come, and no
    search for a worse failing case (``harness.run.worst_case``) is spent on them."""
    return bool(_entries_of(item))


def _entries_of(item: pytest.Item) -> list[Expectation]:
    """The expectations entries of this clause test's adapter (empty: none apply)."""
    applied = item.config.stash.get(_KEY, None)
    callspec = getattr(item, "callspec", None)
    if applied is None or callspec is None:
        return []
    return applied.entries(str(callspec.params.get("impl")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A property-based clause test of an adapter with known causes runs without hypothesis' shrink
    phase. Why: shrinking a failure the file already explains repeats the kernel call hundreds of
    times for nothing (on hf-sdpa it was most of the run). The first failing example is judged as the
    shrunk one would be: it is explained only if it has every feature of a cause (shrinking only
    removes features), and otherwise it is an unexpected failure, reported unshrunk
    (``--expectations=none`` shrinks it)."""
    from conformance.harness.spec.clause import info_of

    obj = getattr(item, "obj", None)
    current = getattr(obj, "_hypothesis_internal_use_settings", None)
    info = info_of(getattr(item, "function", None))
    if current is None or info is None or not getattr(obj, "is_hypothesis_test", False):
        return (yield)
    from hypothesis import Phase, settings

    if Phase.shrink not in current.phases or not _entries_of(item):
        return (yield)
    obj._hypothesis_internal_use_settings = settings(
        parent=current, phases=[p for p in current.phases if p is not Phase.shrink]
    )
    try:
        return (yield)
    finally:
        obj._hypothesis_internal_use_settings = current


def apply(item: pytest.Item, rep: pytest.TestReport, result: Any) -> Any:
    """A failing clause test whose failure record a known cause explains becomes an expected failure
    (an xfail carrying the cause); returns its record (``verdict.ClauseResult``) with the outcome, the
    cause and the entry's key, or ``result`` unchanged."""
    from conformance.harness.records import verdict

    if rep.when != "call" or not rep.failed:
        return result
    applied = item.config.stash.get(_KEY, None)
    exp = applied.explaining(result.impl, result.failure) if applied is not None else None
    if exp is None:
        return result
    rep.outcome = "skipped"
    rep.wasxfail = f"expected failure ({exp.where}): {exp.behaviour}: {exp.reason}"
    return dataclasses.replace(result, outcome=verdict.EXPECTED_FAILURE, reason=exp.behaviour, expectation=exp.key)


def certificate_section(config: pytest.Config, spec: str, rows: list[dict], fails: dict) -> dict:
    """The certificate's record for ``spec``: the expectations file applied, each entry with what it did
    in this run (``records.expectations.review``: matched, stale, not reached), and the clause tests it
    turned into expected failures (with the failure's message, from ``fails`` by node id)."""
    from conformance.harness.records import verdict

    applied = config.stash.get(_KEY, None)
    path = applied.files.get(spec) if applied is not None else None
    section: dict = {"file": str(path) if path else None, "entries": []}
    try:
        entries = applied.entries(spec) if applied is not None else []
    except ExpectationsError as exc:
        section["error"] = str(exc)
        entries = []
    status = review(entries, rows)
    section["entries"] = [{**e.as_dict(), **status[e.key]} for e in entries]
    others = applied.other_releases(spec) if applied is not None and "error" not in section else []
    section["entries"] += [
        {**e.as_dict(), "status": "other releases", "why": why, "tests": 0, "clauses": [], "reached": 0}
        for e, why in others
    ]
    section["expected_failures"] = [
        {
            "clause": r["clause"],
            "dtype": r["dtype"],
            "reason": r["reason"],
            "expectation": r.get("expectation"),
            "message": fails.get(r["nodeid"], {}).get("message", ""),
        }
        for r in rows
        if r["outcome"] == verdict.EXPECTED_FAILURE
    ]
    return section
