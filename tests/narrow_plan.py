"""A whole verdict from a run of a few clause files, for the self-tests that run a certification in
process (pytester) and need its verdict word, not the coverage of every clause.

A run's verdict is decided against the plan of every clause of the suite (harness.run.runstate.
planned_dtypes), so a run of one clause file is PARTIAL by design. :func:`narrow_plan` cuts the plan
to the clauses of the given clause files, as a run of exactly those files would plan them: each still
runs on every dtype it plans, and a clause that is skipped, deselected or not run still makes the run
PARTIAL. The verdict rule itself is unchanged; tests/test_verdict.py checks it on a full plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CLAUSE_DIR = Path(__file__).resolve().parents[1] / "conformance" / "clauses"


def narrow_plan(monkeypatch: pytest.MonkeyPatch, *files: str) -> list[str]:
    """Plan only the clauses of ``files`` (clause module names, such as ``test_golden``) for in-process
    runs while ``monkeypatch`` holds; returns those files' paths, to pass to the run."""
    from conformance import catalog
    from conformance.harness.run import runstate

    modules = tuple(f".{Path(f).stem}" for f in files)
    plan = {c: d for c, d in runstate.planned_dtypes().items() if catalog.load()[c].module.endswith(modules)}
    assert plan, f"no clause in {files}"
    monkeypatch.setattr(runstate, "planned_dtypes", lambda: plan)
    return [str(CLAUSE_DIR / f"{Path(f).stem}.py") for f in files]
