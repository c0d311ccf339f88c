"""The pytest plugin (entry point ``pytest11: sdpa_conformance``).

It adds ``--impl`` and friends (harness.run.options), turns every clause function into one test per (adapter, dtype),
reports clauses a kernel's declaration rules out as *not applicable* with the reason, wraps each
clause failure with the clause id, the spec sentence and a command that reproduces it
(harness.run.failures), and ends the run with one verdict per adapter (harness.records.verdict), which the exit
code follows. The run's state lives in harness.run.runstate, shared with the sub-plugins (certificate,
baseline, self-defense) registered here. Loaded for every pytest run in an environment where the
package is installed, so it imports nothing heavy at module level and does nothing for tests that
are not clauses.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.calls import signatures
from conformance.harness.run import (
    baseline,
    certificate,
    coverage,
    expectations_plugin,
    failures,
    options,
    ordering,
    pair_coverage,
    perf,
    preconditions,
    programs,
    quiet_summary,
    runstate,
    selfdefense,
    summary,
    transforms,
    worst_case,
)
from conformance.harness.run.runstate import State, get_state
from conformance.harness.spec.clause import info_of

SUBPLUGINS = (
    certificate,
    baseline,
    selfdefense,
    signatures,
    coverage,
    coverage.CHANNEL,
    pair_coverage,
    pair_coverage.CHANNEL,
    preconditions,
    preconditions.CHANNEL,
    programs,
    programs.CHANNEL,
    transforms,
    transforms.CHANNEL,
    ordering,
    perf,
    expectations_plugin,
    quiet_summary,
)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    for sub in SUBPLUGINS:
        if not pluginmanager.is_registered(sub):
            pluginmanager.register(sub, sub.__name__)
    options.add_options(parser)


def _state(config: pytest.Config) -> State:
    return config.stash[runstate.STATE_KEY]


def pytest_configure(config: pytest.Config) -> None:
    from conformance.harness.calls import registry
    from conformance.harness.run import cores

    cores.share()  # before any kernel's library loads: xdist workers share the cores
    from conformance.harness.cases import strategies

    strategies.register_profiles()
    profile = config.getoption(runstate.OPT_PROFILE)
    strategies.load_profile(profile)
    specs = [s.strip() for opt in config.getoption(runstate.OPT_IMPL) for s in opt.split(",") if s.strip()]
    declare = config.getoption(runstate.OPT_DECLARE)
    if declare and not specs:
        raise pytest.UsageError("--declare needs --impl: a declaration describes one kernel, not every built-in")
    try:
        overrides = registry.parse_declare(declare)
    except registry.ImplSpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    explicit = bool(specs)
    if not specs:
        specs = registry.default_names()
    state = State(specs, explicit, declare, overrides, config.getoption(runstate.OPT_CALL_TIMEOUT), profile)
    config.stash[runstate.STATE_KEY] = state
    if not explicit and not runstate.is_xdist_worker(config):
        config.pluginmanager.register(_ResolveWhileTestsRun(config))
    if config.getoption(runstate.OPT_DISCOVER) and not explicit:
        raise pytest.UsageError("--discover needs --impl: discovery measures one named kernel")
    if config.getoption(runstate.OPT_IMPL_LIST) or not explicit:
        return
    # Named on the command line: resolve now, so that a bad --impl is a usage error (exit 4).
    resolved = {}
    for spec in specs:
        try:
            resolved[spec] = registry.resolve(spec, overrides, config.getoption(signatures.OPT_SIGNATURE))
        except registry.ImplSpecError as exc:
            raise pytest.UsageError(str(exc)) from None
    state._resolved = resolved
    if config.getoption(runstate.OPT_DISCOVER):  # the discovered declaration replaces the declared one
        from conformance.harness.run import discovery_run

        discovery_run.apply(config, state, overrides, config.getoption(signatures.OPT_SIGNATURE))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: a worker certifies under the declaration the controller discovered."""
    from conformance.harness.run import discovery_run

    discovery_run.to_worker(node, node.config)


class _ResolveWhileTestsRun:
    """pytest-xdist controller: resolve the built-ins when the first clause test has reported.

    The verdicts and the summary need every adapter's declaration, and resolving the sixteen CPU
    built-ins imports torch, jax, keras, transformers, mlx and onnxruntime (about 9 s). Done at the
    end of the run, that came after the last test with both cores idle; done when the workers have
    collected, it held back their first tests. Once a clause test has reported, the workers have
    their tests queued and run on while the controlling process imports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = get_state(self.config)
        if state is None or state._resolved is not None:
            self.config.pluginmanager.unregister(self)
            return
        if _in_clause_package(self.config.rootpath / report.nodeid.split("::")[0]):
            state.resolved  # noqa: B018 - the property resolves and keeps every adapter
            self.config.pluginmanager.unregister(self)


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--impl-list``: every adapter known here, whether it can run, and what it declares."""
    if not config.getoption(runstate.OPT_IMPL_LIST):
        return None
    options.print_impl_list()
    return 0


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """A certification run (``pytest --impl=X`` at the repo root) does not even import the project's
    self-tests: they do not depend on --impl, and importing them (mutants, held-out kernels, every
    framework they use) cost a kernel author 4-5 s of each run in the edit loop. A bare `pytest` or
    `pytest tests` still runs them; the clause package is never ignored."""
    if not summary.certifying_from_testpaths(config):
        return None
    if _in_clause_package(collection_path) or _clause_dir().is_relative_to(collection_path):
        return None  # the clause package, what is in it, or a folder above it
    return True if collection_path.is_relative_to(config.rootpath) else None


@functools.cache
def _clause_dir() -> Path:
    """The clause package's folder, found by name (as pytest finds it) without importing it here;
    looked up once (it is asked for every collected path and every report until a clause reports)."""
    import importlib.util

    from conformance.harness.spec.clause import CLAUSE_PACKAGE

    spec = importlib.util.find_spec(CLAUSE_PACKAGE)
    assert spec is not None and spec.origin is not None, CLAUSE_PACKAGE
    return Path(spec.origin).resolve().parent


def _in_clause_package(path: Path) -> bool:
    return path.resolve().is_relative_to(_clause_dir())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # What pytest_ignore_collect let through that is not a clause (a test module in a folder of
    # the clause package's own) is deselected, and counted so by pytest.
    if not summary.certifying_from_testpaths(config):
        return
    keep, drop = [], []
    for item in items:
        (keep if info_of(getattr(item, "function", None)) is not None else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _clause_specs(state: State) -> list[str]:
    """Adapters the clauses run on. Asked for by name (--impl): all of them, so that every clause
    of an unavailable one says why it is skipped. By default (every built-in): the available ones;
    each unavailable built-in is reported once, by test_adapter_availability, with its reason."""
    if state.explicit:
        return state.specs
    return [s for s in state.specs if state.resolved[s].usable]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = _state(metafunc.config)
    if getattr(metafunc.function, "sdpa_availability_check", False):
        metafunc.parametrize("impl_spec", state.specs, ids=state.specs)
        return
    info = info_of(metafunc.function)
    if info is None:
        return
    if "impl" in metafunc.fixturenames:
        specs = _clause_specs(state)
        metafunc.parametrize("impl", specs, indirect=True, ids=specs)
    if "dtype" in metafunc.fixturenames:
        from conformance.contract import DTYPES

        metafunc.parametrize("dtype", list(info.dtypes or DTYPES))


@pytest.fixture
def impl(request: pytest.FixtureRequest):
    """The kernel under test for this clause test, guarded (see conformance.harness.calls.guarded)."""
    state = _state(request.config)
    spec = request.param
    res = state.resolved[spec]
    if not res.usable:
        pytest.skip(f"{spec} is unavailable here: {res.reason}")
    handle = state.guarded(spec)
    handle.begin()
    info = info_of(request.function)
    callspec = getattr(request.node, "callspec", None)
    reasons = info.not_applicable_reasons(handle.declaration, callspec.params.get("dtype") if callspec else None)
    if reasons:
        pytest.skip(f"not applicable to {handle.name}: {'; '.join(reasons)}")
    return handle


def availability(config: pytest.Config, spec: str) -> str | None:
    """Why adapter ``spec`` cannot run here, or None."""
    res = _state(config).resolved[spec]
    return None if res.usable else res.reason


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    info = info_of(getattr(item, "function", None)) if hasattr(item, "function") else None
    if info is None:
        return rep
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        result = runstate.clause_result(item, rep, info, call.excinfo)
        result = expectations_plugin.apply(item, rep, result)  # a failure a known cause explains: expected
        _state(item.config).results.append(result.as_dict())
    if rep.failed and call.excinfo is not None and item.config.getoption("tbstyle") != "long":
        compact = failures.compact_failure(call.excinfo.value)
        if compact is not None:
            rep.longrepr = compact
    if rep.failed:
        rep.sections.insert(0, ("sdpa-conformance", failures.clause_section(item, info)))
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """A property-based clause none of whose generated cases the kernel could take is not
    applicable (with the kernel's reasons), not an error of the suite; a clause test that fails
    unexpectedly goes on past its failing cases for the worst one (harness.run.worst_case)."""
    try:
        return (yield)
    except Exception as exc:
        from hypothesis.errors import Unsatisfiable

        impl = pyfuncitem.funcargs.get("impl")
        if not isinstance(exc, Unsatisfiable) or impl is None or not getattr(impl, "rejected", None):
            worst_case.after_failure(pyfuncitem, impl, exc)
            raise
        from collections import Counter

        common = "; ".join(f"{r} ({n}x)" for r, n in Counter(impl.rejected).most_common(3))
        pytest.skip(f"not applicable to {impl.name}: none of the generated cases applied: {common}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The exit code follows the worst verdict: a partial or empty certification is not a pass."""
    config = session.config
    state = get_state(config)
    if state is None or not state.results or runstate.is_xdist_worker(config):
        return
    from conformance.harness.records import verdict

    words = [v.word for v in runstate.verdicts(config).values()]
    if config.getoption(runstate.OPT_ALLOW_PARTIAL):
        words = [verdict.CONFORMS if w == verdict.PARTIAL else w for w in words]
    code = verdict.EXIT_CODES[verdict.worst(words) or verdict.CONFORMS]
    if code and session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = code


def pytest_report_header(config: pytest.Config) -> list[str]:
    return summary.header_lines(config)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    summary.write_verdicts(terminalreporter, config)
