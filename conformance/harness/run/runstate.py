"""The run's state, shared by the plugin and its sub-plugins (certificate, baseline, self-defense).

It holds what one pytest run knows about the kernels under test: the ``--impl`` specs and how they
resolved, the guarded adapters (one :class:`~conformance.harness.calls.guarded.GuardedAdapter` per spec, reused by
every clause), and the per-clause records the verdict is computed from. Sub-plugins import this
module, never the plugin, so imports run one way: plugin -> sub-plugins -> runstate. Kept free of
heavy imports: the plugin loads for every pytest run in the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from conformance.harness.calls.call_timeout import DEFAULT_CALL_TIMEOUT  # noqa: F401 - re-exported: options, failures

# Option destinations, named once (pytest derives them from the flags: --impl -> "impl").
OPT_IMPL = "impl"
OPT_DECLARE = "declare"
OPT_IMPL_LIST = "impl_list"
OPT_PROFILE = "conformance_profile"
OPT_CALL_TIMEOUT = "call_timeout"
OPT_ALLOW_PARTIAL = "allow_partial"
OPT_RANDOM_SEEDS = "conformance_random_seeds"
OPT_CERTIFICATE = "certificate"
OPT_BASELINE = "baseline"
OPT_RECORD_BASELINE = "record_baseline"
OPT_DISCOVER = "discover"

HYPOTHESIS_PROFILES = ("ci", "thorough")
STATE_KEY = pytest.StashKey["State"]()


@dataclass
class State:
    specs: list[str]
    explicit: bool  # named with --impl (a certification run), not the default set of built-ins
    declare: list[str]
    overrides: dict[str, Any]
    timeout: float
    profile: str
    _resolved: dict[str, Any] | None = None
    impls: dict[str, Any] = field(default_factory=dict)  # spec -> GuardedAdapter, the guarded adapter
    results: list[dict] = field(default_factory=list)  # verdict.ClauseResult.as_dict() records
    verdicts: dict[str, Any] | None = None  # spec -> verdict.Verdict, computed at the end of the run
    discovered: dict[str, dict] = field(default_factory=dict)  # spec -> Discovery.as_dict() under --discover
    expectations: Any = None  # expectations_plugin.Applied: the known causes that apply to each spec

    @property
    def resolved(self) -> dict[str, Any]:
        """spec -> registry.Resolved. Built-ins are resolved (which imports torch and jax) only
        when first needed, i.e. when clauses are collected: the plugin is loaded by every pytest
        run in the environment, and a run that collects no clause must not pay for those imports."""
        if self._resolved is None:
            from conformance.harness.calls import registry

            resolved = {}
            for spec in self.specs:
                try:
                    resolved[spec] = registry.resolve(spec, self.overrides if self.explicit else None)
                except registry.ImplSpecError as exc:  # only a broken built-in can get here
                    resolved[spec] = registry.Resolved(spec, None, str(exc))
            self._resolved = resolved
        return self._resolved

    def guarded(self, spec: str) -> Any:
        """The one guarded adapter of ``spec`` for this run (its coverage counters live on it)."""
        from conformance.harness.calls.guarded import GuardedAdapter

        if spec not in self.impls:
            self.impls[spec] = GuardedAdapter(self.resolved[spec].adapter, spec=spec, timeout=self.timeout)
        return self.impls[spec]


def get_state(config: pytest.Config) -> State | None:
    """The run's state; None before the plugin configured it (or when it is not loaded)."""
    return config.stash.get(STATE_KEY, None)


def getoption(config: pytest.Config, name: str) -> Any:
    """An option's value, or None for an option of a sub-plugin that is not loaded."""
    try:
        return config.getoption(name)
    except ValueError:
        return None


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def planned_dtypes() -> dict[str, tuple[str | None, ...]]:
    """Every clause of the suite and the dtypes it runs with (``spec.clause.planned_dtypes``); the one
    place the run asks, so that a self-test can narrow the plan for a run of a few clause files."""
    from conformance.harness.spec import clause

    return clause.planned_dtypes()


def verdicts(config: pytest.Config) -> dict[str, Any]:
    """spec -> verdict.Verdict for every adapter with clause results in this run (computed once)."""
    state = get_state(config)
    if state is None:
        return {}
    if state.verdicts is None:
        from conformance.harness.records import deviations, verdict

        rows: dict[str, list] = {}
        for r in state.results:
            rows.setdefault(str(r["impl"]), []).append(verdict.ClauseResult.from_dict(r))
        plan = planned_dtypes() if rows else {}
        state.verdicts = {
            spec: verdict.decide(rs, plan, deviations.of_resolved(state.resolved.get(spec)), _expectations(state, spec))
            for spec, rs in rows.items()
        }
    return state.verdicts


def _expectations(state: State, spec: str) -> list:
    """The known causes of ``spec`` (harness.records.expectations), or none."""
    return state.expectations.entries(spec) if state.expectations is not None else []


def clause_result(item: pytest.Item, rep: pytest.TestReport, info: Any, excinfo: Any = None) -> Any:
    """The verdict's record of one clause test: its outcome, and the cases it covered.

    ``excinfo``: the failure pytest saw, for its likely cause (harness.causes.likely) and for the known
    cause that may explain it (harness.run.expectations_plugin.apply)."""
    from conformance.harness.records import verdict

    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    outcome, reason = rep.outcome, ""
    if rep.skipped and isinstance(rep.longrepr, tuple):
        reason = str(rep.longrepr[2]).removeprefix("Skipped: ")
        if reason.startswith("not in profile"):
            outcome = verdict.NOT_IN_PROFILE
        elif reason.startswith("not applicable"):
            outcome = verdict.NOT_APPLICABLE
        else:
            outcome = verdict.SKIPPED
    impl = getattr(item, "funcargs", {}).get("impl")
    counts: dict[str, Any] = {}
    if impl is not None and hasattr(impl, "cases_run"):
        counts = dict(cases_run=impl.cases_run, cases_declared_na=len(impl.rejected), cases_refused=len(impl.refused))
        obj = getattr(item, "obj", None)
        hyp = getattr(obj, "_hypothesis_internal_use_settings", None)
        if hyp is not None and getattr(obj, "is_hypothesis_test", False):
            counts.update(examples_run=impl.examples_run, examples_planned=hyp.max_examples)
        from conformance.harness.causes import likely as causes

        counts.update(causes.record_fields(impl, outcome, excinfo))
    return verdict.ClauseResult(
        clause=info.id,
        impl=str(params.get("impl")),
        dtype=params.get("dtype"),
        outcome=outcome,
        reason=reason,
        nodeid=item.nodeid,
        duration=rep.duration,
        **counts,
    )
