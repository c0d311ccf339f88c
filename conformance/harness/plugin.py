"""The pytest plugin (entry point ``pytest11: sdpa_conformance``).

It adds ``--impl`` and friends, turns every clause function into one test per (adapter, dtype),
reports clauses a kernel's declaration rules out as *not applicable* with the reason, and wraps
each clause failure with the clause id, the spec sentence and a command that reproduces it.
Loaded for every pytest run in an environment where the package is installed, so it imports
nothing heavy at module level and does nothing for tests that are not clauses.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.clause import info_of

_STATE = pytest.StashKey["State"]()
HYPOTHESIS_PROFILES = ("ci", "thorough")
DEFAULT_CALL_TIMEOUT = 120.0
# Optional harness plugins (certificates, baselines, ...) living in their own modules; each is
# registered when present, so features can be added without touching this file.
SUBPLUGINS = (
    "conformance.harness.certificate",
    "conformance.harness.baseline",
    "conformance.harness.golden_plugin",
    "conformance.harness.selfdefense",
)


@dataclass
class State:
    specs: list[str]
    explicit: bool
    declare: list[str]
    overrides: dict[str, Any]
    timeout: float
    profile: str
    _resolved: dict[str, Any] | None = None
    impls: dict[str, Any] = field(default_factory=dict)
    results: list[dict] = field(default_factory=list)  # verdict.ClauseResult.as_dict() records
    verdicts: dict[str, Any] | None = None  # spec -> verdict.Verdict, computed at the end of the run

    @property
    def resolved(self) -> dict[str, Any]:
        """spec -> registry.Resolved. Built-ins are resolved (which imports torch and jax) only
        when first needed, i.e. when clauses are collected: the plugin is loaded by every pytest
        run in the environment, and a run that collects no clause must not pay for those imports."""
        if self._resolved is None:
            from conformance.harness import registry

            resolved = {}
            for spec in self.specs:
                try:
                    resolved[spec] = registry.resolve(spec, self.overrides if self.explicit else None)
                except registry.ImplSpecError as exc:  # only a broken built-in can get here
                    resolved[spec] = registry.Resolved(spec, None, str(exc))
            self._resolved = resolved
        return self._resolved


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    import importlib
    import importlib.util

    for name in SUBPLUGINS:
        if importlib.util.find_spec(name) is not None and not pluginmanager.has_plugin(name):
            pluginmanager.register(importlib.import_module(name), name)
    group = parser.getgroup("sdpa-conformance", "SDPA conformance suite")
    group.addoption(
        "--impl",
        action="append",
        default=[],
        metavar="SPEC",
        help="kernel to certify: a built-in name (numpy, torch-eager, torch-sdpa, jax, ...), "
        "module:attr (adapter object or class), or module:function (torch SDPA signature). "
        "Repeatable or comma-separated. Default: every built-in adapter importable here.",
    )
    group.addoption(
        "--declare",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a declaration field of the kernel under test, e.g. grad=false, "
        "dtypes=float32,float64, all_blocked=nan, causal_alignment=bottom-right. Repeatable.",
    )
    group.addoption("--impl-list", action="store_true", help="list available adapters and their declarations, then exit")
    group.addoption(
        "--conformance-profile",
        choices=HYPOTHESIS_PROFILES,
        default=os.environ.get("SDPA_CONFORMANCE_PROFILE", "ci"),
        help="hypothesis profile: ci (fast, derandomized) or thorough (many more examples, random seeds)",
    )
    group.addoption(
        "--allow-partial",
        action="store_true",
        default=False,
        help="exit 0 when a run that selected only some clauses (-k, --deselect, a file subset) passed; "
        "the verdict still says PARTIAL, never CONFORMS",
    )
    group.addoption(
        "--call-timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT,
        metavar="SECONDS",
        help="a single kernel call that takes longer fails its clause (0 disables the guard)",
    )


def _state(config: pytest.Config) -> State:
    return config.stash[_STATE]


def get_state(config: pytest.Config) -> State | None:
    """The run's state (resolved adapters, per-clause results) for sub-plugins; None before configure."""
    return config.stash.get(_STATE, None)


def pytest_configure(config: pytest.Config) -> None:
    from conformance.harness import registry, strategies

    strategies.register_profiles()
    profile = config.getoption("conformance_profile")
    strategies.load_profile(profile)
    specs = [s.strip() for opt in config.getoption("impl") for s in opt.split(",") if s.strip()]
    declare = config.getoption("declare")
    if declare and not specs:
        raise pytest.UsageError("--declare needs --impl: a declaration describes one kernel, not every built-in")
    try:
        overrides = registry.parse_declare(declare)
    except registry.ImplSpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    explicit = bool(specs)
    if not specs:
        specs = list(registry.builtin_names())
    state = State(specs, explicit, declare, overrides, config.getoption("call_timeout"), profile)
    config.stash[_STATE] = state
    if config.getoption("impl_list") or not explicit:
        return
    # Named on the command line: resolve now, so that a bad --impl is a usage error (exit 4).
    resolved = {}
    for spec in specs:
        try:
            resolved[spec] = registry.resolve(spec, overrides)
        except registry.ImplSpecError as exc:
            raise pytest.UsageError(str(exc)) from None
    state._resolved = resolved


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if not config.getoption("impl_list"):
        return None
    from conformance.harness import registry

    config._do_configure()
    try:
        names = registry.known_names()
        for name, target in sorted(names.items()):
            try:
                res = registry.resolve(name)
            except registry.ImplSpecError as exc:
                print(f"{name:28s} ERROR {exc}")
                continue
            status = "available" if res.adapter is not None and not res.reason else f"unavailable: {res.reason}"
            print(f"{name:28s} {target}  [{status}]")
            if res.adapter is not None:
                for key, value in res.adapter.declaration.as_dict().items():
                    print(f"    {key:18s} {value}")
    finally:
        config._ensure_unconfigure()
    return 0


def _certifying_from_testpaths(config: pytest.Config) -> bool:
    """True for ``pytest --impl=X`` at the repo root: a certification run, not a self-test run."""
    state = config.stash.get(_STATE, None)
    return bool(state and state.explicit and config.args_source == pytest.Config.ArgsSource.TESTPATHS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The project's self-tests do not depend on --impl; a certification run keeps the clauses only
    # (the report header says so, and pytest counts them as deselected). A bare `pytest` or
    # `pytest tests` still runs them.
    if not _certifying_from_testpaths(config):
        return
    keep, drop = [], []
    for item in items:
        (keep if info_of(getattr(item, "function", None)) is not None else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(_STATE, None)
    if state is None or not state.explicit:
        return []  # a default run resolves built-ins lazily; the summary lists them
    lines = [f"sdpa-conformance: hypothesis profile {state.profile}; call timeout {state.timeout:g}s"]
    for spec, res in state.resolved.items():
        if res.adapter is None or res.reason:
            lines.append(f"  {spec}: unavailable here ({res.reason})")
        else:
            d = res.adapter.declaration
            lines.append(
                f"  {spec}: dtypes={','.join(sorted(d.dtypes))} grad={d.grad} dropout={d.dropout} gqa={d.gqa} "
                f"all_blocked={d.all_blocked} causal_alignment={d.causal_alignment} device={d.device}"
            )
    if state.declare:
        lines.append(f"  --declare overrides: {' '.join(state.declare)}")
    if _certifying_from_testpaths(config):
        lines.append("  certification run: clauses only (the project's self-tests run with a bare `pytest`)")
    return lines


def _clause_specs(state: State) -> list[str]:
    """Adapters the clauses run on. Asked for by name (--impl): all of them, so that every clause
    of an unavailable one says why it is skipped. By default (every built-in): the available ones;
    each unavailable built-in is reported once, by test_adapter_availability, with its reason."""
    if state.explicit:
        return state.specs
    return [s for s in state.specs if state.resolved[s].adapter is not None and not state.resolved[s].reason]


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


def _requirement_met(decl: Any, req: str) -> tuple[bool, str]:
    key, sep, want = req.partition("=")
    have = getattr(decl, key)
    if sep:
        return str(have) == want, f"declares {key}={have}, this clause checks {key}={want}"
    return bool(have), f"declares {key}={have}"


@pytest.fixture
def impl(request: pytest.FixtureRequest):
    """The kernel under test for this clause test, guarded (see conformance.harness.impl)."""
    from conformance.harness.impl import Impl

    state = _state(request.config)
    spec = request.param
    res = state.resolved[spec]
    if res.adapter is None or res.reason:
        pytest.skip(f"{spec} is unavailable here: {res.reason}")
    if spec not in state.impls:
        state.impls[spec] = Impl(res.adapter, spec=spec, timeout=state.timeout)
    handle = state.impls[spec]
    handle.begin()
    info = info_of(request.function)
    decl = handle.declaration
    for req in info.requires if info else ():
        ok, why = _requirement_met(decl, req)
        if not ok:
            pytest.skip(f"not applicable to {handle.name}: {why}")
    callspec = getattr(request.node, "callspec", None)
    dtype = callspec.params.get("dtype") if callspec else None
    if dtype is not None and dtype not in decl.dtypes:
        pytest.skip(f"not applicable to {handle.name}: declares dtypes {sorted(decl.dtypes)}, not {dtype}")
    return handle


def availability(config: pytest.Config, spec: str) -> str | None:
    """Why adapter ``spec`` cannot run here, or None."""
    res = _state(config).resolved[spec]
    return res.reason if (res.adapter is None or res.reason) else None


def reproduce_command(item: pytest.Item) -> str:
    """One command that reruns exactly this clause test, with every option that changes its inputs."""
    state = _state(item.config)
    config = item.config
    path = Path(str(item.path))
    try:
        shown = path.relative_to(Path(config.invocation_params.dir))
    except ValueError:
        shown = path
    cmd = ["pytest", f"{shown}::{item.name}"]
    spec = getattr(item, "callspec", None) and item.callspec.params.get("impl")
    if spec:
        cmd.append(f"--impl={spec}")
    cmd += [f"--declare={d}" for d in state.declare]
    if state.profile != "ci":
        cmd.append(f"--conformance-profile={state.profile}")
    if state.timeout != DEFAULT_CALL_TIMEOUT:
        cmd.append(f"--call-timeout={state.timeout:g}")
    for opt, flag in (("conformance_random_seeds", "--conformance-random-seeds"),):
        if _getoption(config, opt):
            cmd.append(flag)
    seed = _getoption(config, "hypothesis_seed")
    if seed is not None:
        cmd.append(f"--hypothesis-seed={seed}")
    text = " ".join(shlex.quote(c) for c in cmd)
    if (state.profile != "ci" or _getoption(config, "conformance_random_seeds")) and seed is None:
        text += "  (random examples: add the @reproduce_failure line printed above, or rerun with --hypothesis-seed)"
    return text


def _getoption(config: pytest.Config, name: str) -> Any:
    try:
        return config.getoption(name)
    except ValueError:  # an option of a plugin that is not loaded
        return None


def _clause_result(item: pytest.Item, rep: pytest.TestReport, info: Any, params: dict) -> Any:
    """The verdict's record of one clause test: its outcome, and the cases it covered."""
    from conformance.harness import verdict

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
        counts = dict(cases_run=impl.cases_run, cases_declared_na=len(impl.rejected),
                      cases_refused=len(impl.refused))
        hyp = getattr(getattr(item, "obj", None), "_hypothesis_internal_use_settings", None)
        if hyp is not None and getattr(item.obj, "is_hypothesis_test", False):
            counts.update(examples_run=impl.examples_run, examples_planned=hyp.max_examples)
    return verdict.ClauseResult(
        clause=info.id, impl=str(params.get("impl")), dtype=params.get("dtype"), outcome=outcome,
        reason=reason, nodeid=item.nodeid, duration=rep.duration, **counts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    info = info_of(getattr(item, "function", None)) if hasattr(item, "function") else None
    if info is None:
        return rep
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        _state(item.config).results.append(_clause_result(item, rep, info, params).as_dict())
    if rep.failed and call.excinfo is not None and item.config.getoption("tbstyle") != "long":
        compact = _compact_failure(call.excinfo.value)
        if compact is not None:
            rep.longrepr = compact
    if rep.failed:
        text = (
            f"clause {info.id}: {info.title}\n"
            f"spec: {info.source.cite()}\n"
            + (f"tolerance: {info.tolerance}\n" if info.tolerance else "")
            + (f"false-positive rate: {info.fpr}\n" if info.fpr else "")
            + f"reproduce: {reproduce_command(item)}"
        )
        rep.sections.insert(0, ("sdpa-conformance", text))
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """A property-based clause none of whose generated cases the kernel could take is not
    applicable (with the kernel's reasons), not an error of the suite."""
    try:
        return (yield)
    except Exception as exc:
        from hypothesis.errors import Unsatisfiable

        impl = pyfuncitem.funcargs.get("impl")
        if not isinstance(exc, Unsatisfiable) or impl is None or not getattr(impl, "rejected", None):
            raise
        from collections import Counter

        common = "; ".join(f"{r} ({n}x)" for r, n in Counter(impl.rejected).most_common(3))
        pytest.skip(f"not applicable to {impl.name}: none of the generated cases applied: {common}")


def _describe_exception(exc: BaseException) -> str:
    import traceback

    from conformance.harness.report import AdapterError

    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, AdapterError) and exc.__cause__ is not None:
        cause = exc.__cause__
        here = str(Path(__file__).resolve().parents[2])
        frames = [f for f in traceback.extract_tb(cause.__traceback__) if not f.filename.startswith(here)]
        if frames:
            text += "\n  the kernel's own traceback (suite and adapter frames hidden):\n" + "".join(
                traceback.format_list(frames[-4:])).rstrip()
    notes = getattr(exc, "__notes__", None) or []
    if notes:
        text += "\n" + "\n".join(str(n) for n in notes)
    return text


def _compact_failure(exc: BaseException) -> str | None:
    """The clause's own message (plus hypothesis' falsifying example) instead of a source listing.

    Only clause violations are compacted; any other exception is a bug in the suite or the test
    and keeps pytest's full traceback. ``--tb=long`` keeps the full traceback for everything.
    """
    from conformance.harness.report import ClauseViolation

    if isinstance(exc, ClauseViolation):
        return _describe_exception(exc)
    group = exc if isinstance(exc, BaseExceptionGroup) else None
    if group is not None and all(isinstance(e, ClauseViolation) for e in group.exceptions):
        parts = [f"[{i}] " + _describe_exception(e) for i, e in enumerate(group.exceptions, 1)]
        return f"{len(parts)} distinct failures:\n" + "\n\n".join(parts)
    return None


def planned_dtypes() -> dict[str, tuple[str | None, ...]]:
    """Every clause of the suite and the dtypes it runs with: what a full run covers.

    The whole clause package is imported (a run of one file has not imported the others), so that a
    run that selected a subset can say so instead of certifying on what it happened to collect.
    """
    import inspect

    from conformance import catalog
    from conformance.contract import DTYPES

    plan = {}
    for cid, info in catalog.load().items():
        has_dtype = "dtype" in inspect.signature(info.func).parameters
        plan[cid] = tuple(info.dtypes or DTYPES) if has_dtype else (None,)
    return plan


def verdicts(config: pytest.Config) -> dict[str, Any]:
    """spec -> verdict.Verdict for every adapter with clause results in this run (computed once)."""
    state = _state(config)
    if state.verdicts is None:
        from conformance.harness import verdict

        rows: dict[str, list] = {}
        for r in state.results:
            rows.setdefault(str(r["impl"]), []).append(verdict.ClauseResult.from_dict(r))
        plan = planned_dtypes() if rows else {}
        state.verdicts = {spec: verdict.decide(rs, plan) for spec, rs in rows.items()}
    return state.verdicts


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The exit code follows the worst verdict: a partial or empty certification is not a pass."""
    config = session.config
    state = config.stash.get(_STATE, None)
    if state is None or not state.results or _is_xdist_worker(config):
        return
    from conformance.harness import verdict

    words = [v.word for v in verdicts(config).values()]
    if config.getoption("allow_partial"):
        words = [verdict.CONFORMS if w == verdict.PARTIAL else w for w in words]
    code = verdict.EXIT_CODES[verdict.worst(words) or verdict.CONFORMS]
    if code and session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = code


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not state.results:
        return
    tr = terminalreporter
    tr.section("sdpa-conformance summary")
    for spec, v in verdicts(config).items():
        tr.write_line(f"{spec}: {v.headline()} ({state.profile} profile)")
        for line in v.details():
            tr.write_line(f"    {line}")
    failed = sorted({(r["impl"], r["clause"]) for r in state.results if r["outcome"] == "failed"})
    if failed:
        tr.write_line("failed clauses: " + ", ".join(f"{c} [{i}]" for i, c in failed))
