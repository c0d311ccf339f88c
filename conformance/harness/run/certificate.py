"""``--certificate=PATH``: a record a person can read to decide whether to trust a kernel.

Written at the end of the run as PATH (JSON, for tools: ``python -m conformance.certificates
compare`` renders several side by side) and PATH with the suffix ``.md`` (for people). It holds,
per ``--impl``: the declaration the verdict is conditional on, the environment (and, once per run, the
machine as the libraries see it, harness.calls.machine), every clause with
its outcome per dtype (not-applicable ones with the reason, since "passed" on a kernel that
declared everything away means little), the measured error against the float64 oracle per dtype
(the regression-baseline grid, harness.run.baseline), each failure with the command that reproduces it,
the regression-baseline comparison if one ran, and the SHA-256 of the golden fixture set, so the
certificate names exactly which frozen answers it was checked against.

This module gathers the record (the pytest hooks and :func:`build`); its readable forms are drawn
by ``harness.records.certificate_markdown`` and ``harness.records.certificate_html``, and several certificates are
compared by the command ``python -m conformance.certificates``.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.records import coverage_tables
from conformance.harness.records import verdict as verdict_mod
from conformance.harness.records.certificate_markdown import render_markdown
from conformance.harness.run import coverage as space_coverage
from conformance.harness.run import expectations_plugin, pair_coverage, perf, preconditions, programs, transforms
from conformance.harness.spec.clause import CLAUSES, info_of

FORMAT = 1
_FAILS = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("sdpa-conformance").addoption(
        "--certificate",
        metavar="PATH",
        default=None,
        help="write a conformance certificate to PATH (JSON) and PATH with .md (Markdown); a PATH ending in "
        ".html writes a self-contained HTML page with charts there, and the JSON and Markdown next to it",
    )


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if not item.config.getoption("certificate") or not rep.failed:
        return rep
    info = info_of(getattr(item, "function", None)) if hasattr(item, "function") else None
    if info is None:
        return rep
    from conformance.harness.run.failures import reproduce_command

    text = ""
    exc = getattr(call, "excinfo", None)
    if exc is not None:
        text = str(exc.value)
    item.config.stash.setdefault(_FAILS, {})[item.nodeid] = {
        "reproduce": reproduce_command(item),
        "message": text[:3000],
    }
    return rep


def _error_stats(config: pytest.Config, spec: str, impl: Any, base: dict) -> tuple[dict, str]:
    if base.get("per_dtype"):
        return base["per_dtype"], "regression-baseline grid (this run's --baseline comparison)"
    from conformance.harness.records.baseline_grid import run_grid

    try:
        run = run_grid(impl)
    except (Exception, pytest.skip.Exception, pytest.fail.Exception) as exc:  # noqa: BLE001 - stats are informative; the verdict stands without them
        return {}, f"could not be measured: {type(exc).__name__}: {exc}"
    return run.per_dtype, "regression-baseline grid (harness.records.baseline_grid), max/mean/p99 of |out - oracle|"


def build(config: pytest.Config) -> dict:
    from conformance import SPEC_REVISION, __version__, fixtures
    from conformance.harness.calls.environment import environment
    from conformance.harness.calls.machine import machine
    from conformance.harness.run import baseline
    from conformance.harness.run.runstate import get_state, verdicts

    state = get_state(config)
    run_verdicts = verdicts(config) if state and state.results else {}
    fails = config.stash.get(_FAILS, {})
    golden_dir = fixtures.default_dir()
    _, problems = fixtures.check_hashes(golden_dir)
    base_results = baseline.results(config)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "suite": {"version": __version__, "spec_revision": SPEC_REVISION},
        "command": "pytest " + " ".join(config.invocation_params.args),
        "profile": state.profile if state else None,
        "machine": machine(),  # CPU, SIMD levels, BLAS core type, library builds: which code ran
        "golden_set": {
            "directory": str(golden_dir),
            "sha256": fixtures.set_hash(golden_dir),
            "hashes_ok": not problems,
            "problems": problems,
        },
        "adapters": {},
    }
    for spec, res in state.resolved.items() if state else []:
        rows = [r for r in state.results if r["impl"] == spec]
        entry: dict[str, Any] = {"spec": spec}
        if not res.usable:
            entry.update(verdict="NOT RUN", reason=f"unavailable here: {res.reason}")
            doc["adapters"][spec] = entry
            continue
        impl = state.guarded(spec)
        v = run_verdicts.get(spec)
        by_clause: dict[str, list[dict]] = {}
        for r in rows:
            by_clause.setdefault(r["clause"], []).append(r)
        clauses = {}
        for cid in sorted(set(by_clause) | set(CLAUSES)):
            info = CLAUSES.get(cid)
            meta = {"title": info.title if info else "", "source": info.source.cite() if info else ""}
            if cid not in by_clause:
                clauses[cid] = {
                    **meta,
                    "outcome": "not run",
                    "detail": "not collected or deselected in this run",
                    "by_dtype": {},
                }
                continue
            outcome, detail = verdict_mod.clause_outcome(by_clause[cid])
            if v is not None and cid in v.clauses_missing and outcome == "pass":
                outcome, detail = "not run", f"incomplete: {v.clauses_missing[cid]}; {detail}"
            runs = sum(r.get("cases_run", 0) for r in by_clause[cid])
            if runs:
                detail += f" ({runs} cases run)"
            clauses[cid] = {
                **meta,
                "outcome": outcome,
                "detail": detail,
                "by_dtype": {str(r["dtype"]): {"outcome": r["outcome"], "reason": r["reason"]} for r in by_clause[cid]},
            }
            picture = _first_picture(by_clause[cid])  # the first failing case, drawn (harness.causes.picture)
            if picture:
                clauses[cid]["picture"] = picture
        counts: dict[str, int] = {}
        for c in clauses.values():
            counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
        failures = [
            {
                "clause": r["clause"],
                "dtype": r["dtype"],
                "nodeid": r["nodeid"],
                **fails.get(r["nodeid"], {"reproduce": "", "message": ""}),
            }
            for r in rows
            if r["outcome"] == "failed"
        ]
        base = base_results.get(spec, {})
        stats, stats_source = _error_stats(config, spec, impl, base)
        word = v.word if v is not None else verdict_mod.NOT_RUN_VERDICT
        coverage = {
            "summary": v.coverage() if v is not None else "no clause ran",
            "details": v.details() if v is not None else [],
            "clauses_planned": v.clauses_planned if v is not None else 0,
            "cases_run": v.cases_run if v is not None else 0,
            "cases_refused": v.cases_refused if v is not None else 0,
            "not_in_profile": v.not_in_profile if v is not None else [],
            "expected_failures": len(v.clauses_expected) if v is not None else 0,
            "expected_causes": sorted(v.causes_expected) if v is not None else [],
            "stale_expectations": len(v.causes_stale) if v is not None else 0,
        }
        entry.update(
            name=impl.name,
            verdict=word,
            deviations=v.deviations if v is not None else [],
            expectations=expectations_plugin.certificate_section(config, spec, rows, fails),
            coverage=coverage,
            counts=counts,
            declaration=impl.declaration.as_dict(),
            environment=environment(impl.adapter),
            clauses=clauses,
            failures=failures,
            error_stats=stats,
            error_stats_source=stats_source,
            baseline={k: v for k, v in base.items() if k != "per_dtype"} or None,
        )
        entry["perf"] = perf.certificate_section(config, spec)  # perf data and error ratios
        entry["space_coverage"] = coverage_tables.cells_table(
            space_coverage.counts(config).get(spec, {}), impl.declaration
        )
        entry["pair_coverage"] = pair_coverage.table(config, spec, impl.declaration)
        entry["invalid_inputs"] = preconditions.table(config, spec)  # what each invalid input got
        entry["transforms"] = transforms.table(config, spec)  # forward AD, double backward, vmap: answered or refused
        entry["programs"] = programs.table(config, spec)  # distinct structures, and the time of first calls
        entry["discovery"] = state.discovered.get(spec)  # --discover: what was measured, and the findings
        entry["likely_causes"] = _likely_causes(state.results, spec)  # failures grouped by cause
        doc["adapters"][spec] = entry
    return doc


def _first_picture(rows: list[dict]) -> dict | None:
    """The picture of a clause's first failing test (failed, or failed as expected), with its dtype."""
    for r in rows:
        picture = (r.get("failure") or {}).get("picture") if r["outcome"] in ("failed", "expected failure") else None
        if picture:
            return {**picture, "dtype": r["dtype"] or picture.get("case_dtype")}
    return None


def _likely_causes(results: list[dict], spec: str) -> dict:
    from conformance.harness.causes import likely as causes

    return causes.by_adapter(results).get(spec) or {"failures": 0, "causes": [], "unexplained": []}


def write(config: pytest.Config, path: Path) -> tuple[Path, ...]:
    doc = build(config)
    html, path = (path, path.with_suffix(".json")) if path.suffix == ".html" else (None, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False, default=str) + "\n")
    md = path.with_suffix(".md") if path.suffix != ".md" else path.with_name(path.name + ".md")
    md.write_text(render_markdown(doc))
    if html is None:
        return path, md
    from conformance.harness.records import certificate_html

    return path, md, certificate_html.write(doc, html)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = session.config.getoption("certificate")
    if not target or session.config.getoption("collectonly"):
        return
    paths = write(session.config, Path(target))
    session.config.stash[_PATHS] = paths


_PATHS = pytest.StashKey[tuple]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    paths = config.stash.get(_PATHS, None)
    if paths:
        terminalreporter.write_line("certificate written: " + ", ".join(str(p) for p in paths))
