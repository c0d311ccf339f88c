"""The pytest side of ``--expectations`` (the file format and the choice of file: harness.records.expectations).

A file named on the command line is loaded and checked before any test runs (a bad entry is a usage
error, exit 4, naming the file and the entry); a built-in's own file once clauses are collected,
since every pytest run in the environment loads this plugin and most collect no clause. The plugin's
report hook calls :func:`apply` on each clause test's report before it records the verdict's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conformance.harness.records.expectations import Expectation, ExpectationsError, choose_files, load
from conformance.harness.run import runstate

OPT_EXPECTATIONS = "expectations"


@dataclass
class Applied:
    """This run's expectations: which file applies to each spec, and its entries once loaded."""

    files: dict[str, Path | None]
    loaded: dict[str, list[Expectation]] = field(default_factory=dict)

    def entries(self, spec: str) -> list[Expectation]:
        if spec not in self.loaded:
            path = self.files.get(spec)
            self.loaded[spec] = load(path, runstate.planned_dtypes()) if path is not None else []
        return self.loaded[spec]

    def find(self, spec: str, clause: str, dtype: str | None) -> Expectation | None:
        return next((e for e in self.entries(spec) if e.covers(clause, dtype)), None)


_KEY = pytest.StashKey[Applied]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("sdpa-conformance").addoption(
        "--expectations",
        action="append",
        default=[],
        metavar="FILE|none|SPEC=FILE",
        help="known deviations to report as expected failures (TOML, [[deviation]] entries). Default: a built-in "
        "adapter's own implementations/expectations/<name>.toml; 'none' shows the raw verdict; FILE applies to "
        "every --impl; SPEC=FILE (or SPEC=none) to one. An entry whose clause now passes fails the run.",
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
            applied.entries(spec)  # named on the command line: a bad file stops the run before any test
    except ExpectationsError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_KEY] = applied


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Load the built-ins' own files once clauses are collected, so a bad entry stops the run here."""
    applied = config.stash.get(_KEY, None)
    if applied is None or not any(_is_clause(item) for item in items):
        return
    try:
        for spec in applied.files:
            applied.entries(spec)
    except ExpectationsError as exc:
        raise pytest.UsageError(str(exc)) from None


def _is_clause(item: pytest.Item) -> bool:
    from conformance.harness.spec.clause import info_of

    return info_of(getattr(item, "function", None)) is not None


def listed(item: pytest.Item, clause: str) -> bool:
    """Whether an expectations file lists this clause test as an expected failure."""
    return _listed(item, clause) is not None


def _listed(item: pytest.Item, clause: str) -> Expectation | None:
    """The entry that lists this clause test (its adapter and dtype), or None."""
    applied = item.config.stash.get(_KEY, None)
    callspec = getattr(item, "callspec", None)
    if applied is None or callspec is None:
        return None
    return applied.find(str(callspec.params.get("impl")), clause, callspec.params.get("dtype"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A property-based clause test listed as an expected failure runs without hypothesis' shrink
    phase. Why: shrinking a failure the file already explains repeats the kernel call hundreds of
    times for nothing (on hf-sdpa it was most of the run); whether the test still fails (an expected
    failure) or now passes (a stale expectation) is decided by the generated examples alone, which
    are unchanged. The reported example of such a failure is the first failing one, unshrunk."""
    from conformance.harness.spec.clause import info_of

    obj = getattr(item, "obj", None)
    current = getattr(obj, "_hypothesis_internal_use_settings", None)
    info = info_of(getattr(item, "function", None))
    if current is None or info is None or not getattr(obj, "is_hypothesis_test", False):
        return (yield)
    from hypothesis import Phase, settings

    if Phase.shrink not in current.phases or _listed(item, info.id) is None:
        return (yield)
    obj._hypothesis_internal_use_settings = settings(
        parent=current, phases=[p for p in current.phases if p is not Phase.shrink]
    )
    try:
        return (yield)
    finally:
        obj._hypothesis_internal_use_settings = current


def apply(item: pytest.Item, rep: pytest.TestReport, clause: str) -> tuple[str, str] | None:
    """Turn a listed clause test's report into an expected failure (xfail) or a stale expectation
    (a failure); returns (verdict outcome, reason) for its record, or None when no entry lists it."""
    from conformance.harness.records import verdict

    if rep.when != "call" or rep.skipped:
        return None
    exp = _listed(item, clause)
    if exp is None:
        return None
    if rep.failed:
        rep.outcome = "skipped"
        rep.wasxfail = f"expected failure ({exp.where}): {exp.reason}"
        return verdict.EXPECTED_FAILURE, exp.reason
    message = (
        f"stale expectation: {clause} passed, but {exp.where} lists it as an expected failure "
        f"({exp.reason}). The kernel no longer deviates here: remove the entry."
    )
    rep.outcome = "failed"
    rep.longrepr = message
    return verdict.STALE_EXPECTATION, message


def certificate_section(config: pytest.Config, spec: str, rows: list[dict], fails: dict) -> dict:
    """The certificate's record for ``spec``: the expectations file applied, its entries, and the clause
    tests it turned into expected failures (with the failure's message, from ``fails`` by node id) or
    stale expectations. ``rows``: this spec's ClauseResult dicts."""
    from conformance.harness.records import verdict

    applied = config.stash.get(_KEY, None)
    path = applied.files.get(spec) if applied is not None else None
    section: dict = {"file": str(path) if path else None, "entries": []}
    try:
        section["entries"] = [e.as_dict() for e in applied.entries(spec)] if applied is not None else []
    except ExpectationsError as exc:
        section["error"] = str(exc)
    for key, outcome in (("expected_failures", verdict.EXPECTED_FAILURE), ("stale", verdict.STALE_EXPECTATION)):
        section[key] = [
            {
                "clause": r["clause"],
                "dtype": r["dtype"],
                "reason": r["reason"],
                "message": fails.get(r["nodeid"], {}).get("message", ""),
            }
            for r in rows
            if r["outcome"] == outcome
        ]
    return section
